package meta

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
)

// snapCluster is a stream on a real embedded NATS server, filled with a
// generated event mix, its snapshot bucket, and a lease whose next term is
// above every term in the mix.
type snapCluster struct {
	log   *natslog.Log
	snaps *natslog.Snapshots
	lease *MemLeaseStore
}

func newSnapCluster(t *testing.T, n int) *snapCluster {
	t.Helper()
	_, nc := testkit.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	log, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "snap"})
	if err != nil {
		t.Fatal(err)
	}
	snaps, err := natslog.OpenSnapshots(ctx, log)
	if err != nil {
		t.Fatal(err)
	}
	mix, err := eventgen.Mix(n, 30)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := log.Append(ctx, 0, mix.Events...); err != nil {
		t.Fatal(err)
	}
	return &snapCluster{log: log, snaps: snaps, lease: leaseAbove(t, mix.Events[len(mix.Events)-1].Term)}
}

// leaseAbove is a long lease (a loaded machine must not move leadership
// mid-test) whose next term is above term.
func leaseAbove(t *testing.T, term uint64) *MemLeaseStore {
	t.Helper()
	lease := NewMemLeaseStore(clock.Real{}, 10*time.Second)
	h := lease.Handle()
	for range term {
		if _, err := h.Acquire(ctxT(t), "earlier"); err != nil {
			t.Fatal(err)
		}
		_ = h.Release(ctxT(t))
	}
	return lease
}

// replica runs one meta replica on the cluster until the returned stop is
// called (stop joins it; cleanup stops it too).
func (c *snapCluster) replica(t *testing.T, id string, every int) (*Replica, func()) {
	t.Helper()
	return runSnapReplica(t, id, c.log, c.lease, c.snaps, every)
}

// runSnapReplica runs one meta replica with no workers and snapshots in
// snaps until the returned stop is called (stop joins it; cleanup stops it
// too).
func runSnapReplica(t *testing.T, id string, log events.Log, lease *MemLeaseStore, snaps events.SnapshotStore, every int) (*Replica, func()) {
	t.Helper()
	r, err := New(Config{
		ID: id, Cluster: "snap", Log: log, Lease: lease.Handle(), LeaseTTL: 10 * time.Second,
		WorkerTimeout: time.Hour, Scheduler: SchedulerConfig{StoreTimeout: time.Hour},
		ControlDialer: func(context.Context, string) (ControlConn, error) { return nil, errors.New("no workers here") },
		Snapshots:     snaps, SnapshotEvery: every, SnapshotKeep: 2, Logger: zerolog.Nop(),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() { defer wg.Done(); _ = r.Run(ctx) }()
	var once sync.Once
	stop := func() { once.Do(func() { cancel(); wg.Wait() }) }
	t.Cleanup(stop)
	return r, stop
}

// appendOther appends n events (recorded no-ops) at the projected term, as
// the leader's own appends would be.
func (c *snapCluster) appendOther(t *testing.T, term uint64, n int) uint64 {
	t.Helper()
	ctx := ctxT(t)
	tail, err := c.log.Tail(ctx)
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]events.Event, n)
	for i := range evs {
		evs[i] = events.Event{Term: term, Writer: "test", At: time.Now().UTC(), Data: events.WorkerDeregistered{ID: 1 << 40, Epoch: uint64(i + 1)}}
	}
	last, err := c.log.Append(ctx, tail, evs...)
	if err != nil {
		t.Fatal(err)
	}
	return last
}

func (c *snapCluster) list(t *testing.T) []events.SnapshotInfo {
	t.Helper()
	l, err := c.snaps.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	return l
}

func newest(l []events.SnapshotInfo) uint64 {
	if len(l) == 0 {
		return 0
	}
	return l[len(l)-1].Seq
}

