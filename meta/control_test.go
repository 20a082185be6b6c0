package meta

import (
	"context"
	"fmt"
	"maps"
	"net"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/client"
)

// pipeAgents is a ControlDialer whose workers are in-memory agents that ack
// every barrier; it counts dials per endpoint. An agent at an endpoint in
// hold acks a barrier only after a receive from its channel. Close joins
// every agent (after closing the holds).
type pipeAgents struct {
	mu    sync.Mutex
	dials map[string]int
	hold  map[string]chan struct{}
	conns []net.Conn
	wg    sync.WaitGroup
}

func (p *pipeAgents) dial(_ context.Context, endpoint string) (ControlConn, error) {
	leader, worker := net.Pipe()
	p.mu.Lock()
	p.dials[endpoint]++
	p.conns = append(p.conns, worker)
	hold := p.hold[endpoint]
	p.mu.Unlock()
	p.wg.Go(func() {
		sc := client.NewControlScanner(worker)
		for sc.Scan() {
			m, err := client.DecodeControl(sc.Bytes())
			if err == nil && m.Type == client.MsgBarrier {
				if hold != nil {
					<-hold
				}
				if client.WriteControl(worker, client.ControlMsg{Type: client.MsgAck, Barrier: m.Barrier}) != nil {
					return
				}
			}
		}
	})
	return leader, nil
}

func (p *pipeAgents) dialsTo(endpoint string) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.dials[endpoint]
}

func (p *pipeAgents) close() {
	p.mu.Lock()
	for _, h := range p.hold {
		close(h)
	}
	for _, c := range p.conns {
		c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// advancing polls cond with eventually, advancing the manual clock (the
// loop's debounce and retry timers) before each look.
func advancing(t *testing.T, clk *clock.Manual, what string, cond func() bool) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, what, func() bool {
		clk.Advance(controlDebounce)
		return cond()
	})
}

// The control loop opens one session per endpoint and completes the
// recovery; afterwards it reacts to the workers that changed only: a new
// worker at an old endpoint replaces that session alone, a removed worker's
// session closes, and nothing else is dialled again.
func TestControlLoopReactsToChangedWorkers(t *testing.T) {
	clk := clock.NewManual(t0)
	agents := &pipeAgents{dials: map[string]int{}}
	defer agents.close()
	tl := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) { c.ControlDialer = agents.dial })
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	const n = 40
	ep := func(i int) string { return fmt.Sprintf("10.0.0.%d:7000", i) }
	refs := map[int]client.Reply{}
	for i := range n {
		refs[i] = tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: fmt.Sprint("w", i), Endpoint: ep(i)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { tl.duties.recovery.controlLoop(ctx) })
	defer func() { cancel(); loop.Wait() }()

	advancing(t, clk, "initial recovery", func() bool {
		r := tl.recovery()
		return r.State == RecoveryComplete && len(r.Sessions) == n && len(r.Waiting) == 0
	})
	// Replace worker 0 at its endpoint, remove worker 1.
	b := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "w0-again", Endpoint: ep(0)})
	if rep := tl.duties.workers.deregister(ctxT(t), client.WorkerRef{ID: refs[1].ID, Epoch: refs[1].Epoch, Incarnation: "w1"}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	advancing(t, clk, "the replacement's session and the removal", func() bool {
		r := tl.recovery()
		_, has1 := r.Sessions[ep(1)]
		return r.Sessions[ep(0)] == b.ID && !has1 && len(r.Sessions) == n-1 && len(r.Waiting) == 0
	})
	if got := agents.dialsTo(ep(0)); got != 2 {
		t.Errorf("endpoint 0 dialled %d times, want 2 (once per worker)", got)
	}
	for i := 2; i < n; i++ {
		if got := agents.dialsTo(ep(i)); got != 1 {
			t.Errorf("unchanged endpoint %d dialled %d times, want 1", i, got)
		}
	}
	if r := tl.recovery(); r.Rounds < 2 || r.Attempts != n+1 {
		t.Errorf("rounds %d attempts %d, want >= 2 rounds and %d barrier injections", r.Rounds, r.Attempts, n+1)
	}
}

