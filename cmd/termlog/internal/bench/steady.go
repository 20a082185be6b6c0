package bench

import (
	"context"
	"fmt"
	"runtime/pprof"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
)

// steadyWants says what a steady phase measures.
type steadyWants struct{ heartbeat, memory, failover bool }

// steadyResult is what a steady phase measured.
type steadyResult struct {
	leader string
	hb     hbSample
	mem    live // process heap and stacks per worker (both / n)
	fo     failoverResult
}

// steadyPhase is 3 replicas of steadyCluster over a seeded stream, their
// leader recovered, and n workers active and heartbeating.
type steadyPhase struct {
	nodes  []*metaNode
	leader *metaNode
	term   uint64
	watch  *termWatch
	fl     *fleet
}

func (c *steadyPhase) stop() {
	if c.fl != nil {
		c.fl.stop()
	}
	stopAll(c.nodes)
}

// steady measures heartbeat load, memory and failover with n workers in the
// projection, each with a control session, all heartbeating.
func (r *run) steady(ctx context.Context, conns []*nats.Conn, n int, want steadyWants) (steadyResult, error) {
	var res steadyResult
	r.progress("steady: seeding stream of cluster %s with %d registered, active workers", steadyCluster, n)
	if err := r.seed(ctx, steadyCluster, n); err != nil {
		return res, fmt.Errorf("seed: %w", err)
	}
	h0 := liveNow()
	c, err := r.steadyUp(ctx, conns, n)
	defer c.stop()
	if err != nil {
		return res, err
	}
	res.leader = c.leader.ID()
	time.Sleep(warmup)
	if want.heartbeat {
		r.progress("heartbeat: measuring %d workers at 1 Hz against leader %s for %s", n, c.leader.ID(), r.cfg.HeartbeatFor)
		res.hb = c.fl.heartbeatWindow(r.cfg.HeartbeatFor)
		r.saveProfile(fmt.Sprintf("heartbeat.%d", n), res.hb.cpu.profile)
	}
	if want.memory {
		h1 := liveNow()
		res.mem = live{heap: (h1.heap - min(h0.heap, h1.heap)) / uint64(n), stacks: (h1.stacks - min(h0.stacks, h1.stacks)) / uint64(n)}
	}
	if want.failover {
		if res.fo, err = r.failover(ctx, c, n); err != nil {
			return res, fmt.Errorf("failover: %w", err)
		}
	}
	return res, nil
}

// steadyUp starts the replicas, waits for the recovered leader, then for
// every worker of the fleet to be active.
func (r *run) steadyUp(ctx context.Context, conns []*nats.Conn, n int) (*steadyPhase, error) {
	c := &steadyPhase{watch: newTermWatch()}
	start := time.Now()
	var err error
	if c.nodes, c.leader, c.term, err = r.metas(ctx, steadyCluster, c.watch, true); err != nil {
		return c, err
	}
	r.progress("steady: %s leads term %d, barrier recovery over %d workers complete %s after start; the workers join and heartbeat",
		c.leader.ID(), c.term, n, time.Since(start).Round(time.Millisecond))
	if c.fl, err = newFleet(steadyCluster, n, conns); err != nil {
		return c, err
	}
	wctx, cancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer cancel()
	c.fl.start(ctx)
	if err := poll(wctx, 5*time.Millisecond, func() bool { return c.fl.activated.Load() == int64(n) || c.fl.failed.Load() > 0 }); err != nil || c.fl.err() != nil {
		return c, fmt.Errorf("steady: %d of %d workers active (%v, %v)", c.fl.activated.Load(), n, err, c.fl.err())
	}
	if got := c.fl.reregistered.Load(); got > 0 {
		r.progress("steady: note: %d workers had to register again", got)
	}
	return c, nil
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
		if js, err = jetstream.New(nc); err != nil {
			return
		}
		var term uint64
		if term, err = r.seedTerm(ctx, js, cluster); err != nil {
			return
		}
		var evs []events.Event
		var bodies [][]byte
		if evs, bodies, err = seedEvents(term, n); err != nil {
			return
		}
		err = fillBatches(ctx, js, log, evs, bodies)
	})
	return err
}

// seedTerm takes and releases the lease once: the seeded term.
func (r *run) seedTerm(ctx context.Context, js jetstream.JetStream, cluster string) (uint64, error) {
	lease, err := meta.OpenKVLease(ctx, js, cluster, r.cfg.Lease, r.env.replicas)
	if err != nil {
		return 0, err
	}
	term, err := lease.Acquire(ctx, "seeder")
	if err != nil {
		return 0, err
	}
	return term, lease.Release(ctx)
}

// fillBatches publishes encoded events into a termlog stream in order as
// atomic batches of 1000 (one sync each on a server that syncs before
// every ack: the seed is not what is measured).
func fillBatches(ctx context.Context, js jetstream.JetStream, l *natslog.Log, evs []events.Event, bodies [][]byte) error {
	for i := 0; i < len(bodies); i += 1000 {
		j := min(i+1000, len(bodies))
		msgs := make([]*nats.Msg, 0, j-i)
		for k := i; k < j; k++ {
			msgs = append(msgs, &nats.Msg{Subject: l.Subject(evs[k].Type()), Data: bodies[k], Header: nats.Header{}})
		}
		if len(msgs) == 1 {
			if _, err := js.PublishMsg(ctx, msgs[0]); err != nil {
				return err
			}
			continue
		}
		if _, err := jetstreamext.PublishMsgBatch(ctx, js, msgs); err != nil {
			return fmt.Errorf("seed batch at %d: %w", i, err)
		}
	}
	return nil
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

// addHeartbeat adds the heartbeat figures, next to the responder's.
func (r *run) addHeartbeat(s, base hbSample, leader string, n int) {
	u := s.cpu
	value, baseline, note := leaderCPU(s, base, leader)
	extra := map[string]float64{
		"process_cores": u.share(u.process), "baseline_process_cores": base.cpu.share(base.cpu.process),
		"workers_cores": u.share(u.byLabel[labelWorkers]), "unlabelled_cores": u.share(u.byLabel[""]),
		"heartbeats": float64(len(s.lat)), "heartbeat_errors": float64(s.errs), "window_s": u.wall.Seconds(),
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
		Name: "heartbeat.p99", What: "heartbeat reply latency at the worker (client.Worker.Run's heartbeat, by WorkerConfig.Observe), 99th percentile",
		Unit: "ms", Value: ms(percentile(s.lat, 99)), Baseline: ms(percentile(base.lat, 99)),
		BaselineWhat: "the same against the trivial responder",
		Extra:        map[string]float64{"p50_ms": ms(percentile(s.lat, 50)), "baseline_p50_ms": ms(percentile(base.lat, 50)), "max_ms": ms(percentile(s.lat, 100))},
	})
}

// leaderCPU is the leader's and the responder's share of a core in their
// windows, by pprof label, or the whole process's where the labels say
// nothing (note says why).
func leaderCPU(s, base hbSample, leader string) (value, baseline float64, note string) {
	u, b := s.cpu, base.cpu
	value, baseline = u.share(u.byLabel[leader]), b.share(b.byLabel[labelResponder])
	switch {
	case u.err != nil || b.err != nil:
		return u.share(u.process), b.share(b.process), fmt.Sprintf("no CPU profile (%v; %v): whole-process CPU instead", u.err, b.err)
	case value == 0 || baseline == 0:
		return u.share(u.process), b.share(b.process), "below the profiler's 10 ms resolution at this size: whole-process CPU instead"
	}
	return value, baseline, ""
}
