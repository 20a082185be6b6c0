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
	if cfg.ID == "" {
		return nil, errors.New("meta: replica needs an ID")
	}
	if cfg.Cluster == "" {
		cfg.Cluster = "termlog"
	}
	if cfg.LeaseTTL <= 0 {
		cfg.LeaseTTL = 3 * time.Second
	}
	replicas := max(cfg.Replicas, 1)
	wait := cfg.Wait
	if wait == nil {
		wait = func(ctx context.Context, _ string, open func(context.Context) error) error { return open(ctx) }
	}
	cfg.NC = nc
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	var stream *natslog.Log
	if cfg.Log == nil {
		if err := wait(ctx, "the event stream "+natslog.StreamName(cfg.Cluster), func(ctx context.Context) error {
			stream, err = natslog.Open(ctx, nc, natslog.Config{Cluster: cfg.Cluster, Replicas: cfg.Replicas})
			return err
		}); err != nil {
			return nil, err
		}
		cfg.Log = stream
	}
	if cfg.Lease == nil {
		var lease *KVLease
		if err := wait(ctx, "the lease bucket "+LeaseBucket(cfg.Cluster), func(ctx context.Context) error {
			lease, err = OpenKVLease(ctx, js, cfg.Cluster, cfg.LeaseTTL, replicas)
			return err
		}); err != nil {
			return nil, err
		}
		cfg.Lease = lease
	}
	if cfg.Snapshots == nil && cfg.SnapshotEvery != 0 {
		// The bucket is next to the stream the replica reads: the one
		// opened here, or the one the caller's Log wraps.
		l, ok := cfg.Log.(*natslog.Log)
		if stream != nil {
			l, ok = stream, true
		}
		if !ok {
			return nil, errors.New("meta: Open makes the snapshot bucket next to a *natslog.Log; give Snapshots with another Log")
		}
		var snaps *natslog.Snapshots
		if err := wait(ctx, "the snapshot bucket "+natslog.SnapshotBucket(cfg.Cluster), func(ctx context.Context) error {
			snaps, err = natslog.OpenSnapshots(ctx, l)
			return err
		}); err != nil {
			return nil, err
		}
		cfg.Snapshots = snaps
	}
	if cfg.Health == nil && !cfg.NoHealth {
		if err := wait(ctx, "the health bucket "+HealthBucket(cfg.Cluster), func(ctx context.Context) error {
			cfg.Health, err = OpenHealthKV(ctx, js, cfg.Cluster, replicas)
			return err
		}); err != nil {
			return nil, err
		}
	}
	return New(cfg)
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
