// Package tests holds multi-component scenario tests: real embedded NATS,
// several meta replicas in one process with separate connections, real TCP
// control streams on loopback.
package tests

import (
	"context"
	"errors"
	"fmt"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections"
)

func TestMain(m *testing.M) {
	// dragonboat's loggers are process-wide: silence them once, here.
	if err := logstore.SetDragonboatLogLevel("critical"); err != nil {
		panic(err)
	}
	goleak.VerifyTestMain(m,
		// nats-server v2.15.2 can orphan one file store when a stream is
		// created while the server shuts down (the outage tests stop NATS
		// under running roles that create their stream, lease bucket or
		// snapshot bucket): Account.addStreamWithAssignment does not check
		// for shutdown, so a create that passed its checks completes after
		// Shutdown stopped the account's streams. The store's flush loop and
		// the access-time ticker it registered then never stop. Seen once
		// in ~10 runs of this package; the server itself is shut down and
		// waited for (a server left running leaks dozens of goroutines,
		// which this does not hide).
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

const cluster = "termlog"

type cluster_ struct {
	t      *testing.T
	srvCfg natsserver.ServerConfig
	srv    *natsserver.Server
	// auth is the dir of the role keys the server requires; "" runs an
	// open server and every connection may do anything.
	auth string
	// storeSnapshots makes newStore's stores start from the snapshot
	// bucket (bound when they start; a meta must have made it).
	storeSnapshots bool
	// storeFP is every store's failpoint set (logstore.FP*).
	storeFP *failpoint.Set

	mu     sync.Mutex
	denied []string // permission violations reported to connAs connections
}

// violations are the permission violations the server reported to the
// connections of connAs (unless a test installed its own error handler).
func (c *cluster_) violations() []string {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]string(nil), c.denied...)
}

func newCluster(t *testing.T) *cluster_ {
	t.Helper()
	c := &cluster_{t: t, srvCfg: natsserver.ServerConfig{DataDir: t.TempDir()}}
	c.startNATS()
	return c
}

// newClusterOnPort runs NATS on a fixed port, so it can be stopped and
// started again at the same URL.
func newClusterOnPort(t *testing.T) *cluster_ {
	t.Helper()
	_, port, _ := net.SplitHostPort(testkit.FreeAddr(t))
	p, _ := strconv.Atoi(port)
	c := &cluster_{t: t, srvCfg: natsserver.ServerConfig{DataDir: t.TempDir(), Port: p}}
	c.startNATS()
	return c
}

// newSecureCluster runs NATS requiring the role keys it generates: every
// connection of the harness authenticates as its role (metas as meta,
// workers as worker, stores as store, the test itself as admin).
func newSecureCluster(t *testing.T) *cluster_ {
	t.Helper()
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := natsserver.InitAuth(dir); err != nil {
		t.Fatal(err)
	}
	a, err := natsserver.LoadServerAuth(dir, cluster)
	if err != nil {
		t.Fatal(err)
	}
	c := &cluster_{t: t, srvCfg: natsserver.ServerConfig{DataDir: t.TempDir(), Auth: a}, auth: dir}
	c.startNATS()
	return c
}

func (c *cluster_) startNATS() {
	c.t.Helper()
	srv, err := natsserver.StartServer(c.srvCfg)
	if err != nil {
		c.t.Fatalf("start nats: %v", err)
	}
	c.t.Cleanup(srv.Shutdown)
	c.srv = srv
	c.srvCfg.Port = portOf(srv.ClientURL())
}

func (c *cluster_) stopNATS() { c.srv.Shutdown() }

func portOf(url string) int {
	_, port, _ := net.SplitHostPort(strings.TrimPrefix(url, "nats://"))
	p, _ := strconv.Atoi(port)
	return p
}

// conn opens an admin connection like the termlog roles': it never gives
// up reconnecting and never buffers a publish while reconnecting.
func (c *cluster_) conn() *nats.Conn {
	c.t.Helper()
	return c.connAs(natsserver.RoleAdmin)
}

