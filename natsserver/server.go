package natsserver

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
)

// loopback is the only address an embedded server listens on.
const loopback = "127.0.0.1"

// tlsTimeout bounds a TLS handshake (client or route).
const tlsTimeout = 5 * time.Second

// DefaultLameDuck is ServerConfig.LameDuck's default: the clients of a
// node stopping in lame-duck mode are closed (and reconnect elsewhere)
// within it, after its leaderships moved and its JetStream stopped.
const DefaultLameDuck = 4 * time.Second

// MoveOnLameDuck is the LameDuckModeHandler of termlog's clients: told that
// its server is stopping gracefully (its JetStream is already stopped), a
// connection moves to another server at once, not when the server closes
// it. (Going on using the stopping server for 300 ms first, so that the
// replies in flight arrive, measured no better in the nodeloss bench: a
// meta replica does that for its appends instead, meta.Replica.ServerLeaving.)
func MoveOnLameDuck() nats.Option {
	return nats.LameDuckModeHandler(func(nc *nats.Conn) { _ = nc.ForceReconnect() })
}

// DefaultReadyTimeout bounds how long StartServer waits for the server to
// accept clients and for JetStream to answer.
const DefaultReadyTimeout = 10 * time.Second

// ServerConfig configures an embedded NATS server with JetStream. The zero
// value is not usable: DataDir is required.
//
// Setting ClusterName makes the server one node of a NATS cluster whose
// JetStream is clustered (streams and KV buckets with Replicas > 1). Every
// node needs a stable Name, its own DataDir, a client listener (not
// DontListen) and the route URLs of the other nodes; all listen on
// 127.0.0.1 only.
type ServerConfig struct {
	// DataDir is the JetStream file store directory (required). Starting a
	// new server on the same directory recovers its streams.
	DataDir string
	// Host is the client listen address; only "127.0.0.1" (the default) is
	// accepted.
	Host string
	// Port is the client port; 0 picks a free one.
	Port int
	// DontListen serves in-process connections only (see Server.Connect).
	DontListen bool
	// Name is the server name; empty lets the server use its generated ID.
	Name string
	// ReadyTimeout bounds the start; 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// MaxStore and MaxMemory bound JetStream storage in bytes; 0 lets the
	// server pick its defaults.
	MaxStore, MaxMemory int64
	// Sync says when the file store syncs to disk. The zero value,
	// SyncAlways, syncs every write before the server acknowledges it.
	Sync SyncPolicy
	// Log receives the server's log, one call per entry, from the server's
	// goroutines at once; level is nats-server's ("INF", "WRN", "ERR",
	// "FTL", "DBG", "TRC"). nil discards it. Debug and Trace make it verbose.
	Log          func(level, msg string)
	Debug, Trace bool

	// ClusterName names the NATS cluster this server joins; empty runs a
	// standalone server (and the cluster fields below must be empty).
	ClusterName string
	// ClusterPort is the route listen port on 127.0.0.1; 0 picks a free one
	// (see ClusterURL).
	ClusterPort int
	// Auth, when set, makes every client authenticate as one of its roles
	// (an NKey user with that role's permissions); nil runs an open server
	// that lets anyone do anything.
	Auth *ServerAuth
	// TLS, when set, makes every client connection use TLS (in-process
	// connections excepted); nil serves plaintext.
	TLS *tls.Config

	// RouteTLS, when set on a cluster node, makes its routes mutual TLS
	// (see RouteTLSConfig): a node without a certificate signed by the
	// cluster's CA cannot join. nil: plaintext routes on 127.0.0.1.
	RouteTLS *tls.Config

	// LameDuck is how long LameDuckShutdown spreads closing the clients
	// over, once the node's Raft leaderships were handed over; 0 means
	// DefaultLameDuck.
	LameDuck time.Duration

	// Routes are the route URLs of the cluster's nodes, for example
	// "nats-route://127.0.0.1:6222"; this node's own URL may be listed too.
	// Required with ClusterName (JetStream needs configured routes). Only
	// 127.0.0.1 is allowed.
	Routes []string
}

