package tests

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// Tests on a 3-node NATS cluster in this process (loopback), with the event
// stream and the lease bucket at R3.

// TestCluster3AppendAcrossStreamLeaderChange pins the clustered append
// semantics natslog relies on: the stream checks the Msg-Id before the
// expected last seq, so a retry is answered by a duplicate ack, which is
// success only if the stored event is ours; appends that run while the
// stream leader's server shuts down are each stored exactly once; and
// reads do not hang on the election.
func TestCluster3AppendAcrossStreamLeaderChange(t *testing.T) {
	c := newNATSCluster3(t)
	nc := c.connect("appender", c.urls(0))
	l := c.openLog(nc)
	ctx := t.Context()
	ev := func(term, id uint64) events.Event {
		ep := fmt.Sprintf("127.0.0.1:%d", 1000+id)
		return events.Event{Term: term, Writer: "meta-x", At: time.Now().UTC(),
			Data: events.WorkerRegistered{ID: id, Incarnation: ep, Endpoint: ep, Kind: "compute"}}
	}
	e1 := ev(1, 1)
	if seq, err := l.Append(ctx, 0, e1); err != nil || seq != 1 {
		t.Fatalf("append = %d, %v", seq, err)
	}
	// The retry of a stored append: a duplicate ack at its seq.
	if seq, err := l.Append(ctx, 0, e1); err != nil || seq != 1 {
		t.Fatalf("retry of a stored append = %d, %v; want 1, nil", seq, err)
	}
	// Another event decided on the same stale view gets the same Msg-Id
	// (<term>-<seq>) and the same duplicate ack: it is fenced, not stored.
	if seq, err := l.Append(ctx, 0, ev(1, 2)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("another event under a stored msg id = %d, %v; want ErrFenced", seq, err)
	} else {
		t.Logf("same msg id, other event: %v", err)
	}
	// A new id at a stale seq: 10071 (wrong last sequence).
	var apiErr *jetstream.APIError
	if _, err := l.Append(ctx, 0, ev(2, 2)); !errors.Is(err, events.ErrFenced) || !errors.As(err, &apiErr) || apiErr.ErrorCode != 10071 {
		t.Fatalf("stale append: %v; want ErrFenced wrapping err_code 10071", err)
	}

	// Append as a leader does (each attempt bounded, retried with the same
	// ids while the outcome is unknown) while the stream leader goes.
	leader := streamLeader(ctx, nc, l.Stream())
	if leader == "" {
		t.Fatal("no stream leader")
	}
	var (
		mu      sync.Mutex
		last    = uint64(1)
		retries int
		stop    = make(chan struct{})
		done    = make(chan error, 1)
	)
	var stopOnce sync.Once
	var result error
	stopAppender := func() error {
		stopOnce.Do(func() { close(stop); result = <-done })
		return result
	}
	t.Cleanup(func() { _ = stopAppender() }) // also when the test fails early
	go func() {
		for id := uint64(2); ; id++ {
			select {
			case <-stop:
				done <- nil
				return
			default:
			}
			e := ev(1, id)
			var err error
			for attempt := range 3 {
				actx, cancel := context.WithTimeout(ctx, 2*time.Second)
				var seq uint64
				seq, err = l.Append(actx, last, e)
				cancel()
				if err == nil {
					mu.Lock()
					last, retries = seq, retries+attempt
					mu.Unlock()
					break
				}
				t.Logf("append of id %d at seq %d, attempt %d: %v", id, last+1, attempt+1, err)
				if errors.Is(err, events.ErrFenced) {
					break
				}
			}
			if err != nil {
				done <- err
				return
			}
		}
	}()
	appended := func() uint64 { mu.Lock(); defer mu.Unlock(); return last }
	testkit.Eventually(t, 10*time.Second, "appends to flow", func() bool { return appended() >= 20 })
	c.stop(c.index(leader))
	before := appended()
	// A request that reaches the stream while it elects its next leader is
	// never answered, however long one waits: a Tail that sent one request
	// and waited for it would fail with its context's deadline. The log
	// asks again until the new leader answers, so Tail returns the tail —
	// at least every acked append — before that deadline. (The deadline is
	// the test's patience, not a performance target: how long the election
	// took is logged.)
	tctx, tcancel := context.WithTimeout(ctx, 30*time.Second)
	t0 := time.Now()
	tailSeq, err := l.Tail(tctx)
	tcancel()
	if err != nil || tailSeq < before {
		t.Fatalf("Tail right after the stream leader went = %d, %v; want at least the last acked seq %d", tailSeq, err, before)
	}
	t.Logf("Tail right after the stream leader went: %d after %s", tailSeq, time.Since(t0).Round(time.Millisecond))
	testkit.Eventually(t, 20*time.Second, "appends to flow under a new stream leader", func() bool {
		l := streamLeader(ctx, nc, "TERMLOG_TERMLOG")
		return l != "" && l != leader && appended() >= before+20
	})
	if err := stopAppender(); err != nil {
		t.Fatalf("append failed for good: %v", err)
	}
	t.Logf("stream leader %s shut down at seq %d; %d appended in all; %d retried attempts",
		leader, before, appended(), retries)
	recs := readAllRecords(t, l)
	checkContiguous(t, recs)
	for i, r := range recs {
		e, err := r.Decode()
		if err != nil {
			t.Fatalf("seq %d: %v", r.Seq, err)
		}
		if w := e.Data.(events.WorkerRegistered); w.ID != uint64(i+1) {
			t.Fatalf("seq %d holds worker %d, want %d (lost or duplicated append)", r.Seq, w.ID, i+1)
		}
	}
}

