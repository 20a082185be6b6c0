package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// env is the embedded server every figure runs on (one node, or a 3-node
// cluster on loopback: Config.Replicas), and the connections opened on it
// (closed at the end).
type env struct {
	srvs     []*natsserver.Server
	replicas int // of every stream and bucket made on it
	sync     natsserver.SyncPolicy

	mu    sync.Mutex
	conns []*nats.Conn
}

// startEnvSync starts a server on dir syncing as p says; with replicas 3,
// a 3-node cluster (routes on free loopback ports), every stream and
// bucket of the run at 3 replicas.
func startEnvSync(dir string, p natsserver.SyncPolicy, replicas int) (*env, error) {
	e := &env{replicas: max(replicas, 1), sync: p}
	if e.replicas == 1 {
		srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: filepath.Join(dir, "nats"), Port: 0, Sync: p})
		if err != nil {
			return nil, err
		}
		e.srvs = []*natsserver.Server{srv}
		return e, nil
	}
	srvs, err := natsserver.StartCluster(natsserver.ServerConfig{ClusterName: "bench", Sync: p}, dir, e.replicas)
	if err != nil {
		return nil, err
	}
	e.srvs = srvs
	return e, nil
}

// url lists the client URLs of the nodes.
func (e *env) url() string {
	var out []string
	for _, s := range e.srvs {
		out = append(out, s.ClientURL())
	}
	return strings.Join(out, ",")
}

// what names the server configuration, for the report.
func (e *env) what() string {
	if e.replicas == 1 {
		return fmt.Sprintf("1 node, sync %s", e.sync)
	}
	return fmt.Sprintf("%d-node cluster on loopback, R%d, sync %s", len(e.srvs), e.replicas, e.sync)
}

// connect opens a TCP connection to the server (as every termlog process
// does; to every node of a cluster). Call it inside pprof.Do to label the
// connection's goroutines.
func (e *env) connect(name string) (*nats.Conn, error) {
	var nc *nats.Conn
	var err error
	if len(e.srvs) == 1 {
		nc, err = e.srvs[0].Connect(nats.Name(name), nats.NoReconnect())
	} else {
		nc, err = nats.Connect(e.url(), nats.Name(name), nats.NoReconnect())
	}
	if err != nil {
		return nil, err
	}
	e.mu.Lock()
	e.conns = append(e.conns, nc)
	e.mu.Unlock()
	return nc, nil
}

func (e *env) close() {
	e.mu.Lock()
	conns := e.conns
	e.conns = nil
	e.mu.Unlock()
	for _, nc := range conns {
		nc.Close()
	}
	for _, s := range e.srvs {
		s.Shutdown()
	}
}

// openLog opens the termlog stream of cluster, at e's replicas.
func (e *env) openLog(ctx context.Context, nc *nats.Conn, cluster string) (*natslog.Log, error) {
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return natslog.Open(octx, nc, natslog.Config{Cluster: cluster, Replicas: e.replicas})
}

// rawStream creates a plain stream with the termlog stream's storage,
// replicas and dedupe window, atomic batches allowed, for raw baselines.
func (e *env) rawStream(ctx context.Context, js jetstream.JetStream, name, subjects string) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	return js.CreateStream(ctx, jetstream.StreamConfig{
		Name: name, Subjects: []string{subjects}, Retention: jetstream.LimitsPolicy,
		Storage: jetstream.FileStorage, Replicas: e.replicas, Duplicates: natslog.DefaultDuplicates,
		AllowAtomicPublish: true,
	})
}

// asyncWindow is the raw async publisher's window of pending acks (below
// nats.go's default limit of 4000).
const asyncWindow = 2048

// publishAsync publishes n bodies with a sliding window of asyncWindow
// pending acks and waits for every ack. It returns the time it took.
func publishAsync(ctx context.Context, js jetstream.JetStream, n int, subject func(i int) string, body func(i int) []byte) (time.Duration, error) {
	start := time.Now()
	ring := make([]jetstream.PubAckFuture, asyncWindow)
	head, tail := 0, 0 // ring[head%len .. tail%len) are pending
	wait := func() error {
		f := ring[head%len(ring)]
		ring[head%len(ring)] = nil
		head++
		select {
		case <-f.Ok():
			return nil
		case err := <-f.Err():
			return fmt.Errorf("async publish: %w", err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	for i := range n {
		if tail-head == len(ring) {
			if err := wait(); err != nil {
				return 0, err
			}
		}
		f, err := js.PublishAsync(subject(i), body(i))
		if err != nil {
			return 0, fmt.Errorf("async publish %d: %w", i, err)
		}
		ring[tail%len(ring)] = f
		tail++
	}
	for head < tail {
		if err := wait(); err != nil {
			return 0, err
		}
	}
	return time.Since(start), nil
}

// fill publishes encoded events into a termlog stream, as fast as the server
// takes them, in order (seq i+1 holds bodies[i]).
func fill(ctx context.Context, js jetstream.JetStream, l *natslog.Log, evs []events.Event, bodies [][]byte) (time.Duration, error) {
	return publishAsync(ctx, js, len(bodies), func(i int) string { return l.Subject(evs[i].Type()) }, func(i int) []byte { return bodies[i] })
}

// percentile returns the p-th percentile (0..100) of ds, which it sorts.
func percentile(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sort.Slice(ds, func(i, j int) bool { return ds[i] < ds[j] })
	i := int(p / 100 * float64(len(ds)-1))
	return ds[i]
}

func ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
