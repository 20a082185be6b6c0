package logstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"time"

	"github.com/lni/dragonboat/v4"

	"github.com/termlog/termlog/meta/client"
)

// Membership is a shard's membership as Raft has applied it, read
// linearizably through a local replica.
type Membership struct {
	Replicas  map[uint64]string   `json:"replicas"` // voting replica id -> raft address
	NonVoting map[uint64]string   `json:"non_voting,omitempty"`
	Witnesses map[uint64]string   `json:"witnesses,omitempty"`
	Removed   map[uint64]struct{} `json:"removed,omitempty"` // ids that can never be added back
	CCID      uint64              `json:"ccid"`              // index of the last applied config change
}

// IsMember reports whether replica is a voting, non-voting or witness member.
func (m *Membership) IsMember(replica uint64) bool {
	if m == nil {
		return false
	}
	_, a := m.Replicas[replica]
	_, b := m.NonVoting[replica]
	_, c := m.Witnesses[replica]
	return a || b || c
}

// IsRemoved reports whether replica was removed from the shard.
func (m *Membership) IsRemoved(replica uint64) bool {
	if m == nil {
		return false
	}
	_, ok := m.Removed[replica]
	return ok
}

// holder returns the member replica at addr, if any.
func (m *Membership) holder(addr string) (uint64, bool) {
	for _, set := range []map[uint64]string{m.Replicas, m.NonVoting, m.Witnesses} {
		for r, a := range set {
			if a == addr {
				return r, true
			}
		}
	}
	return 0, false
}

// Membership reads the shard's applied membership through the local replica.
// It is a linearizable read and needs a leader: attempts that find the shard
// not ready, busy, or that time out (a read sent while the leader changes
// can be dropped silently) are retried until ctx ends. Without a deadline
// ctx is bounded by 10s.
func (h *Host) Membership(ctx context.Context, shard uint64) (*Membership, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	return h.readMembership(ctx, shard)
}

// membershipOnce is one linearizable membership read.
func (h *Host) membershipOnce(ctx context.Context, shard uint64) (*Membership, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	nh, release := h.acquire()
	m, err := nh.SyncGetShardMembership(ctx, shard)
	release()
	if err != nil {
		return nil, fmt.Errorf("logstore: membership of shard %d: %w", shard, err)
	}
	return &Membership{
		Replicas:  maps.Clone(m.Nodes),
		NonVoting: maps.Clone(m.NonVotings),
		Witnesses: maps.Clone(m.Witnesses),
		Removed:   maps.Clone(m.Removed),
		CCID:      m.ConfigChangeID,
	}, nil
}

// Outcome classifies a config change.
type Outcome int

