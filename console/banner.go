package console

import (
	"fmt"
	"slices"

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
)

// Banner is one line of the overview's red banner: a cluster-wide fault
// the operator must act on, with what to do (the README's runbook, "When
// the console shows a red banner").
type Banner struct {
	// Kind is "no-leader", "no-quorum" or "no-raft-leader".
	Kind  string `json:"kind"`
	Shard uint64 `json:"shard,omitempty"`
	// Running and Expected count the shard's replicas, for no-quorum.
	Running  int `json:"running,omitempty"`
	Expected int `json:"expected,omitempty"`
	// Stopped are the members known not to run, "replica@store".
	Stopped []string `json:"stopped,omitempty"`
}

// banners decides the red banner from the lease reading and the leader's
// health record (nil: none published). A shard is short of a quorum only
// on what the leader knows: a member on a store the leader has not heard
// from yet this term (rec.Collecting) may well run, so it neither counts
// as stopped nor raises the banner on its own — the record says
// "collecting reports" until the store reports or its timeout passes.
func banners(leaseHolder, leaseErr string, rec *meta.HealthRecord) []Banner {
	var out []Banner
	if leaseHolder == "" && leaseErr == "" {
		out = append(out, Banner{Kind: "no-leader"})
	}
	if rec == nil {
		return out
	}
	for _, sh := range rec.Shards {
		if b, ok := shardBanner(sh, rec.Collecting); ok {
			out = append(out, b)
		}
	}
	return out
}

func shardBanner(sh sched.ShardHealth, collecting []string) (Banner, bool) {
	quorum := sh.Expected/2 + 1
	var stopped []string
	unheard := 0
	members := make([]uint64, 0, len(sh.Members))
	for r := range sh.Members {
		members = append(members, r)
	}
	slices.Sort(members)
	for _, r := range members {
		if slices.Contains(sh.Running, r) {
			continue
		}
		if slices.Contains(collecting, sh.Members[r]) {
			unheard++
			continue
		}
		stopped = append(stopped, fmt.Sprintf("%d@%s", r, sh.Members[r]))
	}
	switch {
	case sh.Live+unheard < quorum:
		return Banner{Kind: "no-quorum", Shard: sh.Shard, Running: sh.Live, Expected: sh.Expected, Stopped: stopped}, true
	case sh.Live >= quorum && sh.Leader == 0:
		return Banner{Kind: "no-raft-leader", Shard: sh.Shard}, true
	}
	return Banner{}, false
}
