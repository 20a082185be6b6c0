package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

const (
	metaCluster   = "bench"       // the registration burst: 3 meta replicas
	steadyCluster = "benchsteady" // heartbeat and failover: 3 meta replicas over a seeded stream
	rawCluster    = "benchraw"    // the baseline: a trivial responder
	rawStreamN    = "BENCHRAW_REG"
	rawSubject    = "benchraw.reg"

	workerTimeout  = 10 * time.Second // meta's default
	expiryInterval = 2 * time.Second  // meta's default cadence at that timeout
	heartbeatEvery = time.Second
	warmup         = time.Second // every worker is in its heartbeat loop before a window opens
	labelWorkers   = "workers"
	labelResponder = "responder"
)

// metaNode is one meta replica with its own connection, as a process has.
type metaNode struct {
	*meta.Replica
	nc     *nats.Conn
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

// stop ends the replica cleanly (it releases its lease).
func (m *metaNode) stop() { m.once.Do(func() { m.cancel(); <-m.done }) }

// kill simulates a crash: the connection goes first, so nothing is released.
func (m *metaNode) kill() { m.once.Do(func() { m.nc.Close(); m.cancel(); <-m.done }) }

// startMeta starts a replica (meta.Open, as up does) whose connection and
// goroutines carry its id as their pprof label. Its log lines are encoded at
// info level, as in production, and dropped; its term phases go to watch.
func (r *run) startMeta(ctx context.Context, cluster, id string, watch *termWatch) (*metaNode, error) {
	var m *metaNode
	var err error
	pprof.Do(context.Background(), pprof.Labels(labelKey, id), func(context.Context) {
		var nc *nats.Conn
		if nc, err = r.env.connect(id); err != nil {
			return
		}
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		defer cancel()
		var rep *meta.Replica
		rep, err = meta.Open(octx, nc, meta.Config{
			ID: id, Cluster: cluster, LeaseTTL: r.cfg.Lease, NoHealth: true, Replicas: r.env.replicas,
			WorkerTimeout: workerTimeout, ExpiryInterval: expiryInterval, ControlDialer: dialAgent,
			Logger: zerolog.New(io.Discard).Level(zerolog.InfoLevel).With().Timestamp().Logger(),
			OnTerm: watch.add,
		})
		if err != nil {
			nc.Close()
			return
		}
		rctx, rcancel := context.WithCancel(context.Background())
		m = &metaNode{Replica: rep, nc: nc, cancel: rcancel, done: make(chan struct{})}
		go func() {
			defer close(m.done)
			_ = rep.Run(rctx)
		}()
	})
	return m, err
}

// leaderOf is meta.LeaderOf over the nodes.
func leaderOf(nodes []*metaNode) (*metaNode, uint64) {
	rs := make([]*meta.Replica, len(nodes))
	for i, n := range nodes {
		rs[i] = n.Replica
	}
	l, term := meta.LeaderOf(rs...)
	for _, n := range nodes {
		if n.Replica == l {
			return n, term
		}
	}
	return nil, 0
}

// poll calls cond every interval until it holds or ctx is done.
func poll(ctx context.Context, interval time.Duration, cond func() bool) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for !cond() {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
	return nil
}

// fleet is N simulated worker processes sharing a few NATS connections. Each
// does what client.Worker.Run does — register, activate, heartbeat every
// second, register again when told — with the real client on the real RPC
// subjects, and records its latencies.
type fleet struct {
	workers []*client.Worker
	cancel  context.CancelFunc
	wg      sync.WaitGroup

	registered, activated atomic.Int64
	reregistered          atomic.Int64
	failed                atomic.Int64

	mu         sync.Mutex
	regLat     []time.Duration
	regDone    time.Time    // when the last first registration returned
	window     [2]time.Time // heartbeats that start inside are recorded
	hbLat      []time.Duration
	hbErrors   int
	maxEpoch   uint64
	firstError error
}

// workerConns opens the connections a fleet shares: one per 250 workers, 1 to 40.
func (r *run) workerConns(n int) ([]*nats.Conn, error) {
	k := min(max(n/250, 1), 40)
	conns := make([]*nats.Conn, 0, k)
	var err error
	pprof.Do(context.Background(), pprof.Labels(labelKey, labelWorkers), func(context.Context) {
		for i := range k {
			var nc *nats.Conn
			if nc, err = r.env.connect(fmt.Sprintf("bench-workers-%d", i)); err != nil {
				return
			}
			conns = append(conns, nc)
		}
	})
	return conns, err
}

// fleetIncarnation is the incarnation of the fleet's worker i.
func fleetIncarnation(i int) string { return fmt.Sprintf("bench-%d", i) }

func newFleet(cluster string, n int, conns []*nats.Conn) (*fleet, error) {
	f := &fleet{workers: make([]*client.Worker, n)}
	for i := range n {
		w, err := client.NewWorker(conns[i%len(conns)], client.WorkerConfig{
			Cluster: cluster, Incarnation: fleetIncarnation(i), Endpoint: fakeEndpoint(i),
			Kind: "compute", Parallelism: 4, Logger: zerolog.Nop(),
		})
		if err != nil {
			return nil, err
		}
		f.workers[i] = w
	}
	return f, nil
}

// start launches every worker at once; it returns the start time.
func (f *fleet) start(ctx context.Context) time.Time {
	ctx, f.cancel = context.WithCancel(ctx)
	gate := make(chan struct{})
	rng := rand.New(rand.NewPCG(3, 5))
	pprof.Do(ctx, pprof.Labels(labelKey, labelWorkers), func(ctx context.Context) {
		for _, w := range f.workers {
			offset := time.Duration(rng.Int64N(int64(heartbeatEvery)))
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				<-gate
				f.run(ctx, w, offset)
			}()
		}
	})
	t0 := time.Now()
	close(gate)
	return t0
}

