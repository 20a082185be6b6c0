package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/termlog/termlog/chaos/netns"
	"github.com/termlog/termlog/internal/testkit"
)

// Topology is the NATS side of a cluster.
type Topology string

const (
	Standalone Topology = "standalone" // one NATS server, R1 stream
	R3         Topology = "r3"         // three NATS nodes, R3 stream and lease
)

// ParseTopology accepts standalone, r3, or both ("" or "both").
func ParseTopology(s string) ([]Topology, error) {
	switch strings.ToLower(s) {
	case "standalone":
		return []Topology{Standalone}, nil
	case "r3":
		return []Topology{R3}, nil
	case "", "both":
		return []Topology{Standalone, R3}, nil
	}
	return nil, fmt.Errorf("topology %q: want standalone, r3 or both", s)
}

// Config is one cluster of separate processes on 127.0.0.1.
type Config struct {
	Bin      string   // the built termlog binary
	Dir      string   // data dirs, keys and logs of this cluster
	Topology Topology // standalone or r3
	Metas    int      // meta replicas (3)
	Workers  int      // `worker run` processes
	Stores   int      // log stores (3)
	Shards   int      // Raft shards the scheduler keeps

	Lease         time.Duration
	WorkerTimeout time.Duration
	StoreTimeout  time.Duration

	// Netns runs every role in a network namespace of its own (chaos/netns:
	// each NATS node, meta and store in one, the workers, probes and read
	// commands in a "client" one), so schedules can cut links between them:
	// the partition faults are drawn only then.
	Netns bool

	// StoreArgs are extra flags for every log store.
	StoreArgs []string
	// NATSArgs are extra flags for every NATS node (`--sync interval`).
	NATSArgs []string
}

// DefaultConfig is the short-lease cluster the suite runs.
func DefaultConfig(bin, dir string, top Topology) Config {
	return Config{Bin: bin, Dir: dir, Topology: top, Metas: 3, Workers: 3, Stores: 3, Shards: 2,
		Lease: 2 * time.Second, WorkerTimeout: 3 * time.Second, StoreTimeout: 3 * time.Second}
}

// Cluster is the running processes of one Config.
type Cluster struct {
	Cfg     Config
	Auth    string
	NATS    []*Proc
	Metas   []*Proc
	Workers []*Proc
	Stores  []*Proc

	URLs      []string          // client URLs of the NATS nodes
	Endpoints map[string]string // worker proc name -> its endpoint
	StoreIDs  map[string]string // store proc name -> store id
	Metrics   map[string]string // proc name -> metrics host:port
	natsPorts []int
	env       []string

	// Netns mode: the net, each process's node (workers share "client"),
	// and the relays that make the NATS nodes reachable on their
	// namespace's address.
	Net    *netns.Net
	nodes  map[string]*netns.Node
	relays []*netns.Relay
}

// In Netns mode every namespace has its own loopback and address, so the
// ports are fixed.
const (
	nsNATSPort    = 4222
	nsClusterPort = 6221 // + node index
	nsRaftPort    = 63001
	nsEndpoint    = 5688 // + worker index, on the client's address
	nsMetrics     = 9464 // + worker index in the client namespace; 127.0.0.1 inside each role's namespace
)

// ClientNode is the namespace of the workers, probes and read commands.
const ClientNode = "client"

// freePorts picks n ports below the ephemeral range (testkit.PickPort):
// they are bound again after every kill and restart, and a port from the
// ephemeral range may be some client connection's source port by then.
func freePorts(n int) ([]int, error) {
	var out []int
	for range n {
		port, err := testkit.PickPort()
		if err != nil {
			return nil, err
		}
		out = append(out, port)
	}
	return out, nil
}