// TestCluster3StreamLeaderDown shuts down the server that leads the event
// stream while the meta leader appends registrations, deregistrations and
// expiries. No event is lost or stored twice, every registration a worker
// got a reply for is in the stream exactly once, and the three replicas
// (one per server; the one on the dead server reconnects to another) end
// with the same view.
func TestCluster3StreamLeaderDown(t *testing.T) {
	c := newNATSCluster3(t)
	opts := metaOpts{workerTimeout: 2 * time.Second, expiry: 100 * time.Millisecond}
	var nodes []*metaNode
	for i := range 3 {
		nodes = append(nodes, c.startMeta(fmt.Sprintf("meta-%d", i+1), c.urls(i), opts))
	}
	for i := range 3 {
		c.startWorker(fmt.Sprintf("w%d", i), c.urls(i), 200*time.Millisecond)
	}
	leader, term := recoveredLeader(t, 20*time.Second, 3, nodes...)
	home := c.index(leader.nc.ConnectedServerName())
	victim := (home + 1) % 3
	// The stream is led from the victim, the lease bucket is not: only the
	// stream leader goes, and the meta leader's connection stays up.
	obs := c.connect("observer", c.urls(home))
	moveStreamLeader(t, obs, "TERMLOG_TERMLOG", c.cfgs[victim].Name)
	if streamLeader(t.Context(), obs, "KV_"+meta.LeaseBucket(cluster)) == c.cfgs[victim].Name {
		moveStreamLeader(t, obs, "KV_"+meta.LeaseBucket(cluster), c.cfgs[home].Name)
	}
	t.Logf("meta leader %s (term %d) on %s; stream leader %s", leader.ID(), term, c.cfgs[home].Name, c.cfgs[victim].Name)

	reg := startRegistrar(t, c.connect("registrar", c.urls(2)))
	testkit.Eventually(t, 20*time.Second, "registrations and expiries before the shutdown", func() bool {
		return reg.count() >= 10 && len(expired(leader.View(), reg.snapshot())) > 0
	})
	pending := reg.snapshot() // registrations left to expire, not yet expired
	for id := range expired(leader.View(), pending) {
		delete(pending, id)
	}
	killSeq := leader.View().Seq
	killedAt := reg.count()
	// The next append of the leader runs while the server goes, and its
	// ack is lost: the leader must retry it with the same message ids.
	stopped := c.hook(leader.ID()).arm(func() { c.stop(victim) })
	select {
	case <-stopped:
	case <-time.After(20 * time.Second):
		t.Fatal("the meta leader did not append within 20s")
	}
	t.Logf("shut down %s at seq %d after %d registrations", c.cfgs[victim].Name, killSeq, killedAt)
	testkit.Eventually(t, 30*time.Second, "registrations and expiries under the new stream leader", func() bool {
		l, _ := leaderOf(nodes...)
		return l != nil && reg.count() >= killedAt+10 && len(expired(l.View(), pending)) > 0
	})
	replies := reg.stop()

	lg := c.openLog(obs)
	v := converged(t, lg, nodes...)
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if v.Counters.Rejected != 0 || v.Counters.Corrupt != 0 {
		t.Fatalf("rejected %d corrupt %d events, want none: %+v", v.Counters.Rejected, v.Counters.Corrupt, v.Anomalies)
	}
	recs := readAllRecords(t, lg)
	checkContiguous(t, recs)
	checkExactlyOnce(t, recs, replies)
	if n := c.hook(leader.ID()).unknown.Load(); n < 1 {
		t.Fatalf("the leader saw %d appends with an unknown outcome, want >= 1 (the lost ack)", n)
	}
	newLeader, newTerm := leaderOf(nodes...)
	t.Logf("%d events, %d registrations replied; leader now %v term %d; appends with unknown outcome %d, fenced %d",
		len(recs), len(replies), nodeID(newLeader), newTerm, c.hook(leader.ID()).unknown.Load(), leader.Fenced())
}