func (f *fleet) stop() {
	if f.cancel != nil {
		f.cancel()
	}
	f.wg.Wait()
}

func (f *fleet) fail(err error) {
	f.failed.Add(1)
	f.mu.Lock()
	if f.firstError == nil {
		f.firstError = err
	}
	f.mu.Unlock()
}

func (f *fleet) run(ctx context.Context, w *client.Worker, offset time.Duration) {
	registered, activated := false, false
	for ctx.Err() == nil {
		t := time.Now()
		ref, err := w.Register(ctx)
		if err != nil {
			if ctx.Err() == nil {
				f.fail(err)
			}
			return
		}
		f.mu.Lock()
		f.maxEpoch = max(f.maxEpoch, ref.Epoch)
		if !registered {
			f.regLat = append(f.regLat, time.Since(t))
			f.regDone = time.Now()
		}
		f.mu.Unlock()
		if !registered {
			registered = true
			f.registered.Add(1)
		} else {
			f.reregistered.Add(1)
		}
		err = w.Activate(ctx)
		if errors.Is(err, client.ErrReregister) {
			continue
		}
		if err != nil {
			if ctx.Err() == nil {
				f.fail(err)
			}
			return
		}
		if !activated {
			f.activated.Add(1)
			activated = true
		}
		wait := heartbeatEvery + offset
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			wait = heartbeatEvery
			t := time.Now()
			err := w.Heartbeat(ctx)
			d := time.Since(t)
			f.mu.Lock()
			if !f.window[0].IsZero() && !t.Before(f.window[0]) && (f.window[1].IsZero() || t.Before(f.window[1])) {
				if err == nil {
					f.hbLat = append(f.hbLat, d)
				} else if ctx.Err() == nil {
					f.hbErrors++
				}
			}
			f.mu.Unlock()
			if errors.Is(err, client.ErrReregister) {
				break
			}
			if err != nil {
				if ctx.Err() == nil {
					f.fail(err)
				}
				return
			}
		}
	}
}

// heartbeatWindow records heartbeat latencies and CPU for d.
func (f *fleet) heartbeatWindow(d time.Duration) (cpuUsage, []time.Duration, int) {
	f.mu.Lock()
	f.window = [2]time.Time{time.Now(), {}}
	f.hbLat = f.hbLat[:0]
	f.hbErrors = 0
	f.mu.Unlock()
	u := measureCPU(func() { time.Sleep(d) })
	f.mu.Lock()
	f.window[1] = time.Now()
	lat := append([]time.Duration(nil), f.hbLat...)
	errs := f.hbErrors
	f.mu.Unlock()
	return u, lat, errs
}

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

