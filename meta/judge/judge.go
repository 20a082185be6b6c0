// Package judge is the one judge of a cluster's health: status, status
// --wait-healthy and anything else that says "healthy" (the web console)
// call Problems on what they read: the projection of the stream, the lease
// holder and the meta leader's published health record.
//
// It is pure (no I/O, no clock: the record's age comes in) and it trusts
// the record only as far as the stream allows: a store whose process
// announced its own stop in the stream is gone from that event on, and a
// report of a process from before a restart (another incarnation than the
// one the stream has registered) counts for nothing, however young the
// record is. So a planned stop shows at once, and a gate never passes on a
// report of the process that was restarted.
package judge

import (
	"fmt"
	"maps"
	"sort"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

// Input is what a reader gathered: the projection of the stream (term,
// workers, stores, shards), the lease holder, and the health record with
// its age when read.
type Input struct {
	Term        uint64
	LeaseHolder string
	LeaseError  string // why the lease bucket could not be read ("" when it was)
	Workers     []projections.Worker
	Stores      []projections.Store
	Shards      []projections.Shard
	Record      *meta.HealthRecord // nil: none published
	Age         time.Duration      // the record's age when read
	Stale       time.Duration      // a record older than this: no leader is publishing
}

// Problems lists what keeps the cluster from healthy; none means healthy:
// a meta leader holds the lease and publishes, in the stream's term, a
// record built after every store reported to it; barrier recovery is
// complete; every worker runs; every shard exists with all its members
// running on a live process whose report is of its current incarnation,
// a Raft leader, no operator and no pending change; no store is down,
// stopped, or silent while it drains; a restarted store's drain is over.
func Problems(in Input) []string {
	var out []string
	switch {
	case in.LeaseError != "":
		out = append(out, "lease holder unknown: "+in.LeaseError)
	case in.LeaseHolder == "" && in.Record != nil && in.Record.Leader != "":
		out = append(out, fmt.Sprintf("no meta leader holds the lease (%s, which published the last health record in term %d, released it or stopped)", in.Record.Leader, in.Record.Term))
	case in.LeaseHolder == "":
		out = append(out, "no meta leader holds the lease")
	}
	stores := map[string]projections.Store{}
	for _, st := range in.Stores {
		stores[st.ID] = st
	}
	// From the stream, whatever the record says: it may predate them.
	running := 0
	for _, w := range in.Workers {
		if w.State == projections.WorkerRunning {
			running++
		}
	}
	if running < len(in.Workers) {
		out = append(out, fmt.Sprintf("%d of %d workers running", running, len(in.Workers)))
	}
	for _, st := range in.Stores {
		switch {
		case st.PlannedStop():
			out = append(out, fmt.Sprintf("%s stopped for a planned restart at %s, drained until %s", st.ID, st.StoppedAt.UTC().Format(time.RFC3339), st.Until.UTC().Format(time.RFC3339)))
		case st.State == events.StoreDraining && st.DrainedBy != "" && st.DrainedBy != st.Incarnation:
			out = append(out, fmt.Sprintf("%s restarted (incarnation %s): its drain is not over (it ends once the store runs its replicas)", st.ID, st.Incarnation))
		}
	}
	rec := in.Record
	if rec == nil {
		out = append(out, "no health record: no meta leader has published one")
		for _, sh := range in.Shards {
			if p := streamShard(sh); p != "" {
				out = append(out, p)
			}
		}
		return out
	}
	if rec.Term < in.Term {
		// The fence on read, for the record as for events: a deposed
		// leader may still be writing it until its lease runs out.
		out = append(out, fmt.Sprintf("health record from term %d (%s), the stream is at term %d: the current leader has not published yet", rec.Term, rec.Leader, in.Term))
	}
	if in.Age > in.Stale {
		out = append(out, fmt.Sprintf("health record is %s old (written by %s in term %d): no leader is publishing", in.Age.Round(100*time.Millisecond), rec.Leader, rec.Term))
	}
	if rec.Recovery.State != meta.RecoveryComplete {
		out = append(out, fmt.Sprintf("barrier recovery %s", orDash(rec.Recovery.State)))
	}
	if len(rec.Collecting) > 0 {
		out = append(out, fmt.Sprintf("the leader (%s, term %d) is collecting reports: not heard from %s yet", rec.Leader, rec.Term, strings.Join(rec.Collecting, ", ")))
	}
	recStores := map[string]sched.StoreHealth{}
	for _, rs := range rec.Stores {
		recStores[rs.Store] = rs
	}
	for _, rs := range rec.Stores {
		st, ok := stores[rs.Store]
		switch {
		case ok && st.PlannedStop():
			// Named above, from the stream.
		case rs.State == events.StoreDown:
			out = append(out, fmt.Sprintf("store %s down", rs.Store))
		case rs.State == events.StoreDraining && !rs.Live:
			out = append(out, fmt.Sprintf("store %s draining and silent (until %s)", rs.Store, rs.Until.Format(time.RFC3339)))
		}
	}
	for _, st := range in.Stores {
		if st.State == events.StoreTombstone || st.State == events.StoreDown || st.PlannedStop() {
			continue // named as such, not as a missing report
		}
		if !current(st, recStores) {
			out = append(out, fmt.Sprintf("%s: no report of its process (incarnation %s) in the health record yet", st.ID, st.Incarnation))
		}
	}
	if n := len(rec.Shards); n < rec.ShardsWanted {
		out = append(out, fmt.Sprintf("%d of %d shards exist (a shard is created once %d live stores are up)", n, rec.ShardsWanted, 3))
	}
	inRecord := map[uint64]sched.ShardHealth{}
	for _, h := range rec.Shards {
		inRecord[h.Shard] = h
	}
	for _, sh := range in.Shards {
		h, ok := inRecord[sh.ID]
		if !ok {
			out = append(out, fmt.Sprintf("shard %d: not in the health record yet", sh.ID))
			continue
		}
		if p := shard(sh, h, stores, recStores); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// current reports whether the record holds a report of the store's
// registered process.
func current(st projections.Store, recStores map[string]sched.StoreHealth) bool {
	rs, ok := recStores[st.ID]
	if !ok {
		return false
	}
	if rs.Incarnation == "" {
		// A record of a leader from before reports carried the
		// incarnation: its heartbeat time is all it says.
		return !rs.LastHeartbeat.IsZero()
	}
	return rs.Incarnation == st.Incarnation
}

// shard judges one shard: the record's verdict, with the replicas it
// counted running recounted against the stream (not on a stopped process,
// not from a report of a process from before a restart) and the stream's
// membership, operator and pending changes.
func shard(sh projections.Shard, h sched.ShardHealth, stores map[string]projections.Store, recStores map[string]sched.StoreHealth) string {
	if h.LostQuorum {
		// The leader's verdict over a whole threshold, with the runbook's
		// command: first, whatever the recount says.
		return fmt.Sprintf("shard %d: %s", sh.ID, h.Why)
	}
	expected := max(h.Expected, len(sh.Members))
	var gone []string
	n := 0
	for _, r := range h.Running {
		store := h.Members[r]
		st, ok := stores[store]
		switch {
		case !ok || sh.Members[r] != store:
			gone = append(gone, fmt.Sprintf("%d@%s no longer a member", r, store))
		case st.PlannedStop():
			gone = append(gone, fmt.Sprintf("%d@%s stopped", r, store))
		case !current(st, recStores):
			gone = append(gone, fmt.Sprintf("%d@%s restarted, not reported yet", r, store))
		default:
			n++
		}
	}
	switch {
	case strings.HasPrefix(h.Why, "collecting reports"):
		return fmt.Sprintf("shard %d: %s", sh.ID, h.Why)
	case n < expected:
		p := fmt.Sprintf("shard %d: %d/%d running", sh.ID, n, expected)
		if !h.Healthy && h.Why != "" && !strings.HasSuffix(h.Why, "replicas running") {
			// The leader's own reason (blocked, lost quorum, ...) beside
			// the count: a reason the judge does not know passes through.
			gone = append([]string{h.Why}, gone...)
		}
		if len(gone) > 0 {
			p += " (" + strings.Join(gone, ", ") + ")"
		}
		return p
	case !maps.Equal(sh.Members, h.Members):
		return fmt.Sprintf("shard %d: membership changed in the stream since the health record", sh.ID)
	}
	if p := streamShard(sh); p != "" {
		return p
	}
	if !h.Healthy {
		return fmt.Sprintf("shard %d: %s", sh.ID, h.Why)
	}
	if h.Leader == 0 {
		return fmt.Sprintf("shard %d: no raft leader", sh.ID)
	}
	return ""
}

// streamShard is what the stream alone says is wrong with a shard: an
// operator running or a change pending.
func streamShard(sh projections.Shard) string {
	switch {
	case sh.Operator != "":
		return fmt.Sprintf("shard %d: operator %s running", sh.ID, sh.Operator)
	case len(sh.Pending) > 0:
		ids := make([]uint64, 0, len(sh.Pending))
		for r := range sh.Pending {
			ids = append(ids, r)
		}
		sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
		var ps []string
		for _, r := range ids {
			ps = append(ps, fmt.Sprintf("%s %d@%s", sh.Pending[r].Kind, r, sh.Pending[r].Store))
		}
		return fmt.Sprintf("shard %d: pending change (%s)", sh.ID, strings.Join(ps, ", "))
	}
	return ""
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
