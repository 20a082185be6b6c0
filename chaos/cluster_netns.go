package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"

	"github.com/termlog/termlog/chaos/netns"
)

// newNSCluster lays out a Netns cluster: a net with one namespace per
// NATS node, meta and store, and a client namespace for the workers (and
// the probes and read commands). The embedded NATS listens on 127.0.0.1
// only, so relays in each NATS namespace carry its client port, its route
// port, and the routes to its peers across the bridge (and its cuts).
// Nothing runs until Start; Stop tears the net down.
func newNSCluster(ctx context.Context, cfg Config) (c *Cluster, err error) {
	c = &Cluster{Cfg: cfg, Endpoints: map[string]string{}, StoreIDs: map[string]string{}, Metrics: map[string]string{}, nodes: map[string]*netns.Node{}}
	logs := filepath.Join(cfg.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, err
	}
	c.Auth = filepath.Join(cfg.Dir, "auth")
	if out, err := exec.CommandContext(ctx, cfg.Bin, "auth", "init", "--dir", c.Auth).CombinedOutput(); err != nil {
		return nil, fmt.Errorf("auth init: %v\n%s", err, out)
	}
	if c.Net, err = netns.New(ctx); err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			c.closeNet()
		}
	}()
	nodes := 1
	replicas := "1"
	if cfg.Topology == R3 {
		nodes, replicas = 3, "3"
	}
	var names []string
	for i := range nodes {
		names = append(names, fmt.Sprintf("nats-%d", i+1))
	}
	for i := range cfg.Metas {
		names = append(names, fmt.Sprintf("meta-%d", i+1))
	}
	for i := range cfg.Stores {
		names = append(names, fmt.Sprintf("store-%d", i+1))
	}
	names = append(names, ClientNode)
	for _, name := range names {
		nd, err := c.Net.Add(ctx, name)
		if err != nil {
			return nil, err
		}
		c.nodes[name] = nd
	}
	var routes []string
	for i := range nodes {
		nd := c.nodes[fmt.Sprintf("nats-%d", i+1)]
		c.natsPorts = append(c.natsPorts, nsNATSPort)
		c.URLs = append(c.URLs, "nats://"+net.JoinHostPort(nd.IP, fmt.Sprint(nsNATSPort)))
		routes = append(routes, fmt.Sprintf("nats-route://127.0.0.1:%d", nsClusterPort+i))
	}
	c.env = []string{
		"TERMLOG_NATS=" + strings.Join(c.URLs, ","),
		"TERMLOG_AUTH_DIR=" + c.Auth,
		"TERMLOG_REPLICAS=" + replicas,
		"TERMLOG_LOG_FORMAT=json",
		"TERMLOG_FAILPOINTS=",
		"GOTRACEBACK=all",
	}
	proc := func(name, node string, args ...string) *Proc {
		argv := append(append(c.nodes[node].Exec()[1:], cfg.Bin), args...)
		return &Proc{Name: name, Bin: "ip", Args: argv, Env: c.env, LogPath: filepath.Join(logs, name+".log")}
	}
	metrics := fmt.Sprintf("127.0.0.1:%d", nsMetrics)
	for i := range nodes {
		name := fmt.Sprintf("nats-%d", i+1)
		args := []string{"nats", "--port", fmt.Sprint(nsNATSPort), "--data", filepath.Join(cfg.Dir, name), "--auth-dir", c.Auth}
		if cfg.Topology == R3 {
			args = append(args, "--name", fmt.Sprintf("n%d", i+1), "--cluster-port", fmt.Sprint(nsClusterPort+i), "--routes", strings.Join(routes, ","))
		}
		c.NATS = append(c.NATS, proc(name, name, args...))
	}
	for i := range cfg.Metas {
		name := fmt.Sprintf("meta-%d", i+1)
		c.Metrics[name] = metrics
		c.Metas = append(c.Metas, proc(name, name, "meta", "run", "--id", name, "--shards", fmt.Sprint(cfg.Shards),
			"--lease", cfg.Lease.String(), "--worker-timeout", cfg.WorkerTimeout.String(), "--store-timeout", cfg.StoreTimeout.String(),
			"--metrics-addr", metrics))
	}
	client := c.nodes[ClientNode]
	for i := range cfg.Workers {
		name := fmt.Sprintf("worker-%d", i+1)
		ep := net.JoinHostPort(client.IP, fmt.Sprint(nsEndpoint+i))
		m := fmt.Sprintf("127.0.0.1:%d", nsMetrics+1+i)
		c.Endpoints[name], c.Metrics[name] = ep, m
		c.Workers = append(c.Workers, proc(name, ClientNode, "worker", "run", "--endpoint", ep, "--metrics-addr", m))
	}
	for i := range cfg.Stores {
		name := fmt.Sprintf("store-%d", i+1)
		raft := net.JoinHostPort(c.nodes[name].IP, fmt.Sprint(nsRaftPort))
		c.StoreIDs[name], c.Metrics[name] = name, metrics
		c.Stores = append(c.Stores, proc(name, name, "logstore", "--id", name, "--raft-addr", raft, "--data", filepath.Join(cfg.Dir, name),
			"--metrics-addr", metrics))
	}
	relay := func(nd *netns.Node, listen, target string) error {
		r, err := nd.Relay(listen, target)
		if err != nil {
			return err
		}
		c.relays = append(c.relays, r)
		return nil
	}
	// A relay dials per connection, so it may start before its server.
	for i := range nodes {
		nd := c.nodes[fmt.Sprintf("nats-%d", i+1)]
		if err := relay(nd, net.JoinHostPort(nd.IP, fmt.Sprint(nsNATSPort)), fmt.Sprintf("127.0.0.1:%d", nsNATSPort)); err != nil {
			return nil, err
		}
		if cfg.Topology != R3 {
			continue
		}
		if err := relay(nd, net.JoinHostPort(nd.IP, fmt.Sprint(nsClusterPort+i)), fmt.Sprintf("127.0.0.1:%d", nsClusterPort+i)); err != nil {
			return nil, err
		}
		for j := range nodes {
			if j != i {
				peer := c.nodes[fmt.Sprintf("nats-%d", j+1)]
				if err := relay(nd, fmt.Sprintf("127.0.0.1:%d", nsClusterPort+j), net.JoinHostPort(peer.IP, fmt.Sprint(nsClusterPort+j))); err != nil {
					return nil, err
				}
			}
		}
	}
	return c, nil
}

