package judge

import (
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

var t0 = time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)

// healthy is a cluster of three stores and one shard at 3/3, as the
// stream and a fresh record of the current term say.
func healthy() Input {
	members := map[uint64]string{1: "store-1", 2: "store-2", 3: "store-3"}
	in := Input{Term: 4, LeaseHolder: "meta-1", Stale: time.Minute,
		Workers: []projections.Worker{{ID: 1, State: projections.WorkerRunning}},
		Shards:  []projections.Shard{{ID: 1, Members: members, Leader: 1}}}
	rec := &meta.HealthRecord{Leader: "meta-1", Term: 4, At: t0}
	rec.Recovery.State = meta.RecoveryComplete
	rec.ShardsWanted = 1
	for _, id := range []string{"store-1", "store-2", "store-3"} {
		in.Stores = append(in.Stores, projections.Store{ID: id, Incarnation: "i-" + id, State: events.StoreUp})
		rec.Stores = append(rec.Stores, sched.StoreHealth{Store: id, State: events.StoreUp, Live: true, LastHeartbeat: t0, Incarnation: "i-" + id, Replicas: 1})
	}
	rec.Shards = []sched.ShardHealth{{Shard: 1, Expected: 3, Members: members, Live: 3, Running: []uint64{1, 2, 3}, Leader: 1, LeaderStore: "store-1", Healthy: true}}
	in.Record = rec
	return in
}

func TestHealthyHasNoProblems(t *testing.T) {
	if p := Problems(healthy()); len(p) != 0 {
		t.Fatalf("problems %q", p)
	}
}

// TestPlannedStopShowsAtOnce: the stream says store-3's process stops (its
// SIGTERM); the record, written a moment before, still counts its replica
// running and the store live. The judge names the stop and counts 2/3.
func TestPlannedStopShowsAtOnce(t *testing.T) {
	in := healthy()
	st := &in.Stores[2]
	st.State, st.Until, st.DrainedBy, st.Stopped, st.StoppedAt = events.StoreDraining, t0.Add(15*time.Minute), st.Incarnation, st.Incarnation, t0
	p := strings.Join(Problems(in), "\n")
	for _, want := range []string{
		"store-3 stopped for a planned restart at 2026-12-01T03:00:00Z, drained until 2026-12-01T03:15:00Z",
		"shard 1: 2/3 running (3@store-3 stopped)",
	} {
		if !strings.Contains(p, want) {
			t.Fatalf("problems:\n%s\nwant %q", p, want)
		}
	}
}

// TestReportFromBeforeARestartDoesNotCount: store-3 was restarted (the
// stream has its new incarnation registered); the record still holds the
// old process's report with its replica running. Not healthy, until a
// record holds the new process's report.
func TestReportFromBeforeARestartDoesNotCount(t *testing.T) {
	in := healthy()
	st := &in.Stores[2]
	st.State, st.Until, st.DrainedBy, st.Incarnation = events.StoreDraining, t0.Add(15*time.Minute), "i-store-3", "i-store-3-again"
	p := strings.Join(Problems(in), "\n")
	for _, want := range []string{
		"store-3 restarted (incarnation i-store-3-again): its drain is not over",
		"store-3: no report of its process (incarnation i-store-3-again) in the health record yet",
		"shard 1: 2/3 running (3@store-3 restarted, not reported yet)",
	} {
		if !strings.Contains(p, want) {
			t.Fatalf("problems:\n%s\nwant %q", p, want)
		}
	}
	// The new process reported and its drain ended: healthy.
	in.Record.Stores[2].Incarnation = "i-store-3-again"
	st.State, st.Until, st.DrainedBy = events.StoreUp, time.Time{}, ""
	if p := Problems(in); len(p) != 0 {
		t.Fatalf("problems %q", p)
	}
}

// TestCollectingReports: a new leader that has not heard from a store yet
// is not healthy, and says why instead of 0/3.
func TestCollectingReports(t *testing.T) {
	in := healthy()
	in.Record.Collecting = []string{"store-3"}
	in.Record.Shards[0].Healthy, in.Record.Shards[0].Live, in.Record.Shards[0].Running = false, 2, []uint64{1, 2}
	in.Record.Shards[0].Why = "collecting reports (2/3 replicas running so far; not heard from store-3 yet this term)"
	p := strings.Join(Problems(in), "\n")
	if !strings.Contains(p, "collecting reports: not heard from store-3") || !strings.Contains(p, "shard 1: collecting reports") || strings.Contains(p, "2/3 running") {
		t.Fatalf("problems:\n%s", p)
	}
}

