package chaos

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"

	"github.com/termlog/termlog/chaos/netns"
)

// nsAddrs builds the net of a Netns cluster: one namespace per NATS node,
// meta and store, and a client namespace for the workers (and the probes
// and read commands). Each namespace has its own loopback and address, so
// the ports are fixed. The embedded NATS listens on 127.0.0.1 only, so
// relays in each NATS namespace carry its client port, its route port,
// and the routes to its peers across the bridge (and its cuts).
func (c *Cluster) nsAddrs(ctx context.Context, nodes int) (addrs, error) {
	cfg := c.Cfg
	var err error
	if c.Net, err = netns.New(ctx); err != nil {
		return addrs{}, err
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
			return addrs{}, err
		}
		c.nodes[name] = nd
	}
	at := func(name string, port int) string { return net.JoinHostPort(c.nodes[name].IP, fmt.Sprint(port)) }
	metrics := fmt.Sprintf("127.0.0.1:%d", nsMetrics)
	var a addrs
	for i := range nodes {
		a.natsPorts, a.clusterPorts = append(a.natsPorts, nsNATSPort), append(a.clusterPorts, nsClusterPort+i)
		a.urls = append(a.urls, "nats://"+at(fmt.Sprintf("nats-%d", i+1), nsNATSPort))
		a.routes = append(a.routes, fmt.Sprintf("nats-route://127.0.0.1:%d", nsClusterPort+i)) // relayed to the peer
	}
	for range cfg.Metas {
		a.metaMetrics = append(a.metaMetrics, metrics)
	}
	for i := range cfg.Workers {
		a.workerEndpoints = append(a.workerEndpoints, at(ClientNode, nsEndpoint+i))
		a.workerMetrics = append(a.workerMetrics, fmt.Sprintf("127.0.0.1:%d", nsMetrics+1+i))
	}
	for i := range cfg.Stores {
		a.storeRaft, a.storeMetrics = append(a.storeRaft, at(fmt.Sprintf("store-%d", i+1), nsRaftPort)), append(a.storeMetrics, metrics)
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
		name := fmt.Sprintf("nats-%d", i+1)
		nd := c.nodes[name]
		if err := relay(nd, at(name, nsNATSPort), fmt.Sprintf("127.0.0.1:%d", nsNATSPort)); err != nil {
			return addrs{}, err
		}
		if cfg.Topology != R3 {
			continue
		}
		if err := relay(nd, at(name, nsClusterPort+i), fmt.Sprintf("127.0.0.1:%d", nsClusterPort+i)); err != nil {
			return addrs{}, err
		}
		for j := range nodes {
			if j != i {
				if err := relay(nd, fmt.Sprintf("127.0.0.1:%d", nsClusterPort+j), at(fmt.Sprintf("nats-%d", j+1), nsClusterPort+j)); err != nil {
					return addrs{}, err
				}
			}
		}
	}
	return a, nil
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