// cluster runs the register, heartbeat and failover groups: first the
// baseline (the same fleet against a trivial responder), then the burst
// against 3 fresh meta replicas, then heartbeat and failover against 3
// replicas of another cluster whose stream already holds the N workers.
func (r *run) cluster(ctx context.Context) error {
	n := r.cfg.Workers
	if _, err := r.server(); err != nil {
		return err
	}
	conns, err := r.workerConns(n)
	if err != nil {
		return err
	}
	defer func() {
		for _, nc := range conns {
			nc.Close()
		}
	}()
	r.progress("baseline: %d workers against a trivial responder (register/activate = raw async publish, heartbeat = echo)", n)
	base, baseHB, baseLat, err := r.baselineCluster(ctx, conns)
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if r.cfg.wants(GroupRegister) {
		if err := r.burst(ctx, conns, base); err != nil {
			return fmt.Errorf("burst: %w", err)
		}
	}
	if r.cfg.wants(GroupHeartbeat) || r.cfg.wants(GroupFailover) {
		if err := r.steady(ctx, conns, baseHB, baseLat); err != nil {
			return err
		}
	}
	return nil
}

// metas starts 3 replicas of cluster and waits for a leader whose term has
// started (and, with recovered, whose barrier recovery is complete).
func (r *run) metas(ctx context.Context, cluster string, watch *termWatch, recovered bool) ([]*metaNode, *metaNode, uint64, error) {
	var nodes []*metaNode
	for i := 1; i <= 3; i++ {
		m, err := r.startMeta(ctx, cluster, fmt.Sprintf("meta-%d", i), watch)
		if err != nil {
			return nodes, nil, 0, err
		}
		nodes = append(nodes, m)
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	if err := poll(wctx, 10*time.Millisecond, func() bool { l, _ := leaderOf(nodes); return l != nil }); err != nil {
		return nodes, nil, 0, fmt.Errorf("no leader: %w", err)
	}
	leader, term := leaderOf(nodes)
	phase := meta.TermStarted
	if recovered {
		phase = meta.TermRecovered
	}
	if _, err := watch.wait(wctx, func(e meta.TermEvent) bool { return e.Phase == phase && e.Term == term }); err != nil {
		return nodes, nil, 0, fmt.Errorf("leader %s, term %d: not %s: %w", leader.ID(), term, phase, err)
	}
	return nodes, leader, term, nil
}

func stopAll(nodes []*metaNode) {
	var wg sync.WaitGroup
	for _, m := range nodes {
		wg.Add(1)
		go func() { defer wg.Done(); m.stop() }()
	}
	wg.Wait()
}

// burst registers N fresh workers at once against 3 replicas, bounded by
// BurstTimeout.
func (r *run) burst(ctx context.Context, conns []*nats.Conn, base burstResult) error {
	res, err := r.runBurst(ctx, conns, "register.burst")
	if err != nil {
		return err
	}
	r.addBurst(res, base, r.cfg.Workers)
	return nil
}

// runBurst is one registration burst on the run's server (its CPU profile
// named profile).
func (r *run) runBurst(ctx context.Context, conns []*nats.Conn, profile string) (burstResult, error) {
	n := r.cfg.Workers
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
		res, err = r.waitBurst(bctx, fl, t0, tail0, func(seq uint64) bool {
			for _, m := range nodes {
				if m.Projector().Seq() < seq {
					return false
				}
			}
			return true
		}, func(ctx context.Context) (uint64, error) { return leader.Log().Tail(ctx) })
	})
	if err != nil {
		return burstResult{}, err
	}
	if l, t := leaderOf(nodes); l != leader || t != term {
		r.progress("register: note: leadership changed during the burst")
	}
	return res, nil
}