// TestCluster3MetaLeaderServerDown shuts down the NATS server the meta
// leader is connected to. Each replica runs next to its own server and
// reaches only that one (a replica given every URL would reconnect to
// another server and could keep its lease): the lease moves to another
// replica with a higher term, the old leader stops leading, and once its
// server is back it follows with the same view as the others.
func TestCluster3MetaLeaderServerDown(t *testing.T) {
	c := newNATSCluster3(t)
	opts := metaOpts{workerTimeout: 3 * time.Second, expiry: 100 * time.Millisecond}
	var nodes []*metaNode
	for i := range 3 {
		nodes = append(nodes, c.startMeta(fmt.Sprintf("meta-%d", i+1), c.url(i), opts, nats.IgnoreDiscoveredServers()))
	}
	for i := range 3 {
		c.startWorker(fmt.Sprintf("w%d", i), c.urls(i), 200*time.Millisecond)
	}
	old, oldTerm := recoveredLeader(t, 20*time.Second, 3, nodes...)
	home := c.index(old.nc.ConnectedServerName())
	t.Logf("meta leader %s (term %d) on %s", old.ID(), oldTerm, c.cfgs[home].Name)

	c.stop(home)
	stopped := time.Now()
	var rest []*metaNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	testkit.Eventually(t, 10*time.Second, "the old leader to stop leading", func() bool { ok, _ := old.Leading(); return !ok })
	testkit.Eventually(t, 10*time.Second, "the old leader's term to be closed", func() bool { return termEnded(old) })
	t.Logf("old leader stopped leading after %s: %s", time.Since(stopped).Round(time.Millisecond), lastReason(old))
	var newLeader *metaNode
	var newTerm uint64
	testkit.Eventually(t, 20*time.Second, "another replica to lead with a higher term", func() bool {
		newLeader, newTerm = leaderOf(rest...)
		return newLeader != nil && newTerm > oldTerm && newLeader.View().Term == newTerm
	})
	t.Logf("%s leads term %d after %s", newLeader.ID(), newTerm, time.Since(stopped).Round(time.Millisecond))
	if ok, _ := old.Leading(); ok {
		t.Fatalf("%s leads again while its server is down", old.ID())
	}

	c.start(home)
	obs := c.connect("observer", c.urls((home+1)%3))
	lg := c.openLog(obs)
	v := converged(t, lg, nodes...)
	if v.Term != newTerm || v.Leader != newLeader.ID() {
		t.Fatalf("converged view has term %d leader %s, want %d %s", v.Term, v.Leader, newTerm, newLeader.ID())
	}
	if ok, _ := old.Leading(); ok {
		t.Fatalf("%s leads after its server came back", old.ID())
	}
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 20*time.Second, "3 running workers under the new leader", func() bool {
		n := 0
		for _, w := range newLeader.View().ListWorkers() {
			if w.State == projections.WorkerRunning {
				n++
			}
		}
		return n == 3
	})
	checkContiguous(t, readAllRecords(t, lg))
}

// registrar registers one short-lived worker after another, as many
// processes starting would: even ones are left to expire, odd ones
// deregister at once. It records every registration it got a reply for.
type registrar struct {
	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	replies []registration
}

type registration struct {
	incarnation string
	id, epoch   uint64
}