// SyncPolicy is when a server's JetStream file store syncs its writes to
// disk (fsync): the difference between an acknowledged event surviving a
// power loss or an OS crash and not.
type SyncPolicy int

const (
	// SyncAlways syncs every write (stream messages and, on a cluster node,
	// the Raft log) before the write is acknowledged: an acknowledged event
	// survives a power loss or an OS crash. It costs an fsync per write
	// (batched by the server under load). The default.
	SyncAlways SyncPolicy = iota
	// SyncInterval is nats-server's own default: writes go to the page
	// cache and are synced every DefaultSyncInterval (2 minutes). A process
	// crash loses nothing, but a power loss or an OS crash loses what was
	// acknowledged since the last sync: on a 3-node cluster, every node
	// losing power at once loses it from all three (Jepsen, NATS 2.12.1).
	SyncInterval
)

// DefaultSyncInterval is how often SyncInterval syncs (nats-server's
// default sync_interval).
const DefaultSyncInterval = 2 * time.Minute

// String is the policy's name, as ParseSyncPolicy reads it.
func (p SyncPolicy) String() string {
	switch p {
	case SyncAlways:
		return "always"
	case SyncInterval:
		return "interval"
	}
	return fmt.Sprintf("SyncPolicy(%d)", int(p))
}

// ParseSyncPolicy reads "always" or "interval".
func ParseSyncPolicy(s string) (SyncPolicy, error) {
	switch s {
	case "always":
		return SyncAlways, nil
	case "interval":
		return SyncInterval, nil
	}
	return 0, fmt.Errorf("sync %q: want always (fsync before every acknowledgement) or interval (fsync every %s: a power loss loses acknowledged events)", s, DefaultSyncInterval)
}

// clustered reports whether cfg asks for a cluster node.
func (c ServerConfig) clustered() bool { return c.ClusterName != "" }

// routeURLs validates the clustering fields and parses Routes.
func (c ServerConfig) routeURLs() ([]*url.URL, error) {
	if !c.clustered() {
		if c.ClusterPort != 0 || len(c.Routes) > 0 || c.RouteTLS != nil {
			return nil, errors.New("ClusterPort, Routes and RouteTLS need a ClusterName")
		}
		return nil, nil
	}
	if c.Name == "" {
		return nil, errors.New("a cluster node needs a Name (JetStream identifies its peers by server name)")
	}
	if c.DontListen {
		return nil, errors.New("a cluster node cannot be DontListen (routes and clients need listeners)")
	}
	if c.ClusterPort < 0 || c.ClusterPort > 65535 {
		return nil, fmt.Errorf("cluster port %d out of range 0..65535", c.ClusterPort)
	}
	if len(c.Routes) == 0 {
		return nil, errors.New("a cluster node needs Routes (JetStream needs configured routes)")
	}
	var out []*url.URL
	for _, r := range c.Routes {
		u, err := ParseRouteURL(r)
		if err != nil {
			return nil, err
		}
		out = append(out, u)
	}
	return out, nil
}

// ParseRouteURL parses one route URL: scheme nats-route (or nats), host
// 127.0.0.1 and a port.
func ParseRouteURL(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("route %q: %w", s, err)
	}
	if u.Scheme != "nats-route" && u.Scheme != "nats" {
		return nil, fmt.Errorf("route %q: scheme must be nats-route", s)
	}
	if u.Hostname() != loopback {
		return nil, fmt.Errorf("route %q: host must be %s", s, loopback)
	}
	if p, err := strconv.Atoi(u.Port()); err != nil || p < 1 || p > 65535 {
		return nil, fmt.Errorf("route %q: needs a port 1..65535", s)
	}
	if u.User != nil || (u.Path != "" && u.Path != "/") || u.RawQuery != "" {
		return nil, fmt.Errorf("route %q: only nats-route://%s:PORT is allowed", s, loopback)
	}
	return u, nil
}

// RouteURL is the route URL of a cluster node listening on port.
func RouteURL(port int) string {
	return "nats-route://" + net.JoinHostPort(loopback, strconv.Itoa(port))
}

