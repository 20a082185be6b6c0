package meta

import (
	"context"
	"errors"
	"time"

	"github.com/termlog/termlog/events/natslog"
)

// campaign takes the lease whenever it is free and leads under it, until
// ctx is done. When to try again is CampaignWait's decision.
func (r *Replica) campaign(ctx context.Context) {
	ttl := r.cfg.LeaseTTL
	var failing time.Time // since when tries go unanswered (zero: they are answered)
	for ctx.Err() == nil {
		// Each attempt bounded: a lease bucket electing a leader leaves a
		// request unanswered however long one waits, and answers the next
		// one once it has a leader.
		actx, acancel := context.WithTimeout(ctx, campaignAttempt(ttl))
		lease, err := r.cfg.Lease.Acquire(actx, r.cfg.ID)
		acancel()
		if err != nil && ctx.Err() != nil {
			return
		}
		now := r.cfg.Clock.Now()
		failing = r.logCampaign(err, failing, now)
		if err == nil {
			r.leadThenFollow(ctx, lease)
			continue
		}
		r.sleep(ctx, CampaignWait(ttl, err, now))
	}
}

// logCampaign says what a try for the lease found, once per outage of the
// bucket, and returns since when tries go unanswered.
func (r *Replica) logCampaign(err error, failing, now time.Time) time.Time {
	switch {
	case err == nil || errors.Is(err, ErrLeaseHeld):
		if !failing.IsZero() {
			r.log.Info().Dur("for", now.Sub(failing)).Msg("lease bucket answers again")
		}
		return time.Time{}
	case natslog.Unanswered(err):
		if failing.IsZero() {
			r.log.Warn().Err(err).Msg("campaign: the lease bucket does not answer (electing a leader?); trying again every " + CampaignFast(r.cfg.LeaseTTL).String())
			return now
		}
		return failing
	default:
		r.log.Warn().Err(err).Msg("campaign failed")
		return failing
	}
}

// campaignAttempt bounds one try for the lease: lease/3, at least 1 s. A
// Create stored but answered after the bound leaves the lease held by this
// replica unknowingly until it lapses, so the bound is not tight: a
// bucket without a leader answers "no responders" at once anyway.
func campaignAttempt(ttl time.Duration) time.Duration { return max(ttl/3, time.Second) }

// CampaignFast is the pause between tries once the lease is due to be free
// or while the bucket does not answer: ttl/60, at most 50 ms.
func CampaignFast(ttl time.Duration) time.Duration { return min(ttl/60, 50*time.Millisecond) }

// CampaignWait decides how long a follower waits before its next try for
// the lease, from the last try's error err (a *LeaseHeldError carries the
// held lease's last renewal as the server dated it) and now.
//
//   - Held, renewed known: until the lease is due to lapse (renewed + ttl),
//     but at most ttl/6, so that a release is seen soon; from then on every
//     CampaignFast, until the server drops the key (about ttl after the
//     last renewal, with no notification to watch for). Before this, every
//     follower tried every ttl/6 throughout, so the lease was taken up to
//     ttl/6 after it lapsed (failover at 30,000 workers on R3: term.started
//     3.65 s after the leader's kill, lease 3 s).
//   - Held, renewal unknown, or any other failure: ttl/6.
//   - Unanswered (the bucket is electing a leader, or its leader's node is
//     gone): CampaignFast, since the attempt itself already waited; the
//     next one that is answered is the first after the election.
//
// The server alone decides when the lease is free: the clocks' skew only
// moves the tries, never who holds the lease.
func CampaignWait(ttl time.Duration, err error, now time.Time) time.Duration {
	slow, fast := ttl/6, CampaignFast(ttl)
	var held *LeaseHeldError
	switch {
	case errors.As(err, &held) && !held.Renewed.IsZero():
		return min(slow, max(fast, held.Renewed.Add(ttl).Sub(now)))
	case !errors.Is(err, ErrLeaseHeld) && natslog.Unanswered(err):
		return fast
	default:
		return slow
	}
}