func startRegistrar(t *testing.T, nc *nats.Conn) *registrar {
	ctx, cancel := context.WithCancel(context.Background())
	r := &registrar{cancel: cancel, done: make(chan struct{})}
	t.Cleanup(func() { r.stop() }) // also when the test fails early
	go func() {
		defer close(r.done)
		for i := 0; ctx.Err() == nil; i++ {
			inc := fmt.Sprintf("reg-%d", i)
			// Nothing listens there: the leader's control dial fails fast.
			w, err := client.NewWorker(nc, client.WorkerConfig{
				Cluster: cluster, Incarnation: inc, Endpoint: fmt.Sprintf("127.0.0.1:%d", 1024+i%8192),
				Kind: "compute", Parallelism: 1, RequestTimeout: 500 * time.Millisecond, Logger: testkit.Logger(t),
			})
			if err != nil {
				t.Errorf("registrar: %v", err)
				return
			}
			ref, err := w.Register(ctx)
			if err != nil {
				return // ctx done
			}
			r.mu.Lock()
			r.replies = append(r.replies, registration{incarnation: inc, id: ref.ID, epoch: ref.Epoch})
			r.mu.Unlock()
			if i%2 == 1 {
				_ = w.Deregister(ctx)
			}
			select {
			case <-ctx.Done():
			case <-time.After(20 * time.Millisecond): // pacing, not synchronisation
			}
		}
	}()
	return r
}

func (r *registrar) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.replies)
}

func (r *registrar) stop() []registration {
	r.cancel()
	<-r.done
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]registration(nil), r.replies...)
}

// snapshot returns the registrations left to expire (the even ones), by id.
func (r *registrar) snapshot() map[uint64]registration {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := map[uint64]registration{}
	for i, rep := range r.replies {
		if i%2 == 0 {
			out[rep.id] = rep
		}
	}
	return out
}

// expired returns the registrations of regs that v no longer holds: they
// were expired.
func expired(v *projections.State, regs map[uint64]registration) map[uint64]registration {
	out := map[uint64]registration{}
	for id, rep := range regs {
		if w, ok := v.Worker(id); !ok || w.Epoch != rep.epoch {
			out[id] = rep
		}
	}
	return out
}

func readAllRecords(t *testing.T, l events.Log) []events.Record {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	var out []events.Record
	if err := l.Read(ctx, 1, func(r events.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("read the stream: %v", err)
	}
	return out
}

// checkContiguous fails unless recs are seqs 1..n, each a distinct event.
func checkContiguous(t *testing.T, recs []events.Record) {
	t.Helper()
	seen := map[string]uint64{}
	for i, r := range recs {
		if r.Seq != uint64(i+1) {
			t.Fatalf("record %d has seq %d: the stream has a gap", i, r.Seq)
		}
		if prev, ok := seen[string(r.Data)]; ok {
			t.Fatalf("seq %d repeats the event at seq %d: %s", r.Seq, prev, r.Data)
		}
		seen[string(r.Data)] = r.Seq
	}
}

// checkExactlyOnce fails unless every replied registration is in the stream
// once, at seq = its epoch, and no worker was removed twice.
func checkExactlyOnce(t *testing.T, recs []events.Record, replies []registration) {
	t.Helper()
	registered := map[string][]uint64{} // incarnation -> seqs
	removed := map[[2]uint64]int{}      // id, epoch -> removals
	for _, r := range recs {
		e, err := r.Decode()
		if err != nil {
			t.Fatalf("seq %d: %v", r.Seq, err)
		}
		switch d := e.Data.(type) {
		case events.WorkerRegistered:
			registered[d.Incarnation] = append(registered[d.Incarnation], r.Seq)
		case events.WorkerExpired:
			removed[[2]uint64{d.ID, d.Epoch}]++
		case events.WorkerDeregistered:
			removed[[2]uint64{d.ID, d.Epoch}]++
		}
	}
	for k, n := range removed {
		if n > 1 {
			t.Errorf("worker %d epoch %d removed %d times", k[0], k[1], n)
		}
	}
	for _, rep := range replies {
		seqs := registered[rep.incarnation]
		if len(seqs) != 1 || seqs[0] != rep.epoch {
			t.Errorf("registration %s (id %d epoch %d) stored at seqs %v, want exactly [%d]",
				rep.incarnation, rep.id, rep.epoch, seqs, rep.epoch)
		}
	}
}

// termEnded reports whether n's last term is closed: every leader task of
// it joined (Leading turns false earlier, when the term starts ending).
func termEnded(n *metaNode) bool {
	terms := n.Terms()
	return len(terms) > 0 && !terms[len(terms)-1].Ended.IsZero()
}

func lastReason(n *metaNode) string {
	terms := n.Terms()
	if len(terms) == 0 {
		return ""
	}
	return terms[len(terms)-1].Reason
}

func nodeID(n *metaNode) string {
	if n == nil {
		return "none"
	}
	return n.ID()
}
