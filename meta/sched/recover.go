package sched

import (
	"fmt"
	"maps"
	"slices"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// PlanRecovery plans an operator's recovery of a shard that lost its quorum
// (termlog shard recover): rebuild it as a one-member shard from its replica
// on req.From. h is the shard's health as the leader last decided it, asked
// what every member store said of its replica (client.ExecApplied). It
// refuses, with the reason, when a quorum of members still runs or the
// running ones follow a Raft leader (Raft can repair the shard itself), when req.From holds no running replica of the
// shard, or when another store's replica applied more (unless req.Force:
// its entries past req.From's would be lost). The event is shard.recovered,
// to append with the leader's fence when req.Yes and not req.DryRun.
func PlanRecovery(v *projections.State, h *ShardHealth, req client.RecoverRequest, asked []client.ReplicaApplied) (client.RecoveryPlan, events.ShardRecovered, error) {
	var none events.ShardRecovered
	sh := v.Shards[req.Shard]
	if sh == nil {
		return client.RecoveryPlan{}, none, fmt.Errorf("shard %d does not exist", req.Shard)
	}
	plan := client.RecoveryPlan{Shard: req.Shard, Store: req.From, Members: maps.Clone(sh.Members), Asked: asked}
	if h == nil {
		return plan, none, fmt.Errorf("shard %d: the leader has no health of it yet; try again in a moment", req.Shard)
	}
	if q := quorum(len(sh.Members)); h.Live >= q {
		return plan, none, fmt.Errorf("shard %d: a quorum is still alive (%d of %d members running on live stores, a quorum is %d): Raft repairs it itself; nothing to recover", req.Shard, h.Live, len(sh.Members), q)
	}
	if h.Leader != 0 {
		// Silence is not death: members that stopped reporting may still
		// form a quorum with a leader the running ones follow.
		return plan, none, fmt.Errorf("shard %d: its running members follow Raft leader %d: a quorum is still alive (stores silent to meta may still serve Raft); nothing to recover", req.Shard, h.Leader)
	}
	var replica uint64
	for _, r := range slices.Sorted(maps.Keys(sh.Members)) {
		if sh.Members[r] == req.From {
			replica = r
		}
	}
	if replica == 0 {
		return plan, none, fmt.Errorf("store %s does not hold shard %d (members %s)", req.From, req.Shard, members(sh.Members))
	}
	plan.Replica = replica
	var mine *client.ReplicaApplied
	best := client.ReplicaApplied{}
	for i := range asked {
		a := asked[i]
		if a.Error != "" || sh.Members[a.Replica] != a.Store {
			continue
		}
		if a.Store == req.From {
			mine = &asked[i]
		}
		if a.Applied > best.Applied {
			best = a
		}
	}
	if mine == nil {
		why := "it did not answer"
		for _, a := range asked {
			if a.Store == req.From && a.Error != "" {
				why = a.Error
			}
		}
		return plan, none, fmt.Errorf("store %s does not hold shard %d running (replica %d): %s", req.From, req.Shard, replica, why)
	}
	plan.Applied = mine.Applied
	if best.Applied > mine.Applied {
		plan.Lost = best.Applied - mine.Applied
		if !req.Force {
			return plan, none, fmt.Errorf("store %s's replica %d of shard %d applied up to index %d, more than %s's %d: recover from %s, or --force to lose the entries after %d",
				best.Store, best.Replica, req.Shard, best.Applied, req.From, mine.Applied, best.Store, mine.Applied)
		}
	}
	plan.Gone = map[uint64]string{}
	for r, st := range sh.Members {
		if r != replica {
			plan.Gone[r] = st
		}
	}
	for r, p := range sh.Pending {
		if r != replica && !sh.IsMember(r) {
			plan.Gone[r] = p.Store
		}
	}
	plan.After = map[uint64]string{replica: req.From}
	ev := events.ShardRecovered{Shard: req.Shard, Replica: replica, Store: req.From, Applied: mine.Applied, Gone: maps.Clone(plan.Gone), Operator: req.Operator,
		Reason: fmt.Sprintf("%d of %d members running on live stores", h.Live, len(sh.Members))}
	if h.LostQuorum {
		ev.Reason = "lost-quorum: " + ev.Reason
	}
	return plan, ev, nil
}

func members(m map[uint64]string) string {
	s := "{"
	for i, r := range slices.Sorted(maps.Keys(m)) {
		if i > 0 {
			s += " "
		}
		s += fmt.Sprintf("%d:%s", r, m[r])
	}
	return s + "}"
}