// Outcomes of a config change step.
const (
	// Applied: Raft applied the change (or the membership already showed
	// it); Result.CCID is the config change id read after it.
	Applied Outcome = iota + 1
	// Rejected: Raft (or the pre-check against the fresh membership)
	// refused the change: stale config change id, id already removed,
	// target address still held by a member. Re-read membership and
	// re-plan; do not retry the same step blindly.
	Rejected
	// Retry: the shard stayed not ready or busy (no leader, a pending
	// config change, a full queue) until the step context ended. Nothing
	// was applied.
	Retry
	// Unknown: the request timed out and the membership read after it
	// does not show the change: it may still apply later. Re-read before
	// retrying.
	Unknown
	// Failed: the change could not be requested here (the shard does not
	// run on this store, the NodeHost is closed, an invalid request).
	Failed
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Rejected:
		return "rejected"
	case Retry:
		return "retry"
	case Unknown:
		return "unknown"
	case Failed:
		return "failed"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Result is the outcome of one config change step.
type Result struct {
	Outcome Outcome
	// Already is set when the membership read before the request already
	// showed the change: nothing was proposed.
	Already bool
	// UsedCCID is the config change id passed with the last request (0 if
	// none was sent).
	UsedCCID uint64
	// CCID is the config change id of the last membership read (after the
	// change when Applied).
	CCID uint64
	// Membership is the last membership read, if any.
	Membership *Membership
	// Attempts counts the requests sent to Raft.
	Attempts int
	// Reason says why, for Rejected, Retry, Unknown and Failed.
	Reason string
	// Err is the last error from dragonboat, if any.
	Err error
}

func (r Result) String() string {
	s := fmt.Sprintf("%s ccid=%d used_ccid=%d attempts=%d", r.Outcome, r.CCID, r.UsedCCID, r.Attempts)
	if r.Already {
		s += " already"
	}
	if r.Reason != "" {
		s += " reason=" + r.Reason
	}
	return s
}

// change is one config change: how to request it and how to see it.
type change struct {
	what string
	// base, when not 0, is the config change id the change was decided on:
	// a membership that moved past it (and does not show the change) is
	// not the one the decision's rules were checked against, so the change
	// is rejected without a proposal.
	base    uint64
	request func(ctx context.Context, ccid uint64) error
	// check returns (done, reject reason) against a fresh membership.
	check func(m *Membership) (done bool, reject string)
	// visible reports whether m shows the change applied.
	visible func(m *Membership) bool
}

// AddReplica adds replica at addr to the shard through the local live
// member, passing the config change id read right before. The new replica
// is not started here: its store starts it (join) once the addition is
// recorded. ctx bounds the step (retries included); give it a deadline.
func (h *Host) AddReplica(ctx context.Context, shard, replica uint64, addr string) Result {
	return h.AddReplicaOn(ctx, shard, replica, addr, 0)
}

// AddReplicaOn is AddReplica decided on the membership at config change id
// base: if Raft's membership moved past base (and does not show the
// addition), it is Rejected without a proposal. 0 checks nothing.
func (h *Host) AddReplicaOn(ctx context.Context, shard, replica uint64, addr string, base uint64) Result {
	return h.execute(ctx, shard, change{
		base: base,
		what: fmt.Sprintf("add replica %d at %s to shard %d", replica, addr, shard),
		request: func(ctx context.Context, ccid uint64) error {
			nh, release := h.acquire()
			defer release()
			return nh.SyncRequestAddReplica(ctx, shard, replica, addr, ccid)
		},
		check: func(m *Membership) (bool, string) {
			if a, ok := m.Replicas[replica]; ok {
				if a == addr {
					return true, ""
				}
				return false, fmt.Sprintf("replica %d is already a member at %s", replica, a)
			}
			if m.IsRemoved(replica) {
				return false, fmt.Sprintf("replica %d was removed from shard %d; ids are never reused", replica, shard)
			}
			if r, ok := m.holder(addr); ok && r != replica {
				return false, fmt.Sprintf("address %s is still held by member replica %d", addr, r)
			}
			return false, ""
		},
		visible: func(m *Membership) bool { return m.Replicas[replica] == addr },
	})
}

// RemoveReplica removes replica from the shard through the local live
// member, passing the config change id read right before. A replica that is
// not a member is Applied with Already set (the goal holds; nothing is
// proposed). ctx bounds the step; give it a deadline.
func (h *Host) RemoveReplica(ctx context.Context, shard, replica uint64) Result {
	return h.RemoveReplicaOn(ctx, shard, replica, 0)
}

// RemoveReplicaOn is RemoveReplica decided on the membership at config
// change id base (see AddReplicaOn).
func (h *Host) RemoveReplicaOn(ctx context.Context, shard, replica, base uint64) Result {
	return h.execute(ctx, shard, change{
		base: base,
		what: fmt.Sprintf("remove replica %d from shard %d", replica, shard),
		request: func(ctx context.Context, ccid uint64) error {
			nh, release := h.acquire()
			defer release()
			return nh.SyncRequestDeleteReplica(ctx, shard, replica, ccid)
		},
		check: func(m *Membership) (bool, string) {
			return !m.IsMember(replica), ""
		},
		visible: func(m *Membership) bool { return !m.IsMember(replica) },
	})
}

// GiveUp fences the shard's config change id base: it proposes, at base,
// the removal of client.FenceReplica(base), a replica id no replica ever
// has: a config change of no member that moves Raft's config change id
// past base. Every change the scheduler asks for names the id it was
// decided on (AddReplicaOn, RemoveReplicaOn) and OrderedConfigChange
// applies a change only at the id it names, so once the fence applied no
// proposal at base can apply any more: a late one, of a step the leader
// gives up, is rejected. The leader fails a step that sent its change only
// after this (client.ExecGiveUp).
//
// Applied: the fence applied (now or by an earlier give-up); CCID is
// Raft's config change id read after it. Rejected: Raft's id had moved
// past base already and nothing was proposed (or the fence lost the race
// to another change at base): Membership shows what moved it. Retry,
// Unknown: no outcome; give up again. ctx bounds it; give it a deadline.
func (h *Host) GiveUp(ctx context.Context, shard, base uint64) Result {
	fence := client.FenceReplica(base)
	if base == 0 {
		return Result{Outcome: Failed, Reason: "no config change id to fence"}
	}
	return h.execute(ctx, shard, change{
		base: base,
		what: fmt.Sprintf("fence config change id %d of shard %d (remove replica id %d, no member)", base, shard, fence),
		request: func(ctx context.Context, ccid uint64) error {
			nh, release := h.acquire()
			defer release()
			return nh.SyncRequestDeleteReplica(ctx, shard, fence, ccid)
		},
		check: func(m *Membership) (bool, string) {
			return m.IsRemoved(fence), ""
		},
		visible: func(m *Membership) bool { return m.IsRemoved(fence) },
	})
}

// removeReplicaWithCCID sends a removal with a caller-chosen config change
// id (tests: a stale id must be Rejected).
func (h *Host) removeReplicaWithCCID(ctx context.Context, shard, replica, ccid uint64) Result {
	return h.executeOnce(ctx, shard, ccid, change{
		what: fmt.Sprintf("remove replica %d from shard %d", replica, shard),
		request: func(ctx context.Context, ccid uint64) error {
			nh, release := h.acquire()
			defer release()
			return nh.SyncRequestDeleteReplica(ctx, shard, replica, ccid)
		},
		visible: func(m *Membership) bool { return !m.IsMember(replica) },
	})
}

// retryable errors: nothing was appended, try again.
func retryable(err error) bool {
	return errors.Is(err, dragonboat.ErrShardNotReady) ||
		errors.Is(err, dragonboat.ErrSystemBusy) ||
		errors.Is(err, dragonboat.ErrShardNotInitialized) ||
		errors.Is(err, dragonboat.ErrAborted)
}

// outcomeUnknown errors: the request may have been appended.
func outcomeUnknown(err error) bool {
	return errors.Is(err, dragonboat.ErrTimeout) ||
		errors.Is(err, dragonboat.ErrCanceled) ||
		errors.Is(err, context.DeadlineExceeded) ||
		errors.Is(err, context.Canceled)
}

func (h *Host) sleepCtx(ctx context.Context, wait *time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-h.clock.After(*wait):
	}
	*wait = min(*wait*2, 500*time.Millisecond)
	return true
}

