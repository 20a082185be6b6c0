package bench

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/meta"
)

// failoverResult is one leader kill, each time from the kill on.
type failoverResult struct {
	started   time.Duration // the new leader's term.started appended
	recovered time.Duration // its barrier recovery complete
	served    time.Duration // a worker's request first answered in the new term
	base      time.Duration // the raw KV lease handover
	sessions  int           // control sessions the new leader recovered
	newLeader string
}

// failover kills the leader right after one of its lease renewals and times
// the new leader's term.started, its barrier recovery and the first
// worker it serves, with the fleet still heartbeating. The baseline is a
// raw KV lease handover with the same TTL, renewal and retry cadence,
// killed at the same point.
func (r *run) failover(ctx context.Context, c *steadyPhase, n int) (failoverResult, error) {
	var res failoverResult
	fctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	// Watch the lease on another replica's connection: the leader's goes
	// down with it. Under load the lease can move to the watching replica
	// before the kill: then watch on another one (at most twice).
	var obs *metaNode
	var ojs jetstream.JetStream
	for try := 0; ; try++ {
		obs = c.nodes[0]
		if obs == c.leader {
			obs = c.nodes[1]
		}
		var err error
		if ojs, err = jetstream.New(obs.nc); err != nil {
			return res, err
		}
		okv, err := ojs.KeyValue(fctx, meta.LeaseBucket(steadyCluster))
		if err != nil {
			return res, err
		}
		w, err := okv.Watch(fctx, meta.LeaseKey, jetstream.UpdatesOnly())
		if err != nil {
			return res, err
		}
		err = r.awaitRenewal(fctx, c, obs, w)
		_ = w.Stop()
		if err == nil {
			break
		}
		if !errors.Is(err, errMovedToObserver) || try == 2 {
			return res, err
		}
		r.progress("failover: %v; watching the lease from another replica", err)
	}
	r.progress("failover: killing leader %s (term %d) right after a lease renewal, %d workers", c.leader.ID(), c.term, n)
	if err := r.killLeader(fctx, c, &res); err != nil {
		return res, err
	}
	r.progress("failover: %s started term after %s, recovery complete after %s (%d sessions), first worker served after %s", res.newLeader,
		res.started.Round(time.Millisecond), res.recovered.Round(time.Millisecond), res.sessions, res.served.Round(time.Millisecond))
	var err error
	if res.base, err = r.rawLeaseHandover(fctx, ojs); err != nil {
		return res, fmt.Errorf("raw lease handover: %w", err)
	}
	return res, nil
}

// errMovedToObserver is awaitRenewal's error when the lease moved to the
// replica whose connection watches it.
var errMovedToObserver = errors.New("leadership moved to the watching replica before the kill")

// awaitRenewal waits for a lease update made while c's leader still leads
// its term. Under load a leader can lose its lease before the kill: the
// new leader is then the one killed, after its own next renewal (unless it
// is obs, whose connection the measurement needs).
func (r *run) awaitRenewal(ctx context.Context, c *steadyPhase, obs *metaNode, w jetstream.KeyWatcher) error {
	for {
		select {
		case <-w.Updates():
		case <-ctx.Done():
			return fmt.Errorf("no lease renewal seen: %w", ctx.Err())
		}
		l, t := leaderOf(c.nodes)
		if l == c.leader && t == c.term {
			return nil
		}
		if l == obs {
			c.leader, c.term = l, t
			return fmt.Errorf("%w: %s (term %d), under load", errMovedToObserver, l.ID(), t)
		}
		if l != nil {
			r.progress("failover: leadership moved from %s (term %d) to %s (term %d) before the kill; waiting for its renewal", c.leader.ID(), c.term, l.ID(), t)
			c.leader, c.term = l, t
		}
	}
}

