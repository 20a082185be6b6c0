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