// Server is a running embedded NATS server.
type Server struct {
	ns  *server.Server
	cfg ServerConfig
	// ready is an in-memory NKey user that may only ask for JetStream
	// account info, for the readiness check on an authenticated server
	// (nil on an open one). Its seed is never written anywhere.
	ready nkeys.KeyPair
}

// StartServer starts a NATS server with JetStream enabled and returns once it
// accepts clients and JetStream answers, or an error saying which did not
// happen in time. A cluster node returns once it accepts clients and has
// JetStream enabled: its JetStream answers only once the cluster elected a
// meta leader, which needs a quorum of nodes; WaitJetStream waits for that.
// The caller must call Shutdown.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("start NATS server: DataDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = loopback
	}
	if cfg.Host != loopback {
		return nil, fmt.Errorf("start NATS server: host %q: only %s is allowed", cfg.Host, loopback)
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	routes, err := cfg.routeURLs()
	if err != nil {
		return nil, fmt.Errorf("start NATS server: %w", err)
	}
	if cfg.Sync != SyncAlways && cfg.Sync != SyncInterval {
		return nil, fmt.Errorf("start NATS server: unknown sync policy %d", int(cfg.Sync))
	}
	opts := &server.Options{
		ServerName:         cfg.Name,
		Host:               cfg.Host,
		Port:               port,
		DontListen:         cfg.DontListen,
		HTTPPort:           0, // no monitoring endpoint
		NoSigs:             true,
		NoLog:              true, // we install our own logger below
		Debug:              cfg.Debug,
		Trace:              cfg.Trace,
		JetStream:          true,
		StoreDir:           cfg.DataDir,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamMaxMemory: cfg.MaxMemory,
		SyncAlways:         cfg.Sync == SyncAlways,
		SyncInterval:       DefaultSyncInterval,
	}
	if cfg.LameDuck <= 0 {
		cfg.LameDuck = DefaultLameDuck
	}
	opts.LameDuckDuration = cfg.LameDuck
	// Must be > 0 (0 is 10 s) and < the duration: no client is closed
	// before it (400ms by default), so a client that moves by itself on the
	// notice (meta.Replica.ServerLeaving: at most 300ms) always moves first.
	opts.LameDuckGracePeriod = cfg.LameDuck / 10
	if cfg.clustered() {
		cport := cfg.ClusterPort
		if cport == 0 {
			cport = server.RANDOM_PORT
		}
		opts.Cluster = server.ClusterOpts{Name: cfg.ClusterName, Host: loopback, Port: cport, TLSConfig: cfg.RouteTLS}
		if cfg.RouteTLS != nil {
			opts.Cluster.TLSTimeout = tlsTimeout.Seconds()
		}
		opts.Routes = routes
	}
	opts.TLSConfig = cfg.TLS
	if cfg.TLS != nil {
		opts.TLSTimeout = tlsTimeout.Seconds()
	}
	var ready nkeys.KeyPair
	if cfg.Auth != nil {
		if opts.Nkeys, err = cfg.Auth.users(); err != nil {
			return nil, fmt.Errorf("start NATS server: %w", err)
		}
		if ready, err = nkeys.CreateUser(); err != nil {
			return nil, fmt.Errorf("start NATS server: %w", err)
		}
		pub, err := ready.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("start NATS server: %w", err)
		}
		opts.Nkeys = append(opts.Nkeys, &server.NkeyUser{Nkey: pub, Permissions: &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: []string{jsAPI + "INFO"}},
			Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix(pub) + ".>"}},
		}})
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("start NATS server: %w", err)
	}
	// Always our logger: the server reports fatal start errors (a port in
	// use) through it, and the stock logger would exit the process.
	logger := &serverLogger{fn: cfg.Log, fatal: make(chan string, 1)}
	ns.SetLoggerV2(logger, cfg.Debug, cfg.Trace, false)
	s := &Server{ns: ns, cfg: cfg, ready: ready}
	deadline := time.Now().Add(cfg.ReadyTimeout)
	ns.Start()
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-logger.fatal:
			s.Shutdown()
			return nil, fmt.Errorf("start NATS server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, fmt.Errorf("start NATS server: not ready for connections after %s (%s:%d, data dir %s)",
				cfg.ReadyTimeout, cfg.Host, cfg.Port, cfg.DataDir)
		}
	}
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	if err := s.waitEnabled(ctx, logger.fatal); err != nil {
		s.Shutdown()
		return nil, fmt.Errorf("start NATS server: %w", err)
	}
	if cfg.clustered() {
		return s, nil
	}
	if err := s.waitAnswers(ctx); err != nil {
		s.Shutdown()
		return nil, fmt.Errorf("start NATS server: %w", err)
	}
	return s, nil
}