// Barrier recovery is complete only when every worker active in the
// projection at the seq it reports has acked. A worker registered while the
// others ack (its reconcile still debounced) keeps the recovery open until it
// has a session and has acked too; its ack then completes the recovery at
// once, at the seq the session was opened on.
func TestRecoveryWaitsForWorkerJoinedMeanwhile(t *testing.T) {
	clk := clock.NewManual(t0)
	epA, epB := "10.0.0.1:7000", "10.0.0.2:7000"
	agents := &pipeAgents{dials: map[string]int{}, hold: map[string]chan struct{}{epA: make(chan struct{}), epB: make(chan struct{})}}
	defer agents.close()
	// No retry timer: reconciles run only when the debounce fires.
	tl := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) {
		c.ControlDialer, c.RecoveryRetry = agents.dial, time.Hour
	})
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "a", Endpoint: epA})
	if a.Error != nil {
		t.Fatal(a.Error)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { tl.duties.recovery.controlLoop(ctx) })
	defer func() { cancel(); loop.Wait() }()
	testkit.Eventually(t, 10*time.Second, "a's session", func() bool { return tl.recovery().Sessions[epA] == a.ID })

	b := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "b", Endpoint: epB})
	if b.Error != nil {
		t.Fatal(b.Error)
	}
	v := tl.r.proj.View()
	if _, ok := v.Worker(b.ID); !ok {
		t.Fatalf("worker %d not active after its registration", b.ID)
	}
	seqB := v.Seq
	// a acks; the clock stands still, so b's reconcile stays debounced.
	agents.hold[epA] <- struct{}{}
	testkit.Eventually(t, 10*time.Second, "a's ack handled", func() bool { return len(tl.recovery().Waiting) == 0 })
	if r := tl.recovery(); r.State != RecoveryRecovering {
		t.Fatalf("recovery %s at seq %d with sessions %v; worker %d, active since seq %d, has no session and never acked",
			r.State, r.Seq, r.Sessions, b.ID, seqB)
	}
	advancing(t, clk, "b's session", func() bool { return tl.recovery().Sessions[epB] == b.ID })
	if r := tl.recovery(); r.State != RecoveryRecovering || !slices.Equal(r.Waiting, []uint64{b.ID}) {
		t.Fatalf("after b's session opened: state %s waiting %v, want recovering on [%d]", r.State, r.Waiting, b.ID)
	}
	// b's ack completes the recovery without another reconcile: the
	// projection is still at the seq b's session was opened on.
	rounds := tl.recovery().Rounds
	agents.hold[epB] <- struct{}{}
	testkit.Eventually(t, 10*time.Second, "recovery complete", func() bool { return tl.recovery().State == RecoveryComplete })
	r := tl.recovery()
	want := map[string]uint64{epA: a.ID, epB: b.ID}
	if r.Seq != seqB || !maps.Equal(r.Sessions, want) || r.Waiting != nil || r.Rounds != rounds {
		t.Fatalf("complete at seq %d sessions %v waiting %v rounds %d; want seq %d sessions %v, nobody waiting, rounds %d",
			r.Seq, r.Sessions, r.Waiting, r.Rounds, seqB, want, rounds)
	}
}

// A worker that leaves while the recovery waits on it leaves the waiting set
// at the next reconcile: the last ack of the others, arriving after the
// projection moved on, completes nothing itself; the reconcile completes the
// recovery at the seq that no longer has the worker.
func TestRecoveryCompletesWithoutWorkerLeftMeanwhile(t *testing.T) {
	clk := clock.NewManual(t0)
	epA, epB := "10.0.0.1:7000", "10.0.0.2:7000"
	agents := &pipeAgents{dials: map[string]int{}, hold: map[string]chan struct{}{epA: make(chan struct{}), epB: make(chan struct{})}}
	defer agents.close()
	tl := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) { c.ControlDialer = agents.dial })
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "a", Endpoint: epA})
	b := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "b", Endpoint: epB})
	if a.Error != nil || b.Error != nil {
		t.Fatal(a.Error, b.Error)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { tl.duties.recovery.controlLoop(ctx) })
	defer func() { cancel(); loop.Wait() }()
	testkit.Eventually(t, 10*time.Second, "both sessions", func() bool { return len(tl.recovery().Sessions) == 2 })

	if rep := tl.duties.workers.deregister(ctxT(t), client.WorkerRef{ID: b.ID, Epoch: b.Epoch, Incarnation: "b"}); rep.Error != nil {
		t.Fatal(rep.Error)
	}
	seq := tl.r.proj.Seq()
	agents.hold[epA] <- struct{}{}
	testkit.Eventually(t, 10*time.Second, "a's ack handled", func() bool { return !slices.Contains(tl.recovery().Waiting, a.ID) })
	if r := tl.recovery(); r.State != RecoveryRecovering || !slices.Equal(r.Waiting, []uint64{b.ID}) {
		t.Fatalf("before the reconcile: state %s waiting %v, want recovering on [%d]", r.State, r.Waiting, b.ID)
	}
	advancing(t, clk, "recovery complete", func() bool { return tl.recovery().State == RecoveryComplete })
	r := tl.recovery()
	want := map[string]uint64{epA: a.ID}
	if r.Seq != seq || !maps.Equal(r.Sessions, want) || r.Waiting != nil {
		t.Fatalf("complete at seq %d sessions %v waiting %v; want seq %d sessions %v, nobody waiting", r.Seq, r.Sessions, r.Waiting, seq, want)
	}
}

// An ack completes a worker's part of the recovery only if it names this
// term's barrier: an ack of another barrier leaves the worker waiting.
func TestControlAckMustNameTheBarrier(t *testing.T) {
	clk := clock.NewManual(t0)
	tl := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1)
	c := &controller{rd: newDuties(tl.leaderSession).recovery, barrier: 5, sessions: map[string]*session{}}
	s := &session{endpoint: "10.0.0.1:7000", id: 1, epoch: 2}
	c.sessions[s.endpoint] = s
	tl.loop.do(ctxT(t), func() {
		tl.recov.rec = Recovery{Term: 5, State: RecoveryRecovering, Barrier: 5, Sessions: map[string]uint64{s.endpoint: 1}}
		tl.recov.waiting = map[uint64]struct{}{1: {}, 2: {}} // worker 2 keeps the recovery open
	})
	for _, wrong := range []uint64{4, 6, 1 << 63} {
		c.event(sessionEvent{s: s, barrier: wrong})
		if r := tl.recovery(); s.acked || !slices.Contains(r.Waiting, 1) {
			t.Fatalf("an ack of barrier %d (ours 5) counted: acked %v, waiting %v", wrong, s.acked, r.Waiting)
		}
	}
	c.event(sessionEvent{s: s, barrier: 5})
	if r := tl.recovery(); !s.acked || !slices.Equal(r.Waiting, []uint64{2}) {
		t.Fatalf("the ack of barrier 5: acked %v, waiting %v; want worker 1 done", s.acked, r.Waiting)
	}
}
