package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections"
)

type upOpts struct {
	data     string
	port     int
	metas    int
	workers  int
	stores   int
	shards   int
	logDB    string
	raftLog  string
	storeTO  time.Duration
	lease    leaseOpts
	timeout  time.Duration
	interval time.Duration
	replicas int // of the stream and the lease bucket
	// snapEvery is the meta leader's snapshot interval in events (0: no
	// snapshots are read or written).
	snapEvery int
	sec       serverSecurity
	authDir   string // --auth-dir of up: "" means <data>/auth
	// inUp: the replica runs in up (which has the admin key).
	inUp bool
	// sync is when the embedded NATS server fsyncs (--sync).
	sync natsserver.SyncPolicy
	// peer is mutual TLS on the control streams (meta) and Raft (logstore);
	// zero: plaintext.
	peer tlsFiles
	// metricsAddr serves Prometheus metrics at http://<addr>/metrics ("": off).
	metricsAddr string
	// restartGrace is how long a stopping store drains itself (0: it does not).
	restartGrace time.Duration
	// web is up's --web: "off", "" (a free loopback port) or an address;
	// webTLS its certificate.
	web    string
	webTLS webOpts
	// lostQuorum: a shard short of a quorum this long is lost-quorum (0:
	// 3 * storeTO).
	lostQuorum time.Duration
}

