package meta

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/client"
)

// gateLog is a log whose appends in flight the test steers: before the nth
// AppendAsync is forwarded it runs before[n]; the nth append's Wait first
// waits for hold[n] to be closed and, with lose[n], reports an unknown
// outcome whatever the log did (a lost ack). Watch holds back every record
// from seq pauseFrom on while paused is open, so the leader's projection
// does not see what the test appended "behind its back" yet.
type gateLog struct {
	events.Log
	mu     sync.Mutex
	n      int
	before map[int]func()
	hold   map[int]chan struct{}
	lose   map[int]bool
	// holdFrom > 0: every append from the holdFrom-th on waits for
	// holdAll (see holdAppends).
	holdFrom int
	holdAll  chan struct{}

	pmu       sync.Mutex
	pauseFrom uint64
	paused    chan struct{} // nil: not paused
}

func newGateLog(l events.Log) *gateLog {
	return &gateLog{Log: l, before: map[int]func(){}, hold: map[int]chan struct{}{}, lose: map[int]bool{}}
}

func (g *gateLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	g.mu.Lock()
	g.n++
	n := g.n
	before, hold, lose := g.before[n], g.hold[n], g.lose[n]
	if g.holdFrom > 0 && n >= g.holdFrom {
		hold = g.holdAll
	}
	g.mu.Unlock()
	if before != nil {
		before()
	}
	return &gatedPending{p: g.Log.AppendAsync(ctx, expected, prevID, evs...), hold: hold, lose: lose}
}

// Append is how the committer resends a group whose outcome is unknown
// (appendOnce): after holdAppends it waits for the release too, and it
// stores nothing while it waits. (The gate once held AppendAsync alone: a
// resend 500 ms after a held first attempt was stored at once, and on a
// loaded machine its registrations were answered before the queue the
// test waits for had filled: census 8 of docs/testing.md, twice.)
func (g *gateLog) Append(ctx context.Context, expected uint64, evs ...events.Event) (uint64, error) {
	g.mu.Lock()
	hold := g.holdAll
	g.mu.Unlock()
	if hold != nil {
		select {
		case <-hold:
		case <-ctx.Done():
			return 0, fmt.Errorf("gate held: %w", ctx.Err())
		}
	}
	return g.Log.Append(ctx, expected, evs...)
}

type gatedPending struct {
	p    events.Pending
	hold chan struct{}
	lose bool
}

func (p *gatedPending) Wait(ctx context.Context) (uint64, error) {
	if p.hold != nil {
		select {
		case <-p.hold:
		case <-ctx.Done():
			return 0, fmt.Errorf("gate held: %w", ctx.Err())
		}
	}
	last, err := p.p.Wait(ctx)
	if p.lose {
		return 0, fmt.Errorf("ack lost (test): the append returned %d, %v", last, err)
	}
	return last, err
}

func (g *gateLog) pause(from uint64) {
	g.pmu.Lock()
	defer g.pmu.Unlock()
	g.pauseFrom, g.paused = from, make(chan struct{})
}

func (g *gateLog) resume() {
	g.pmu.Lock()
	defer g.pmu.Unlock()
	if g.paused != nil {
		close(g.paused)
		g.paused = nil
	}
}

