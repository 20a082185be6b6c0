package bench

import (
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/projections"
)

// live is the live heap and the goroutine stacks after a full GC.
type live struct{ heap, stacks uint64 }

func (l live) total() uint64 { return l.heap + l.stacks }

func liveNow() live {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return live{heap: ms.HeapAlloc, stacks: ms.StackInuse}
}

func perWorker(a, b uint64, n int) float64 { return float64(int64(b)-int64(a)) / float64(n) }

// workerStream is term.started, then n worker.registered, then their n
// worker.activated, encoded.
func workerStream(n int) ([][]byte, int, error) {
	bodies := make([][]byte, 0, 2*n+1)
	regBytes := 0
	base := eventgen.Base()
	add := func(p events.Payload) error {
		seq := len(bodies) + 1
		b, err := events.Encode(events.Event{Term: 1, Writer: "meta-1", At: base.Add(time.Duration(seq) * time.Millisecond), Data: p})
		if err != nil {
			return err
		}
		bodies = append(bodies, b)
		return nil
	}
	if err := add(events.TermStarted{Term: 1, Leader: "meta-1"}); err != nil {
		return nil, 0, err
	}
	for i := range n {
		if err := add(events.WorkerRegistered{ID: uint64(i + 1), Incarnation: fmt.Sprintf("bench-%d", i), Endpoint: fakeEndpoint(i), Kind: "compute", Parallelism: 4}); err != nil {
			return nil, 0, err
		}
		regBytes += len(bodies[len(bodies)-1])
	}
	for i := range n {
		if err := add(events.WorkerActivated{ID: uint64(i + 1), Epoch: uint64(i + 2)}); err != nil {
			return nil, 0, err
		}
	}
	return bodies, regBytes, nil
}

// gatedLease refuses every candidate until opened, so a replica can fold
// the whole log as a follower before it leads.
type gatedLease struct {
	meta.Lease
	open atomic.Bool
}

func (g *gatedLease) Acquire(ctx context.Context, holder string) (uint64, error) {
	if !g.open.Load() {
		return 0, meta.ErrLeaseHeld
	}
	return g.Lease.Acquire(ctx, holder)
}

// minMemoryWorkers is the smallest population memory is measured on: below
// it the runtime's own noise would dominate the per-worker figure.
const minMemoryWorkers = 1000

func (r *run) memory(ctx context.Context) error {
	n := max(r.cfg.Workers, minMemoryWorkers)
	r.progress("memory: %d workers in a bare projection, then in a leading replica", n)
	m, err := r.memoryAt(ctx, n)
	if err != nil {
		return err
	}
	r.add(Figure{
		Name: "memory.projection", What: fmt.Sprintf("live heap of a projections.State holding %d running workers, per worker", n),
		Unit: "B/worker", Value: m.projection, Baseline: m.eventBytes,
		BaselineWhat: "the worker's worker.registered event body as stored in the stream",
	})
	r.add(Figure{
		Name: "memory.leader", What: fmt.Sprintf("live heap + stacks of a leading meta replica (projector state and view, deadlines, one control session each) over %d workers, per worker", n),
		Unit: "B/worker", Value: m.leader, Baseline: m.projection,
		BaselineWhat: "memory.projection: the bare projections.State",
		Note:         "in-memory log and in-memory control streams; the log's bodies are not counted",
		Extra:        map[string]float64{"heap_b_per_worker": m.leaderHeap, "stacks_b_per_worker": m.leaderStacks},
	})
	return nil
}

// memResult is memory per worker: a bare projection, a leading replica
// (heap + stacks, and each), and the registration event's body.
type memResult struct {
	projection, eventBytes           float64
	leader, leaderHeap, leaderStacks float64
}

// memoryAt measures memory per worker with n workers: a bare projection,
// then a leading replica on an in-memory log.
func (r *run) memoryAt(ctx context.Context, n int) (memResult, error) {
	var m memResult
	bodies, regBytes, err := workerStream(n)
	if err != nil {
		return m, err
	}
	h0 := liveNow()
	st := projections.New()
	for i, b := range bodies {
		st.DecodeApply(uint64(i+1), b)
	}
	h1 := liveNow()
	if len(st.Workers) != n || st.Counters.Applied != uint64(len(bodies)) {
		return m, fmt.Errorf("projection of %d workers: %d workers, %+v", n, len(st.Workers), st.Counters)
	}
	runtime.KeepAlive(st)
	m.projection, m.eventBytes = perWorker(h0.heap, h1.heap, n), float64(regBytes)/float64(n)
	st = nil
	log := events.NewMemLog()
	for _, b := range bodies {
		log.AppendRaw(b)
	}
	bodies = nil
	m.leader, m.leaderHeap, m.leaderStacks, err = r.leaderMemory(ctx, log, n)
	return m, err
}

// leaderMemory is a leading replica's memory per worker over log, every
// worker with a control session and a heartbeat deadline.
func (r *run) leaderMemory(ctx context.Context, log *events.MemLog, n int) (total, heap, stacks float64, err error) {
	lease := &gatedLease{Lease: meta.NewMemLeaseStore(clock.Real{}, 1500*time.Millisecond).Handle()}
	rep, err := meta.New(meta.Config{
		ID: "meta-1", Log: log, Lease: lease, LeaseTTL: 1500 * time.Millisecond,
		WorkerTimeout: time.Hour, ExpiryInterval: 100 * time.Millisecond, ControlDialer: dialAgent, Logger: zerolog.Nop(),
	})
	if err != nil {
		return 0, 0, 0, err
	}
	h0 := liveNow()
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() { _ = rep.Run(rctx) })
	bctx, bcancel := context.WithTimeout(ctx, r.cfg.PhaseTimeout)
	defer bcancel()
	want := uint64(2*n + 1)
	if err := poll(bctx, 5*time.Millisecond, func() bool { return rep.Projector().Seq() >= want }); err != nil {
		return 0, 0, 0, fmt.Errorf("follower fold: %w", err)
	}
	lease.open.Store(true)
	if err := poll(bctx, 10*time.Millisecond, func() bool {
		ts := rep.Terms()
		return len(ts) > 0 && ts[len(ts)-1].Recovery.State == meta.RecoveryComplete && len(ts[len(ts)-1].Recovery.Sessions) == n
	}); err != nil {
		return 0, 0, 0, fmt.Errorf("leader recovery over %d workers: %w", n, err)
	}
	time.Sleep(300 * time.Millisecond) // an expiry tick has given every worker a deadline
	h1 := liveNow()
	return perWorker(h0.total(), h1.total(), n), perWorker(h0.heap, h1.heap, n), perWorker(h0.stacks, h1.stacks, n), nil
}
