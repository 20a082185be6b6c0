package view_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/view"
)

func appendTerm(t *testing.T, log *events.MemLog, term uint64) uint64 {
	t.Helper()
	body, err := events.Encode(events.Event{Term: term, Writer: "meta-1", Data: events.TermStarted{Term: term, Leader: "meta-1"}})
	if err != nil {
		t.Fatal(err)
	}
	return log.AppendRaw(body)
}

// runProjector runs p until the test ends.
func runProjector(t *testing.T, p *view.Projector) {
	_, stop := startProjector(context.Background(), p)
	t.Cleanup(stop)
}

// startProjector runs p under a child of parent until stop, which cancels
// and joins it; ctx is for the calls made on p meanwhile.
func startProjector(parent context.Context, p *view.Projector) (ctx context.Context, stop func()) {
	ctx, cancel := context.WithCancel(parent)
	var wg sync.WaitGroup
	wg.Go(func() { _ = p.Run(ctx) })
	return ctx, func() { cancel(); wg.Wait() }
}

// TestProjectorAwaitSeq: AwaitSeq returns once its seq is folded (not
// before), at once for a seq already folded, and with ctx's error when ctx
// ends first; Changed is closed by the next event.
func TestProjectorAwaitSeq(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // after runProjector's cleanup
	log := events.NewMemLog()
	appendTerm(t, log, 1)
	appendTerm(t, log, 2)
	p := view.NewProjector(log, zerolog.Nop(), nil)
	runProjector(t, p)
	ctx := context.Background()
	if err := p.AwaitSeq(ctx, 2); err != nil {
		t.Fatal(err)
	}
	if err := p.AwaitSeq(ctx, 1); err != nil {
		t.Fatal(err)
	}

	done := make(chan error, 1)
	early := make(chan error, 1)
	ectx, ecancel := context.WithCancel(ctx)
	defer ecancel()
	go func() { done <- p.AwaitSeq(ctx, 4) }()
	go func() { early <- p.AwaitSeq(ectx, 4) }()
	changed := p.Changed()
	appendTerm(t, log, 3)
	<-changed
	testkit.Eventually(t, 10*time.Second, "seq 3", func() bool { return p.Seq() == 3 })
	// Released waiters return nil even when their context ends later; this
	// one must still be waiting.
	ecancel()
	if err := <-early; !errors.Is(err, context.Canceled) {
		t.Fatalf("AwaitSeq(4) at seq 3: %v, want %v", err, context.Canceled)
	}
	appendTerm(t, log, 4)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitSeq(4) not released at seq 4")
	}

	cctx, cancel := context.WithCancel(ctx)
	go func() { done <- p.AwaitSeq(cctx, 100) }()
	cancel()
	select {
	case err := <-done:
		if !errors.Is(err, context.Canceled) {
			t.Fatalf("AwaitSeq after cancel: %v", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("AwaitSeq ignored its context")
	}
	// The cancelled waiter is gone; a later one is released as usual.
	go func() { done <- p.AwaitSeq(ctx, 5) }()
	appendTerm(t, log, 5)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
}

// AwaitSeq returns once its seq is folded (and not before), for many
// waiters at once, and a waiter that gives up is forgotten.
func TestAwaitSeq(t *testing.T) {
	log := events.NewMemLog()
	p := view.NewProjector(log, zerolog.Nop(), nil)
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	var run sync.WaitGroup
	pctx, stop := context.WithCancel(ctx)
	run.Go(func() { _ = p.Run(pctx) })
	defer func() { stop(); run.Wait() }()

	append1 := func(n uint64) {
		t.Helper()
		ev := events.Event{Term: 1, Writer: "meta-1", At: time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC),
			Data: events.TermStarted{Term: n, Leader: "meta-1"}}
		if _, err := log.Append(ctx, n-1, ev); err != nil {
			t.Fatal(err)
		}
	}
	const waiters = 50
	type result struct {
		want, seen uint64
		err        error
	}
	results := make(chan result, waiters)
	var wg sync.WaitGroup
	for i := range waiters {
		want := uint64(i%5 + 1) // seqs 1..5
		wg.Go(func() {
			err := p.AwaitSeq(ctx, want)
			results <- result{want, p.Seq(), err}
		})
	}
	// One waiter gives up before its seq comes.
	gctx, giveUp := context.WithCancel(ctx)
	gave := make(chan error, 1)
	go func() { gave <- p.AwaitSeq(gctx, 100) }()
	for n := uint64(1); n <= 5; n++ {
		append1(n)
	}
	wg.Wait()
	close(results)
	for r := range results {
		if r.err != nil || r.seen < r.want {
			t.Errorf("AwaitSeq(%d) = %v with the state at seq %d", r.want, r.err, r.seen)
		}
	}
	giveUp()
	if err := <-gave; !errors.Is(err, context.Canceled) {
		t.Fatalf("AwaitSeq of an unreached seq after cancel = %v, want context.Canceled", err)
	}
	if err := p.AwaitSeq(ctx, 5); err != nil {
		t.Fatalf("AwaitSeq of a folded seq = %v", err)
	}
}

