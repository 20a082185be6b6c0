package logstore

import (
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// fold builds a view by folding events under term 1, as a store's projector
// would.
func fold(t *testing.T, payloads ...events.Payload) *projections.State {
	t.Helper()
	st := projections.New()
	all := append([]events.Payload{events.TermStarted{Term: 1, Leader: "meta-1"}}, payloads...)
	for _, p := range all {
		r := st.Apply(events.Event{Term: 1, Writer: "meta-1", At: time.Unix(0, 0), Data: p})
		if r.Outcome != projections.Applied {
			t.Fatalf("event %T %+v: %v", p, p, r)
		}
	}
	return st
}

func stores3() []events.Payload {
	return []events.Payload{
		events.StoreRegistered{Store: "s1", Incarnation: "i1", RaftAddr: "127.0.0.1:1001"},
		events.StoreRegistered{Store: "s2", Incarnation: "i2", RaftAddr: "127.0.0.1:1002"},
		events.StoreRegistered{Store: "s3", Incarnation: "i3", RaftAddr: "127.0.0.1:1003"},
	}
}

func created() events.Payload {
	return events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}}
}

func with(ps ...events.Payload) []events.Payload { return append(stores3(), ps...) }

func ref(shard, replica uint64) projections.ReplicaRef {
	return projections.ReplicaRef{Shard: shard, Replica: replica}
}

func refs(rs ...projections.ReplicaRef) []projections.ReplicaRef { return rs }

var initial3 = map[uint64]string{1: "127.0.0.1:1001", 2: "127.0.0.1:1002", 3: "127.0.0.1:1003"}

