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

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/health"
)

// Health is the cluster's health as `status` judges it (package
// meta/health holds the judge, so that the web console uses the same one).
type Health = health.Health

// healthStale is how old a health record may be before status says no
// leader is publishing (health.Stale).
func healthStale(lease time.Duration) time.Duration { return health.Stale(lease) }

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

// judge lists what keeps the cluster from healthy (health.Judge: the
// judge itself lives in meta/health, moved there unchanged).
func judge(s Status, rec *meta.HealthRecord, age, stale time.Duration) []string {
	return health.Judge(s, rec, age, stale)
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
			if st.Stopped {
				line += "  stopped for a planned restart at " + st.StoppedAt.Format(time.RFC3339)
			} else if st.LastHeartbeat.IsZero() {
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