func (g *gateLog) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	return g.Log.Watch(ctx, from, func(r events.Record) error {
		g.pmu.Lock()
		paused := g.paused
		if r.Seq < g.pauseFrom {
			paused = nil
		}
		g.pmu.Unlock()
		if paused != nil {
			select {
			case <-paused:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return fn(r)
	})
}

// pipelineLogs runs fn on a MemLog and on a JetStream log on an embedded
// server (a single server: groups are pipelined there).
func pipelineLogs(t *testing.T, fn func(t *testing.T, log events.Log)) {
	t.Run("MemLog", func(t *testing.T) { fn(t, events.NewMemLog()) })
	t.Run("JetStream", func(t *testing.T) {
		_, nc := testkit.NATS(t)
		l, err := natslog.Open(ctxT(t), nc, natslog.Config{})
		if err != nil {
			t.Fatal(err)
		}
		fn(t, l)
	})
}

func longAppends(c *Config) { c.AppendTimeout = 10 * time.Second }

// pipelining makes tl send a group while another is in flight however few
// mutations wait.
func pipelining(tl *testLeader) *testLeader {
	tl.loop.do(context.Background(), func() { tl.commit.minPipelined = 1 })
	return tl
}

// registerAsync registers req in the background; the reply arrives on the
// returned channel.
func registerAsync(t *testing.T, tl *testLeader, req client.RegisterRequest) <-chan client.Reply {
	ch := make(chan client.Reply, 1)
	tl.wg.Go(func() { ch <- tl.duties.workers.register(ctxT(t), req) })
	return ch
}

func reply(t *testing.T, ch <-chan client.Reply) client.Reply {
	t.Helper()
	select {
	case r := <-ch:
		return r
	case <-time.After(10 * time.Second):
		t.Fatal("no reply in 10s")
		return client.Reply{}
	}
}

// logTerms reads the log and renders each record's seq, type and term.
func logTerms(t *testing.T, log events.Log) string {
	t.Helper()
	var out []string
	if err := log.Read(ctxT(t), 1, func(r events.Record) error {
		ev, err := r.Decode()
		if err != nil {
			return err
		}
		out = append(out, fmt.Sprintf("%d:%s@%d", r.Seq, ev.Type(), ev.Term))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return fmt.Sprint(out)
}

// Three groups in flight at once: each is decided on the previous ones'
// events and sent before the first group's append is answered (its Wait
// is held until the third is sent: a leader that waited for a group's
// acks before sending the next would never send it). All land in order and
// every caller is answered once the projection holds its worker.
func TestPipelinedGroupsInFlight(t *testing.T) {
	pipelineLogs(t, func(t *testing.T, base events.Log) {
		g := newGateLog(base)
		tl := pipelining(newTestLeader(t, "meta-1", g, clock.NewManual(t0), 1, longAppends))
		if err := tl.startTerm(ctxT(t)); err != nil { // append 1
			t.Fatal(err)
		}
		entered2, go2, entered3, go3, sent4 := make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{}), make(chan struct{})
		g.mu.Lock()
		g.before[2] = func() { close(entered2); <-go2 }
		g.before[3] = func() { close(entered3); <-go3 }
		g.before[4] = func() { close(sent4) }
		g.hold[2] = sent4
		g.mu.Unlock()
		a := registerAsync(t, tl, client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
		<-entered2
		b := registerAsync(t, tl, client.RegisterRequest{Incarnation: "b", Endpoint: "10.0.0.2:1"})
		queued(t, tl.leaderSession, 1)
		close(go2)
		<-entered3
		c := registerAsync(t, tl, client.RegisterRequest{Incarnation: "c", Endpoint: "10.0.0.1:1"}) // replaces a at its endpoint
		queued(t, tl.leaderSession, 1)
		close(go3)
		for i, want := range []struct{ id, epoch uint64 }{{1, 2}, {2, 3}, {3, 4}} {
			rep := reply(t, []<-chan client.Reply{a, b, c}[i])
			if rep.Error != nil || rep.ID != want.id || rep.Epoch != want.epoch {
				t.Fatalf("reply %d = %+v, want id %d epoch %d", i, rep, want.id, want.epoch)
			}
			// Answered only once projected.
			if v := tl.r.proj.View(); v.Seq < rep.Epoch {
				t.Fatalf("reply %d answered at projection seq %d, before its event at %d", i, v.Seq, rep.Epoch)
			}
		}
		if got, want := logTerms(t, base), "[1:term.started@1 2:worker.registered@1 3:worker.registered@1 4:worker.registered@1]"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		if got := workerList(tl.r.proj.View()); got != "[2,3]" {
			t.Fatalf("workers %s, want [2,3]", got)
		}
	})
}

// A new leader's term.started takes the seq of the deposed leader's first
// group in flight, one event long, so the second group's expected last seq
// matches the log again. The old leader's projection has not seen the new
// term (held back), so only the msg-id chain can stop the second group: it
// must. Neither group lands, every caller gets not_leader, and the old
// leader steps down.
func TestPipelinedGroupsFencedByNewTerm(t *testing.T) {
	pipelineLogs(t, func(t *testing.T, base events.Log) {
		clk := clock.NewManual(t0)
		ctx := ctxT(t)
		g := newGateLog(base)
		old := pipelining(newTestLeader(t, "meta-1", g, clk, 1, longAppends))
		if err := old.startTerm(ctx); err != nil { // append 1, seq 1
			t.Fatal(err)
		}
		entered2, go2, sent3 := make(chan struct{}), make(chan struct{}), make(chan struct{})
		g.mu.Lock()
		g.before[2] = func() { close(entered2); <-go2 }
		g.before[3] = func() { close(sent3) }
		g.hold[2] = sent3
		g.mu.Unlock()
		a := registerAsync(t, old, client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
		<-entered2 // group 1 decided on seq 1, not sent yet
		b := registerAsync(t, old, client.RegisterRequest{Incarnation: "b", Endpoint: "10.0.0.2:1"})
		queued(t, old.leaderSession, 1)
		g.pause(2)
		nl := newTestLeader(t, "meta-2", base, clk, 2)
		if err := nl.startTerm(ctx); err != nil { // term.started at seq 2
			t.Fatal(err)
		}
		close(go2)
		<-sent3 // group 2 sent, chained to group 1, expected last seq 2
		// The old projection is still at seq 1, and group 2 was decided: only
		// now may the old leader learn of the new term.
		g.resume()
		for i, ch := range []<-chan client.Reply{a, b} {
			if rep := reply(t, ch); rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
				t.Errorf("caller %d: %+v, want a not_leader error", i, rep)
			}
		}
		select {
		case why := <-old.lost:
			t.Logf("stepped down: %s", why)
		case <-ctx.Done():
			t.Fatal("the deposed leader did not step down")
		}
		if got, want := logTerms(t, base), "[1:term.started@1 2:term.started@2]"; got != want {
			t.Fatalf("log %s, want %s: something the deposed leader decided landed after term.started", got, want)
		}
	})
}

// twoGroupsInFlight starts tl's term and registers "a" and then "b": a's
// group (seq 2) waits on entry until go2 is closed, its ack is held until
// seq 3 (b's group) is sent, which closes sent3, and with loseFirst its ack
// is lost. It returns once b is queued behind a's group.
func twoGroupsInFlight(t *testing.T, tl *testLeader, g *gateLog, loseFirst bool) (a, b <-chan client.Reply, go2, sent3 chan struct{}) {
	t.Helper()
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	entered2 := make(chan struct{})
	go2, sent3 = make(chan struct{}), make(chan struct{})
	g.mu.Lock()
	g.before[2] = func() { close(entered2); <-go2 }
	g.before[3] = func() { close(sent3) }
	g.hold[2] = sent3
	g.lose[2] = loseFirst
	g.mu.Unlock()
	a = registerAsync(t, tl, client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
	<-entered2
	b = registerAsync(t, tl, client.RegisterRequest{Incarnation: "b", Endpoint: "10.0.0.2:1"})
	queued(t, tl.leaderSession, 1)
	return a, b, go2, sent3
}

// The first of two groups in flight loses its ack: its outcome is unknown,
// so it is sent again with the same message ids once the group before it
// is known stored, and stored once; the second group, chained to it, landed
// and is answered too.
func TestPipelinedGroupLostAckRetriedOnce(t *testing.T) {
	pipelineLogs(t, func(t *testing.T, base events.Log) {
		g := newGateLog(base)
		tl := pipelining(newTestLeader(t, "meta-1", g, clock.NewManual(t0), 1, longAppends))
		a, b, go2, _ := twoGroupsInFlight(t, tl, g, true)
		close(go2)
		for i, ch := range []<-chan client.Reply{a, b} {
			if rep := reply(t, ch); rep.Error != nil || rep.ID != uint64(i+1) {
				t.Fatalf("caller %d: %+v, want id %d", i, rep, i+1)
			}
		}
		if got, want := logTerms(t, base), "[1:term.started@1 2:worker.registered@1 3:worker.registered@1]"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		// The retry did not discard anything: the next group is decided on
		// the scratch state, which is the projection.
		if rep := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "c", Endpoint: "10.0.0.3:1"}); rep.Error != nil || rep.ID != 3 {
			t.Fatalf("next register: %+v", rep)
		}
		v := tl.r.proj.View()
		if seq, hash := tl.scratch(); seq != v.Seq || hash != v.Hash() {
			t.Fatalf("scratch at seq %d differs from the projection at seq %d", seq, v.Seq)
		}
	})
}

// A group whose append is refused mid-way (a foreign event after its first
// event) fails every later group in flight: their callers get not_leader
// errors (none is answered a success for an event that is not stored) and
// the scratch state is discarded, so the next decision sees the log.
func TestPipelinedGroupRefusedFailsLaterGroups(t *testing.T) {
	pipelineLogs(t, func(t *testing.T, base events.Log) {
		clk := clock.NewManual(t0)
		g := newGateLog(base)
		tl := pipelining(newTestLeader(t, "meta-2", g, clk, 2, longAppends))
		a, b, go2, sent3 := twoGroupsInFlight(t, tl, g, false)
		// A deposed leader's late event (an older term, 0: the projection
		// drops it, the leader keeps its term) takes seq 2.
		g.pause(2)
		if _, err := base.Append(ctxT(t), 1, events.Event{Term: 0, Writer: "meta-1", At: t0, Data: events.WorkerRegistered{ID: 7, Incarnation: "x", Endpoint: "10.0.0.9:1", Kind: "compute"}}); err != nil {
			t.Fatal(err)
		}
		close(go2)
		<-sent3
		g.resume()
		for i, ch := range []<-chan client.Reply{a, b} {
			if rep := reply(t, ch); rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
				t.Errorf("caller %d: %+v, want a not_leader error", i, rep)
			}
		}
		if got, want := logTerms(t, base), "[1:term.started@1 2:worker.registered@0]"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		select {
		case why := <-tl.lost:
			t.Fatalf("stepped down without a higher term: %s", why)
		default:
		}
		// Still the leader: the next decision is made on the log as it is.
		rep := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "c", Endpoint: "10.0.0.3:1"})
		if rep.Error != nil || rep.ID != 1 {
			t.Fatalf("register after the refused groups: %+v, want id 1", rep)
		}
		if got, want := logTerms(t, base), "[1:term.started@1 2:worker.registered@0 3:worker.registered@1]"; got != want {
			t.Fatalf("log %s, want %s", got, want)
		}
		v := tl.r.proj.View()
		if got := workerList(v); v.Seq != 3 || got != "[1]" || v.Counters.StaleTerm != 1 {
			t.Fatalf("after: seq %d workers %s stale %d", v.Seq, got, v.Counters.StaleTerm)
		}
	})
}

