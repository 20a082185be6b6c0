package logstore

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// recorder is an Actuator that records every action it applies.
type recorder struct {
	*Host
	mu      sync.Mutex
	applied []Action
}

func (r *recorder) apply(ctx context.Context, a Action) error {
	r.mu.Lock()
	r.applied = append(r.applied, a)
	r.mu.Unlock()
	return r.Host.apply(ctx, a)
}

func (r *recorder) actions() []Action {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.applied)
}

// storeProc is the store side of one store process: its projector over the
// stream and its reconciler, both joined by stop.
type storeProc struct {
	proj   *view.Projector
	rec    *Reconciler
	act    *recorder
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startStore(t *testing.T, log events.Log, h *Host) *storeProc {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	p := &storeProc{
		proj:   view.NewProjector(log, testkit.Logger(t), nil),
		act:    &recorder{Host: h},
		cancel: cancel,
	}
	p.rec = NewReconciler(ReconcilerConfig{
		Store:  h.StoreID(),
		Host:   p.act,
		View:   ViewOf(p.proj),
		Logger: testkit.Logger(t),
		Resync: 200 * time.Millisecond,
	})
	p.wg.Add(2)
	go func() { defer p.wg.Done(); p.proj.Run(ctx) }()
	go func() { defer p.wg.Done(); p.rec.Run(ctx) }()
	t.Cleanup(p.stop)
	return p
}

func (p *storeProc) stop() {
	p.cancel()
	p.wg.Wait()
}

// meta appends events as the meta leader of term 1 would.
type meta struct {
	t   *testing.T
	log *events.MemLog
}

func (m meta) append(ps ...events.Payload) uint64 {
	m.t.Helper()
	ctx := ctxTimeout(m.t, 5*time.Second)
	tail, err := m.log.Tail(ctx)
	if err != nil {
		m.t.Fatal(err)
	}
	evs := make([]events.Event, len(ps))
	for i, p := range ps {
		evs[i] = events.Event{Term: 1, Writer: "meta-1", At: time.Now(), Data: p}
	}
	seq, err := m.log.Append(ctx, tail, evs...)
	if err != nil {
		m.t.Fatal(err)
	}
	return seq
}

// TestZombieReplicaNeverStarts is the second report at the dragonboat level:
// store 3 is down while replica 3 is removed from shard 1; it restarts from
// the same data dir with a bootstrap record for replica 3. The reconciler,
// gated by the projected membership, never starts replica 3 (so it never
// campaigns) and removes its data; once replica 4 on store 3 is added, it
// joins and the shard is back to three members with one leader.
func TestZombieReplicaNeverStarts(t *testing.T) {
	c := newCluster(t, 3)
	log := events.NewMemLog()
	t.Cleanup(log.Close)
	mt := meta{t: t, log: log}
	mt.append(events.TermStarted{Term: 1, Leader: "meta-1"})
	for i, cfg := range c.cfgs {
		mt.append(events.StoreRegistered{Store: cfg.StoreID, Incarnation: "i1", RaftAddr: c.cfgs[i].RaftAddr})
	}
	mt.append(events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}})

	// Every store bootstraps its replica from the projection alone.
	procs := make([]*storeProc, 3)
	for i, h := range c.hosts {
		procs[i] = startStore(t, log, h)
	}
	waitAgree(t, 1, []uint64{1, 2, 3}, c.hosts...)
	for i, p := range procs {
		want := Action{Kind: ActStart, Shard: 1, Replica: uint64(i + 1), Initial: c.initial()}
		if got := p.act.actions(); len(got) == 0 || got[0].Kind != want.Kind || got[0].Replica != want.Replica || len(got[0].Initial) != 3 {
			t.Fatalf("store %d bootstrapped with %v, want %v", i+1, got, want)
		}
	}
	mustPropose(t, c.hosts[0], 1, "before")

	// Store 3 goes down; the scheduler removes replica 3 through store 1.
	procs[2].stop()
	c.stop(2)
	h1 := c.hosts[0]
	before, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	mt.append(events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: before.CCID, Op: "op-1"})
	res := h1.RemoveReplica(ctxTimeout(t, 10*time.Second), 1, 3)
	if res.Outcome != Applied {
		t.Fatalf("remove 3: %v", res)
	}
	mt.append(events.ShardReplicaRemoved{Shard: 1, Replica: 3, Store: "s3", CCID: res.CCID, Op: "op-1"})
	leader := waitAgree(t, 1, []uint64{1, 2}, c.hosts[0], c.hosts[1])
	si, _ := info(h1, 1)
	term := si.Term
	mustPropose(t, h1, 1, "while 3 is down")

	// Store 3 restarts from the same dir: replica 3's stale bootstrap record is there.
	h3 := c.restart(2)
	if !slices.Contains(h3.Persisted(), projections.ReplicaRef{Shard: 1, Replica: 3}) || h3.Running(1, 3) {
		t.Fatalf("restarted store 3: persisted %v running %v", h3.Persisted(), h3.Running(1, 3))
	}
	procs[2] = startStore(t, log, h3)
	testkit.Eventually(t, 10*time.Second, "replica 3's data removed", func() bool { return len(h3.Persisted()) == 0 })
	// Give a would-be zombie several election timeouts to campaign.
	time.Sleep(5 * c.hosts[0].electionTimeout())
	for _, a := range procs[2].act.actions() {
		if a.Kind == ActStart {
			t.Fatalf("store 3 started something: %v", a)
		}
	}
	if _, ok := info(h3, 1); ok {
		t.Fatalf("store 3 runs shard 1: %v", h3.ShardInfos())
	}
	if si, _ := info(h1, 1); si.Term != term || si.Leader != leader {
		t.Fatalf("survivors disturbed: term %d->%d leader %d->%d", term, si.Term, leader, si.Leader)
	}
	if sk := procs[2].rec.Skipped(); len(sk) != 0 {
		t.Fatalf("skipped: %v", sk)
	}

	// The scheduler adds replica 4 on store 3 (its address is free again).
	mt.append(events.ShardReplicaAdding{Shard: 1, Replica: 4, Store: "s3", CCID: res.CCID, Op: "op-1"})
	add := h1.AddReplica(ctxTimeout(t, 10*time.Second), 1, 4, c.cfgs[2].RaftAddr)
	if add.Outcome != Applied {
		t.Fatalf("add 4: %v", add)
	}
	seq := mt.append(events.ShardReplicaAdded{Shard: 1, Replica: 4, Store: "s3", CCID: add.CCID, Op: "op-1"})
	waitAgree(t, 1, []uint64{1, 2, 4}, c.hosts...)
	mustCount(t, h3, 1, 2)
	mustPropose(t, h3, 1, "after")
	for _, h := range c.hosts {
		mustCount(t, h, 1, 3)
	}
	var started []Action
	for _, a := range procs[2].act.actions() {
		if a.Kind == ActStart {
			started = append(started, a)
		}
	}
	if len(started) != 1 || started[0].Replica != 4 || !started[0].Join {
		t.Fatalf("store 3 starts: %v", started)
	}
	testkit.Eventually(t, 5*time.Second, "reconciler status at the tail", func() bool {
		st := procs[2].rec.Status()
		return st.Ready && st.Seq == seq && st.Err == ""
	})
}
