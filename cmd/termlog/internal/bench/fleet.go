package bench

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/meta/client"
)

// fleet is N worker processes in one: each is a client.Worker running
// Worker.Run, the code a termlog worker runs, on the real RPC subjects,
// sharing a few NATS connections. What the bench records it learns through
// WorkerConfig.Observe, as a process exporting metrics would.
type fleet struct {
	workers []*client.Worker
	cancel  context.CancelFunc
	wg      sync.WaitGroup
	stopped atomic.Bool

	registered, activated atomic.Int64
	reregistered          atomic.Int64
	failed                atomic.Int64
	// serveAbove > 0 makes the first reply of a higher term without an
	// error set served (UnixNano): when a new leader first served a worker.
	serveAbove atomic.Uint64
	served     atomic.Int64

	mu         sync.Mutex
	regLat     []time.Duration
	regDone    time.Time    // when the last first registration returned
	window     [2]time.Time // heartbeats that start inside are recorded
	hbLat      []time.Duration
	hbErrors   int
	maxEpoch   uint64
	firstError error
}

// member is one worker's own record; Observe runs on its Run goroutine.
type member struct {
	f                     *fleet
	registered, activated bool
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

// newFleet makes n workers of cluster on conns, each with its own
// heartbeat offset in [0, 1 s) so that their heartbeats spread.
func newFleet(cluster string, n int, conns []*nats.Conn) (*fleet, error) {
	f := &fleet{workers: make([]*client.Worker, n)}
	rng := rand.New(rand.NewPCG(3, 5))
	for i := range n {
		m := &member{f: f}
		w, err := client.NewWorker(conns[i%len(conns)], client.WorkerConfig{
			Cluster: cluster, Incarnation: fleetIncarnation(i), Endpoint: fakeEndpoint(i),
			Kind: "compute", Parallelism: 4, Logger: zerolog.Nop(), Heartbeat: heartbeatEvery,
			HeartbeatOffset: time.Duration(rng.Int64N(int64(heartbeatEvery))), Observe: m.observe,
		})
		if err != nil {
			return nil, err
		}
		f.workers[i] = w
	}
	return f, nil
}

// start launches every worker's Run at once; it returns the start time.
func (f *fleet) start(ctx context.Context) time.Time {
	ctx, f.cancel = context.WithCancel(ctx)
	gate := make(chan struct{})
	pprof.Do(ctx, pprof.Labels(labelKey, labelWorkers), func(ctx context.Context) {
		for _, w := range f.workers {
			f.wg.Add(1)
			go func() {
				defer f.wg.Done()
				<-gate
				if err := w.Run(ctx); err != nil && ctx.Err() == nil {
					f.fail(err)
				}
			}()
		}
	})
	t0 := time.Now()
	close(gate)
	return t0
}

func (f *fleet) stop() {
	f.stopped.Store(true)
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

// observe is the worker's WorkerConfig.Observe.
func (m *member) observe(c client.Call) {
	f := m.f
	if t := f.serveAbove.Load(); t > 0 && c.Err == nil && c.Reply.Term > t {
		f.served.CompareAndSwap(0, time.Now().UnixNano())
	}
	switch {
	case c.RPC == client.RPCRegister && c.Err == nil:
		f.mu.Lock()
		f.maxEpoch = max(f.maxEpoch, c.Reply.Epoch)
		if !m.registered {
			f.regLat = append(f.regLat, c.Took)
			f.regDone = time.Now()
		}
		f.mu.Unlock()
		if !m.registered {
			m.registered = true
			f.registered.Add(1)
		} else {
			f.reregistered.Add(1)
		}
	case c.RPC == client.RPCActivate && c.Err == nil && !m.activated:
		m.activated = true
		f.activated.Add(1)
	case c.RPC == client.RPCHeartbeat:
		f.heartbeat(c)
	}
}

// heartbeat records a heartbeat that started inside the window.
func (f *fleet) heartbeat(c client.Call) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.window[0].IsZero() || c.Start.Before(f.window[0]) || (!f.window[1].IsZero() && !c.Start.Before(f.window[1])) {
		return
	}
	if c.Err == nil {
		f.hbLat = append(f.hbLat, c.Took)
	} else if !f.stopped.Load() {
		f.hbErrors++
	}
}

// hbSample is one heartbeat window: CPU, reply latencies, errors.
type hbSample struct {
	cpu  cpuUsage
	lat  []time.Duration
	errs int
}

// heartbeatWindow records heartbeat latencies and CPU for d.
func (f *fleet) heartbeatWindow(d time.Duration) hbSample {
	f.mu.Lock()
	f.window = [2]time.Time{time.Now(), {}}
	f.hbLat = f.hbLat[:0]
	f.hbErrors = 0
	f.mu.Unlock()
	u := measureCPU(func() { time.Sleep(d) })
	f.mu.Lock()
	defer f.mu.Unlock()
	f.window[1] = time.Now()
	return hbSample{cpu: u, lat: append([]time.Duration(nil), f.hbLat...), errs: f.hbErrors}
}

// firstError returns the first worker failure, if any.
func (f *fleet) err() error {
	if f.failed.Load() == 0 {
		return nil
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return fmt.Errorf("a worker failed: %w", f.firstError)
}