// connAs is conn authenticated as role (on an open server, role does not
// matter).
func (c *cluster_) connAs(role natsserver.Role, opts ...nats.Option) *nats.Conn {
	c.t.Helper()
	record := nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
		if errors.Is(err, nats.ErrPermissionViolation) {
			c.mu.Lock()
			c.denied = append(c.denied, string(role)+": "+err.Error())
			c.mu.Unlock()
		}
	})
	opts = append([]nats.Option{nats.MaxReconnects(-1), nats.ReconnectWait(100 * time.Millisecond), nats.ReconnectBufSize(-1), record}, opts...)
	if c.auth != "" {
		ro, err := natsserver.RoleOptions(c.auth, role)
		if err != nil {
			c.t.Fatal(err)
		}
		opts = append(opts, ro...)
	}
	nc, err := c.srv.Connect(opts...)
	if err != nil {
		c.t.Fatalf("connect: %v", err)
	}
	c.t.Cleanup(nc.Close)
	return nc
}

func (c *cluster_) openLog(nc *nats.Conn) *natslog.Log {
	c.t.Helper()
	return c.openLogWith(nc, natslog.Config{Cluster: cluster})
}

// openLogWith opens the log with cfg.
func (c *cluster_) openLogWith(nc *nats.Conn, cfg natslog.Config) *natslog.Log {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := natslog.Open(ctx, nc, cfg)
	if err != nil {
		c.t.Fatalf("open log: %v", err)
	}
	return l
}

// metaNode is one meta replica with its own NATS connection.
type metaNode struct {
	*meta.Replica
	nc     *nats.Conn
	log    *natslog.Log
	fp     *failpoint.Set
	cancel context.CancelFunc
	done   chan struct{}
}

type metaOpts struct {
	workerTimeout time.Duration
	expiry        time.Duration
	clock         clock.Clock
	scheduler     meta.SchedulerConfig
	lease         time.Duration                 // default 3 s
	leaseReplicas int                           // default 1
	wrapLog       func(*natslog.Log) events.Log // wraps the log the replica appends to
	snapshotEvery int                           // > 0: snapshots in the cluster's bucket every N events
}

func (c *cluster_) startMeta(id string, o metaOpts) *metaNode {
	c.t.Helper()
	nc := c.connAs(natsserver.RoleMeta)
	return runMeta(c.t, nc, c.openLog(nc), id, o)
}

