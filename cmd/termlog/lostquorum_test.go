package main

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

// TestStatusNamesLostQuorum: a shard the leader's health calls lost-quorum
// makes status degraded with the shard, how many members run, which are
// gone and since when, and the runbook's command, in the problems and the
// shard's line.
func TestStatusNamesLostQuorum(t *testing.T) {
	since := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	sh := sched.ShardHealth{Shard: 1, Expected: 3, Members: map[uint64]string{1: "store-1", 2: "store-2", 3: "store-3"}, Live: 1, Running: []uint64{1},
		LostQuorum: true, QuorumShortSince: since, Gone: []string{"2@store-2 (down since seq 40)", "3@store-3 (down since seq 31)"},
		Runbook: sched.RecoverCommand(1, "store-1")}
	sh.Why = "lost-quorum: 1 of 3 members running on live stores (a quorum is 2) since ...; recover with " + sh.Runbook
	// The judge judges the stream's shards with the record's verdict.
	s := Status{Term: 2, LeaseHolder: "meta-1", Shards: []projections.Shard{{ID: 1, Members: sh.Members}}}
	rec := &meta.HealthRecord{Leader: "meta-1", Term: 2, At: since.Add(time.Minute), Health: sched.Health{Term: 2, Shards: []sched.ShardHealth{sh}, ShardsWanted: 1}}
	rec.Recovery.State = meta.RecoveryComplete
	problems := judge(s, rec, 0, time.Minute)
	if len(problems) != 1 || !strings.Contains(problems[0], "shard 1: lost-quorum") || !strings.Contains(problems[0], "termlog shard recover --shard 1 --from store-1 --dry-run") {
		t.Fatalf("problems %q, want shard 1 lost-quorum naming the command", problems)
	}
	var b bytes.Buffer
	printHealth(&b, Health{Record: rec, Problems: problems})
	for _, want := range []string{"LOST-QUORUM since 2026-12-01T03:00:00Z", "gone 2@store-2 (down since seq 40) 3@store-3 (down since seq 31)", "run termlog shard recover --shard 1 --from store-1 --dry-run", "DEGRADED"} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status output lacks %q:\n%s", want, b.String())
		}
	}
}