// NewCluster lays out a cluster: keys, addresses, dirs (in Netns mode the
// net and its relays too) and the processes' command lines. Nothing runs
// until Start; Stop ends it (and tears a net down).
func NewCluster(ctx context.Context, cfg Config) (c *Cluster, err error) {
	c = &Cluster{Cfg: cfg, Endpoints: map[string]string{}, StoreIDs: map[string]string{}, Metrics: map[string]string{}, nodes: map[string]*netns.Node{}}
	logs := filepath.Join(cfg.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	c.Auth = filepath.Join(cfg.Dir, "auth")
	if out, err := exec.CommandContext(ctx, cfg.Bin, "auth", "init", "--dir", c.Auth).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("auth init: %v\n%s", err, out)
	}
	nodes, replicas := 1, "1"
	if cfg.Topology == R3 {
		nodes, replicas = 3, "3"
	}
	var a addrs
	if cfg.Netns {
		defer func() {
			if err != nil {
				_ = c.closeNet()
			}
		}()
		a, err = c.nsAddrs(ctx, nodes)
	} else {
		a, err = loopbackAddrs(cfg, nodes)
	}
	if err != nil {
		return nil, err
	}
	c.natsPorts, c.URLs = a.natsPorts, a.urls
	c.env = []string{
		"TERMLOG_NATS=" + strings.Join(c.URLs, ","),
		"TERMLOG_AUTH_DIR=" + c.Auth,
		"TERMLOG_REPLICAS=" + replicas,
		"TERMLOG_LOG_FORMAT=json",
		"TERMLOG_FAILPOINTS=",
		"GOTRACEBACK=all",
	}
	proc := func(name string, args ...string) *Proc {
		p := &Proc{Name: name, Bin: cfg.Bin, Args: args, Env: c.env, LogPath: filepath.Join(logs, name+".log")}
		if nd := c.Node(name); nd != nil {
			p.Bin, p.Args = "ip", append(append(nd.Exec()[1:], cfg.Bin), args...)
		}
		return p
	}
	for i := range nodes {
		name := fmt.Sprintf("nats-%d", i+1)
		args := []string{"nats", "--server-log", "info", "--port", fmt.Sprint(a.natsPorts[i]), "--data", filepath.Join(cfg.Dir, name), "--auth-dir", c.Auth}
		if cfg.Topology == R3 {
			args = append(args, "--name", fmt.Sprintf("n%d", i+1), "--cluster-port", fmt.Sprint(a.clusterPorts[i]), "--routes", strings.Join(a.routes, ","))
		}
		c.NATS = append(c.NATS, proc(name, append(args, cfg.NATSArgs...)...))
	}
	for i := range cfg.Metas {
		name := fmt.Sprintf("meta-%d", i+1)
		c.Metrics[name] = a.metaMetrics[i]
		c.Metas = append(c.Metas, proc(name, "meta", "run", "--id", name, "--shards", fmt.Sprint(cfg.Shards),
			"--lease", cfg.Lease.String(), "--worker-timeout", cfg.WorkerTimeout.String(), "--store-timeout", cfg.StoreTimeout.String(),
			"--metrics-addr", a.metaMetrics[i]))
	}
	for i := range cfg.Workers {
		name := fmt.Sprintf("worker-%d", i+1)
		c.Endpoints[name], c.Metrics[name] = a.workerEndpoints[i], a.workerMetrics[i]
		c.Workers = append(c.Workers, proc(name, "worker", "run", "--endpoint", a.workerEndpoints[i], "--metrics-addr", a.workerMetrics[i]))
	}
	for i := range cfg.Stores {
		name := fmt.Sprintf("store-%d", i+1)
		c.StoreIDs[name], c.Metrics[name] = name, a.storeMetrics[i]
		c.Stores = append(c.Stores, proc(name, append([]string{"logstore", "--id", name, "--raft-addr", a.storeRaft[i], "--data", filepath.Join(cfg.Dir, name),
			"--metrics-addr", a.storeMetrics[i]}, cfg.StoreArgs...)...))
	}
	return c, nil
}

