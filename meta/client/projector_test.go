package client_test

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// AwaitSeq returns once its seq is folded (and not before), for many
// waiters at once, and a waiter that gives up is forgotten.
func TestAwaitSeq(t *testing.T) {
	log := events.NewMemLog()
	p := client.NewProjector(log, zerolog.Nop(), nil)
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