// room bounds what is in flight: at most maxFlights groups, and, unless
// none is in flight, at least minPipelined mutations waiting and room for
// them (one event each) under maxFlightEvents.
func TestRoomBoundsFlights(t *testing.T) {
	c := &committer{minPipelined: 3}
	fly := func(n int) {
		c.flights = append(c.flights, &flight{evs: make([]events.Event, n)})
		c.flightEvents += n
	}
	reset := func(queued int) {
		c.flights, c.flightEvents, c.queue = nil, 0, make([]*mutation, queued)
	}
	reset(3)
	for range maxFlights - 1 {
		fly(1)
	}
	if !c.room() {
		t.Fatalf("group %d not taken with %d in flight", maxFlights, maxFlights-1)
	}
	fly(1)
	if c.room() {
		t.Fatalf("group %d taken with %d in flight", maxFlights+1, maxFlights)
	}
	reset(10)
	fly(maxFlightEvents - 10)
	if !c.room() {
		t.Fatal("a group that fits the events bound waits")
	}
	c.queue = make([]*mutation, 11)
	if c.room() {
		t.Fatalf("a group of 11 taken with %d events in flight", maxFlightEvents-10)
	}
	reset(2 * maxFlightEvents)
	if !c.room() {
		t.Fatal("a large queue waits with nothing in flight")
	}
	reset(3)
	fly(1)
	c.unsent = 1
	if c.room() {
		t.Fatal("a group taken while the sender still hands the one before it to the log")
	}
	c.unsent = 0
	reset(2)
	fly(1)
	if c.room() {
		t.Fatal("2 mutations taken while a group is in flight (minPipelined 3)")
	}
	c.queue = make([]*mutation, 3)
	if !c.room() {
		t.Fatal("3 mutations not taken while a group is in flight (minPipelined 3)")
	}
}