// addrs is where each process of a cluster listens.
type addrs struct {
	natsPorts, clusterPorts []int    // per NATS node, on its 127.0.0.1
	urls, routes            []string // what clients and peer nodes dial
	metaMetrics             []string
	workerEndpoints         []string
	workerMetrics           []string
	storeRaft, storeMetrics []string
}

// loopbackAddrs puts every process on 127.0.0.1, each port its own.
func loopbackAddrs(cfg Config, nodes int) (addrs, error) {
	ports, err := freePorts(2*nodes + cfg.Metas + 2*cfg.Workers + 2*cfg.Stores)
	if err != nil {
		return addrs{}, err
	}
	next := func() string { p := ports[0]; ports = ports[1:]; return fmt.Sprintf("127.0.0.1:%d", p) }
	var a addrs
	for range nodes {
		a.natsPorts, a.clusterPorts = append(a.natsPorts, ports[0]), append(a.clusterPorts, ports[1])
		a.urls = append(a.urls, "nats://"+next())
		a.routes = append(a.routes, "nats-route://"+next())
	}
	for range cfg.Metas {
		a.metaMetrics = append(a.metaMetrics, next())
	}
	for range cfg.Workers {
		a.workerEndpoints, a.workerMetrics = append(a.workerEndpoints, next()), append(a.workerMetrics, next())
	}
	for range cfg.Stores {
		a.storeRaft, a.storeMetrics = append(a.storeRaft, next()), append(a.storeMetrics, next())
	}
	return a, nil
}

// Env is what a command run against the cluster needs (NATS URLs, keys,
// replicas, JSON logs).
func (c *Cluster) Env() []string { return c.env }

// NATSStoreDir is where NATS node i (0-based) keeps its JetStream store
// (`termlog nats --data D` stores in D/nats).
func (c *Cluster) NATSStoreDir(i int) string {
	return filepath.Join(c.Cfg.Dir, fmt.Sprintf("nats-%d", i+1), "nats")
}

// LogDir is where every process logs.
func (c *Cluster) LogDir() string { return filepath.Join(c.Cfg.Dir, "logs") }

// All is every process, NATS first.
func (c *Cluster) All() []*Proc {
	var out []*Proc
	for _, g := range [][]*Proc{c.NATS, c.Metas, c.Workers, c.Stores} {
		out = append(out, g...)
	}
	return out
}

// Start starts every process (roles wait for NATS by themselves).
func (c *Cluster) Start() error {
	for _, p := range c.All() {
		if err := p.Start(); err != nil {
			return err
		}
	}
	return nil
}

// Heal resumes every paused process and starts every one that is not
// running (killed, or exited by itself: that exit is in its log).
func (c *Cluster) Heal() (restarted []string, err error) {
	if c.Net != nil {
		// Every link too (a step that failed half-way may have left a cut).
		if err := c.Net.Heal(context.Background()); err != nil {
			return nil, err
		}
	}
	for _, p := range c.All() {
		if p.Paused() {
			if err := p.Resume(); err != nil {
				return restarted, err
			}
		}
		if !p.Running() {
			p.Reap()
			if err := p.Start(); err != nil {
				return restarted, err
			}
			restarted = append(restarted, p.Name)
		}
	}
	return restarted, nil
}

// Stop ends every process: roles with SIGTERM first (workers deregister,
// stores drain), NATS last; then it tears a Netns cluster's net down.
func (c *Cluster) Stop() error {
	c.stopProcs()
	return c.closeNet()
}

func (c *Cluster) stopProcs() {
	for _, g := range [][]*Proc{c.Workers, c.Stores, c.Metas, c.NATS} {
		done := make(chan struct{}, len(g))
		for _, p := range g {
			go func() {
				_ = p.Term(5 * time.Second)
				done <- struct{}{}
			}()
		}
		for range g {
			<-done
		}
	}
}

// Proc returns the process named name (nil: none).
func (c *Cluster) Proc(name string) *Proc {
	for _, p := range c.All() {
		if p.Name == name {
			return p
		}
	}
	return nil
}
