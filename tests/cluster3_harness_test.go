package tests

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// natsCluster3 is a 3-node NATS cluster in this process, on loopback: every
// node has its own data dir, client port and route port, and routes to all
// three. A node can be shut down and started again on the same ports and
// data dir.
type natsCluster3 struct {
	t     *testing.T
	mu    sync.Mutex
	cfgs  [3]natsserver.ServerConfig
	srvs  [3]*natsserver.Server  // nil while a node is down
	hooks map[string]*appendHook // by meta replica id
}

func newNATSCluster3(t *testing.T) *natsCluster3 {
	t.Helper()
	c := &natsCluster3{t: t, hooks: map[string]*appendHook{}}
	var routes []string
	ports := [3]int{}
	for i := range ports {
		_, p, _ := net.SplitHostPort(testkit.FreeAddr(t))
		ports[i], _ = strconv.Atoi(p)
		routes = append(routes, natsserver.RouteURL(ports[i]))
	}
	for i := range c.cfgs {
		c.cfgs[i] = natsserver.ServerConfig{
			DataDir: t.TempDir(), Name: fmt.Sprintf("n%d", i+1),
			ClusterName: "termlog-test", ClusterPort: ports[i], Routes: routes,
			ReadyTimeout: 20 * time.Second,
		}
	}
	for i := range c.cfgs {
		c.start(i)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for i := range c.srvs {
		if _, err := c.srv(i).WaitJetStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return c
}

// start starts node i (again), on the ports it had before.
func (c *natsCluster3) start(i int) {
	c.t.Helper()
	c.mu.Lock()
	cfg := c.cfgs[i]
	c.mu.Unlock()
	s, err := natsserver.StartServer(cfg)
	if err != nil {
		c.t.Fatalf("start nats node %d: %v", i+1, err)
	}
	c.t.Cleanup(s.Shutdown)
	c.mu.Lock()
	c.srvs[i] = s
	c.cfgs[i].Port = portOf(s.ClientURL())
	c.mu.Unlock()
}

// stop shuts node i down.
func (c *natsCluster3) stop(i int) {
	c.mu.Lock()
	s := c.srvs[i]
	c.srvs[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
	}
}

func (c *natsCluster3) srv(i int) *natsserver.Server {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.srvs[i]
}

// index is the node index of a server name, -1 if unknown.
func (c *natsCluster3) index(name string) int {
	for i, cfg := range c.cfgs {
		if cfg.Name == name {
			return i
		}
	}
	return -1
}

// url is node i's client URL.
func (c *natsCluster3) url(i int) string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return fmt.Sprintf("nats://127.0.0.1:%d", c.cfgs[i].Port)
}

// urls lists every node's client URL, node first first.
func (c *natsCluster3) urls(first int) string {
	var out []string
	for k := range 3 {
		out = append(out, c.url((first+k)%3))
	}
	return strings.Join(out, ",")
}

// connect dials urls in order and keeps reconnecting, as the roles do.
// Options follow the defaults (nats.IgnoreDiscoveredServers pins a
// connection to the URLs given).
func (c *natsCluster3) connect(name, urls string, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	opts = append([]nats.Option{nats.Name(name), nats.DontRandomize(), nats.Timeout(10 * time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(50 * time.Millisecond)}, opts...)
	nc, err := nats.Connect(urls, opts...)
	if err != nil {
		c.t.Fatalf("connect %s to %s: %v", name, urls, err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

// openLog opens the R3 event stream on nc.
func (c *natsCluster3) openLog(nc *nats.Conn) *natslog.Log {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(c.t.Context(), 30*time.Second)
	defer cancel()
	l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: 3})
	if err != nil {
		c.t.Fatalf("open log: %v", err)
	}
	return l
}

// startMeta runs a meta replica whose connection dials urls (opts as for
// connect), with the stream and the lease bucket at R3.
func (c *natsCluster3) startMeta(id, urls string, o metaOpts, opts ...nats.Option) *metaNode {
	c.t.Helper()
	nc := c.connect(id, urls, opts...)
	o.leaseReplicas = 3
	o.wrapLog = func(lg *natslog.Log) events.Log {
		hook := &appendHook{Log: lg}
		c.mu.Lock()
		c.hooks[id] = hook
		c.mu.Unlock()
		return hook
	}
	return runMeta(c.t, nc, c.openLog(nc), id, o)
}

// hook is the append hook of meta replica id.
func (c *natsCluster3) hook(id string) *appendHook {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.hooks[id]
}

// appendHook is a meta replica's log. Armed, its next Append runs a
// function concurrently (to fail something while the append is in flight)
// and loses the ack: whatever the server did, the caller learns nothing
// (as when a publish times out), unless the append was fenced. It counts
// the appends whose outcome the caller did not learn.
type appendHook struct {
	events.Log
	next    atomic.Pointer[func()]
	unknown atomic.Int64
}

// arm makes the next Append start f concurrently and lose its ack; the
// returned channel is closed once f has returned.
func (h *appendHook) arm(f func()) <-chan struct{} {
	ran := make(chan struct{})
	g := func() { defer close(ran); f() }
	h.next.Store(&g)
	return ran
}

func (h *appendHook) Append(ctx context.Context, expectedLast uint64, evs ...events.Event) (uint64, error) {
	return h.AppendAsync(ctx, expectedLast, "", evs...).Wait(ctx)
}

func (h *appendHook) AppendAsync(ctx context.Context, expectedLast uint64, prevID string, evs ...events.Event) events.Pending {
	f := h.next.Swap(nil)
	if f != nil {
		go (*f)()
	}
	return &hookedPending{h: h, p: h.Log.AppendAsync(ctx, expectedLast, prevID, evs...), lose: f != nil}
}

// hookedPending is an append in flight through an appendHook.
type hookedPending struct {
	h    *appendHook
	p    events.Pending
	lose bool // the ack is lost
}

func (p *hookedPending) Wait(ctx context.Context) (uint64, error) {
	seq, err := p.p.Wait(ctx)
	if p.lose && !errors.Is(err, events.ErrFenced) {
		err = fmt.Errorf("ack lost (test): outcome unknown (the append returned seq %d, error %v)", seq, err)
	}
	if err != nil && !errors.Is(err, events.ErrFenced) {
		p.h.unknown.Add(1)
	}
	return seq, err
}

// startWorker runs a heartbeating worker (agent and client) whose
// connection dials urls.
func (c *natsCluster3) startWorker(name, urls string, heartbeat time.Duration) *workerNode {
	c.t.Helper()
	return runWorker(c.t, c.connect(name, urls), testkit.FreeAddr(c.t), name, heartbeat)
}

// streamLeader is the server name of stream's Raft leader ("" while there
// is none), asked through nc.
func streamLeader(ctx context.Context, nc *nats.Conn, stream string) string {
	js, err := jetstream.New(nc)
	if err != nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	st, err := js.Stream(ctx, stream)
	if err != nil {
		return ""
	}
	if ci := st.CachedInfo().Cluster; ci != nil {
		return ci.Leader
	}
	return ""
}

// moveStreamLeader asks stream's leader to hand leadership to server to,
// and waits until it has.
func moveStreamLeader(t *testing.T, nc *nats.Conn, stream, to string) {
	t.Helper()
	req, _ := json.Marshal(map[string]any{"placement": map[string]string{"preferred": to}})
	err := testkit.Poll(t.Context(), 20*time.Second, 0, func() error {
		if streamLeader(t.Context(), nc, stream) == to {
			return nil
		}
		if _, err := nc.Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, req, 2*time.Second); err != nil {
			t.Logf("stream %s leader stepdown: %v", stream, err)
		}
		// The election takes a moment: wait for it before asking again.
		return testkit.Poll(t.Context(), 3*time.Second, 20*time.Millisecond, func() error {
			if l := streamLeader(t.Context(), nc, stream); l != to {
				return fmt.Errorf("leader %q", l)
			}
			return nil
		})
	})
	if err != nil {
		t.Fatalf("stream %s not led by %s after 20s (%v)", stream, to, err)
	}
}
