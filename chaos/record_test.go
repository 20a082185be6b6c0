package chaos

import (
	"testing"
	"time"

	"github.com/termlog/termlog/chaos/history"
)

// Reset waits for the operations in flight: a new schedule's history
// never misses an operation that was in flight when it began, and never
// holds a return without its invocation.
func TestOpLogResetWaitsForOperationsInFlight(t *testing.T) {
	var l OpLog
	ret := l.Invoke(Op{Client: "probe-1", Kind: OpHeartbeat, ID: 1, Epoch: 2})
	if ops := l.Ops(); len(ops) != 1 || ops[0].Done {
		t.Fatalf("in flight: %+v", ops)
	}
	reset := make(chan struct{})
	go func() {
		l.Reset()
		close(reset)
	}()
	select {
	case <-reset:
		t.Fatal("Reset returned while an operation was in flight")
	case <-time.After(50 * time.Millisecond): // long enough for a Reset that does not wait to return
	}
	ret(Op{Client: "probe-1", Kind: OpHeartbeat, ID: 1, Epoch: 2, Outcome: OutcomeOK})
	select {
	case <-reset:
	case <-time.After(10 * time.Second):
		t.Fatal("Reset did not return once the operation returned")
	}
	if ops := l.Ops(); len(ops) != 0 {
		t.Fatalf("after Reset: %+v", ops)
	}
	ret(Op{Outcome: "again"}) // a second return counts for nothing
	if ops := l.Ops(); len(ops) != 0 {
		t.Fatalf("a second return recorded: %+v", ops)
	}
}

func TestToHistory(t *testing.T) {
	var l OpLog
	r1 := l.Invoke(Op{Client: "probe-1", Kind: OpRegister, Endpoint: "127.0.0.1:1", Incarnation: "i1"})
	r1(Op{Client: "probe-1", Kind: OpRegister, Endpoint: "127.0.0.1:1", Incarnation: "i1", Outcome: OutcomeOK, ReplyID: 4, ReplyEpoch: 9})
	r2 := l.Invoke(Op{Client: "probe-2", Kind: OpRegister, Endpoint: "127.0.0.1:2", Incarnation: "i2"})
	r2(Op{Client: "probe-2", Kind: OpRegister, Endpoint: "127.0.0.1:2", Incarnation: "i2", Outcome: "no_responders"})
	_ = l.Invoke(Op{Client: "probe-1", Kind: OpDeregister, ID: 4, Epoch: 9}) // pending
	h := ToHistory(l.Ops())
	if len(h) != 2 {
		t.Fatalf("want the registration and the pending deregistration (the refused one left out), got %+v", h)
	}
	if h[0].Input.Kind != history.Register || h[0].Output.Outcome != history.OK || h[0].Output.ID != 4 || h[0].Output.Epoch != 9 || !h[0].Done || h[0].Call != 0 || h[0].Return < 0 {
		t.Errorf("registration: %+v", h[0])
	}
	if h[1].Input.Kind != history.Deregister || h[1].Input.ID != 4 || h[1].Done || h[1].Output.Outcome != history.Unknown {
		t.Errorf("pending deregistration: %+v", h[1])
	}
}