// killLeader kills c's leader and waits for the next term to start,
// recover and serve a worker.
func (r *run) killLeader(ctx context.Context, c *steadyPhase, res *failoverResult) error {
	c.fl.served.Store(0)
	c.fl.serveAbove.Store(c.term)
	killed := time.Now()
	var started, recovered meta.TermEvent
	var err error
	r.profile(fmt.Sprintf("failover.%d", len(c.fl.workers)), func() {
		c.leader.kill()
		started, err = c.watch.wait(ctx, func(e meta.TermEvent) bool {
			return e.Phase == meta.TermStarted && e.Term > c.term && e.Replica != c.leader.ID()
		})
		if err != nil {
			err = fmt.Errorf("no new term started: %w", err)
			return
		}
		recovered, err = c.watch.wait(ctx, func(e meta.TermEvent) bool {
			return e.Phase == meta.TermRecovered && e.Term == started.Term && e.Replica == started.Replica
		})
		if err != nil {
			err = fmt.Errorf("new leader %s did not complete recovery: %w", started.Replica, err)
			return
		}
		if err = poll(ctx, time.Millisecond, func() bool { return c.fl.served.Load() != 0 }); err != nil {
			err = fmt.Errorf("no worker served in term %d: %w", started.Term, err)
		}
	})
	if err != nil {
		return err
	}
	res.started, res.recovered = started.At.Sub(killed), recovered.At.Sub(killed)
	res.served = time.Unix(0, c.fl.served.Load()).Sub(killed)
	res.newLeader = started.Replica
	for _, m := range c.nodes {
		if ts := m.Terms(); m.ID() == started.Replica && len(ts) > 0 {
			res.sessions = len(ts[len(ts)-1].Recovery.Sessions)
		}
	}
	return nil
}

// addFailover adds the failover figures.
func (r *run) addFailover(fo failoverResult, n int) {
	lease := r.cfg.Lease
	baseWhat := fmt.Sprintf("raw KV lease handover: holder killed right after a renewal, contender retrying Create as a meta follower does (meta.CampaignWait: every %s, every %s once the lease is due to lapse; TTL %s)",
		(lease / 6).Round(time.Millisecond), meta.CampaignFast(lease), lease)
	r.add(Figure{
		Name: "failover.term_started", What: fmt.Sprintf("leader killed right after a renewal -> new leader's term.started appended (%d workers)", n),
		Unit: "s", Value: fo.started.Seconds(), Baseline: fo.base.Seconds(), BaselineWhat: baseWhat,
	})
	r.add(Figure{
		Name: "failover.recovered", What: fmt.Sprintf("leader killed -> new leader's initial barrier recovery complete over %d workers' control streams", n),
		Unit: "s", Value: fo.recovered.Seconds(), Baseline: fo.base.Seconds(), BaselineWhat: baseWhat,
		Target: &Target{Of: "value", Op: "<=", Limit: (lease + time.Second).Seconds(), Text: fmt.Sprintf("<= lease + 1 s = %s (at 10,000 workers)", lease+time.Second)},
		Extra:  map[string]float64{"recovery_s": (fo.recovered - fo.started).Seconds(), "sessions": float64(fo.sessions)},
	})
	r.add(Figure{
		Name: "failover.served", What: fmt.Sprintf("leader killed -> the first of %d heartbeating workers answered by the new leader (client.Worker.Run retrying)", n),
		Unit: "s", Value: fo.served.Seconds(), Baseline: fo.base.Seconds(), BaselineWhat: baseWhat,
		Target: &Target{Of: "value", Op: "<=", Limit: (lease + 500*time.Millisecond).Seconds(), Text: fmt.Sprintf("< lease + 0.5 s = %s (at 30,000 workers)", lease+500*time.Millisecond)},
	})
}

// rawLeaseHandover measures a bare KV lease changing hands.
func (r *run) rawLeaseHandover(ctx context.Context, js jetstream.JetStream) (time.Duration, error) {
	lease := r.cfg.Lease
	kv, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "benchlease", TTL: lease, Storage: jetstream.FileStorage, History: 1, Replicas: r.env.replicas})
	if err != nil {
		return 0, err
	}
	rev, err := kv.Create(ctx, meta.LeaseKey, []byte("holder"))
	if err != nil {
		return 0, err
	}
	time.Sleep(lease / 3)
	if _, err = kv.Update(ctx, meta.LeaseKey, []byte("holder"), rev); err != nil {
		return 0, err
	}
	killed := time.Now() // the holder stops renewing right after a renewal
	// The contender tries as a meta follower does (meta.CampaignWait), from
	// a random phase of its cadence.
	time.Sleep(time.Duration(rand.Int64N(int64(lease / 6))))
	for {
		_, err := kv.Create(ctx, meta.LeaseKey, []byte("contender"))
		if err == nil {
			return time.Since(killed), nil
		}
		if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, err
		}
		var renewed time.Time
		if e, gerr := kv.Get(ctx, meta.LeaseKey); gerr == nil {
			renewed = e.Created()
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(meta.CampaignWait(lease, &meta.LeaseHeldError{Renewed: renewed}, time.Now())):
		}
	}
}