// seed writes what a previous term left: term.started, then n workers
// registered and activated, each as the fleet's worker i (same incarnation
// and endpoint), so the fleet's registrations are idempotent. The lease's
// revision is moved past that term so the next leader's term is higher.
func (r *run) seed(ctx context.Context, cluster string, n int) error {
	var err error
	pprof.Do(context.Background(), pprof.Labels(labelKey, "seeder"), func(context.Context) {
		var nc *nats.Conn
		if nc, err = r.env.connect("bench-seeder"); err != nil {
			return
		}
		defer nc.Close()
		var log *natslog.Log
		if log, err = r.env.openLog(ctx, nc, cluster); err != nil {
			return
		}
		var js jetstream.JetStream
		if js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*asyncWindow)); err != nil {
			return
		}
		var lease *meta.KVLease
		if lease, err = meta.OpenKVLease(ctx, js, cluster, r.cfg.Lease, r.env.replicas); err != nil {
			return
		}
		var term uint64
		if term, err = lease.Acquire(ctx, "seeder"); err != nil {
			return
		}
		if err = lease.Release(ctx); err != nil {
			return
		}
		var evs []events.Event
		var bodies [][]byte
		if evs, bodies, err = seedEvents(term, n); err != nil {
			return
		}
		_, err = fill(ctx, js, log, evs, bodies)
	})
	return err
}

// seedEvents is term.started of term, worker i registered as the fleet's
// worker i at seq i+2, then each activated.
func seedEvents(term uint64, n int) ([]events.Event, [][]byte, error) {
	evs := make([]events.Event, 0, 2*n+1)
	at := time.Now().UTC()
	evs = append(evs, events.Event{Term: term, Writer: "seeder", At: at, Data: events.TermStarted{Term: term, Leader: "seeder"}})
	for i := range n {
		evs = append(evs, events.Event{Term: term, Writer: "seeder", At: at, Data: events.WorkerRegistered{
			ID: uint64(i + 1), Incarnation: fleetIncarnation(i), Endpoint: fakeEndpoint(i), Kind: "compute", Parallelism: 4}})
	}
	for i := range n {
		evs = append(evs, events.Event{Term: term, Writer: "seeder", At: at, Data: events.WorkerActivated{ID: uint64(i + 1), Epoch: uint64(i + 2)}})
	}
	bodies := make([][]byte, len(evs))
	for i, ev := range evs {
		b, err := events.Encode(ev)
		if err != nil {
			return nil, nil, err
		}
		bodies[i] = b
	}
	return evs, bodies, nil
}

// steady measures heartbeat load and failover with N workers in the
// projection, each with a control session, all heartbeating.
func (r *run) steady(ctx context.Context, conns []*nats.Conn, baseHB cpuUsage, baseLat []time.Duration) error {
	n := r.cfg.Workers
	r.progress("steady: seeding stream of cluster %s with %d registered, active workers", steadyCluster, n)
	if err := r.seed(ctx, steadyCluster, n); err != nil {
		return fmt.Errorf("seed: %w", err)
	}
	watch := newTermWatch()
	start := time.Now()
	nodes, leader, term, err := r.metas(ctx, steadyCluster, watch, true)
	defer stopAll(nodes)
	if err != nil {
		return err
	}
	r.progress("steady: %s leads term %d, barrier recovery over %d workers complete %s after start; the workers join and heartbeat",
		leader.ID(), term, n, time.Since(start).Round(time.Millisecond))
	fl, err := newFleet(steadyCluster, n, conns)
	if err != nil {
		return err
	}
	defer fl.stop()
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	fl.start(ctx)
	if err := poll(wctx, 5*time.Millisecond, func() bool { return fl.activated.Load() == int64(n) || fl.failed.Load() > 0 }); err != nil || fl.failed.Load() > 0 {
		return fmt.Errorf("steady: %d of %d workers active (%v, %v)", fl.activated.Load(), n, err, fl.firstError)
	}
	if got := fl.reregistered.Load(); got > 0 {
		r.progress("steady: note: %d workers had to register again", got)
	}
	if r.cfg.wants(GroupHeartbeat) {
		time.Sleep(warmup)
		r.progress("heartbeat: measuring %d workers at 1 Hz against leader %s for %s", n, leader.ID(), r.cfg.HeartbeatFor)
		u, lat, errs := fl.heartbeatWindow(r.cfg.HeartbeatFor)
		r.saveProfile("heartbeat", u.profile)
		r.addHeartbeat(u, lat, errs, baseHB, baseLat, leader.ID(), n)
	}
	if r.cfg.wants(GroupFailover) {
		if err := r.failover(ctx, nodes, leader, term, watch, n); err != nil {
			return fmt.Errorf("failover: %w", err)
		}
	}
	return nil
}