// attemptTimeout bounds one request or read inside a step: a request sent
// while the leader changes can be dropped silently and would otherwise eat
// the whole step.
func (h *Host) attemptTimeout() time.Duration {
	return max(5*h.electionTimeout(), time.Second)
}

// verifyTimeout bounds the membership read after an unknown outcome when
// the step context has already ended, so that Unknown is only reported when
// the change is really not visible. It is the only time a step overruns its
// context.
func (h *Host) verifyTimeout() time.Duration {
	return max(3*h.electionTimeout(), time.Second)
}

// readMembership reads the membership, retrying not-ready, busy and
// per-attempt timeouts until ctx ends.
func (h *Host) readMembership(ctx context.Context, shard uint64) (*Membership, error) {
	wait := 20 * time.Millisecond
	for {
		actx, cancel := context.WithTimeout(ctx, h.attemptTimeout())
		m, err := h.membershipOnce(actx, shard)
		cancel()
		if err == nil {
			return m, nil
		}
		if !retryable(err) && !outcomeUnknown(err) {
			return nil, err
		}
		if ctx.Err() != nil || !h.sleepCtx(ctx, &wait) {
			return nil, err
		}
	}
}

// verify reads the membership after a request; when ctx has ended it uses a
// fresh context bounded by verifyTimeout.
func (h *Host) verify(ctx context.Context, shard uint64) (*Membership, error) {
	if ctx.Err() == nil {
		if dl, ok := ctx.Deadline(); ok && dl.Sub(h.clock.Now()) > h.verifyTimeout() {
			return h.readMembership(ctx, shard)
		}
	}
	vctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), h.verifyTimeout())
	defer cancel()
	return h.readMembership(vctx, shard)
}

