package sched_test

import (
	"maps"
	"strings"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

// TestPlanRecovery: the plan of an operator's recovery, and its refusals
// with the reason: a quorum still alive, a store that does not hold the
// shard (or does not answer), another store with a higher applied index
// (unless forced).
func TestPlanRecovery(t *testing.T) {
	w := newWorld()
	w.newTerm("meta-1")
	w.append(w.term, w.leader,
		events.StoreRegistered{Store: "s1", Incarnation: "i", RaftAddr: "a1"},
		events.StoreRegistered{Store: "s2", Incarnation: "i", RaftAddr: "a2"},
		events.StoreRegistered{Store: "s3", Incarnation: "i", RaftAddr: "a3"},
		events.StoreRegistered{Store: "s4", Incarnation: "i", RaftAddr: "a4"},
		events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}},
		events.OperatorStarted{Op: "op-1-7", Shard: 1, Remove: 3, Add: "s4"},
		events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3, Op: "op-1-7"})
	lost := &sched.ShardHealth{Shard: 1, Live: 1, LostQuorum: true}
	asked := []client.ReplicaApplied{{Store: "s1", Replica: 1, Applied: 9}, {Store: "s2", Error: "no responders"}, {Store: "s3", Error: "no responders"}}
	req := client.RecoverRequest{Shard: 1, From: "s1", Operator: "admin"}

	plan, ev, err := sched.PlanRecovery(w.v, lost, req, asked)
	if err != nil {
		t.Fatal(err)
	}
	if plan.Replica != 1 || plan.Applied != 9 || plan.Lost != 0 || !maps.Equal(plan.Gone, map[uint64]string{2: "s2", 3: "s3"}) || !maps.Equal(plan.After, map[uint64]string{1: "s1"}) {
		t.Fatalf("plan %+v", plan)
	}
	st := w.v.Clone()
	if r := st.Apply(events.Event{Seq: st.Seq + 1, Term: w.term, Writer: w.leader, At: w.now, Data: ev}); r.Outcome != projections.Applied {
		t.Fatalf("the planned event does not fold: %v", r)
	}

	for _, tc := range []struct {
		name  string
		h     *sched.ShardHealth
		req   client.RecoverRequest
		asked []client.ReplicaApplied
		want  string
	}{
		{"quorum alive", &sched.ShardHealth{Shard: 1, Live: 2}, req, asked, "a quorum is still alive (2 of 3 members running"},
		{"a raft leader", &sched.ShardHealth{Shard: 1, Live: 1, Leader: 2}, req, asked, "its running members follow Raft leader 2: a quorum is still alive"},
		{"not on the store", lost, client.RecoverRequest{Shard: 1, From: "s4", Operator: "admin"}, asked, "store s4 does not hold shard 1"},
		{"not answering", lost, req, asked[1:], "store s1 does not hold shard 1 running (replica 1): it did not answer"},
		{"a higher applied index", lost, client.RecoverRequest{Shard: 1, From: "s2", Operator: "admin"},
			[]client.ReplicaApplied{{Store: "s1", Replica: 1, Applied: 9}, {Store: "s2", Replica: 2, Applied: 7}}, "store s1's replica 1 of shard 1 applied up to index 9, more than s2's 7"},
		{"unknown shard", lost, client.RecoverRequest{Shard: 5, From: "s1", Operator: "admin"}, asked, "shard 5 does not exist"},
	} {
		if _, _, err := sched.PlanRecovery(w.v, tc.h, tc.req, tc.asked); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want %q", tc.name, err, tc.want)
		}
	}
	// --force recovers from the lower index, and says what is lost.
	forced := client.RecoverRequest{Shard: 1, From: "s2", Operator: "admin", Force: true}
	plan, _, err = sched.PlanRecovery(w.v, lost, forced, []client.ReplicaApplied{{Store: "s1", Replica: 1, Applied: 9}, {Store: "s2", Replica: 2, Applied: 7}})
	if err != nil || plan.Lost != 2 || plan.Replica != 2 {
		t.Fatalf("forced: %+v %v", plan, err)
	}
}
