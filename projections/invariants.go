package projections

import (
	"errors"
	"fmt"

	"github.com/termlog/termlog/events"
)

// Violation is one broken invariant.
type Violation struct {
	Seq  uint64 // the state's seq when it was found
	Rule string
	What string
}

func (v Violation) Error() string {
	return fmt.Sprintf("seq %d: invariant %s violated: %s", v.Seq, v.Rule, v.What)
}

// Invariant names.
const (
	RuleOneWorkerPerEndpoint = "one-worker-per-endpoint"
	RuleWorkerIDs            = "worker-ids-below-next"
	RuleWorkerTerm           = "worker-term-not-above-current"
	RuleTermMonotonic        = "term-never-decreases"
	RuleSeqMonotonic         = "seq-never-decreases"
	RuleMembersOnStores      = "members-on-registered-stores"
	RuleMemberNotRemoved     = "member-not-removed"
	RuleOneReplicaPerStore   = "one-replica-per-store"
	RuleOperatorsOnShards    = "operators-on-shards"
	RuleUniqueRaftAddr       = "unique-raft-addresses"
	RuleLeaderIsMember       = "leader-is-member"
)

// CheckInvariants returns nil or an error joining every Violation found.
func (s *State) CheckInvariants() error {
	if s.invariantsHold() {
		return nil
	}
	return s.violations()
}

// violations names every broken invariant, in a stable order.
func (s *State) violations() error {
	var vs []error
	bad := func(rule, format string, a ...any) {
		vs = append(vs, Violation{Seq: s.Seq, Rule: rule, What: fmt.Sprintf(format, a...)})
	}
	for _, id := range sortedKeys(s.Workers) {
		w := s.Workers[id]
		if w == nil {
			bad(RuleOneWorkerPerEndpoint, "worker %d is nil", id)
			continue
		}
		if w.ID != id {
			bad(RuleOneWorkerPerEndpoint, "worker keyed %d has id %d", id, w.ID)
		}
		if got, ok := s.Endpoints[w.Endpoint]; !ok || got != id {
			bad(RuleOneWorkerPerEndpoint, "worker %d at %s but the endpoint maps to %d", id, w.Endpoint, got)
		}
		if id >= s.NextWorkerID {
			bad(RuleWorkerIDs, "worker %d >= next worker id %d", id, s.NextWorkerID)
		}
		if w.Term > s.Term {
			bad(RuleWorkerTerm, "worker %d registered in term %d > current %d", id, w.Term, s.Term)
		}
	}
	for _, ep := range sortedKeys(s.Endpoints) {
		id := s.Endpoints[ep]
		if w, ok := s.Workers[id]; !ok || w == nil || w.Endpoint != ep {
			bad(RuleOneWorkerPerEndpoint, "endpoint %s maps to worker %d which is not active there", ep, id)
		}
	}
	addrs := map[string]string{}
	for _, id := range sortedKeys(s.Stores) {
		st := s.Stores[id]
		if st == nil || st.State == events.StoreTombstone {
			continue
		}
		if other, ok := addrs[st.RaftAddr]; ok {
			bad(RuleUniqueRaftAddr, "stores %s and %s share %s", other, id, st.RaftAddr)
		}
		addrs[st.RaftAddr] = id
	}
	for _, id := range sortedKeys(s.Shards) {
		sh := s.Shards[id]
		if sh == nil {
			bad(RuleMembersOnStores, "shard %d is nil", id)
			continue
		}
		perStore := map[string]uint64{}
		for _, r := range sortedKeys(sh.Members) {
			st := sh.Members[r]
			if !s.registeredStore(st) {
				bad(RuleMembersOnStores, "shard %d replica %d on unregistered store %q", id, r, st)
			}
			if _, ok := sh.Removed[r]; ok {
				bad(RuleMemberNotRemoved, "shard %d replica %d is both member and removed", id, r)
			}
			if other, ok := perStore[st]; ok {
				bad(RuleOneReplicaPerStore, "shard %d replicas %d and %d on store %s", id, other, r, st)
			}
			perStore[st] = r
		}
		if sh.Leader != 0 && !sh.IsMember(sh.Leader) {
			bad(RuleLeaderIsMember, "shard %d leader %d is not a member", id, sh.Leader)
		}
		if sh.Operator != "" {
			if op, ok := s.Operators[sh.Operator]; !ok || op == nil || op.Shard != id {
				bad(RuleOperatorsOnShards, "shard %d names operator %s which is not running on it", id, sh.Operator)
			}
		}
	}
	for _, id := range sortedKeys(s.Operators) {
		op := s.Operators[id]
		if op == nil {
			bad(RuleOperatorsOnShards, "operator %s is nil", id)
			continue
		}
		if sh, ok := s.Shards[op.Shard]; !ok || sh.Operator != id {
			bad(RuleOperatorsOnShards, "operator %s runs on shard %d which does not name it", id, op.Shard)
		}
	}
	return errors.Join(vs...)
}

// CheckStep checks what must hold between two consecutive states: the term
// and the seq never decrease.
func CheckStep(before Provenance, after *State) error {
	var vs []error
	if after.Term < before.Term {
		vs = append(vs, Violation{Seq: after.Seq, Rule: RuleTermMonotonic, What: fmt.Sprintf("term went from %d to %d", before.Term, after.Term)})
	}
	if after.Seq < before.Seq {
		vs = append(vs, Violation{Seq: after.Seq, Rule: RuleSeqMonotonic, What: fmt.Sprintf("seq went from %d to %d", before.Seq, after.Seq)})
	}
	return errors.Join(vs...)
}

// invariantsHold is CheckInvariants' fast path, for checks after every
// event (replay --check, scripts): the same rules without sorting or
// allocating; when it says no, CheckInvariants names the violations in a
// stable order.
func (s *State) invariantsHold() bool {
	for id, w := range s.Workers {
		if w == nil || w.ID != id || id >= s.NextWorkerID || w.Term > s.Term {
			return false
		}
		if got, ok := s.Endpoints[w.Endpoint]; !ok || got != id {
			return false
		}
	}
	for ep, id := range s.Endpoints {
		if w, ok := s.Workers[id]; !ok || w == nil || w.Endpoint != ep {
			return false
		}
	}
	live := func(st *Store) bool { return st != nil && st.State != events.StoreTombstone }
	if n := len(s.Stores); n > 32 {
		addrs := make(map[string]bool, n)
		for _, st := range s.Stores {
			if live(st) {
				if addrs[st.RaftAddr] {
					return false
				}
				addrs[st.RaftAddr] = true
			}
		}
	} else if n > 1 {
		for id, st := range s.Stores {
			for id2, st2 := range s.Stores {
				if id2 != id && live(st) && live(st2) && st.RaftAddr == st2.RaftAddr {
					return false
				}
			}
		}
	}
	for id, sh := range s.Shards {
		if sh == nil {
			return false
		}
		for r, st := range sh.Members {
			if !s.registeredStore(st) {
				return false
			}
			if _, ok := sh.Removed[r]; ok {
				return false
			}
			for r2, st2 := range sh.Members {
				if r2 != r && st2 == st {
					return false
				}
			}
		}
		if sh.Leader != 0 && !sh.IsMember(sh.Leader) {
			return false
		}
		if sh.Operator != "" {
			if op, ok := s.Operators[sh.Operator]; !ok || op == nil || op.Shard != id {
				return false
			}
		}
	}
	for id, op := range s.Operators {
		if op == nil {
			return false
		}
		if sh, ok := s.Shards[op.Shard]; !ok || sh == nil || sh.Operator != id {
			return false
		}
	}
	return true
}