// waitBurst waits until every worker has registered and activated once and
// every replica has folded it, or ctx ends (the result is then partial).
// visible(seq) says whether every view has folded seq; tail returns the
// log's last seq, tail0 what it was before the burst. It fails only when a
// worker fails.
func (r *run) waitBurst(ctx context.Context, fl *fleet, t0 time.Time, tail0 uint64, visible func(uint64) bool, tail func(context.Context) (uint64, error)) (burstResult, error) {
	n := int64(len(fl.workers))
	var res burstResult
	failed := func() error {
		if fl.failed.Load() > 0 {
			fl.mu.Lock()
			defer fl.mu.Unlock()
			return fmt.Errorf("a worker failed: %w", fl.firstError)
		}
		return nil
	}
	finish := func() (burstResult, error) {
		fl.mu.Lock()
		res.regLat = append([]time.Duration(nil), fl.regLat...)
		if len(fl.regLat) == len(fl.workers) {
			res.replied = fl.regDone.Sub(t0)
		}
		fl.mu.Unlock()
		res.regReached, res.actReached = int(fl.registered.Load()), int(fl.activated.Load())
		res.reregs = fl.reregistered.Load()
		tctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if last, err := tail(tctx); err == nil && last > tail0 {
			res.appended = last - tail0
		}
		return res, failed()
	}
	if err := poll(ctx, time.Millisecond, func() bool { return fl.registered.Load() == n || fl.failed.Load() > 0 }); err != nil {
		res.registered, res.regPartial, res.active, res.actPartial = time.Since(t0), true, time.Since(t0), true
		return finish()
	}
	if err := failed(); err != nil {
		return res, err
	}
	fl.mu.Lock()
	maxEpoch := fl.maxEpoch
	fl.mu.Unlock()
	if err := poll(ctx, time.Millisecond, func() bool { return visible(maxEpoch) }); err != nil {
		res.registered, res.regPartial, res.active, res.actPartial = time.Since(t0), true, time.Since(t0), true
		return finish()
	}
	res.registered = time.Since(t0)
	if err := poll(ctx, time.Millisecond, func() bool { return fl.activated.Load() == n || fl.failed.Load() > 0 }); err != nil {
		res.active, res.actPartial = time.Since(t0), true
		return finish()
	}
	if err := failed(); err != nil {
		return res, err
	}
	last, err := tail(ctx)
	if err == nil {
		err = poll(ctx, time.Millisecond, func() bool { return visible(last) })
	}
	res.active = time.Since(t0)
	res.actPartial = err != nil
	return finish()
}

