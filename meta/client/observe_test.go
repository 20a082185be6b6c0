package client

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
)

// TestRunObservedAndOffset: Run reports each request's outcome to Observe
// (register, activate, then heartbeats, with the reply and the time taken),
// and the first heartbeat after an activation waits Heartbeat +
// HeartbeatOffset, the next ones Heartbeat.
func TestRunObservedAndOffset(t *testing.T) {
	_, nc := testkit.NATS(t)
	clk := clock.NewManual(time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	var beats atomic.Int64
	reply := func(rpc string) nats.MsgHandler {
		return func(m *nats.Msg) {
			b, _ := json.Marshal(Reply{ID: 7, Epoch: 9, Term: 3})
			if rpc == RPCHeartbeat && beats.Add(1) == 2 {
				b, _ = json.Marshal(Reply{Term: 4, Error: &RPCError{Code: CodeForbidden, Message: "not yours"}})
			}
			_ = m.Respond(b)
		}
	}
	for _, rpc := range []string{RPCRegister, RPCActivate, RPCHeartbeat} {
		sub, err := nc.Subscribe(RPCSubject("obs", rpc), reply(rpc))
		if err != nil {
			t.Fatal(err)
		}
		defer sub.Unsubscribe()
	}
	var mu sync.Mutex
	var calls []Call
	w, err := NewWorker(nc, WorkerConfig{Cluster: "obs", Incarnation: "i", Endpoint: "127.0.0.1:1", Clock: clk,
		Heartbeat: time.Second, HeartbeatOffset: 700 * time.Millisecond,
		Observe: func(c Call) { mu.Lock(); calls = append(calls, c); mu.Unlock() }})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- w.Run(context.Background()) }()
	testkit.Eventually(t, 5*time.Second, "activated, waiting for the first heartbeat", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 2 && clk.Waiters() == 1
	})
	clk.Advance(time.Second) // the offset is not over: no heartbeat yet
	mu.Lock()
	n := len(calls)
	mu.Unlock()
	if n != 2 || clk.Waiters() != 1 {
		t.Fatalf("after Heartbeat alone: %d calls, %d waiters; want the offset still running", n, clk.Waiters())
	}
	clk.Advance(700 * time.Millisecond)
	testkit.Eventually(t, 5*time.Second, "the first heartbeat answered, the next one waiting", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(calls) == 3 && clk.Waiters() == 1
	})
	clk.Advance(time.Second) // the next heartbeat waits Heartbeat alone
	if err := <-done; !errors.Is(err, ErrForbidden) {
		t.Fatalf("Run: %v, want the forbidden heartbeat", err)
	}
	if len(calls) != 4 {
		t.Fatalf("calls %+v", calls)
	}
	for i, want := range []string{RPCRegister, RPCActivate, RPCHeartbeat, RPCHeartbeat} {
		if calls[i].RPC != want {
			t.Fatalf("call %d is %s, want %s", i, calls[i].RPC, want)
		}
	}
	if c := calls[0]; c.Err != nil || c.Reply.ID != 7 || c.Reply.Epoch != 9 || c.Start.IsZero() {
		t.Fatalf("register observed as %+v", c)
	}
	if c := calls[2]; c.Err != nil || c.Reply.Term != 3 {
		t.Fatalf("first heartbeat observed as %+v", c)
	}
	if c := calls[3]; !errors.Is(c.Err, ErrForbidden) || c.Reply.Term != 4 || !c.Start.Equal(clk.Now()) {
		t.Fatalf("heartbeat observed as %+v (now %s)", c, clk.Now())
	}
}