// Node is the namespace a process (or ClientNode) runs in; nil when the
// cluster is not in Netns mode.
func (c *Cluster) Node(name string) *netns.Node {
	if c.Net == nil {
		return nil
	}
	if strings.HasPrefix(name, "worker-") {
		name = ClientNode
	}
	return c.nodes[name]
}

// Cut cuts every link between the nodes of a and each of bs (process
// names); Uncut with the same arguments releases exactly these cuts.
func (c *Cluster) Cut(ctx context.Context, a string, bs ...string) error {
	if c.Net == nil {
		return errors.New("chaos: partitions need a Netns cluster")
	}
	for _, b := range bs {
		if err := c.Net.Cut(ctx, c.Node(a).Name, c.Node(b).Name); err != nil {
			return err
		}
	}
	return nil
}

// Uncut releases the cuts of one Cut call.
func (c *Cluster) Uncut(ctx context.Context, a string, bs ...string) error {
	if c.Net == nil {
		return nil
	}
	var errs []error
	for _, b := range bs {
		errs = append(errs, c.Net.Uncut(ctx, c.Node(a).Name, c.Node(b).Name))
	}
	return errors.Join(errs...)
}

// closeNet closes the relays and deletes the namespaces (processes first:
// Stop calls it last).
func (c *Cluster) closeNet() error {
	if c.Net == nil {
		return nil
	}
	var errs []error
	for _, r := range c.relays {
		errs = append(errs, r.Close())
	}
	c.relays = nil
	errs = append(errs, c.Net.Teardown())
	return errors.Join(errs...)
}