func newUp(g *globals) *cobra.Command {
	o := upOpts{}
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Run a whole cluster in one process on an embedded NATS JetStream server",
		Long: `up starts an embedded NATS JetStream server on 127.0.0.1, the meta replicas and
the workers, waits until the cluster is healthy (a leader, every worker running,
barrier recovery complete), then prints a compact status line until Ctrl-C.
The data directory survives: running up again resumes the same stream.

Every connection authenticates as its role with the keys in <data>/auth (or
--auth-dir), generated on the first start; --insecure runs an open server, and
--tls requires TLS with a CA and certificate generated into <auth dir>/tls:
then every connection is TLS, the NATS clients and routes, the meta leader's
control streams to the workers and the Raft traffic between the stores (the
last two mutual TLS with that CA).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.replicas = int(g.replicas)
			o.authDir = g.auth.authDir
			o.lease.explicit = cmd.Flags().Changed("lease")
			o.inUp = true
			return runUp(cmd.Context(), g, o, cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&o.data, "data", "termlog-data", "data directory (created if missing)")
	f.IntVar(&o.port, "nats-port", 4222, "client port of the embedded NATS server on 127.0.0.1 (0 picks a free one)")
	f.IntVar(&o.metas, "metas", 3, "meta replicas")
	f.IntVar(&o.workers, "workers", 3, "workers")
	f.IntVar(&o.stores, "stores", 3, "log stores (dragonboat NodeHosts on 127.0.0.1)")
	f.IntVar(&o.shards, "shards", 2, "Raft shards, 3 replicas each (needs --stores >= 3)")
	f.StringVar(&o.logDB, "logdb", "tiny", "LogDB profile of the stores: tiny (about 0.3 MiB, ~22 goroutines) or default (up to 8 GiB of write buffers)")
	f.StringVar(&o.raftLog, "raft-log-level", "error", "dragonboat log level: debug, info, warning, error, critical")
	durationFlag(f, &o.storeTO, "store-timeout", 10*time.Second, "a store silent this long is down and its replicas are replaced")
	lostQuorumFlag(f, &o.lostQuorum)
	leaseFlag(f, &o.lease.ttl)
	f.BoolVar(&o.lease.update, "update-lease", false, "when the cluster's lease bucket has another TTL than --lease, change it to --lease (with the admin key); meta replicas running elsewhere must restart with it")
	durationFlag(f, &o.timeout, "worker-timeout", 10*time.Second, "worker heartbeat timeout")
	durationFlag(f, &o.interval, "status-every", time.Second, "status line interval")
	snapshotFlag(f, &o.snapEvery)
	metricsFlag(f, &o.metricsAddr)
	syncFlag(f, &o.sync)
	f.StringVar(&o.web, "web", "", "serve the web console: off, or host:port (default a free port on 127.0.0.1; the URL is printed next to the healthy line)")
	o.webTLS.tlsFlags(f)
	o.sec.register(cmd)
	return cmd
}

func newIncarnation() string {
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// validate checks every flag of up before anything starts.
func (o upOpts) validate() error {
	if o.metas < 1 || o.workers < 0 || o.stores < 0 || o.shards < 0 {
		return errors.New("--metas must be >= 1; --workers, --stores and --shards >= 0")
	}
	if o.shards > 0 && o.stores < 3 {
		return errors.New("--shards needs --stores >= 3 (3 replicas per shard)")
	}
	if o.port < 0 || o.port > 65535 {
		return fmt.Errorf("--nats-port %d: want 0 (a free port) to 65535", o.port)
	}
	if o.snapEvery < 0 {
		return fmt.Errorf("--snapshot-every %d: want >= 0 (0: no snapshots)", o.snapEvery)
	}
	if err := validLogDB(o.logDB); err != nil {
		return err
	}
	return logstore.SetDragonboatLogLevel(o.raftLog)
}

// portFree checks that port (0: any) of 127.0.0.1 can be listened on.
func portFree(port int) error {
	if port == 0 {
		return nil
	}
	ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		return fmt.Errorf("--nats-port %d: %w: another NATS (or another termlog up) listens there; pass another --nats-port, or 0 for a free one", port, err)
	}
	return ln.Close()
}

func runUp(ctx context.Context, g *globals, o upOpts, out io.Writer) (err error) {
	env, err := o.prepare(g)
	if err != nil {
		return err
	}
	// A first up that fails before the cluster runs leaves no data dir
	// behind (one that existed is never removed).
	_, statErr := os.Stat(env.data)
	fresh := errors.Is(statErr, os.ErrNotExist)
	running := false
	// Before NATS opens the data dir: one up (or nats) per data dir.
	lock, err := lockDataDir(env.data, "termlog up")
	if err != nil {
		return err
	}
	defer func() {
		lock.Unlock()
		if err != nil && fresh && !running {
			_ = os.RemoveAll(env.data)
		}
	}()
	if err := portFree(o.port); err != nil {
		return err
	}
	sec, err := o.security(g, env.data, out)
	if err != nil {
		return err
	}
	o.peer = sec.peer
	srv, err := o.startNATS(ctx, g.cluster, env, sec, out)
	if err != nil {
		return err
	}
	defer srv.Shutdown()
	f, err := startFleets(ctx, srv, g.cluster, o, env)
	if err != nil {
		return err
	}
	defer f.shutdown()
	stopMetrics, err := metricsFor(ctx, o.metricsAddr, env.lg, f.collectors()...)
	if err != nil {
		return err
	}
	defer stopMetrics()
	web, stopWeb, err := o.startWeb(ctx, srv, g.cluster, env.lg)
	if err != nil {
		return err
	}
	defer stopWeb()
	running = true
	look := selfCommand() + " status --nats " + srv.URLs(0)
	if sec.authDir != "" {
		look += " --auth-dir " + sec.authDir
	}
	if sec.caFile != "" {
		look += " --tls-ca " + sec.caFile
	}
	o.reportHealth(ctx, f, look, web, out)
	stopWeb()
	fmt.Fprintln(out, "termlog up: shutting down")
	f.shutdown()
	fmt.Fprintln(out, "termlog up: stopped; data kept in", env.data)
	return nil
}

// startWeb serves the console (--web) with the observer key on its own
// connection; "" and a no-op stop when --web off.
func (o upOpts) startWeb(ctx context.Context, srv *embeddedNATS, cluster string, lg zerolog.Logger) (string, func(), error) {
	addr, err := upWeb(o.web)
	if err != nil || addr == "" {
		return "", func() {}, err
	}
	w := o.webTLS
	w.addr = addr
	if err := w.check("--web"); err != nil {
		return "", nil, err
	}
	nc, err := srv.Connect(0, "termlog-web", natsserver.RoleObserver)
	if err != nil {
		return "", nil, fmt.Errorf("web console: %w", err)
	}
	l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: o.replicas, Bind: true})
	if err != nil {
		nc.Close()
		return "", nil, fmt.Errorf("web console: %w", err)
	}
	url, stop, err := serveConsole(ctx, w, cluster, nc, l, lg.With().Str("role", "web").Logger())
	if err != nil {
		nc.Close()
		return "", nil, err
	}
	var once sync.Once
	return url, func() { once.Do(func() { stop(); nc.Close() }) }, nil
}

// selfCommand is this binary as it was started, for hints: os.Args[0]
// ("./termlog", "termlog"), or "go run ./cmd/termlog" for a binary that go
// run built in its cache.
func selfCommand() string {
	self := os.Args[0]
	if strings.Contains(filepath.ToSlash(self), "/go-build") {
		return "go run ./cmd/termlog"
	}
	return self
}

// upEnv is what up reads from its flags and environment before it starts
// anything.
type upEnv struct {
	lg   zerolog.Logger
	data string // absolute
	fps  *failpoint.Set
}

// prepare validates every flag and reads the logger, the data dir and the
// failpoints: up fails here, before it starts anything.
func (o upOpts) prepare(g *globals) (upEnv, error) {
	var env upEnv
	if err := o.validate(); err != nil {
		return env, usage(err)
	}
	if err := validMetricsAddr(o.metricsAddr); err != nil {
		return env, err
	}
	if addr, err := upWeb(o.web); err != nil {
		return env, err
	} else if addr != "" {
		w := o.webTLS
		w.addr = addr
		if err := w.check("--web"); err != nil {
			return env, err
		}
	}
	var err error
	if env.lg, err = g.logger(); err != nil {
		return env, err
	}
	if env.data, err = filepath.Abs(o.data); err != nil {
		return env, err
	}
	if env.fps, err = failpoint.Parse(os.Getenv(failpoint.EnvVar)); err != nil {
		return env, err
	}
	return env, nil
}

// security makes or reads the role keys and, with --tls, the CA and
// certificates, under the auth dir (default <data>/auth).
func (o upOpts) security(g *globals, data string, out io.Writer) (secured, error) {
	authDir := o.authDir
	if authDir == "" {
		authDir = filepath.Join(data, "auth")
	}
	sec, err := o.sec.setup(g.cluster, authDir, g.auth.tlsCA, out)
	if err != nil {
		return sec, err
	}
	agentTLS, err := sec.peer.config()
	if err != nil {
		return sec, err
	}
	if agentTLS != nil {
		fmt.Fprintln(out, "TLS: control streams and Raft traffic are mutual TLS with", sec.peer.ca)
	}
	return sec, nil
}

// startNATS starts the embedded server, opens the stream and, with
// --update-lease, changes the lease's TTL.
func (o upOpts) startNATS(ctx context.Context, cluster string, env upEnv, sec secured, out io.Writer) (*embeddedNATS, error) {
	srv, err := startEmbeddedNATS(env.data, o.port, o.replicas, o.sync, sec)
	if err != nil {
		return nil, fmt.Errorf("start NATS: %w", err)
	}
	srv.lg = env.lg
	if err := upOpenStream(ctx, srv, cluster, o.replicas); err != nil {
		srv.Shutdown()
		return nil, err
	}
	if o.lease.update {
		if err := upUpdateLease(ctx, srv, cluster, o.lease.ttl, out); err != nil {
			srv.Shutdown()
			return nil, err
		}
	}
	fmt.Fprintf(out, "termlog up: NATS JetStream at %s (stream and lease at R%d), data in %s\n", srv.URLs(0), max(o.replicas, 1), env.data)
	return srv, nil
}

// upFleets is what up runs: the meta replicas, the workers and the stores,
// each fleet on its own context so that shutdown stops them in order.
type upFleets struct {
	metas []*meta.Replica
	// workers are the workers' collectors (their control sessions).
	workers []workerCollector
	stores  []*logstore.Store

	cancelMetas, stopWorkers, stopStores context.CancelFunc
	metasWG, workersWG, storesWG         sync.WaitGroup
	closers                              []func() // connections and stores, closed last
	once                                 sync.Once
}

// shutdown stops the fleets in order: workers first (they deregister),
// then stores, then metas; then it closes the connections and stores. It
// waits for every goroutine it stops, and may be called again.
func (f *upFleets) shutdown() {
	f.once.Do(func() {
		f.stopWorkers()
		f.workersWG.Wait()
		f.stopStores()
		f.storesWG.Wait()
		f.cancelMetas()
		f.metasWG.Wait()
		for i := len(f.closers) - 1; i >= 0; i-- {
			f.closers[i]()
		}
	})
}

// startFleets starts o.metas replicas, o.workers workers and o.stores
// stores, each on its own connection to srv. On an error it stops what it
// started.
func startFleets(ctx context.Context, srv *embeddedNATS, cluster string, o upOpts, env upEnv) (_ *upFleets, err error) {
	agentTLS, err := o.peer.config()
	if err != nil {
		return nil, err
	}
	f := &upFleets{}
	runCtx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	f.cancelMetas = cancel
	workerCtx, stopWorkers := context.WithCancel(runCtx)
	storeCtx, stopStores := context.WithCancel(runCtx)
	f.stopWorkers, f.stopStores = stopWorkers, stopStores
	defer func() {
		if err != nil {
			f.shutdown()
		}
	}()
	connect := func(i int, name string, role natsserver.Role) (*nats.Conn, error) {
		nc, err := srv.Connect(i-1, name, role)
		if err == nil {
			f.closers = append(f.closers, nc.Close)
		}
		return nc, err
	}
	for i := 1; i <= o.metas; i++ {
		id := fmt.Sprintf("meta-%d", i)
		nc, err := connect(i, id, natsserver.RoleMeta)
		if err != nil {
			return nil, err
		}
		r, err := startMeta(ctx, nc, cluster, id, o, env.fps, env.lg)
		if err != nil {
			return nil, err
		}
		f.metas = append(f.metas, r)
		f.metasWG.Go(func() { _ = r.Run(runCtx) })
	}
	for i := 1; i <= o.workers; i++ {
		nc, err := connect(i, fmt.Sprintf("worker-%d", i), natsserver.RoleWorker)
		if err != nil {
			return nil, err
		}
		wc, err := startWorker(workerCtx, &f.workersWG, nc, cluster, agentTLS, env.lg)
		if err != nil {
			return nil, err
		}
		f.workers = append(f.workers, wc)
	}
	for i := 1; i <= o.stores; i++ {
		id := fmt.Sprintf("store-%d", i)
		nc, err := connect(i, id, natsserver.RoleStore)
		if err != nil {
			return nil, err
		}
		dir := filepath.Join(env.data, id)
		addr, err := raftAddr(dir)
		if err != nil {
			return nil, err
		}
		st, err := startStore(ctx, nc, cluster, id, dir, addr, o.snapEvery != 0, o, env.lg)
		if err != nil {
			return nil, err
		}
		f.closers = append(f.closers, func() { st.Close() })
		f.stores = append(f.stores, st)
		f.storesWG.Go(func() { _ = st.Run(storeCtx) })
	}
	return f, nil
}

// collectors are the fleets' Prometheus metrics.
func (f *upFleets) collectors() []prometheus.Collector {
	var cs []prometheus.Collector
	for _, r := range f.metas {
		cs = append(cs, metaCollector{r: r})
	}
	for _, st := range f.stores {
		cs = append(cs, storeCollector{s: st})
	}
	for _, w := range f.workers {
		cs = append(cs, w)
	}
	return cs
}

// upHealth is up's judgement of the cluster from the leader's view.
type upHealth struct {
	running  int    // workers running
	shardsOK int    // shards at 3/3
	recovery string // the current term's barrier recovery
	waiting  []uint64
}

// judgeUp reads the leader's view, recovery and shard health.
func judgeUp(leader *meta.Replica) upHealth {
	var h upHealth
	for _, w := range leader.View().ListWorkers() {
		if w.State == projections.WorkerRunning {
			h.running++
		}
	}
	for _, sh := range leader.Health() {
		if sh.Healthy {
			h.shardsOK++
		}
	}
	if rec := leader.Terms(); len(rec) > 0 {
		h.recovery = rec[len(rec)-1].Recovery.State
		h.waiting = rec[len(rec)-1].Recovery.Waiting
	}
	return h
}

// healthy: every worker running, every shard at 3/3, recovery complete.
func (h upHealth) healthy(o upOpts) bool {
	return h.running >= o.workers && h.shardsOK >= o.shards && h.recovery == meta.RecoveryComplete
}

// reportHealth prints what up waits for until the cluster is healthy, then
// says so once and prints a status line every o.interval, until ctx ends.
func (o upOpts) reportHealth(ctx context.Context, f *upFleets, look, web string, out io.Writer) {
	start := time.Now()
	healthy := false
	for {
		leader, term := meta.LeaderOf(f.metas...)
		if !healthy && leader != nil {
			if h := judgeUp(leader); h.healthy(o) {
				healthy = true
				fmt.Fprintf(out, "healthy after %s: leader %s term %d, %d workers running, barrier recovery complete, %d shards 3/3\n",
					time.Since(start).Round(time.Millisecond), leader.ID(), term, h.running, h.shardsOK)
				fmt.Fprintf(out, "look at it:  %s\n", look)
				if web != "" {
					fmt.Fprintf(out, "web console: %s\n", web)
				}
				fmt.Fprintf(out, "stop with Ctrl-C; run up again with the same --data to resume\n")
			}
		}
		if healthy {
			fmt.Fprintln(out, statusLine(f.metas, leader, term))
		} else {
			fmt.Fprintln(out, waitingLine(leader, o, start))
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(o.interval):
		}
	}
}

// waitingLine says what up is still waiting for.
func waitingLine(leader *meta.Replica, o upOpts, start time.Time) string {
	prefix := fmt.Sprintf("%s  waiting (%s):", time.Now().Format("15:04:05"), time.Since(start).Round(time.Second))
	if leader == nil {
		return prefix + " a meta leader"
	}
	h := judgeUp(leader)
	line := fmt.Sprintf("%s workers running %d/%d", prefix, h.running, o.workers)
	if h.recovery != "" {
		line += " recovery " + h.recovery
		if len(h.waiting) > 0 {
			line += fmt.Sprintf(" (waiting on workers %v: a dead one expires after %s)", h.waiting, o.timeout)
		}
	}
	return line + fmt.Sprintf(" shards 3/3: %d/%d", h.shardsOK, o.shards)
}

func statusLine(metas []*meta.Replica, leader *meta.Replica, term uint64) string {
	if leader == nil {
		return fmt.Sprintf("%s  no leader", time.Now().Format("15:04:05"))
	}
	v := leader.View()
	rec := leader.Terms()
	state := "-"
	if len(rec) > 0 {
		state = rec[len(rec)-1].Recovery.State
	}
	seqs := ""
	for _, m := range metas {
		seqs += fmt.Sprintf(" %s@%d", m.ID(), m.View().Seq)
	}
	shards := ""
	for _, h := range leader.Health() {
		shards += fmt.Sprintf(" %d:%d/%d", h.Shard, h.Live, h.Expected)
		if h.Operator != "" {
			shards += "(" + h.Operator + ")"
		}
	}
	return fmt.Sprintf("%s  leader %s term %d  seq %d  workers %d  recovery %s  shards%s  rejected %d  views%s",
		time.Now().Format("15:04:05"), leader.ID(), term, v.Seq, len(v.Workers), state, shards, v.Counters.Rejected, seqs)
}

func startMeta(ctx context.Context, nc *nats.Conn, cluster, id string, o upOpts, fps *failpoint.Set, lg zerolog.Logger) (*meta.Replica, error) {
	log, err := openLogWaiting(ctx, lg, nc, natslog.Config{Cluster: cluster, Replicas: o.replicas})
	if err != nil {
		return nil, err
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return nil, err
	}
	fix := "`termlog meta set-lease %s` (admin key), then restart the replicas"
	if o.inUp {
		fix = "`termlog up --lease %s --update-lease`"
	}
	// The lease is opened here, not by meta.Open: without --lease the
	// replica takes the cluster's, and a mismatch is explained with fix.
	var (
		lease meta.Lease
		ttl   time.Duration
	)
	if err := waitJetStream(ctx, lg, "the lease bucket "+meta.LeaseBucket(cluster), func(ctx context.Context) error {
		var err error
		lease, ttl, err = openLease(ctx, js, cluster, o.lease, o.replicas, fix, lg)
		return err
	}); err != nil {
		return nil, err
	}
	controlTLS, err := o.peer.config()
	if err != nil {
		return nil, err
	}
	return meta.Open(ctx, nc, meta.Config{
		ID: id, Cluster: cluster, Log: log, Lease: lease, LeaseTTL: ttl, Replicas: o.replicas,
		WorkerTimeout: o.timeout, Logger: lg, Failpoints: fps, ControlTLS: controlTLS,
		Scheduler:     meta.SchedulerConfig{Shards: o.shards, StoreTimeout: o.storeTO, LostQuorumAfter: o.lostQuorum},
		SnapshotEvery: o.snapEvery,
		Wait: func(ctx context.Context, what string, open func(context.Context) error) error {
			return waitJetStream(ctx, lg, what, open)
		},
	})
}

// startStore opens a log store (of up and of the logstore role) with its
// Raft address addr and data dir dir, its projection starting from the
// newest snapshot when useSnaps.
func startStore(ctx context.Context, nc *nats.Conn, cluster, id, dir, addr string, useSnaps bool, o upOpts, lg zerolog.Logger) (*logstore.Store, error) {
	// A store may only read the stream: it binds to the one the metas made.
	log, err := openLogWaiting(ctx, lg, nc, natslog.Config{Cluster: cluster, Replicas: o.replicas, Bind: true})
	if err != nil {
		return nil, err
	}
	var snaps events.SnapshotStore
	if err := waitJetStream(ctx, lg, "the snapshot bucket "+natslog.SnapshotBucket(cluster), func(ctx context.Context) error {
		var err error
		snaps, err = readSnapshots(ctx, log, useSnaps)
		return err
	}); err != nil {
		return nil, err
	}
	return logstore.OpenStore(logstore.StoreConfig{
		Host:    logstore.Config{StoreID: id, DataDir: dir, RaftAddr: addr, LogDB: o.logDB, TLS: o.peer.raft()},
		Cluster: cluster, NC: nc, Log: log, Logger: lg, Snapshots: snaps,
	})
}

// raftAddr keeps a store's Raft address across restarts of up: it is the
// replica's identity. The first start picks a free loopback port and
// records it in the data dir.
func raftAddr(dir string) (string, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return "", err
	}
	path := filepath.Join(dir, "raft-addr")
	if b, err := os.ReadFile(path); err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	addr := ln.Addr().String()
	ln.Close()
	return addr, os.WriteFile(path, []byte(addr+"\n"), 0o644)
}

// startWorker runs a worker and its control-stream agent (TLS with agentTLS
// unless nil) on a free loopback port.
func startWorker(ctx context.Context, wg *sync.WaitGroup, nc *nats.Conn, cluster string, agentTLS *tls.Config, lg zerolog.Logger) (workerCollector, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return workerCollector{}, err
	}
	endpoint := ln.Addr().String()
	ln.Close()
	var w *client.Worker
	agent, err := client.ListenAgentTLS(endpoint, agentTLS, lg.With().Str("endpoint", endpoint).Logger(), func() client.WorkerRef { return w.Ref() })
	if err != nil {
		return workerCollector{}, err
	}
	inc := newIncarnation()
	w, err = client.NewWorker(nc, client.WorkerConfig{
		Cluster: cluster, Incarnation: inc, Endpoint: endpoint, Kind: "compute", Parallelism: 4,
		// The worker names its endpoint where it matters ("registered").
		Logger: lg.With().Str("incarnation", inc).Logger(), DeregisterOnStop: true,
	})
	if err != nil {
		return workerCollector{}, err
	}
	wg.Add(2)
	go func() { defer wg.Done(); _ = agent.Run(ctx) }()
	go func() { defer wg.Done(); _ = w.Run(ctx) }()
	return workerCollector{agent: agent, w: w}, nil
}

// snapshotFlag is --snapshot-every of up and meta.
func snapshotFlag(f *pflag.FlagSet, every *int) {
	f.IntVar(every, "snapshot-every", meta.DefaultSnapshotEvery,
		"the meta leader stores a snapshot of its projection every N events and on clean shutdown, in the object store <cluster>_snapshots; replicas and stores start from the newest one (0: no snapshots)")
}

// readSnapshots binds the snapshot bucket next to log for a reader (a
// store, whose role may not create it); nil when snapshots are off or no
// meta replica has made the bucket yet: the reader folds from seq 1.
func readSnapshots(ctx context.Context, log *natslog.Log, on bool) (events.SnapshotStore, error) {
	if !on {
		return nil, nil
	}
	s, err := natslog.BindSnapshots(ctx, log)
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	return s, nil
}

// validLogDB checks --logdb before anything starts.
func validLogDB(p string) error {
	switch p {
	case logstore.LogDBTiny, logstore.LogDBDefault:
		return nil
	}
	return usage(fmt.Errorf("--logdb %q: want %s or %s", p, logstore.LogDBTiny, logstore.LogDBDefault))
}

// leaseFlag is --lease of up and meta run.
func leaseFlag(f *pflag.FlagSet, ttl *time.Duration) {
	durationFlag(f, ttl, "lease", 3*time.Second, "leader lease: the TTL of the cluster's lease bucket, set when the bucket is created (default: the existing bucket's, else 3s); another value than the existing bucket's is refused")
}

// upUpdateLease is up --update-lease: the lease bucket's TTL becomes ttl,
// with the admin key, before any replica opens it.
func upUpdateLease(ctx context.Context, srv *embeddedNATS, cluster string, ttl time.Duration, out io.Writer) error {
	nc, err := srv.Connect(0, "termlog-up-admin", natsserver.RoleAdmin)
	if err != nil {
		return err
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	octx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	old, found, err := setLeaseTTL(octx, js, cluster, ttl)
	switch {
	case err != nil:
		return err
	case found && old != ttl:
		fmt.Fprintf(out, "lease of cluster %s changed from %s to %s (--update-lease)\n", cluster, old, ttl)
	}
	return nil
}
