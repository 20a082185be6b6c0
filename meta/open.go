package meta

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events/natslog"
)

// Open is the one way to start a meta replica on a NATS connection: up, the
// meta run role, the bench and the tests' harness all call it. It opens
// what cfg leaves nil, on nc, and returns the replica (not running: Run it):
//
//   - Log: the cluster's event stream (natslog.Open, created if missing,
//     at Replicas);
//   - Lease: the lease bucket with TTL LeaseTTL (default 3s), at Replicas;
//     an existing bucket with another TTL is refused with a
//     *LeaseTTLError, which the caller may turn into advice;
//   - Snapshots: the snapshot bucket, only when SnapshotEvery != 0 (with
//     Open, 0 means no snapshots; New's default applies when Snapshots is
//     given);
//   - Health: the health bucket, at Replicas, unless NoHealth.
//
// NC becomes nc. Each of these steps runs through cfg.Wait (nil: once,
// within ctx), so that a daemon can wait for JetStream and say so.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Replica, error) {
	if nc == nil {
		return nil, errors.New("meta: Open needs a NATS connection")
	}
	if err := cfg.defaultIdentity(); err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	cfg.NC = nc
	o := opener{nc: nc, js: js, cfg: &cfg, replicas: max(cfg.Replicas, 1), wait: cfg.Wait}
	if o.wait == nil {
		o.wait = func(ctx context.Context, _ string, open func(context.Context) error) error { return open(ctx) }
	}
	for _, step := range []func(context.Context) error{o.log, o.lease, o.snapshots, o.health} {
		if err := step(ctx); err != nil {
			return nil, err
		}
	}
	return New(cfg)
}

// opener opens, on one NATS connection, the parts of a replica its Config
// leaves nil; each step runs through wait.
type opener struct {
	nc       *nats.Conn
	js       jetstream.JetStream
	cfg      *Config
	replicas int
	wait     func(ctx context.Context, what string, open func(context.Context) error) error
}

// log opens the cluster's event stream, unless cfg has a Log.
func (o opener) log(ctx context.Context) error {
	if o.cfg.Log != nil {
		return nil
	}
	return o.wait(ctx, "the event stream "+natslog.StreamName(o.cfg.Cluster), func(ctx context.Context) error {
		stream, err := natslog.Open(ctx, o.nc, natslog.Config{Cluster: o.cfg.Cluster, Replicas: o.cfg.Replicas})
		if err == nil {
			o.cfg.Log = stream
		}
		return err
	})
}

// lease opens the lease bucket, unless cfg has a Lease.
func (o opener) lease(ctx context.Context) error {
	if o.cfg.Lease != nil {
		return nil
	}
	return o.wait(ctx, "the lease bucket "+LeaseBucket(o.cfg.Cluster), func(ctx context.Context) error {
		lease, err := OpenKVLease(ctx, o.js, o.cfg.Cluster, o.cfg.LeaseTTL, o.replicas)
		if err == nil {
			o.cfg.Lease = lease
		}
		return err
	})
}

// snapshots opens the snapshot bucket next to the stream the replica reads
// (the one opened here, or the one the caller's Log is), unless cfg has
// Snapshots or asks for none.
func (o opener) snapshots(ctx context.Context) error {
	if o.cfg.Snapshots != nil || o.cfg.SnapshotEvery == 0 {
		return nil
	}
	l, ok := o.cfg.Log.(*natslog.Log)
	if !ok {
		return errors.New("meta: Open makes the snapshot bucket next to a *natslog.Log; give Snapshots with another Log")
	}
	return o.wait(ctx, "the snapshot bucket "+natslog.SnapshotBucket(o.cfg.Cluster), func(ctx context.Context) error {
		snaps, err := natslog.OpenSnapshots(ctx, l)
		if err == nil {
			o.cfg.Snapshots = snaps
		}
		return err
	})
}

// health opens the health bucket, unless cfg has one or asks for none.
func (o opener) health(ctx context.Context) error {
	if o.cfg.Health != nil || o.cfg.NoHealth {
		return nil
	}
	return o.wait(ctx, "the health bucket "+HealthBucket(o.cfg.Cluster), func(ctx context.Context) error {
		h, err := OpenHealthKV(ctx, o.js, o.cfg.Cluster, o.replicas)
		if err == nil {
			o.cfg.Health = h
		}
		return err
	})
}

// TermPhase is a step of a term a replica leads, as Config.OnTerm sees it.
type TermPhase string

// The phases of a term, in order; a term may end after any of them.
const (
	TermAcquired  TermPhase = "acquired"  // the lease is held, nothing appended yet: Term is 0 (not chosen), Lease set
	TermStarted   TermPhase = "started"   // term.started is appended and projected
	TermRecovered TermPhase = "recovered" // the initial barrier recovery is complete
	TermEnded     TermPhase = "ended"     // every leader task of the term is joined
)

// TermEvent is one phase of a term, at the replica's clock.
type TermEvent struct {
	Replica string
	Term    uint64 // 0 in TermAcquired: terms count leaders and are chosen at term.started
	Lease   uint64 // the lease revision: the term's fencing token
	Phase   TermPhase
	At      time.Time
	Reason  string // TermEnded: why the term ended
}

// onTerm calls the OnTerm hook, if any.
func (r *Replica) onTerm(term, lease uint64, phase TermPhase, reason string) {
	if r.cfg.OnTerm == nil {
		return
	}
	r.cfg.OnTerm(TermEvent{Replica: r.cfg.ID, Term: term, Lease: lease, Phase: phase, At: r.cfg.Clock.Now(), Reason: reason})
}

// LeaderOf returns the replica of rs that leads now, and its term; nil and
// 0 when none does.
func LeaderOf(rs ...*Replica) (*Replica, uint64) {
	for _, r := range rs {
		if ok, term := r.Leading(); ok {
			return r, term
		}
	}
	return nil, 0
}
