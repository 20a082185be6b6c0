package meta

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
)

// scriptedLease answers renewals as a script says (then fails them, as a
// lease bucket without a leader does), recording when each was asked.
type scriptedLease struct {
	Lease
	clk *clock.Manual

	mu     sync.Mutex
	script []error
	asked  []time.Time
}

func (s *scriptedLease) Renew(context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.asked = append(s.asked, s.clk.Now())
	if len(s.script) == 0 {
		return jetstream.ErrNoStreamResponse
	}
	err := s.script[0]
	s.script = s.script[1:]
	return err
}

func (s *scriptedLease) calls() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.asked...)
}

// A renewal that goes unanswered (the lease bucket's Raft group is electing
// a leader after a NATS node was lost) is asked again within the lease
// instead of ending the term; but nothing lets the leader act past
// lease*2/3 after its last stored renewal. The first renewal's first
// attempt goes unanswered and its retry succeeds (as a duplicate: the
// first attempt was stored), so the lease runs from the first attempt;
// every later renewal goes unanswered, and the term must end by
// first-attempt + lease*2/3, not by retry + lease*2/3.
func TestRenewalAskedAgainWithinTheLease(t *testing.T) {
	clk := clock.NewManual(t0)
	const lease = 3 * time.Second
	sl := &scriptedLease{clk: clk, script: []error{jetstream.ErrNoStreamResponse, nil}}
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) {
		sl.Lease = c.Lease
		c.Lease = sl
		c.LeaseTTL = lease
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer func() { cancel(); wg.Wait() }()
	wg.Go(func() { l.keeper.renewLoop(ctx) })
	wg.Go(func() { l.keeper.watchdog(ctx) })

	var lostAt time.Time
	var why string
	const step = 10 * time.Millisecond
	for lostAt.IsZero() {
		if clk.Now().Sub(t0) > 2*lease {
			t.Fatalf("still leading %s after the last stored renewal (limit %s); renewals asked at %v", clk.Now().Sub(t0), lease*2/3, sl.calls())
		}
		// Both loops wait on the clock again (or the term ended) before it moves.
		testkit.Eventually(t, 5*time.Second, "the renewal loop and the watchdog waiting", func() bool {
			select {
			case why = <-l.lost:
				lostAt = clk.Now()
				return true
			default:
			}
			return clk.Waiters() >= 2
		})
		if lostAt.IsZero() {
			clk.Advance(step)
		}
	}
	calls := sl.calls()
	if len(calls) < 3 {
		t.Fatalf("renewals asked at %v: want the unanswered first attempt, its retry, and the next renewal's attempts", calls)
	}
	first, retry := calls[0], calls[1]
	if first.Sub(t0) != lease/3 || retry.Sub(first) > 100*time.Millisecond {
		t.Fatalf("first renewal asked at +%s, its retry %s later: want +%s and a retry within 100ms", first.Sub(t0), retry.Sub(first), lease/3)
	}
	limit := first.Add(lease * 2 / 3)
	if lostAt.After(limit.Add(step)) {
		t.Fatalf("the term ended at +%s (%s), %s after the limit: the lease runs from the first attempt of the last stored renewal (+%s) and ends lease*2/3 = %s later",
			lostAt.Sub(t0), why, lostAt.Sub(limit), first.Sub(t0), lease*2/3)
	}
	if lostAt.Before(retry.Add(lease / 3)) {
		t.Fatalf("the term ended at +%s (%s): before the next renewal was even due; the unanswered attempt should have been asked again", lostAt.Sub(t0), why)
	}
	t.Logf("renewals asked at %v; term ended at +%s: %s", calls, lostAt.Sub(t0), why)
}

// A renewal the server refuses for its revision (another replica holds
// the lease) ends the term at once: it is not asked again.
func TestRenewalLostIsNotAskedAgain(t *testing.T) {
	clk := clock.NewManual(t0)
	sl := &scriptedLease{clk: clk, script: []error{ErrLeaseLost}}
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) {
		sl.Lease = c.Lease
		c.Lease = sl
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.keeper.renewLoop(ctx) }()
	defer func() { cancel(); <-done }()
	testkit.Eventually(t, 5*time.Second, "the renewal loop waiting", func() bool { return clk.Waiters() >= 1 })
	clk.Advance(time.Second)
	select {
	case why := <-l.lost:
		t.Logf("term ended: %s", why)
	case <-time.After(5 * time.Second):
		t.Fatal("a lost lease did not end the term")
	}
	if n := len(sl.calls()); n != 1 {
		t.Fatalf("%d renewals asked, want 1", n)
	}
}

// hangingLease is a lease bucket whose renewal never answers and ignores
// its context (a client stuck behind a reconnect dial holds its lock that
// way, whatever the context: see FACTS.md): only the watchdog can end the
// term.
type hangingLease struct {
	Lease
	entered chan struct{} // closed when the first renewal is asked
	release chan struct{} // closed by the test: the renewal returns
	once    sync.Once
}

func (h *hangingLease) Renew(context.Context) error {
	h.once.Do(func() { close(h.entered) })
	<-h.release
	return ErrLeaseLost
}

// The watchdog bites whatever the renewal call is doing: a renewal that
// hangs past its own deadline (lease*2/3 after the last stored renewal,
// which its bounded attempts cannot enforce while the call does not
// return) does not keep the leader acting; the term ends within one
// watchdog tick (lease/12) of the limit, for the watchdog's reason.
func TestWatchdogEndsTermWhileRenewalHangs(t *testing.T) {
	clk := clock.NewManual(t0)
	const lease = 3 * time.Second
	hl := &hangingLease{entered: make(chan struct{}), release: make(chan struct{})}
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) {
		hl.Lease = c.Lease
		c.Lease = hl
		c.LeaseTTL = lease
	})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); l.keeper.keep(ctx) }()
	defer func() { cancel(); close(hl.release); <-done }()

	limit := t0.Add(lease * 2 / 3) // the renewal taken at t0 is the last stored one
	const step = 10 * time.Millisecond
	var lostAt time.Time
	var why string
	for lostAt.IsZero() {
		if clk.Now().Sub(t0) > 2*lease {
			t.Fatalf("still leading at +%s with the renewal hanging since +%s (limit +%s)", clk.Now().Sub(t0), lease/3, lease*2/3)
		}
		testkit.Eventually(t, 5*time.Second, "the watchdog waiting on the clock (and the renewal loop, until it hangs in Renew)", func() bool {
			select {
			case why = <-l.lost:
				lostAt = clk.Now()
				return true
			default:
			}
			select {
			case <-hl.entered:
				return clk.Waiters() >= 1 // the watchdog; the renewal loop is in Renew
			default:
				return clk.Waiters() >= 2
			}
		})
		if lostAt.IsZero() {
			clk.Advance(step)
		}
	}
	if !lostAt.After(limit) || lostAt.After(limit.Add(lease/12+step)) {
		t.Fatalf("the term ended at +%s (%s): want after the limit +%s and within a watchdog tick (%s) of it", lostAt.Sub(t0), why, limit.Sub(t0), lease/12)
	}
	if !strings.Contains(why, "no lease renewal for") {
		t.Fatalf("the term ended for %q, want the watchdog's reason", why)
	}
	if err := l.keeper.leaseFresh(); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("leaseFresh after the limit: %v, want ErrLeaseLost", err)
	}
	t.Logf("term ended at +%s: %s", lostAt.Sub(t0), why)
}
