package meta

import (
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestServerLeavingMovesOnceAppendsSettle: a replica whose NATS server goes
// into lame-duck mode moves as soon as its appends in flight are settled,
// not after the whole leaveDrain (every append was refused for 300 ms of
// every graceful stop), and waits out leaveDrain, no longer, for an
// append that stays in flight. The clock is manual and never advanced
// but where said: a move that waited for time would never come.
func TestServerLeavingMovesOnceAppendsSettle(t *testing.T) {
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { srv.Shutdown() })
	nc, err := nats.Connect(srv.ClientURL(), nats.MaxReconnects(-1), nats.ReconnectWait(10*time.Millisecond))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	clk := clock.NewManual(t0)
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) { c.NC = nc })
	if err := l.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	r := l.r
	r.mu.Lock()
	r.leader = l.leaderSession
	r.mu.Unlock()
	leave := func() chan struct{} {
		done := make(chan struct{})
		go func() { defer close(done); r.ServerLeaving(nc) }()
		return done
	}
	waitDone := func(done chan struct{}, what string) {
		t.Helper()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Fatalf("ServerLeaving did not return: %s", what)
		}
	}

	// Nothing in flight: it moves without the clock moving at all.
	waitDone(leave(), "nothing was in flight, yet it waited for the clock")

	// A group in flight: no move until it settles.
	stuck := &flight{}
	l.loop.do(ctxT(t), func() { l.commit.flights = append(l.commit.flights, stuck) })
	base := clk.Waiters()
	done := leave()
	testkit.Eventually(t, 10*time.Second, "the drain's bound and a poll", func() bool { return clk.Waiters() >= base+2 })
	if !r.leaving.Load() {
		t.Fatal("appends are not refused while the drain waits")
	}
	select {
	case <-done:
		t.Fatal("moved with a group in flight")
	default:
	}
	l.loop.do(ctxT(t), func() { l.commit.flights = l.commit.flights[:0] })
	clk.Advance(leavePoll)
	waitDone(done, "the group settled, yet it kept waiting")

	// A group that stays in flight: leaveDrain, then the move.
	l.loop.do(ctxT(t), func() { l.commit.flights = append(l.commit.flights, stuck) })
	base = clk.Waiters()
	done = leave()
	testkit.Eventually(t, 10*time.Second, "the drain's bound and a poll", func() bool { return clk.Waiters() >= base+2 })
	clk.Advance(leaveDrain)
	waitDone(done, "leaveDrain passed, yet it kept waiting")
	if r.leaving.Load() {
		t.Fatal("still refusing appends after the move began")
	}
	l.loop.do(ctxT(t), func() { l.commit.flights = l.commit.flights[:0] })
}