// runMeta runs a meta replica on a connection and log of the caller's. Its
// lease bucket has o.lease (default 3 s) and o.leaseReplicas (default 1);
// o.wrapLog, if set, wraps the log the replica appends to.
func runMeta(t *testing.T, nc *nats.Conn, lg *natslog.Log, id string, o metaOpts) *metaNode {
	t.Helper()
	if o.lease <= 0 {
		o.lease = 3 * time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	var log events.Log = lg
	if o.wrapLog != nil {
		log = o.wrapLog(lg)
	}
	var snaps events.SnapshotStore
	if o.snapshotEvery > 0 {
		// Next to the stream itself, not the wrapped log.
		s, err := natslog.OpenSnapshots(ctx, lg)
		if err != nil {
			t.Fatalf("snapshots: %v", err)
		}
		snaps = s
	}
	fp := failpoint.New()
	r, err := meta.Open(ctx, nc, meta.Config{
		ID: id, Cluster: cluster, Log: log, LeaseTTL: o.lease, Replicas: o.leaseReplicas,
		WorkerTimeout: o.workerTimeout, ExpiryInterval: o.expiry, RecoveryRetry: 100 * time.Millisecond,
		Clock: o.clock, Logger: testkit.Logger(t), Failpoints: fp, Scheduler: o.scheduler,
		Snapshots: snaps, SnapshotEvery: o.snapshotEvery,
	})
	if err != nil {
		t.Fatalf("open %s: %v", id, err)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	m := &metaNode{Replica: r, nc: nc, log: lg, fp: fp, cancel: rcancel, done: make(chan struct{})}
	go func() {
		defer close(m.done)
		_ = r.Run(rctx)
	}()
	t.Cleanup(m.stop)
	return m
}

// stop shuts the replica down cleanly (it releases its lease).
func (m *metaNode) stop() {
	m.cancel()
	<-m.done
}

// kill simulates a crash: the connection goes first, so nothing is released.
func (m *metaNode) kill() {
	m.nc.Close()
	m.stop()
}

// workerNode is a worker process: control-stream agent on its endpoint plus
// the client that registers and heartbeats.
type workerNode struct {
	agent  *client.Agent
	w      *client.Worker
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func (c *cluster_) startWorker(endpoint, incarnation string, heartbeat time.Duration) *workerNode {
	c.t.Helper()
	return runWorker(c.t, c.connAs(natsserver.RoleWorker), endpoint, incarnation, heartbeat)
}

// runWorker runs a worker process on a connection of the caller's: its
// control-stream agent on endpoint, and the client that registers and
// heartbeats. It crashes (no deregistration) when stopped.
func runWorker(t *testing.T, nc *nats.Conn, endpoint, incarnation string, heartbeat time.Duration) *workerNode {
	t.Helper()
	var w *client.Worker
	agent, err := client.ListenAgent(endpoint, testkit.Logger(t), func() client.WorkerRef { return w.Ref() })
	if err != nil {
		t.Fatal(err)
	}
	w, err = client.NewWorker(nc, client.WorkerConfig{
		Cluster: cluster, Incarnation: incarnation, Endpoint: agent.Addr(), Kind: "compute", Parallelism: 4,
		Heartbeat: heartbeat, RequestTimeout: 500 * time.Millisecond, Logger: testkit.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	n := &workerNode{agent: agent, w: w, cancel: cancel}
	n.wg.Add(2)
	go func() { defer n.wg.Done(); _ = agent.Run(ctx) }()
	go func() { defer n.wg.Done(); _ = w.Run(ctx) }()
	t.Cleanup(n.stop)
	return n
}

func (n *workerNode) stop() {
	n.cancel()
	n.wg.Wait()
}

func leaderOf(nodes ...*metaNode) (*metaNode, uint64) {
	for _, n := range nodes {
		if ok, term := n.Leading(); ok {
			return n, term
		}
	}
	return nil, 0
}

// recoveredLeader waits until one of nodes leads with the given number of
// workers in its view and the recovery of its current term complete, and
// returns that leader with its term.
func recoveredLeader(t *testing.T, within time.Duration, workers int, nodes ...*metaNode) (*metaNode, uint64) {
	t.Helper()
	var (
		leader *metaNode
		term   uint64
	)
	testkit.Eventually(t, within, fmt.Sprintf("a leader with %d running workers and recovery complete", workers), func() bool {
		leader, term = leaderOf(nodes...)
		if leader == nil || len(leader.View().ListWorkers()) != workers {
			return false
		}
		r, ok := currentRecovery(leader)
		return ok && r.State == meta.RecoveryComplete
	})
	return leader, term
}

// expiredCanary registers a worker that then dies, and waits until leader
// has expired it: a full worker timeout has then passed with the leader's
// expiry running. It adds one worker.expired event to the stream.
func (c *cluster_) expiredCanary(t *testing.T, leader *metaNode) {
	t.Helper()
	canary := c.startWorker(testkit.FreeAddr(t), "canary", 200*time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "the canary registered", func() bool { return canary.w.Ref().ID != 0 })
	id := canary.w.Ref().ID
	canary.stop()
	testkit.Eventually(t, 15*time.Second, "the canary expired by "+leader.ID(), func() bool {
		_, ok := leader.View().Worker(id)
		return !ok
	})
}

func currentRecovery(n *metaNode) (meta.Recovery, bool) {
	terms := n.Terms()
	if len(terms) == 0 {
		return meta.Recovery{}, false
	}
	return terms[len(terms)-1].Recovery, true
}

// converged waits until every replica's view is at the log's tail with the
// same hash, and returns that view.
func converged(t *testing.T, lg *natslog.Log, nodes ...*metaNode) *projections.State {
	t.Helper()
	var v *projections.State
	testkit.Eventually(t, 10*time.Second, "views to converge", func() bool {
		tail, err := lg.Tail(context.Background())
		if err != nil {
			return false
		}
		v = nodes[0].View()
		for _, n := range nodes {
			nv := n.View()
			if nv.Seq != tail || nv.Hash() != v.Hash() {
				return false
			}
		}
		return true
	})
	return v
}

func workerIDs(v *projections.State) string {
	var ids []uint64
	for _, w := range v.ListWorkers() {
		ids = append(ids, w.ID)
	}
	return fmt.Sprint(ids)
}
