package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/projections"
)

// Health is the cluster's health as `status` judges it: the leader's
// published record (per shard, per store), its age, and the problems that
// make the cluster degraded. It is part of `status --json`.
type Health struct {
	Record   *meta.HealthRecord `json:"record,omitempty"` // nil: none published
	AgeMS    int64              `json:"age_ms"`           // age of the record when read
	Healthy  bool               `json:"healthy"`
	Problems []string           `json:"problems,omitempty"`
}

// healthStale is how old a health record may be before status says no
// leader is publishing: the leader rewrites it every second, and a new
// leader takes over within a lease.
func healthStale(lease time.Duration) time.Duration { return lease + 3*time.Second }

// readHealth reads the leader's health record; nil when none was published.
func readHealth(ctx context.Context, nc *nats.Conn, cluster string) (*meta.HealthRecord, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	kv, err := meta.BindHealthKV(ctx, js, cluster)
	if errors.Is(err, meta.ErrNoHealth) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	rec, err := kv.Get(ctx)
	if errors.Is(err, meta.ErrNoHealth) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return &rec, nil
}

// judge lists what keeps the cluster from healthy: no meta leader, a
// health record too old, recovery incomplete, workers not running, a shard
// under-replicated, without a Raft leader, with an operator, a pending
// change or blocked, a store down or silent while it drains.
func judge(s Status, rec *meta.HealthRecord, age, stale time.Duration) []string {
	var out []string
	switch {
	case s.LeaseError != "":
		out = append(out, "lease holder unknown: "+s.LeaseError)
	case s.LeaseHolder == "":
		out = append(out, "no meta leader holds the lease")
	}
	if rec == nil {
		out = append(out, "no health record: no meta leader has published one")
		return out
	}
	if rec.Term < s.Term {
		// The fence on read, for the record as for events: a deposed
		// leader may still be writing it until its lease runs out.
		out = append(out, fmt.Sprintf("health record from term %d (%s), the stream is at term %d: the current leader has not published yet", rec.Term, rec.Leader, s.Term))
	}
	if age > stale {
		out = append(out, fmt.Sprintf("health record is %s old (written by %s in term %d): no leader is publishing", age.Round(100*time.Millisecond), rec.Leader, rec.Term))
	}
	if rec.Recovery.State != meta.RecoveryComplete {
		out = append(out, fmt.Sprintf("barrier recovery %s", orDashStr(rec.Recovery.State)))
	}
	running := 0
	for _, w := range s.Workers {
		if w.State == projections.WorkerRunning {
			running++
		}
	}
	if running < len(s.Workers) {
		out = append(out, fmt.Sprintf("%d of %d workers running", running, len(s.Workers)))
	}
	for _, st := range rec.Stores {
		switch {
		case st.State == events.StoreDown:
			out = append(out, fmt.Sprintf("store %s down", st.Store))
		case st.State == events.StoreDraining && !st.Live:
			out = append(out, fmt.Sprintf("store %s draining and silent (until %s)", st.Store, st.Until.Format(time.RFC3339)))
		}
	}
	if n := len(rec.Shards); n < rec.ShardsWanted {
		out = append(out, fmt.Sprintf("%d of %d shards exist (a shard is created once %d live stores are up)", n, rec.ShardsWanted, 3))
	}
	for _, h := range rec.Shards {
		if !h.Healthy {
			out = append(out, fmt.Sprintf("shard %d: %s", h.Shard, h.Why))
		}
	}
	return out
}

func orDashStr(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// printHealth prints the per-shard and per-store health lines of status.
func printHealth(w io.Writer, h Health) {
	rec := h.Record
	if rec == nil {
		fmt.Fprintln(w, "health: none published (no meta leader yet)")
	} else {
		fmt.Fprintf(w, "health from %s term %d at seq %d, %s old:\n", rec.Leader, rec.Term, rec.Seq, (time.Duration(h.AgeMS) * time.Millisecond).Round(100*time.Millisecond))
		for _, sh := range rec.Shards {
			leader := "none"
			if sh.Leader != 0 {
				leader = fmt.Sprintf("%d@%s", sh.Leader, sh.LeaderStore)
				if sh.RaftTerm != 0 {
					leader += fmt.Sprintf(" (raft term %d)", sh.RaftTerm)
				}
			}
			members := make([]string, 0, len(sh.Members))
			for _, r := range sortedIDs(sh.Members) {
				members = append(members, fmt.Sprintf("%d@%s", r, sh.Members[r]))
			}
			line := fmt.Sprintf("  shard %-3d %d/%d running  leader %s  members %s", sh.Shard, sh.Live, sh.Expected, leader, strings.Join(members, " "))
			if len(sh.Pending) > 0 {
				line += "  pending " + strings.Join(sh.Pending, ", ")
			}
			if sh.Operator != "" {
				line += "  operator " + sh.Operator
				if sh.Step != "" {
					line += " (" + sh.Step + ")"
				}
			}
			if sh.Blocked != "" {
				line += "  blocked: " + sh.Blocked
			}
			if len(sh.Zombies) > 0 {
				line += "  zombies refused " + strings.Join(sh.Zombies, " ")
			}
			if sh.LostQuorum {
				line += fmt.Sprintf("  LOST-QUORUM since %s, gone %s: run %s", sh.QuorumShortSince.UTC().Format(time.RFC3339), strings.Join(sh.Gone, " "), sh.Runbook)
			}
			fmt.Fprintln(w, line)
		}
		for _, st := range rec.Stores {
			line := fmt.Sprintf("  store %-10s %-9s", st.Store, st.State)
			if st.LastHeartbeat.IsZero() {
				line += "  no heartbeat this term"
			} else {
				line += fmt.Sprintf("  heartbeat %s before the record", rec.At.Sub(st.LastHeartbeat).Round(100*time.Millisecond))
			}
			if !st.Until.IsZero() {
				line += "  draining until " + st.Until.Format(time.RFC3339)
			}
			fmt.Fprintln(w, line)
		}
	}
	if h.Healthy {
		fmt.Fprintln(w, "healthy")
		return
	}
	fmt.Fprintln(w, "DEGRADED:")
	for _, p := range h.Problems {
		fmt.Fprintln(w, "  "+p)
	}
}
