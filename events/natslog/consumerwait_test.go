package natslog_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/events/natslog/natslogtest"
	"github.com/termlog/termlog/internal/testkit"
)

// ConsumerWait says how long a reader has been waiting for its consumer:
// a long Read (more records than a reader may fetch by get) whose creates
// go unanswered (here the reader's user may not create consumers, so the
// server drops each create and nothing answers, as when the JetStream meta
// leader is lost) shows a wait that grows; a read that ends shows none.
func TestConsumerWaitWhileCreatesGoUnanswered(t *testing.T) {
	rnc := natslogtest.StreamDenyingConsumerCreates(t, "cw", 1500) // more than a Read may fetch by get
	reader := open(t, rnc, natslog.Config{Cluster: "cw", Bind: true})
	if w := reader.ConsumerWait(); w != 0 {
		t.Fatalf("ConsumerWait %s before any read", w)
	}
	ctx, cancel := context.WithCancel(t.Context())
	done := make(chan error, 1)
	go func() { done <- reader.Read(ctx, 1, func(events.Record) error { return nil }) }()
	var seen time.Duration
	testkit.Eventually(t, 10*time.Second, "the read waiting 400ms for its consumer", func() bool {
		seen = reader.ConsumerWait()
		return seen >= 400*time.Millisecond
	})
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("the read ended with %v, want it canceled (no consumer can be made)", err)
	}
	if w := reader.ConsumerWait(); w != 0 {
		t.Fatalf("ConsumerWait %s after the read ended", w)
	}
	t.Logf("a reader denied its consumer: ConsumerWait reached %s", seen.Round(time.Millisecond))
}
