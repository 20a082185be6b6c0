package meta

import (
	"context"
	"fmt"
	"net"
	"sync"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
)

// pipeAgents is a ControlDialer whose workers are in-memory agents that ack
// every barrier; it counts dials per endpoint. Close joins every agent.
type pipeAgents struct {
	mu    sync.Mutex
	dials map[string]int
	conns []net.Conn
	wg    sync.WaitGroup
}

func (p *pipeAgents) dial(_ context.Context, endpoint string) (ControlConn, error) {
	leader, worker := net.Pipe()
	p.mu.Lock()
	p.dials[endpoint]++
	p.conns = append(p.conns, worker)
	p.mu.Unlock()
	p.wg.Go(func() {
		sc := client.NewControlScanner(worker)
		for sc.Scan() {
			m, err := client.DecodeControl(sc.Bytes())
			if err == nil && m.Type == client.MsgBarrier {
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
	eventually(t, what, func() bool {
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
		refs[i] = tl.register(ctxT(t), client.RegisterRequest{Incarnation: fmt.Sprint("w", i), Endpoint: ep(i)})
	}
	ctx, cancel := context.WithCancel(context.Background())
	var loop sync.WaitGroup
	loop.Go(func() { tl.controlLoop(ctx) })
	defer func() { cancel(); loop.Wait() }()

	advancing(t, clk, "initial recovery", func() bool {
		r := tl.recovery()
		return r.State == RecoveryComplete && len(r.Sessions) == n && len(r.Waiting) == 0
	})
	// Replace worker 0 at its endpoint, remove worker 1.
	b := tl.register(ctxT(t), client.RegisterRequest{Incarnation: "w0-again", Endpoint: ep(0)})
	if rep := tl.deregister(ctxT(t), client.WorkerRef{ID: refs[1].ID, Epoch: refs[1].Epoch, Incarnation: "w1"}); rep.Error != nil {
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
