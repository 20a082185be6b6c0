package client

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// deposedStep folds the stream a deposed leader leaves behind: term 1's
// operator op-1-6 records "remove 3" (the intent at seq 7), then meta-2
// starts term 2 (seq 8) without failing the inherited operator yet. It
// returns the state before and after term 2 and the request term 1's leader
// sends for its step.
func deposedStep(t *testing.T) (before, after *projections.State, req ExecRequest) {
	t.Helper()
	st := projections.New()
	at := time.Unix(0, 0)
	fold := func(term uint64, writer string, p events.Payload) {
		t.Helper()
		if r := st.Apply(events.Event{Seq: st.Seq + 1, Term: term, Writer: writer, At: at, Data: p}); r.Outcome != projections.Applied {
			t.Fatalf("%T %+v: %v", p, p, r)
		}
	}
	fold(1, "meta-1", events.TermStarted{Term: 1, Leader: "meta-1"})
	for i, s := range []string{"s1", "s2", "s3"} {
		fold(1, "meta-1", events.StoreRegistered{Store: s, Incarnation: "i", RaftAddr: "127.0.0.1:100" + string(rune('1'+i))})
	}
	fold(1, "meta-1", events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}})
	fold(1, "meta-1", events.OperatorStarted{Op: "op-1-6", Shard: 1, Remove: 3})
	fold(1, "meta-1", events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3, Op: "op-1-6"})
	req = ExecRequest{Op: ExecRemove, Shard: 1, Replica: 3, CCID: 3, Term: 1, Operator: "op-1-6", Intent: st.Seq}
	before = st.Clone()
	fold(2, "meta-2", events.TermStarted{Term: 2, Leader: "meta-2"})
	return before, st, req
}

// TestCheckExecRefusesAnEndedTerm: a step of term 1 is refused once the
// projection has folded term 2, although its operator still runs in the
// projection (inherited, not yet failed by the new leader) and its intent is
// the shard's pending change: only the term check tells them apart.
func TestCheckExecRefusesAnEndedTerm(t *testing.T) {
	before, after, req := deposedStep(t)
	if v, why := CheckExec(before, req); v != ExecRun {
		t.Fatalf("in term 1 the step is the pending change of a running operator: %v (%s), want run", v, why)
	}
	v, why := CheckExec(after, req)
	if v != ExecRefuse || !strings.Contains(why, "term 1 is over") {
		t.Fatalf("term 1's step after term 2 started: %v (%s), want refused: term 1 is over", v, why)
	}
}

// TestCheckExecGiveUp: a give-up is fenced like a change: it runs for the
// pending intent of a running operator under the current term, also one
// the current term inherited, and is refused once its term is over (a
// deposed leader gives nothing up) or for an intent that is not pending.
func TestCheckExecGiveUp(t *testing.T) {
	before, after, req := deposedStep(t)
	req.Op = ExecGiveUp
	if v, why := CheckExec(before, req); v != ExecRun {
		t.Fatalf("term 1's give-up of its pending intent: %v (%s), want run", v, why)
	}
	if v, why := CheckExec(after, req); v != ExecRefuse || !strings.Contains(why, "term 1 is over") {
		t.Fatalf("term 1's give-up after term 2 started: %v (%s), want refused: term 1 is over", v, why)
	}
	inherited := req
	inherited.Term = 2
	if v, why := CheckExec(after, inherited); v != ExecRun {
		t.Fatalf("term 2's give-up of the operator it inherited from term 1: %v (%s), want run", v, why)
	}
	other := req
	other.Intent--
	if v, why := CheckExec(before, other); v != ExecRefuse || !strings.Contains(why, "not intent") {
		t.Fatalf("a give-up of an intent that is not pending: %v (%s), want refused", v, why)
	}
	if _, err := DecodeExec([]byte(`{"op":"giveup","shard":1,"replica":3,"term":1,"operator":"op-1-6","intent":7}`)); err == nil || !strings.Contains(err.Error(), "config change id") {
		t.Fatalf("a give-up without its config change id: %v", err)
	}
	// A fence id is never a replica a change may name.
	if _, err := DecodeExec([]byte(fmt.Sprintf(`{"op":"remove","shard":1,"replica":%d,"term":1,"operator":"op-1-6","intent":7,"ccid":3}`, FenceReplica(3)))); err == nil {
		t.Fatal("a removal of a fence id decoded")
	}
}

// TestCheckExecRefusesAnAddAtTheWrongAddress: term 1's operator adds
// replica 4 on s4, and its intent is the shard's pending change; then s4
// registers again at another Raft address (a restart on a new port) before
// the step reaches a member store. The exec still names the old address:
// every fence but the address passes, and only the address check keeps a
// replica from joining Raft where no store of the projection listens (or
// where another store's replica is).
func TestCheckExecRefusesAnAddAtTheWrongAddress(t *testing.T) {
	st := projections.New()
	at := time.Unix(0, 0)
	fold := func(p events.Payload) {
		t.Helper()
		if r := st.Apply(events.Event{Seq: st.Seq + 1, Term: 1, Writer: "meta-1", At: at, Data: p}); r.Outcome != projections.Applied {
			t.Fatalf("%T %+v: %v", p, p, r)
		}
	}
	fold(events.TermStarted{Term: 1, Leader: "meta-1"})
	for i, s := range []string{"s1", "s2", "s3", "s4"} {
		fold(events.StoreRegistered{Store: s, Incarnation: "i", RaftAddr: fmt.Sprintf("127.0.0.1:100%d", i+1)})
	}
	fold(events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}})
	fold(events.OperatorStarted{Op: "op-1-7", Shard: 1, Add: "s4"})
	fold(events.ShardReplicaAdding{Shard: 1, Replica: 4, Store: "s4", CCID: 3, Op: "op-1-7"})
	req := ExecRequest{Op: ExecAdd, Shard: 1, Replica: 4, Addr: "127.0.0.1:1004", CCID: 3, Term: 1, Operator: "op-1-7", Intent: st.Seq}
	if v, why := CheckExec(st, req); v != ExecRun {
		t.Fatalf("the add at s4's address: %v (%s), want run", v, why)
	}
	fold(events.StoreRegistered{Store: "s4", Incarnation: "i2", RaftAddr: "127.0.0.1:1014"})
	v, why := CheckExec(st, req)
	if want := "replica 4 is to be added on store s4, not at 127.0.0.1:1004"; v != ExecRefuse || why != want {
		t.Fatalf("the add at s4's old address: %v (%s), want refused: %s", v, why, want)
	}
	req.Addr = "127.0.0.1:1003" // another member's address
	if v, why := CheckExec(st, req); v != ExecRefuse || !strings.Contains(why, "not at 127.0.0.1:1003") {
		t.Fatalf("the add at s3's address: %v (%s), want refused", v, why)
	}
}