// execute runs one config change step until it has an outcome or ctx ends.
// Each request carries the config change id read right before it; with
// OrderedConfigChange at most one request based on a given id can apply, so
// re-sending after a timeout inside the step is safe: a duplicate is
// rejected, and a rejection whose change is visible is reported as Applied.
func (h *Host) execute(ctx context.Context, shard uint64, c change) Result {
	var (
		res      Result
		inFlight bool // a request timed out and may still apply
	)
	end := func(reason string) Result {
		if inFlight {
			res.Outcome, res.Reason = Unknown, "timed out; the change may still apply"
		} else {
			res.Outcome, res.Reason = Retry, reason
		}
		h.logger.Warn().Str("change", c.what).Stringer("outcome", res.Outcome).Str("reason", reason).Msg("config change step ended without an outcome")
		return res
	}
	wait := 20 * time.Millisecond
	for {
		m, err := h.readMembership(ctx, shard)
		if err != nil {
			res.Err = err
			if retryable(err) || outcomeUnknown(err) {
				return end("membership unreadable: " + err.Error())
			}
			res.Outcome, res.Reason = Failed, "membership unreadable here: "+err.Error()
			return res
		}
		res.Membership, res.CCID = m, m.CCID
		if done, reject := c.check(m); done {
			res.Outcome, res.Already, res.Reason = Applied, res.Attempts == 0, ""
			return res
		} else if reject != "" {
			res.Outcome, res.Reason = Rejected, reject
			return res
		}
		if c.base != 0 && m.CCID != c.base {
			res.Outcome, res.Reason = Rejected, fmt.Sprintf("membership moved since the change was decided (config change id %d, now %d)", c.base, m.CCID)
			return res
		}
		step := h.executeOnce(ctx, shard, m.CCID, c)
		step.Attempts += res.Attempts
		res = step
		switch step.Outcome {
		case Applied, Failed:
			return res
		case Rejected:
			if res.Membership != nil && res.Membership.CCID != m.CCID && c.visible(res.Membership) {
				// An earlier request of this step (or another executor)
				// applied the same change first.
				res.Outcome, res.Reason = Applied, ""
			}
			return res
		case Unknown:
			inFlight = true
		}
		if ctx.Err() != nil || !h.sleepCtx(ctx, &wait) {
			return end("shard not ready: " + errString(res.Err))
		}
	}
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// executeOnce sends one request with ccid and classifies it.
func (h *Host) executeOnce(ctx context.Context, shard, ccid uint64, c change) Result {
	res := Result{UsedCCID: ccid, CCID: ccid, Attempts: 1}
	rctx, cancel := context.WithTimeout(ctx, h.attemptTimeout())
	err := c.request(rctx, ccid)
	cancel()
	res.Err = err
	lg := h.logger.With().Str("change", c.what).Uint64("ccid", ccid).Logger()
	switch {
	case err == nil:
		res.Outcome = Applied
		if m, err := h.verify(ctx, shard); err == nil {
			res.Membership, res.CCID = m, m.CCID
		} else {
			lg.Warn().Err(err).Msg("config change applied; membership read after it failed")
		}
		lg.Info().Uint64("new_ccid", res.CCID).Msg("config change applied")
	case errors.Is(err, dragonboat.ErrRejected):
		res.Outcome, res.Reason = Rejected, "rejected by raft (stale config change id, removed id or address still a member)"
		if m, err := h.verify(ctx, shard); err == nil {
			res.Membership, res.CCID = m, m.CCID
		}
		lg.Warn().Uint64("fresh_ccid", res.CCID).Msg("config change rejected")
	case retryable(err):
		res.Outcome, res.Reason = Retry, err.Error()
	case outcomeUnknown(err):
		m, verr := h.verify(ctx, shard)
		if verr == nil {
			res.Membership, res.CCID = m, m.CCID
			if c.visible(m) {
				res.Outcome = Applied
				lg.Info().Uint64("new_ccid", res.CCID).Msg("config change timed out but is visible: applied")
				return res
			}
		}
		res.Outcome, res.Reason = Unknown, "timed out; the change may still apply"
		lg.Warn().Err(err).Msg("config change outcome unknown")
	default:
		res.Outcome, res.Reason = Failed, err.Error()
		lg.Warn().Err(err).Msg("config change failed")
	}
	return res
}