func (r *run) addBurst(res, base burstResult, n int) {
	p := func(q float64) float64 { return ms(percentile(res.regLat, q)) }
	f := Figure{
		Name: "register.burst", What: fmt.Sprintf("%d workers register at once through the real RPC (client.Worker -> leader); time until every reply is in and all 3 replicas' projections hold them", n),
		Unit: "s", Value: res.registered.Seconds(), Baseline: base.registered.Seconds(),
		BaselineWhat: "the same workers and connections against a responder that stores each request with " + r.rawStoreWhat() + " and replies on its ack; 3 raw ordered consumers have read them all",
		Target:       &Target{Of: "value", Op: "<=", Limit: 2, Text: "<= 2 s (at 10,000 workers)"},
		Partial:      res.regPartial,
		Extra: map[string]float64{"all_active_s": res.active.Seconds(), "baseline_all_active_s": base.active.Seconds(),
			"registered": float64(res.regReached), "activated": float64(res.actReached), "all_register_replies_s": res.replied.Seconds(),
			"register_p50_ms": p(50), "register_p99_ms": p(99), "register_max_ms": p(100), "reregistered": float64(res.reregs)},
	}
	switch {
	case res.regPartial:
		f.Note = fmt.Sprintf("stopped by the %s bound with %d of %d registered, %d active, %d registered again after expiring", r.cfg.BurstTimeout, res.regReached, n, res.actReached, res.reregs)
	case res.actPartial:
		f.Note = fmt.Sprintf("all registered and visible; stopped by the %s bound with %d of %d active, %d registered again after expiring", r.cfg.BurstTimeout, res.actReached, n, res.reregs)
	}
	r.add(f)
	// Under the burst the leader appends one event per registration and one
	// per activation (and whatever else it decides meanwhile); the
	// responder one raw async publish per request.
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

func (r *run) addHeartbeat(u cpuUsage, lat []time.Duration, errs int, base cpuUsage, baseLat []time.Duration, leader string, n int) {
	note := ""
	value, baseline := u.share(u.byLabel[leader]), base.share(base.byLabel[labelResponder])
	switch {
	case u.err != nil || base.err != nil:
		note = fmt.Sprintf("no CPU profile (%v; %v): whole-process CPU instead", u.err, base.err)
		value, baseline = u.share(u.process), base.share(base.process)
	case value == 0 || baseline == 0:
		note = "below the profiler's 10 ms resolution at this size: whole-process CPU instead"
		value, baseline = u.share(u.process), base.share(base.process)
	}
	extra := map[string]float64{
		"process_cores": u.share(u.process), "baseline_process_cores": base.share(base.process),
		"workers_cores": u.share(u.byLabel[labelWorkers]), "unlabelled_cores": u.share(u.byLabel[""]),
		"heartbeats": float64(len(lat)), "heartbeat_errors": float64(errs), "window_s": u.wall.Seconds(),
	}
	for k, d := range u.byLabel {
		if k != leader && k != labelWorkers && k != "" {
			extra["follower_"+k+"_cores"] = u.share(d)
		}
	}
	r.add(Figure{
		Name: "heartbeat.cpu", What: fmt.Sprintf("CPU of the leader replica (all goroutines of its Run and its NATS connection, by pprof label) while %d workers heartbeat at 1 Hz", n),
		Unit: "cores", Value: value, Baseline: baseline,
		BaselineWhat: "CPU of a trivial responder (decode, echo) answering the same heartbeats",
		Target:       &Target{Of: "value", Op: "<=", Limit: 0.25, Text: "<= 25% of a core (at 10,000 workers)"},
		Note:         note, Extra: extra,
	})
	r.add(Figure{
		Name: "heartbeat.p99", What: "heartbeat reply latency at the worker (client.Worker.Heartbeat), 99th percentile",
		Unit: "ms", Value: ms(percentile(lat, 99)), Baseline: ms(percentile(baseLat, 99)),
		BaselineWhat: "the same against the trivial responder",
		Extra:        map[string]float64{"p50_ms": ms(percentile(lat, 50)), "baseline_p50_ms": ms(percentile(baseLat, 50)), "max_ms": ms(percentile(lat, 100))},
	})
}

// baselineCluster runs the same fleet against a trivial responder: register
// and activate store the request with a raw async publish and reply on the
// ack; heartbeat decodes and echoes. Three raw ordered consumers stand for
// the replicas.
// rawStoreWhat says how the register baseline's responder stores requests.
func (r *run) rawStoreWhat() string {
	if r.env != nil && r.env.sync == natsserver.SyncAlways {
		return "raw atomic batches of the requests that wait (one batch in flight, as with sync always the leader does)"
	}
	return "a raw async publish"
}

func (r *run) baselineCluster(ctx context.Context, conns []*nats.Conn) (burstResult, cpuUsage, []time.Duration, error) {
	n := r.cfg.Workers
	var (
		res  burstResult
		u    cpuUsage
		lat  []time.Duration
		nc   *nats.Conn
		js   jetstream.JetStream
		subs []*nats.Subscription
		err  error
	)
	var ids atomic.Uint64
	var pending sync.WaitGroup
	defer pending.Wait()
	var (
		store, storeAsync func(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply)
		stop              = func() {}
	)
	defer func() { stop() }()
	pprof.Do(context.Background(), pprof.Labels(labelKey, labelResponder), func(context.Context) {
		if nc, err = r.env.connect("bench-responder"); err != nil {
			return
		}
		if js, err = jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4*asyncWindow)); err != nil {
			return
		}
		if _, err = r.env.rawStream(ctx, js, rawStreamN, rawSubject); err != nil {
			return
		}
		if r.env.sync == natsserver.SyncAlways {
			// On a server that syncs before every ack, a raw async publish
			// is one fsync per request: the responder commits the requests
			// that wait as one atomic batch (one sync), as the leader does.
			q := newRawBatcher(js, rawSubject)
			pending.Go(func() { q.run(ctx) })
			stop = q.close
			store = func(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply) { q.add(m, id) }
		}
		if store == nil {
			store = func(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply) {
				storeAsync(m, id)
			}
		}
		storeAsync = func(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply) {
			fut, perr := js.PublishAsync(rawSubject, m.Data)
			if perr != nil {
				b, _ := json.Marshal(client.Reply{Error: &client.RPCError{Code: client.CodeUnavailable, Message: perr.Error()}})
				_ = m.Respond(b)
				return
			}
			pending.Add(1)
			go func() {
				defer pending.Done()
				select {
				case ack := <-fut.Ok():
					b, _ := json.Marshal(id(ack))
					_ = m.Respond(b)
				case <-fut.Err():
				case <-ctx.Done():
				}
			}()
		}
		handlers := map[string]nats.MsgHandler{
			client.RPCRegister: func(m *nats.Msg) {
				store(m, func(ack *jetstream.PubAck) client.Reply {
					return client.Reply{ID: ids.Add(1), Epoch: ack.Sequence, Term: 1}
				})
			},
			client.RPCActivate: func(m *nats.Msg) {
				var ref client.WorkerRef
				_ = json.Unmarshal(m.Data, &ref)
				store(m, func(*jetstream.PubAck) client.Reply { return client.Reply{ID: ref.ID, Epoch: ref.Epoch, Term: 1} })
			},
			client.RPCHeartbeat: func(m *nats.Msg) {
				var ref client.WorkerRef
				_ = json.Unmarshal(m.Data, &ref)
				b, _ := json.Marshal(client.Reply{ID: ref.ID, Epoch: ref.Epoch, Term: 1})
				_ = m.Respond(b)
			},
		}
		for rpc, h := range handlers {
			var s *nats.Subscription
			if s, err = nc.Subscribe(client.RPCSubject(rawCluster, rpc), h); err != nil {
				return
			}
			subs = append(subs, s)
		}
	})
	if err != nil {
		return res, u, nil, err
	}
	defer func() {
		for _, s := range subs {
			_ = s.Unsubscribe()
		}
	}()

	// Three raw readers count what is stored.
	var counts [3]atomic.Int64
	rctx, rcancel := context.WithCancel(ctx)
	var rwg sync.WaitGroup
	defer func() { rcancel(); rwg.Wait() }()
	for i := range counts {
		cons, err := js.OrderedConsumer(ctx, rawStreamN, jetstream.OrderedConsumerConfig{})
		if err != nil {
			return res, u, nil, err
		}
		it, err := cons.Messages()
		if err != nil {
			return res, u, nil, err
		}
		rwg.Add(1)
		go func() {
			defer rwg.Done()
			defer it.Stop()
			for {
				if _, err := it.Next(jetstream.NextContext(rctx)); err != nil {
					if rctx.Err() != nil {
						return
					}
					continue
				}
				counts[i].Add(1)
			}
		}()
	}

	fl, err := newFleet(rawCluster, n, conns)
	if err != nil {
		return res, u, nil, err
	}
	defer fl.stop()
	bctx, cancel := context.WithTimeout(ctx, r.cfg.BurstTimeout)
	defer cancel()
	t0 := fl.start(ctx)
	res, err = r.waitBurst(bctx, fl, t0, 0, func(seq uint64) bool {
		for i := range counts {
			if uint64(counts[i].Load()) < seq {
				return false
			}
		}
		return true
	}, func(context.Context) (uint64, error) { return uint64(2 * n), nil })
	if err != nil {
		return res, u, nil, err
	}
	if !res.done() {
		return res, u, nil, fmt.Errorf("baseline burst did not finish in %s", r.cfg.BurstTimeout)
	}
	r.progress("baseline: %d registered and read by 3 consumers in %s, all active in %s",
		n, res.registered.Round(time.Millisecond), res.active.Round(time.Millisecond))
	if r.cfg.wants(GroupHeartbeat) {
		time.Sleep(warmup)
		r.progress("baseline: measuring %d heartbeats/s against the responder for %s", n, r.cfg.HeartbeatFor)
		var errs int
		u, lat, errs = fl.heartbeatWindow(r.cfg.HeartbeatFor)
		r.saveProfile("heartbeat.baseline", u.profile)
		if errs > 0 {
			r.progress("baseline: %d heartbeat errors", errs)
		}
	}
	return res, u, lat, nil
}