func TestPlan(t *testing.T) {
	removed3 := with(created(),
		events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 5, Op: "op1"},
		events.ShardReplicaRemoved{Shard: 1, Replica: 3, Store: "s3", CCID: 6, Op: "op1"},
	)
	added4 := append(append([]events.Payload(nil), removed3...),
		events.ShardReplicaAdding{Shard: 1, Replica: 4, Store: "s3", CCID: 6, Op: "op1"},
		events.ShardReplicaAdded{Shard: 1, Replica: 4, Store: "s3", CCID: 7, Op: "op1"},
	)
	tests := []struct {
		name  string
		store string
		view  []events.Payload // nil: no view at all
		local Local
		want  []Action
	}{
		{
			name:  "no view plans nothing, even with local data",
			store: "s3",
			local: Local{Persisted: refs(ref(1, 3))},
			want:  nil,
		},
		{
			name:  "fresh shard: every initial member bootstraps with the initial addresses",
			store: "s2",
			view:  with(created()),
			want:  []Action{{Kind: ActStart, Shard: 1, Replica: 2, Initial: initial3}},
		},
		{
			name:  "persisted member restarts from its data",
			store: "s1",
			view:  with(created()),
			local: Local{Persisted: refs(ref(1, 1))},
			want:  []Action{{Kind: ActStart, Shard: 1, Replica: 1}},
		},
		{
			name:  "running member: nothing to do",
			store: "s1",
			view:  with(created()),
			local: Local{Running: refs(ref(1, 1)), Persisted: refs(ref(1, 1))},
			want:  nil,
		},
		{
			name:  "zombie: persisted replica 3 removed in the view is never started; its data is removed",
			store: "s3",
			view:  removed3,
			local: Local{Persisted: refs(ref(1, 3))},
			want:  []Action{{Kind: ActRemoveData, Shard: 1, Replica: 3, Reason: "removed"}},
		},
		{
			name:  "running removed replica is stopped then its data removed",
			store: "s3",
			view:  removed3,
			local: Local{Running: refs(ref(1, 3)), Persisted: refs(ref(1, 3))},
			want: []Action{
				{Kind: ActStop, Shard: 1, Replica: 3, Reason: "removed"},
				{Kind: ActRemoveData, Shard: 1, Replica: 3, Reason: "removed"},
			},
		},
		{
			name:  "replica added to a running shard joins; the removed one's data goes first",
			store: "s3",
			view:  added4,
			local: Local{Persisted: refs(ref(1, 3))},
			want: []Action{
				{Kind: ActRemoveData, Shard: 1, Replica: 3, Reason: "removed"},
				{Kind: ActStart, Shard: 1, Replica: 4, Join: true},
			},
		},
		{
			name:  "persisted replica unknown to the view is skipped, never started",
			store: "s3",
			view:  with(created()),
			local: Local{Persisted: refs(ref(1, 3), ref(9, 7))},
			want: []Action{
				{Kind: ActSkip, Shard: 9, Replica: 7, Reason: ReasonUnknownShard},
				{Kind: ActStart, Shard: 1, Replica: 3},
			},
		},
		{
			name:  "persisted replica id that is not a member anywhere is skipped",
			store: "s3",
			view:  with(created()),
			local: Local{Persisted: refs(ref(1, 3), ref(1, 8))},
			want: []Action{
				{Kind: ActSkip, Shard: 1, Replica: 8, Reason: ReasonNotMember},
				{Kind: ActStart, Shard: 1, Replica: 3},
			},
		},
		{
			name:  "replica listed on another store is stopped and skipped, data kept",
			store: "s3",
			view:  with(created()),
			local: Local{Running: refs(ref(1, 2)), Persisted: refs(ref(1, 2))},
			want: []Action{
				{Kind: ActStop, Shard: 1, Replica: 2, Reason: "a member of store s2, not s3"},
				{Kind: ActSkip, Shard: 1, Replica: 2, Reason: "a member of store s2, not s3"},
				{Kind: ActStart, Shard: 1, Replica: 3, Initial: initial3},
			},
		},
		{
			name:  "replica removed from another store is skipped, its data kept",
			store: "s1",
			view:  removed3,
			local: Local{Persisted: refs(ref(1, 1), ref(1, 3))},
			want: []Action{
				{Kind: ActSkip, Shard: 1, Replica: 3, Reason: "removed from store s3, not s1"},
				{Kind: ActStart, Shard: 1, Replica: 1},
			},
		},
		{
			name:  "a member whose removal is pending is not started",
			store: "s3",
			view:  with(created(), events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 5, Op: "op1"}),
			local: Local{Persisted: refs(ref(1, 3))},
			want:  []Action{{Kind: ActSkip, Shard: 1, Replica: 3, Reason: ReasonRemovalPending}},
		},
		{
			name:  "an adding intent is not membership: nothing starts before the outcome",
			store: "s3",
			view: append(append([]events.Payload(nil), removed3...),
				events.ShardReplicaAdding{Shard: 1, Replica: 4, Store: "s3", CCID: 6, Op: "op1"}),
			want: nil,
		},
		{
			name:  "initial member without data after a config change joins (never a second bootstrap)",
			store: "s2",
			view:  removed3,
			want:  []Action{{Kind: ActStart, Shard: 1, Replica: 2, Join: true}},
		},
		{
			name:  "membership observed from raft replaces the projection's",
			store: "s3",
			view: with(created(),
				events.ShardObserved{Shard: 1, CCID: 9, Replicas: map[uint64]string{1: "s1", 2: "s2"}, Leader: 1}),
			local: Local{Persisted: refs(ref(1, 3))},
			want:  []Action{{Kind: ActRemoveData, Shard: 1, Replica: 3, Reason: "removed"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var view *projections.State
			if tc.view != nil {
				view = fold(t, tc.view...)
			}
			got := Plan(tc.store, view, tc.local)
			if !reflect.DeepEqual(got, tc.want) {
				t.Fatalf("Plan:\n got %v\nwant %v", got, tc.want)
			}
			for _, a := range got {
				if a.Kind != ActStart {
					continue
				}
				if sh := view.Shards[a.Shard]; sh == nil || sh.Members[a.Replica] != tc.store {
					t.Fatalf("planned to start a non-member: %v", a)
				}
			}
		})
	}
}