const readyPoll = 20 * time.Millisecond

// waitEnabled polls until JetStream is enabled on the server.
func (s *Server) waitEnabled(ctx context.Context, fatal <-chan string) error {
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for !s.ns.JetStreamEnabled() {
		select {
		case msg := <-fatal:
			return errors.New(msg)
		case <-ctx.Done():
			return fmt.Errorf("JetStream not enabled after %s", s.cfg.ReadyTimeout)
		case <-tick.C:
		}
	}
	return nil
}

// waitAnswers polls until JetStream answers an account info request on an
// in-process connection (the listener was checked already, and a loaded
// machine can make a TCP dial time out).
func (s *Server) waitAnswers(ctx context.Context) error {
	dial := time.Second
	if d, ok := ctx.Deadline(); ok {
		dial = max(time.Until(d), dial)
	}
	opts := []nats.Option{nats.InProcessServer(s.ns), nats.Name("natsserver-ready-check"), nats.NoReconnect(), nats.Timeout(dial)}
	if s.ready != nil {
		pub, err := s.ready.PublicKey()
		if err != nil {
			return err
		}
		opts = append(opts, nats.Nkey(pub, s.ready.Sign), nats.CustomInboxPrefix(InboxPrefix(pub)))
	}
	nc, err := nats.Connect(nats.DefaultURL, opts...)
	if err != nil {
		return fmt.Errorf("connect in-process: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return err
	}
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("JetStream not usable: %w (last error: %w)", ctx.Err(), err)
		case <-tick.C:
		}
	}
}

// WaitJetStream blocks until JetStream on this server answers API requests:
// for a cluster node, until the cluster has a meta leader (elected by a
// quorum of nodes: start them all, then wait) and this node knows it. It
// returns the meta leader's server name ("" for a standalone server), or an
// error when ctx ends first.
func (s *Server) WaitJetStream(ctx context.Context) (string, error) {
	tick := time.NewTicker(readyPoll)
	defer tick.Stop()
	for s.cfg.clustered() && s.MetaLeader() == "" {
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("NATS server %s: no JetStream meta leader: %w", s.cfg.Name, ctx.Err())
		case <-tick.C:
		}
	}
	if err := s.waitAnswers(ctx); err != nil {
		return "", fmt.Errorf("NATS server %s: %w", s.cfg.Name, err)
	}
	return s.MetaLeader(), nil
}

// MetaLeader is the server name of the JetStream meta leader this node
// knows, "" when there is none (or the server is not clustered).
func (s *Server) MetaLeader() string {
	if !s.ns.JetStreamIsClustered() {
		return ""
	}
	info, err := s.ns.Jsz(&server.JSzOptions{})
	if err != nil || info.Meta == nil {
		return ""
	}
	return info.Meta.Leader
}

// Name is the server's name (its generated ID when ServerConfig.Name was
// empty).
func (s *Server) Name() string { return s.ns.Name() }

// ClusterURL is the route URL other cluster nodes reach this one at ("" for
// a standalone server).
func (s *Server) ClusterURL() string {
	addr := s.ns.ClusterAddr()
	if !s.cfg.clustered() || addr == nil {
		return ""
	}
	return RouteURL(addr.Port)
}

