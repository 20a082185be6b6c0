package bench

import (
	"context"
	"fmt"
	"time"
)

// The register, heartbeat and failover groups run a fleet of workers
// (fleet.go: client.Worker.Run, the real worker client) against 3 meta
// replicas (replicas.go): a burst (burst.go), a steady phase with heartbeat
// load and memory (steady.go), a leader kill (failover.go), each next to
// its raw baseline (raw.go). The scale group (scale.go) repeats them per
// size.
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
	r.progress("baseline: %d workers against a trivial responder (register/activate = raw store, heartbeat = echo)", n)
	base, baseHB, err := r.baseline(ctx, conns, n, r.cfg.wants(GroupHeartbeat))
	if err == nil && !base.done() {
		err = fmt.Errorf("baseline burst did not finish in %s", r.cfg.BurstTimeout)
	}
	if err != nil {
		return fmt.Errorf("baseline: %w", err)
	}
	if r.cfg.wants(GroupRegister) {
		res, err := r.runBurst(ctx, conns, n, "register.burst")
		if err != nil {
			return fmt.Errorf("burst: %w", err)
		}
		r.addBurst(res, base, n)
	}
	if !r.cfg.wants(GroupHeartbeat) && !r.cfg.wants(GroupFailover) {
		return nil
	}
	s, err := r.steady(ctx, conns, n, steadyWants{heartbeat: r.cfg.wants(GroupHeartbeat), failover: r.cfg.wants(GroupFailover)})
	if err != nil {
		return err
	}
	if r.cfg.wants(GroupHeartbeat) {
		r.addHeartbeat(s.hb, baseHB, s.leader, n)
	}
	if r.cfg.wants(GroupFailover) {
		r.addFailover(s.fo, n)
	}
	return nil
}
