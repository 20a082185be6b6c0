package client

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
)

// TestAnsweredWithin: the worker's server probe holds while meta answered
// within d (a not-leader answer too) and fails after, counting from the
// probe's creation before the first reply.
func TestAnsweredWithin(t *testing.T) {
	_, nc := testkit.NATS(t)
	clk := clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	w, err := NewWorker(nc, WorkerConfig{Cluster: "probe", Incarnation: "i", Endpoint: "127.0.0.1:1", Clock: clk, RequestTimeout: time.Second})
	if err != nil {
		t.Fatal(err)
	}
	probe := w.AnsweredWithin(3 * time.Second)
	ctx := context.Background()
	if err := probe(ctx); err != nil {
		t.Fatalf("fresh probe: %v", err)
	}
	clk.Advance(4 * time.Second)
	if err := probe(ctx); !errors.Is(err, ErrNoReply) {
		t.Fatalf("4s without a reply: %v, want ErrNoReply", err)
	}
	sub, err := nc.Subscribe(RPCSubject("probe", RPCHeartbeat), func(m *nats.Msg) {
		_ = m.Respond([]byte(`{"error":{"code":"not_leader","message":"not the leader"}}`))
	})
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()
	hctx, cancel := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- w.Heartbeat(hctx) }() // not-leader answers are retried until cancelled
	testkit.Eventually(t, 5*time.Second, "the not-leader answer counts", func() bool { return probe(ctx) == nil })
	cancel()
	<-done
}