// ClientURL is the URL clients connect to ("" when the server does not
// listen).
func (s *Server) ClientURL() string {
	if s.cfg.DontListen {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens a client connection: in-process when the server does not
// listen, else to ClientURL. opts come after the defaults, so they win.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if s.cfg.DontListen {
		opts = append([]nats.Option{nats.InProcessServer(s.ns)}, opts...)
	}
	url := s.ClientURL()
	if url == "" {
		url = nats.DefaultURL // ignored for in-process connections
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("connect to the embedded NATS server: %w", err)
	}
	return nc, nil
}

// Sync is the server's sync policy.
func (s *Server) Sync() SyncPolicy { return s.cfg.Sync }

// NATS is the underlying server, for tests that need more than this wrapper.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server and waits until it has stopped. It is safe to
// call more than once.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// LameDuckShutdown stops the server gracefully: it stops accepting
// clients, hands each Raft group it leads (streams, KV buckets, the
// JetStream meta group) to a peer and waits a second for the handover,
// stops its JetStream, tells its clients it is going (nats.go's
// LameDuckModeHandler) and closes them within ServerConfig.LameDuck, then
// shuts down. Only then does it return. A node stopped this way costs its
// cluster no election timeout (4-9 s): its peers do not wait for it to
// fall silent. Safe to call more than once, and after Shutdown.
func (s *Server) LameDuckShutdown() {
	s.ns.LameDuckShutdown() // returns at once when the server does not listen
	s.Shutdown()
}

// Secure reports whether clients must authenticate (ServerConfig.Auth).
func (s *Server) Secure() bool { return s.cfg.Auth != nil }

// serverLogger hands the server's log to fn (if any) and the first fatal
// error to StartServer. It never exits the process.
type serverLogger struct {
	fn    func(level, msg string)
	fatal chan string
}

func (l *serverLogger) logf(level, format string, v ...any) string {
	msg := fmt.Sprintf(format, v...)
	if l.fn != nil {
		l.fn(level, msg)
	}
	return msg
}

func (l *serverLogger) Noticef(format string, v ...any) { l.logf("INF", format, v...) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.logf("WRN", format, v...) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.logf("ERR", format, v...) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.logf("DBG", format, v...) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.logf("TRC", format, v...) }

func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := l.logf("FTL", format, v...)
	select {
	case l.fatal <- msg:
	default:
	}
}

// StartCluster starts the n nodes of one JetStream cluster on loopback
// (routes on free ports picked afresh: a node is known to its peers by its
// name, not its address), each from base with its own Name (nats-i),
// DataDir (dir/nats-i) and route port; the first node keeps base.Port, the
// others take a free one. It returns once JetStream answers on every node
// (within 30 s), or shuts down what it started and says which node failed.
func StartCluster(base ServerConfig, dir string, n int) ([]*Server, error) {
	if base.ClusterName == "" {
		base.ClusterName = "termlog"
	}
	var ports []int
	var routes []string
	for range n {
		l, err := net.Listen("tcp", loopback+":0")
		if err != nil {
			return nil, fmt.Errorf("start NATS cluster: a free route port: %w", err)
		}
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
		l.Close()
		routes = append(routes, RouteURL(ports[len(ports)-1]))
	}
	var srvs []*Server
	stop := func() {
		for _, s := range srvs {
			s.Shutdown()
		}
	}
	for i := range n {
		cfg := base
		cfg.Name = fmt.Sprintf("nats-%d", i+1)
		cfg.DataDir = filepath.Join(dir, cfg.Name)
		cfg.ClusterPort, cfg.Routes = ports[i], routes
		if i > 0 {
			cfg.Port = 0
		}
		if err := os.MkdirAll(cfg.DataDir, 0o755); err != nil {
			stop()
			return nil, err
		}
		srv, err := StartServer(cfg)
		if err != nil {
			stop()
			return nil, fmt.Errorf("node %s: %w", cfg.Name, err)
		}
		srvs = append(srvs, srv)
	}
	// The cluster serves JetStream once its nodes elected a meta leader.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, s := range srvs {
		if _, err := s.WaitJetStream(ctx); err != nil {
			stop()
			return nil, err
		}
	}
	return srvs, nil
}
