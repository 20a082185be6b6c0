package bench

import (
	"context"
	"fmt"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

// burstResult is one registration burst. A phase the bound stopped keeps
// how far it got.
type burstResult struct {
	registered time.Duration // all registered and visible everywhere (or the bound)
	regPartial bool
	regReached int
	active     time.Duration // all active and visible everywhere (or the bound)
	actPartial bool
	actReached int
	appended   uint64        // events the writer appended during the burst
	replied    time.Duration // every worker had its first register reply (0: not all did)
	regLat     []time.Duration
	reregs     int64
}

func (b burstResult) done() bool { return !b.regPartial && !b.actPartial }

// runBurst registers n fresh workers at once against 3 fresh replicas on
// the run's server, bounded by BurstTimeout (its CPU profile named
// profile).
func (r *run) runBurst(ctx context.Context, conns []*nats.Conn, n int, profile string) (burstResult, error) {
	watch := newTermWatch()
	nodes, leader, term, err := r.metas(ctx, metaCluster, watch, false)
	defer stopAll(nodes)
	if err != nil {
		return burstResult{}, err
	}
	r.progress("register: %s leads term %d; %d workers register, activate and heartbeat at once (bound %s)", leader.ID(), term, n, r.cfg.BurstTimeout)
	fl, err := newFleet(metaCluster, n, conns)
	if err != nil {
		return burstResult{}, err
	}
	defer fl.stop()
	bctx, cancel := context.WithTimeout(ctx, r.cfg.BurstTimeout)
	defer cancel()
	tail0, err := leader.Log().Tail(bctx)
	if err != nil {
		return burstResult{}, err
	}
	var res burstResult
	r.profile(profile, func() {
		t0 := fl.start(ctx)
		res, err = r.waitBurst(bctx, burstWait{fl: fl, t0: t0, tail0: tail0, visible: func(seq uint64) bool {
			for _, m := range nodes {
				if m.Projector().Seq() < seq {
					return false
				}
			}
			return true
		}, tail: func(ctx context.Context) (uint64, error) { return leader.Log().Tail(ctx) }})
	})
	if err != nil {
		return burstResult{}, err
	}
	if l, t := leaderOf(nodes); l != leader || t != term {
		r.progress("register: note: leadership changed during the burst")
	}
	return res, nil
}

// burstWait is what a burst is timed by: the fleet and when it started,
// the log's last seq before (tail0) and now (tail), and whether every
// view has folded a seq (visible).
type burstWait struct {
	fl      *fleet
	t0      time.Time
	tail0   uint64
	visible func(uint64) bool
	tail    func(context.Context) (uint64, error)
}

// waitBurst waits until every worker has registered and activated once and
// every view has folded it, or ctx ends (the result is then partial). It
// fails only when a worker fails.
func (r *run) waitBurst(ctx context.Context, b burstWait) (burstResult, error) {
	n := int64(len(b.fl.workers))
	var res burstResult
	regErr := b.reach(ctx, &b.fl.registered, n, func(context.Context) (uint64, error) {
		b.fl.mu.Lock()
		defer b.fl.mu.Unlock()
		return b.fl.maxEpoch, nil
	})
	res.registered = time.Since(b.t0)
	if err := b.fl.err(); err != nil {
		return res, err
	}
	if regErr != nil {
		res.regPartial, res.active, res.actPartial = true, res.registered, true
		return b.finish(ctx, res), nil
	}
	actErr := b.reach(ctx, &b.fl.activated, n, b.tail)
	res.active = time.Since(b.t0)
	if err := b.fl.err(); err != nil {
		return res, err
	}
	res.actPartial = actErr != nil
	return b.finish(ctx, res), nil
}

// reach waits until c counts n (or a worker fails), then until every view
// holds the seq upto names.
func (b burstWait) reach(ctx context.Context, c *atomic.Int64, n int64, upto func(context.Context) (uint64, error)) error {
	if err := poll(ctx, time.Millisecond, func() bool { return c.Load() == n || b.fl.failed.Load() > 0 }); err != nil {
		return err
	}
	if err := b.fl.err(); err != nil {
		return err
	}
	seq, err := upto(ctx)
	if err != nil {
		return err
	}
	return poll(ctx, time.Millisecond, func() bool { return b.visible(seq) })
}

// finish fills in how far the burst got.
func (b burstWait) finish(ctx context.Context, res burstResult) burstResult {
	fl := b.fl
	fl.mu.Lock()
	res.regLat = append([]time.Duration(nil), fl.regLat...)
	if len(fl.regLat) == len(fl.workers) {
		res.replied = fl.regDone.Sub(b.t0)
	}
	fl.mu.Unlock()
	res.regReached, res.actReached = int(fl.registered.Load()), int(fl.activated.Load())
	res.reregs = fl.reregistered.Load()
	tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if last, err := b.tail(tctx); err == nil && last > b.tail0 {
		res.appended = last - b.tail0
	}
	return res
}

// addBurst adds the burst's figures, next to the baseline's.
func (r *run) addBurst(res, base burstResult, n int) {
	p := func(q float64) float64 { return ms(percentile(res.regLat, q)) }
	f := Figure{
		Name: "register.burst", What: fmt.Sprintf("%d workers register at once through the real RPC (client.Worker.Run -> leader); time until every reply is in and all 3 replicas' projections hold them", n),
		Unit: "s", Value: res.registered.Seconds(), Baseline: base.registered.Seconds(),
		BaselineWhat: "the same workers and connections against a responder that stores each request with " + r.rawStoreWhat() + " and replies on its ack; 3 raw ordered consumers have read them all",
		Target:       &Target{Of: "value", Op: "<=", Limit: 2, Text: "<= 2 s (at 10,000 workers)"},
		Partial:      res.regPartial,
		Extra: map[string]float64{"all_active_s": res.active.Seconds(), "baseline_all_active_s": base.active.Seconds(),
			"registered": float64(res.regReached), "activated": float64(res.actReached), "all_register_replies_s": res.replied.Seconds(),
			"register_p50_ms": p(50), "register_p99_ms": p(99), "register_max_ms": p(100), "reregistered": float64(res.reregs)},
		Note: r.burstNote(res, n),
	}
	r.add(f)
	// Under the burst the leader appends one event per registration and one
	// per activation (and whatever else it decides meanwhile); the
	// responder one raw store per request.
	f = Figure{
		Name: "register.append_rate", What: "fenced appends per second the leader achieved during the burst (registered + activated, until all active and visible)",
		Unit: "events/s", Value: float64(res.appended) / res.active.Seconds(), Baseline: float64(base.appended) / base.active.Seconds(), Higher: true,
		BaselineWhat: "raw stores per second (" + r.rawStoreWhat() + ") the responder achieved for the same requests",
		Target:       &Target{Of: "ratio", Op: "<=", Limit: 2, Text: ">= 50% of raw async"},
		Partial:      !res.done(),
		Extra:        map[string]float64{"appended": float64(res.appended), "baseline_appended": float64(base.appended)},
	}
	if !res.done() {
		f.Note = fmt.Sprintf("rate over the %s the bound allowed", r.cfg.BurstTimeout)
	}
	r.add(f)
}

// burstNote says what stopped a partial burst ("" when it finished).
func (r *run) burstNote(res burstResult, n int) string {
	switch {
	case res.regPartial:
		return fmt.Sprintf("stopped by the %s bound with %d of %d registered, %d active, %d registered again after expiring", r.cfg.BurstTimeout, res.regReached, n, res.actReached, res.reregs)
	case res.actPartial:
		return fmt.Sprintf("all registered and visible; stopped by the %s bound with %d of %d active, %d registered again after expiring", r.cfg.BurstTimeout, res.actReached, n, res.reregs)
	}
	return ""
}