// losingLog is a MemLog whose first Watch session goes silent after it
// has delivered lose records, as a JetStream reader whose consumer left
// with its server: nothing is delivered and nothing is said until its
// context ends. Later sessions deliver as usual.
type losingLog struct {
	*events.MemLog
	lose     int
	mu       sync.Mutex
	sessions int
}

func (l *losingLog) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	l.mu.Lock()
	l.sessions++
	first := l.sessions == 1
	l.mu.Unlock()
	if !first {
		return l.MemLog.Watch(ctx, from, fn)
	}
	n := 0
	wctx, stop := context.WithCancel(ctx)
	defer stop()
	err := l.MemLog.Watch(wctx, from, func(r events.Record) error {
		if n == l.lose {
			stop() // silent from here
			return nil
		}
		n++
		return fn(r)
	})
	<-ctx.Done()
	_ = err
	return ctx.Err()
}

func (l *losingLog) Sessions() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.sessions
}

// TestAwaitStoredReadsAgainWhenTheSessionIsLost: a reading session that
// goes silent while the log holds the seq awaited is ended after
// StoredStall without progress, and a new one delivers it; AwaitSeq (a seq
// not known to be stored) and a fold that moves are left alone.
func TestAwaitStoredReadsAgainWhenTheSessionIsLost(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	clk := clock.NewManual(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	log := &losingLog{MemLog: events.NewMemLog(), lose: 2}
	p := view.NewProjector(log, zerolog.Nop(), clk)
	ctx, stop := startProjector(t.Context(), p)
	defer stop()
	for term := uint64(1); term <= 3; term++ {
		appendTerm(t, log.MemLog, term)
	}
	testkit.Eventually(t, 10*time.Second, "seq 2 folded", func() bool { return p.Seq() == 2 })

	done := make(chan error, 1)
	go func() { done <- p.AwaitStored(ctx, 3) }()
	testkit.Eventually(t, 10*time.Second, "AwaitStored waits on the clock", func() bool { return clk.Waiters() > 0 })
	select {
	case err := <-done:
		t.Fatalf("AwaitStored(3) returned %v at seq %d before any stall", err, p.Seq())
	default:
	}
	clk.Advance(view.StoredStall)
	select {
	case err := <-done:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("AwaitStored(3) still waiting at seq %d after a stall of %s (%d sessions): the lost session was not ended", p.Seq(), view.StoredStall, log.Sessions())
	}
	if n := log.Sessions(); n != 2 {
		t.Fatalf("%d reading sessions, want 2 (one ended for the stall)", n)
	}
	// The new session delivers as usual: no more sessions for a seq that
	// comes later, however long the clock runs.
	go func() { done <- p.AwaitSeq(ctx, 4) }()
	clk.Advance(10 * view.StoredStall)
	appendTerm(t, log.MemLog, 4)
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := log.Sessions(); n != 2 {
		t.Fatalf("%d reading sessions after a healthy wait, want 2", n)
	}
}

// TestAwaitStoredLeavesAMovingFoldAlone: a fold behind the seq awaited but
// moving at every stall check (a burst) keeps its reading session.
func TestAwaitStoredLeavesAMovingFoldAlone(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	clk := clock.NewManual(time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC))
	log := &losingLog{MemLog: events.NewMemLog(), lose: 1 << 30}
	p := view.NewProjector(log, zerolog.Nop(), clk)
	ctx, stop := startProjector(t.Context(), p)
	defer stop()
	appendTerm(t, log.MemLog, 1)
	testkit.Eventually(t, 10*time.Second, "seq 1 folded", func() bool { return p.Seq() == 1 })
	done := make(chan error, 1)
	go func() { done <- p.AwaitStored(ctx, 6) }() // stored soon: the test appends it
	for term := uint64(2); term <= 6; term++ {
		testkit.Eventually(t, 10*time.Second, "AwaitStored waits on the clock", func() bool { return clk.Waiters() > 0 })
		appendTerm(t, log.MemLog, term)
		testkit.Eventually(t, 10*time.Second, "folded", func() bool { return p.Seq() == term })
		if term < 6 {
			clk.Advance(view.StoredStall)
		}
	}
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if n := log.Sessions(); n != 1 {
		t.Fatalf("%d reading sessions, want 1: a moving fold was read again", n)
	}
}