// foldHash folds the stream up to seq from seq 1.
func (c *snapCluster) foldHash(t *testing.T, seq uint64) string {
	t.Helper()
	st := projections.New()
	if err := c.log.Read(ctxT(t), 1, func(r events.Record) error {
		if r.Seq <= seq {
			st.ApplyRecord(r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st.Hash()
}

func leaderTerm(t *testing.T, r *Replica) uint64 {
	t.Helper()
	var term uint64
	testkit.Eventually(t, 10*time.Second, r.ID()+" to lead", func() bool {
		ok, tm := r.Leading()
		term = tm
		return ok && r.View().Term == tm
	})
	return term
}

// The leader stores a snapshot every N events and one on clean shutdown;
// each is the state of the stream at its seq, and only the newest are kept.
func TestLeaderWritesSnapshots(t *testing.T) {
	const n, every = 400, 100
	c := newSnapCluster(t, n)
	puts := &putLog{SnapshotStore: c.snaps}
	r, stop := runSnapReplica(t, "meta-1", c.log, c.lease, puts, every)
	term := leaderTerm(t, r)
	// Seq n+1 is term.started; n+1 >= every: a snapshot right away.
	testkit.Eventually(t, 10*time.Second, "the first snapshot", func() bool { return newest(c.list(t)) >= n+1 })
	first := newest(c.list(t))
	last := c.appendOther(t, term, 250)
	// Every 100 events: the newest is less than 100 behind the tail.
	// Only the 2 newest are kept (pruned after each write).
	var got []events.SnapshotInfo
	testkit.Eventually(t, 10*time.Second, "2 snapshots kept, the newest less than 100 events behind the tail", func() bool {
		got = c.list(t)
		return newest(got) > last-every && len(got) == 2
	})
	if got[0].Seq < first {
		t.Fatalf("kept %+v, want the 2 newest", got)
	}
	for _, si := range got {
		if si.Writer != "meta-1" || si.LeaderTerm != term || si.Term != term || si.Hash != c.foldHash(t, si.Seq) {
			t.Fatalf("snapshot %+v is not the stream's state at its seq (hash %s) by meta-1 in term %d", si, c.foldHash(t, si.Seq), term)
		}
	}
	// Up to the seq before the next periodic snapshot falls due (the one
	// at before + every): none is stored, but one on shutdown is.
	before := newest(c.list(t))
	if extra := int(before + every - 1 - last); extra > 0 {
		last = c.appendOther(t, term, extra)
	}
	testkit.Eventually(t, 10*time.Second, "the projection to reach the tail", func() bool { return r.Projector().Seq() == last })
	puts.stopping.Store(true)
	stop()
	// The only snapshot stored after the one at before is the final one,
	// stored after stop began; a periodic one in between would also be
	// among the 2 kept.
	got = c.list(t)
	if len(got) != 2 || got[0].Seq != before || got[1].Seq != last || got[1].Hash != c.foldHash(t, last) {
		t.Fatalf("after events short of the next snapshot (one every %d) and a clean shutdown: %+v; want the snapshot at %d and the final one at %d", every, got, before, last)
	}
	var after []putRec
	for _, p := range puts.all() {
		if p.seq > before {
			after = append(after, p)
		}
	}
	if len(after) != 1 || !after[0].stopping {
		t.Fatalf("snapshots stored after seq %d: %+v; want only the final one, stored on shutdown", before, after)
	}
}

// putLog records every snapshot stored through it, and whether the
// replica was being stopped then.
type putLog struct {
	events.SnapshotStore
	stopping atomic.Bool

	mu   sync.Mutex
	puts []putRec
}

type putRec struct {
	seq      uint64
	stopping bool
}

func (p *putLog) Put(ctx context.Context, si events.SnapshotInfo, data []byte) (events.SnapshotInfo, error) {
	p.mu.Lock()
	p.puts = append(p.puts, putRec{si.Seq, p.stopping.Load()})
	p.mu.Unlock()
	return p.SnapshotStore.Put(ctx, si, data)
}

func (p *putLog) all() []putRec {
	p.mu.Lock()
	defer p.mu.Unlock()
	return append([]putRec(nil), p.puts...)
}

// A replica that joins a cluster with a snapshot folds only the events after
// it and reaches the hash of the replicas that folded everything.
func TestReplicaJoinsFromSnapshot(t *testing.T) {
	const n, every = 1500, 1000
	c := newSnapCluster(t, n)
	leader, _ := c.replica(t, "meta-1", every)
	term := leaderTerm(t, leader)
	follower, _ := c.replica(t, "meta-2", every)
	testkit.Eventually(t, 10*time.Second, "the leader's snapshot", func() bool { return newest(c.list(t)) >= n+1 })
	snap := newest(c.list(t))
	last := c.appendOther(t, term, 120) // fewer than every: no newer snapshot
	joiner, _ := c.replica(t, "meta-3", every)
	for _, r := range []*Replica{leader, follower, joiner} {
		testkit.Eventually(t, 10*time.Second, r.ID()+" to reach the tail", func() bool { return r.Projector().Seq() == last })
	}
	want := c.foldHash(t, last)
	for _, r := range []*Replica{leader, follower, joiner} {
		if h := r.View().Hash(); h != want {
			t.Fatalf("%s: hash %s, want %s", r.ID(), h, want)
		}
	}
	o := joiner.Projector().Origin()
	if o.Snapshot == nil || o.Snapshot.Seq != snap || o.Folded != last-snap {
		t.Fatalf("joiner origin %+v: want the snapshot at %d and %d events folded", o, snap, last-snap)
	}
	// The leader's projection started before any snapshot existed.
	if lo := leader.Projector().Origin(); lo.Snapshot != nil || lo.Folded != last {
		t.Fatalf("leader origin %+v, want %d events folded from seq 1", lo, last)
	}
}

// heldSnapshots holds every Put until release is closed, and says when one
// is waiting.
type heldSnapshots struct {
	*events.MemSnapshots
	entered chan uint64   // the seq of each Put that waits
	release chan struct{} // closed: Puts go on
}

func (h *heldSnapshots) Put(ctx context.Context, si events.SnapshotInfo, data []byte) (events.SnapshotInfo, error) {
	select {
	case h.entered <- si.Seq:
	default:
	}
	select {
	case <-h.release:
	case <-ctx.Done():
		return events.SnapshotInfo{}, ctx.Err()
	}
	return h.MemSnapshots.Put(ctx, si, data)
}

// On clean shutdown the leader stores the final snapshot while it still
// holds its lease (only a leader writes snapshots), then releases the lease,
// all before Run returns.
func TestShutdownStoresFinalSnapshotBeforeRelease(t *testing.T) {
	log, last, lease := shutdownLog(t)
	held := &heldSnapshots{MemSnapshots: events.NewMemSnapshots(log), entered: make(chan uint64, 1), release: make(chan struct{})}
	var once sync.Once
	release := func() { once.Do(func() { close(held.release) }) }
	r, stop := runSnapReplica(t, "meta-1", log, lease, held, -1) // only on shutdown
	t.Cleanup(release)                                           // before stop (cleanups run last first)
	term := leaderTerm(t, r)
	last++ // term.started
	testkit.Eventually(t, 10*time.Second, "the projection to reach term.started", func() bool { return r.Projector().Seq() == last })
	stopped := make(chan struct{})
	go func() { defer close(stopped); stop() }()
	select {
	case seq := <-held.entered:
		if seq != last {
			t.Fatalf("final snapshot at seq %d, want %d", seq, last)
		}
	case <-ctxT(t).Done():
		t.Fatal("no snapshot on clean shutdown")
	}
	// The final snapshot is being stored: the lease is still this term's.
	if got, err := lease.Handle().Acquire(ctxT(t), "meta-2"); !errors.Is(err, ErrLeaseHeld) {
		t.Fatalf("lease while the final snapshot is stored: term %d, %v; want it held by term %d", got, err, term)
	}
	release()
	<-stopped
	// Run has returned: the lease was released after the snapshot.
	if got, err := lease.Handle().Acquire(ctxT(t), "meta-2"); err != nil || got <= term {
		t.Fatalf("lease after shutdown: term %d, %v; want it released by term %d", got, err, term)
	}
	list, err := held.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	want := projections.New()
	if err := log.Read(ctxT(t), 1, func(rec events.Record) error { want.ApplyRecord(rec); return nil }); err != nil || want.Seq != last {
		t.Fatalf("fold of the log: at %d, %v", want.Seq, err)
	}
	if len(list) != 1 || list[0].Seq != last || list[0].Writer != "meta-1" || list[0].LeaderTerm != term || list[0].Hash != want.Hash() {
		t.Fatalf("stored %+v; want the snapshot of seq %d (hash %s) by meta-1 in term %d", list, last, want.Hash(), term)
	}
}

// A final snapshot whose store never answers holds shutdown up only within
// the lease the term still holds: Run returns, the lease is released and
// nothing is stored.
func TestShutdownFinalSnapshotBounded(t *testing.T) {
	log, last, lease := shutdownLog(t)
	held := &heldSnapshots{MemSnapshots: events.NewMemSnapshots(log), entered: make(chan uint64, 1), release: make(chan struct{})} // never released
	r, stop := runSnapReplica(t, "meta-1", log, lease, held, -1)
	term := leaderTerm(t, r)
	testkit.Eventually(t, 10*time.Second, "the projection to reach term.started", func() bool { return r.Projector().Seq() == last+1 })
	stopped := make(chan struct{})
	go func() { defer close(stopped); stop() }()
	<-held.entered
	select {
	case <-stopped:
	case <-ctxT(t).Done():
		t.Fatal("shutdown waits on a final snapshot that is never stored")
	}
	if got, err := lease.Handle().Acquire(ctxT(t), "meta-2"); err != nil || got <= term {
		t.Fatalf("lease after shutdown: term %d, %v; want it released by term %d", got, err, term)
	}
	if list, err := held.List(ctxT(t)); err != nil || len(list) != 0 {
		t.Fatalf("stored %+v, %v; want nothing", list, err)
	}
}

// shutdownLog is a log of a generated mix and a lease above its terms.
func shutdownLog(t *testing.T) (*events.MemLog, uint64, *MemLeaseStore) {
	t.Helper()
	mix, err := eventgen.Mix(200, 20)
	if err != nil {
		t.Fatal(err)
	}
	log := events.NewMemLog()
	last, err := log.Append(ctxT(t), 0, mix.Events...)
	if err != nil {
		t.Fatal(err)
	}
	return log, last, leaseAbove(t, mix.Events[len(mix.Events)-1].Term)
}

// A replica without a snapshot store runs past many snapshot intervals
// (SnapshotEvery defaults to 10,000 whether or not there is a store) and
// keeps leading: no snapshot is attempted. Before the guard, the leader's
// snapshot goroutine dereferenced the nil store at the first interval and
// the process crashed.
func TestLeaderWithoutSnapshotStore(t *testing.T) {
	c := newSnapCluster(t, 50)
	r, stop := runSnapReplica(t, "meta-1", c.log, c.lease, nil, 10)
	term := leaderTerm(t, r)
	last := c.appendOther(t, term, 35)
	testkit.Eventually(t, 10*time.Second, "the projection to reach the tail", func() bool { return r.Projector().Seq() == last })
	if ok, tm := r.Leading(); !ok || tm != term {
		t.Fatalf("after 35 events with snapshots every 10 and no store: leading %v term %d, want term %d", ok, tm, term)
	}
	stop()
	if l := c.list(t); len(l) != 0 {
		t.Fatalf("snapshots stored without a store: %+v", l)
	}
}
