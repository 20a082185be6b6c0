package bench

import (
	"context"
	"fmt"
	"io"
	"runtime/pprof"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/meta"
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