// failover kills the leader right after one of its lease renewals and times
// the new leader's term.started and barrier recovery, with the fleet still
// heartbeating. The baseline is a raw KV lease handover with the same TTL,
// renewal and retry cadence, killed at the same point.
func (r *run) failover(ctx context.Context, nodes []*metaNode, leader *metaNode, term uint64, watch *termWatch, n int) error {
	fctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	// Watch the lease on another replica's connection: the leader's goes
	// down with it.
	obs := nodes[0]
	if obs == leader {
		obs = nodes[1]
	}
	ojs, err := jetstream.New(obs.nc)
	if err != nil {
		return err
	}
	okv, err := ojs.KeyValue(fctx, meta.LeaseBucket(steadyCluster))
	if err != nil {
		return err
	}
	w, err := okv.Watch(fctx, meta.LeaseKey, jetstream.UpdatesOnly())
	if err != nil {
		return err
	}
	defer func() { _ = w.Stop() }()
	r.progress("failover: killing leader %s (term %d) right after a lease renewal, %d workers", leader.ID(), term, n)
	select {
	case <-w.Updates():
	case <-fctx.Done():
		return fmt.Errorf("no lease renewal seen: %w", fctx.Err())
	}
	killed := time.Now()
	var started, recovered meta.TermEvent
	r.profile("failover", func() {
		leader.kill()
		started, err = watch.wait(fctx, func(e meta.TermEvent) bool {
			return e.Phase == meta.TermStarted && e.Term > term && e.Replica != leader.ID()
		})
		if err != nil {
			err = fmt.Errorf("no new term started: %w", err)
			return
		}
		recovered, err = watch.wait(fctx, func(e meta.TermEvent) bool {
			return e.Phase == meta.TermRecovered && e.Term == started.Term && e.Replica == started.Replica
		})
		if err != nil {
			err = fmt.Errorf("new leader %s did not complete recovery: %w", started.Replica, err)
		}
	})
	if err != nil {
		return err
	}
	var newLeader *metaNode
	for _, m := range nodes {
		if m.ID() == started.Replica {
			newLeader = m
		}
	}
	sessions := 0
	if newLeader != nil {
		if ts := newLeader.Terms(); len(ts) > 0 {
			sessions = len(ts[len(ts)-1].Recovery.Sessions)
		}
	}
	r.progress("failover: %s started term %d after %s, recovery complete after %s (%d sessions)", started.Replica, started.Term,
		started.At.Sub(killed).Round(time.Millisecond), recovered.At.Sub(killed).Round(time.Millisecond), sessions)

	base, err := r.rawLeaseHandover(fctx, ojs)
	if err != nil {
		return fmt.Errorf("raw lease handover: %w", err)
	}
	lease := r.cfg.Lease
	baseWhat := fmt.Sprintf("raw KV lease handover: holder killed right after a renewal, contender retrying Create every %s (TTL %s)", (lease / 3).Round(time.Millisecond), lease)
	r.add(Figure{
		Name: "failover.term_started", What: fmt.Sprintf("leader killed right after a renewal -> new leader's term.started appended (%d workers)", n),
		Unit: "s", Value: started.At.Sub(killed).Seconds(), Baseline: base.Seconds(), BaselineWhat: baseWhat,
	})
	r.add(Figure{
		Name: "failover.recovered", What: fmt.Sprintf("leader killed -> new leader's initial barrier recovery complete over %d workers' control streams", n),
		Unit: "s", Value: recovered.At.Sub(killed).Seconds(), Baseline: base.Seconds(), BaselineWhat: baseWhat,
		Target: &Target{Of: "value", Op: "<=", Limit: (lease + time.Second).Seconds(), Text: fmt.Sprintf("<= lease + 1 s = %s (at 10,000 workers)", lease+time.Second)},
		Extra:  map[string]float64{"recovery_s": recovered.At.Sub(started.At).Seconds(), "sessions": float64(sessions)},
	})
	return nil
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
	time.Sleep(time.Duration(rand.Int64N(int64(lease / 3))))
	for {
		if _, err := kv.Create(ctx, meta.LeaseKey, []byte("contender")); err == nil {
			return time.Since(killed), nil
		} else if !errors.Is(err, jetstream.ErrKeyExists) {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(lease / 3):
		}
	}
}
