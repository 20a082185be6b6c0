package client

import (
	"fmt"

	"github.com/termlog/termlog/projections"
)

// ExecVerdict is what a store does with a config change (CheckExec).
type ExecVerdict int

// Verdicts.
const (
	// ExecRun: the change is the next step of a running operator of the
	// current term, recorded as an intent in the store's own projection.
	ExecRun ExecVerdict = iota + 1
	// ExecDone: the projection already records the change's outcome:
	// propose nothing and answer applied (a retried step is idempotent).
	ExecDone
	// ExecWait: the projection has not folded the intent yet; wait for
	// it (bounded) and check again.
	ExecWait
	// ExecRefuse: not this store's to run: a deposed leader's step, an
	// operator that is not running, an intent that is not the one named.
	ExecRefuse
)

func (v ExecVerdict) String() string {
	switch v {
	case ExecRun:
		return "run"
	case ExecDone:
		return "done"
	case ExecWait:
		return "wait"
	case ExecRefuse:
		return "refuse"
	}
	return fmt.Sprintf("verdict(%d)", int(v))
}

// CheckExec is the store side of the fence on config changes (pure): a
// change runs only when the store's projection v holds its intent — the
// shard.replica.adding/removing event at req.Intent, of operator
// req.Operator, not yet resolved — under req.Term, and that term is still
// the current one. The reason says why for every verdict but ExecRun.
// Membership reads are not fenced; CheckExec runs them. A give-up
// (ExecGiveUp) is fenced by the same checks but one: it runs only for the
// pending intent of a running operator under the current term (a deposed
// leader gives nothing up), which may be an operator the current leader
// inherited from an earlier term; it never answers ExecDone.
func CheckExec(v *projections.State, req ExecRequest) (ExecVerdict, string) {
	if req.Op == ExecMembership || req.Op == ExecApplied {
		return ExecRun, ""
	}
	if v == nil {
		return ExecWait, "no projection yet"
	}
	if req.Term == 0 || req.Operator == "" || req.Intent == 0 {
		return ExecRefuse, "unfenced config change: no term, operator or intent"
	}
	if v.Term > req.Term {
		return ExecRefuse, fmt.Sprintf("term %d is over: the projection is at term %d", req.Term, v.Term)
	}
	if v.Seq < req.Intent {
		return ExecWait, fmt.Sprintf("projection at seq %d, intent at %d", v.Seq, req.Intent)
	}
	if v.Term < req.Term {
		return ExecRefuse, fmt.Sprintf("term %d never started here (projection at term %d, seq %d)", req.Term, v.Term, v.Seq)
	}
	sh, ok := v.Shards[req.Shard]
	if !ok {
		return ExecRefuse, fmt.Sprintf("unknown shard %d", req.Shard)
	}
	if req.Op != ExecGiveUp {
		if done, why := outcomeRecorded(v, sh, req); done {
			return ExecDone, why
		}
	}
	op, ok := v.Operators[req.Operator]
	if !ok || op.Shard != req.Shard {
		return ExecRefuse, fmt.Sprintf("operator %s is not running on shard %d", req.Operator, req.Shard)
	}
	if op.Term != req.Term && (req.Op != ExecGiveUp || op.Term > req.Term) {
		// A give-up may name an older term's operator: the current
		// leader gives up what it inherited before failing it.
		return ExecRefuse, fmt.Sprintf("operator %s belongs to term %d, not %d", op.ID, op.Term, req.Term)
	}
	p, ok := sh.Pending[req.Replica]
	if !ok {
		return ExecRefuse, fmt.Sprintf("no pending change of replica %d of shard %d", req.Replica, req.Shard)
	}
	if p.Op != req.Operator || p.Seq != req.Intent {
		return ExecRefuse, fmt.Sprintf("the pending change of replica %d is intent %d of %s, not intent %d of %s", req.Replica, p.Seq, p.Op, req.Intent, req.Operator)
	}
	if req.Op == ExecGiveUp {
		return ExecRun, ""
	}
	want := projections.PendingRemoving
	if req.Op == ExecAdd {
		want = projections.PendingAdding
	}
	if p.Kind != want {
		return ExecRefuse, fmt.Sprintf("replica %d is %s, not %s", req.Replica, p.Kind, want)
	}
	for r, q := range sh.Pending {
		if q.Op == req.Operator && q.Seq < p.Seq {
			return ExecRefuse, fmt.Sprintf("intent %d (replica %d) of %s comes first", q.Seq, r, req.Operator)
		}
	}
	if req.Op == ExecAdd {
		st := v.Stores[p.Store]
		if st == nil || st.RaftAddr != req.Addr {
			return ExecRefuse, fmt.Sprintf("replica %d is to be added on store %s, not at %s", req.Replica, p.Store, req.Addr)
		}
	}
	return ExecRun, ""
}

// outcomeRecorded reports whether v already records what req asks for.
func outcomeRecorded(v *projections.State, sh *projections.Shard, req ExecRequest) (bool, string) {
	if _, pending := sh.Pending[req.Replica]; pending {
		return false, ""
	}
	switch req.Op {
	case ExecRemove:
		if _, gone := sh.Removed[req.Replica]; gone {
			return true, fmt.Sprintf("replica %d of shard %d is recorded as removed", req.Replica, req.Shard)
		}
	case ExecAdd:
		if st, ok := sh.Members[req.Replica]; ok {
			if s := v.Stores[st]; s != nil && s.RaftAddr == req.Addr {
				return true, fmt.Sprintf("replica %d of shard %d is recorded as added on %s", req.Replica, req.Shard, st)
			}
		}
	}
	return false, ""
}