// TestPlanNeverStartsNonMembers checks the gate over many local states.
func TestPlanNeverStartsNonMembers(t *testing.T) {
	views := map[string]*projections.State{
		"created": fold(t, with(created())...),
		"removed3": fold(t, with(created(),
			events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 5},
			events.ShardReplicaRemoved{Shard: 1, Replica: 3, Store: "s3", CCID: 6})...),
		"empty": fold(t, stores3()...),
	}
	all := []projections.ReplicaRef{ref(1, 1), ref(1, 2), ref(1, 3), ref(1, 4), ref(2, 1)}
	for name, v := range views {
		for _, store := range []string{"s1", "s2", "s3", "s4"} {
			for mask := range 1 << (2 * len(all)) {
				var l Local
				for i, r := range all {
					if mask&(1<<(2*i)) != 0 {
						l.Running = append(l.Running, r)
						l.Persisted = append(l.Persisted, r)
					} else if mask&(1<<(2*i+1)) != 0 {
						l.Persisted = append(l.Persisted, r)
					}
				}
				for _, a := range Plan(store, v, l) {
					switch a.Kind {
					case ActStart:
						if sh := v.Shards[a.Shard]; sh == nil || sh.Members[a.Replica] != store {
							t.Fatalf("%s/%s/%b: start of non-member %v", name, store, mask, a)
						}
					case ActRemoveData:
						if sh := v.Shards[a.Shard]; sh == nil || sh.Removed[a.Replica] != store {
							t.Fatalf("%s/%s/%b: data removal of a replica not removed from this store %v", name, store, mask, a)
						}
					}
				}
			}
		}
	}
}

func TestActionString(t *testing.T) {
	for _, a := range []Action{
		{Kind: ActStart, Shard: 1, Replica: 4, Join: true},
		{Kind: ActStart, Shard: 1, Replica: 1, Initial: map[uint64]string{1: "a"}},
		{Kind: ActStart, Shard: 1, Replica: 1},
		{Kind: ActSkip, Shard: 1, Replica: 3, Reason: ReasonNotMember},
	} {
		if s := a.String(); !strings.Contains(s, "shard=1") {
			t.Fatalf("%q", s)
		}
	}
}

// TestPlanRecoveredShard: after an operator's recovery (shard.recovered) the
// stores of the replicas declared gone, restarted from their old data, start
// nothing: the retired replicas' data is removed. The store recovered from
// rebuilds the shard once, from the replica's own data.
func TestPlanRecoveredShard(t *testing.T) {
	v := fold(t, with(created(),
		events.ShardObserved{Shard: 1, CCID: 3, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}, Leader: 1},
		events.OperatorStarted{Op: "op-1-7", Shard: 1, Remove: 3},
		events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3, Op: "op-1-7"},
		events.ShardRecovered{Shard: 1, Replica: 1, Store: "s1", Applied: 7, Gone: map[uint64]string{2: "s2", 3: "s3"}, Operator: "admin"})...)
	for _, tc := range []struct {
		store string
		local Local
		want  []Action
	}{
		{"s2", Local{Persisted: refs(ref(1, 2))}, []Action{{Kind: ActRemoveData, Shard: 1, Replica: 2, Reason: "removed"}}},
		{"s3", Local{Persisted: refs(ref(1, 3))}, []Action{{Kind: ActRemoveData, Shard: 1, Replica: 3, Reason: "removed"}}},
		// The store recovered from rebuilds the shard once (it starts the
		// replica), then restarts it as usual.
		{"s1", Local{Persisted: refs(ref(1, 1))}, []Action{{Kind: ActRebuild, Shard: 1, Replica: 1, Seq: v.Shards[1].Recovered.Seq}}},
		{"s1", Local{Persisted: refs(ref(1, 1)), Rebuilt: map[uint64]uint64{1: v.Shards[1].Recovered.Seq}}, []Action{{Kind: ActStart, Shard: 1, Replica: 1}}},
		{"s1", Local{}, []Action{{Kind: ActSkip, Shard: 1, Replica: 1, Reason: "cannot rebuild: no local data of the replica recovered from"}}},
	} {
		got := Plan(tc.store, v, tc.local)
		if !reflect.DeepEqual(got, tc.want) {
			t.Errorf("%s: plan %v, want %v", tc.store, got, tc.want)
		}
	}
}