// TestStreamOperatorAndPending: an operator or a pending change in the
// stream is a problem even when the record predates it.
func TestStreamOperatorAndPending(t *testing.T) {
	in := healthy()
	in.Shards[0].Operator = "op-7"
	if p := strings.Join(Problems(in), "\n"); !strings.Contains(p, "shard 1: operator op-7 running") {
		t.Fatalf("problems:\n%s", p)
	}
	in = healthy()
	in.Shards[0].Pending = map[uint64]projections.Pending{4: {Kind: projections.PendingAdding, Store: "store-4"}}
	if p := strings.Join(Problems(in), "\n"); !strings.Contains(p, "shard 1: pending change (adding 4@store-4)") {
		t.Fatalf("problems:\n%s", p)
	}
}

// TestNoRecordStillNamesPlannedStops: without a record the stream's
// planned stop is named too.
func TestNoRecordStillNamesPlannedStops(t *testing.T) {
	in := healthy()
	in.Record = nil
	st := &in.Stores[0]
	st.State, st.Until, st.Stopped, st.StoppedAt = events.StoreDraining, t0.Add(time.Minute), st.Incarnation, t0
	if p := strings.Join(Problems(in), "\n"); !strings.Contains(p, "store-1 stopped for a planned restart") || !strings.Contains(p, "no health record") {
		t.Fatalf("problems:\n%s", p)
	}
}

// TestLeaderReasonPassesThrough: a reason the judge does not know (a shard
// that lost quorum, blocked) is named beside the count.
func TestLeaderReasonPassesThrough(t *testing.T) {
	in := healthy()
	h := &in.Record.Shards[0]
	h.Healthy, h.Live, h.Running, h.Why = false, 1, []uint64{1}, "lost-quorum: 2 of 3 replicas gone for good"
	if p := strings.Join(Problems(in), "\n"); !strings.Contains(p, "shard 1: 1/3 running (lost-quorum: 2 of 3 replicas gone for good)") {
		t.Fatalf("problems:\n%s", p)
	}
}

// TestReleasedLeaseNamesTheLeader: a leader that stopped (SIGTERM releases
// the lease) is named at once.
func TestReleasedLeaseNamesTheLeader(t *testing.T) {
	in := healthy()
	in.LeaseHolder = ""
	if p := strings.Join(Problems(in), "\n"); !strings.Contains(p, "no meta leader holds the lease (meta-1, which published the last health record in term 4") {
		t.Fatalf("problems:\n%s", p)
	}
}

// TestHealthyShardWithoutRaftLeader: the record counts a shard healthy
// with every member running, yet names no Raft leader (a record that
// judged too kindly, or of an older build): the judge's backstop does not
// pass it, because a shard without a leader serves nothing.
func TestHealthyShardWithoutRaftLeader(t *testing.T) {
	in := healthy()
	h := &in.Record.Shards[0]
	h.Leader, h.LeaderStore = 0, ""
	if !h.Healthy {
		t.Fatal("the record must call the shard healthy for this test")
	}
	if p := Problems(in); len(p) != 1 || p[0] != "shard 1: no raft leader" {
		t.Fatalf("problems %q, want only %q", p, "shard 1: no raft leader")
	}
}

// TestRecordOfAnOlderTermRefused: the stream is at term 5 (meta-2 leads);
// the record, fresh and all healthy, is meta-1's of term 4, a deposed
// leader still publishing until its lease runs out. The fence on read
// refuses it: not healthy until the current term's leader publishes.
func TestRecordOfAnOlderTermRefused(t *testing.T) {
	in := healthy()
	in.Term, in.LeaseHolder = 5, "meta-2"
	want := "health record from term 4 (meta-1), the stream is at term 5: the current leader has not published yet"
	if p := Problems(in); len(p) != 1 || p[0] != want {
		t.Fatalf("problems %q, want only %q", p, want)
	}
	in.Record.Leader, in.Record.Term = "meta-2", 5
	if p := Problems(in); len(p) != 0 {
		t.Fatalf("the current term's record: problems %q", p)
	}
}
