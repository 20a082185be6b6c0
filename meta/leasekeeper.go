package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
)

// leaseKeeper keeps one term's lease: it renews it every lease/3, asks a
// renewal that goes unanswered again within the lease, and ends the term
// (lose) when a renewal is refused or lease*2/3 passes without a stored
// renewal. Before every append, exec and health write the leader asks it
// whether it may act (mayAppend, leaseFresh).
//
// Its only mutable state is when the last stored renewal was sent
// (renewed): the renewal loop writes it; the watchdog and the checks read
// it.
type leaseKeeper struct {
	lease      Lease
	ttl        time.Duration
	clock      clock.Clock
	failpoints *failpoint.Set
	nc         *nats.Conn     // the replica's connection (nil: none), which the log shares
	leaving    *atomic.Bool   // the replica's NATS server is in lame-duck mode
	stale      *atomic.Uint64 // the replica's count of appends refused for a stale lease
	lose       func(reason string)
	logger     zerolog.Logger

	renewed      atomicTime  // when the last stored renewal was sent
	staleCounted atomic.Bool // leaseFresh counted its refusal for this term
}

// newLeaseKeeper keeps the lease r has just taken: the lease runs from now.
func newLeaseKeeper(r *Replica, logger zerolog.Logger, lose func(string)) *leaseKeeper {
	k := &leaseKeeper{
		lease: r.cfg.Lease, ttl: r.cfg.LeaseTTL, clock: r.cfg.Clock, failpoints: r.cfg.Failpoints,
		nc: r.cfg.NC, leaving: &r.leaving, stale: &r.stale, lose: lose, logger: logger,
	}
	k.renewed.Store(r.cfg.Clock.Now())
	return k
}

// keep renews the lease and watches its age until ctx is done (the term
// ends); it returns once both have stopped.
func (k *leaseKeeper) keep(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Go(func() { k.watchdog(ctx) })
	k.renewLoop(ctx)
	wg.Wait()
}

// lastRenewal is when the last stored renewal was sent: the lease runs
// from then.
func (k *leaseKeeper) lastRenewal() time.Time { return k.renewed.Load() }

// renewLoop renews the lease lease/3 after the last renewal that was
// stored. A renewal that goes unanswered or fails without losing the lease
// (a NATS node lost, its lease bucket electing a leader) is asked again
// until it succeeds or the watchdog's limit (lease*2/3 after the last
// stored renewal) passes: one unanswered request does not end the term,
// and nothing extends it past the limit.
func (k *leaseKeeper) renewLoop(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.clock.After(k.lastRenewal().Add(k.ttl / 3).Sub(k.clock.Now())):
		}
		if err := k.failpoints.Hit(ctx, FPBeforeRenewal); err != nil {
			if ctx.Err() == nil {
				k.lose(fmt.Sprintf("renewal: %v", err))
			}
			return
		}
		// The lease runs from when the renewal was sent, not from when
		// its answer came back; after retries, from when its first attempt
		// was sent (a retry answered as a duplicate stored that one).
		sent := k.clock.Now()
		if err := k.renew(ctx, k.lastRenewal()); err != nil {
			if ctx.Err() == nil {
				k.lose(fmt.Sprintf("renewal failed: %v", err))
			}
			return
		}
		k.renewed.Store(sent)
	}
}

// renewRetryMax caps the pause between a renewal's attempts.
const renewRetryMax = 250 * time.Millisecond

// renew is one renewal: attempts until one succeeds, the lease is lost,
// or lease*2/3 has passed since last (the last stored renewal); each
// attempt is bounded by lease/3 and by that limit.
func (k *leaseKeeper) renew(ctx context.Context, last time.Time) error {
	deadline := last.Add(k.limit())
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		left := deadline.Sub(k.clock.Now())
		if left <= 0 {
			return fmt.Errorf("no renewal within %s of the last one (%d attempts)", k.limit(), attempt-1)
		}
		rctx, cancel := context.WithTimeout(ctx, min(k.ttl/3, left))
		err := k.lease.Renew(rctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				k.logger.Info().Int("attempts", attempt).Msg("lease renewed after asking again")
			}
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || ctx.Err() != nil {
			return err
		}
		if attempt == 1 {
			k.logger.Warn().Err(err).Dur("left", left.Round(time.Millisecond)).Msg("lease renewal unanswered; asking again within the lease")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-k.clock.After(min(backoff, max(deadline.Sub(k.clock.Now()), 0))):
		}
		backoff = min(2*backoff, renewRetryMax)
	}
}

// watchdog ends the term when lease*2/3 passes without a renewal, whatever
// the renewal call is doing (a Renew that ignores its context included).
func (k *leaseKeeper) watchdog(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-k.clock.After(k.ttl / 12):
		}
		if why, over := k.overdue(); over {
			k.lose(why)
			return
		}
	}
}

// limit is how long after the last stored renewal the leader may act:
// lease*2/3, a third of the lease short of when the server lets another
// replica take it.
func (k *leaseKeeper) limit() time.Duration { return k.ttl * 2 / 3 }

// overdue says why, when the last stored renewal is older than the limit.
func (k *leaseKeeper) overdue() (string, bool) {
	since := k.clock.Now().Sub(k.lastRenewal())
	if since <= k.limit() {
		return "", false
	}
	return fmt.Sprintf("no lease renewal for %s (limit %s)", since.Round(time.Millisecond), k.limit()), true
}

// mayAppend is checked before every append is sent. It fails with
// ErrDisconnected while the RPC connection (which the log shares) is not
// connected or its server is stopping, and as leaseFresh says once the
// lease is too old. nats.go does not refuse a publish made while it
// reconnects: it buffers it and sends it once the server is back, possibly
// long after the decision, on a view the outage made stale (a worker
// expired because its heartbeats could not arrive). So the leader never
// hands the client an append then.
func (k *leaseKeeper) mayAppend() error {
	if k.nc != nil && !k.nc.IsConnected() {
		return fmt.Errorf("%w (%s)", ErrDisconnected, k.nc.Status())
	}
	if k.leaving.Load() {
		return fmt.Errorf("%w (its NATS server is stopping: lame duck)", ErrDisconnected)
	}
	return k.leaseFresh()
}

// leaseFresh fails with ErrLeaseLost, and ends the term, once the lease
// was last renewed longer ago than the watchdog allows. The watchdog checks
// every lease/12; a leader paused past its lease (SIGSTOP, a long GC, a
// frozen VM: the first report) runs its goroutines again before the
// watchdog's next tick, and without this check its first appends are
// stopped only by the CAS. Checked before every append, exec and health
// write.
func (k *leaseKeeper) leaseFresh() error {
	why, over := k.overdue()
	if !over {
		return nil
	}
	if k.staleCounted.CompareAndSwap(false, true) {
		k.stale.Add(1) // once a term: later retries and queued groups are the same refusal
	}
	k.lose(why)
	return fmt.Errorf("%w: %s", ErrLeaseLost, why)
}
