package main

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/natsserver"
)

// replicasValue is --replicas: 1 (one NATS server) or 3 (a 3-node NATS
// cluster). It is checked when the flag is parsed.
type replicasValue int

func (r *replicasValue) String() string { return strconv.Itoa(int(*r)) }
func (r *replicasValue) Type() string   { return "1|3" }
func (r *replicasValue) Set(s string) error {
	n, err := strconv.Atoi(s)
	if err != nil || (n != 1 && n != 3) {
		return fmt.Errorf("%q: want 1 (one NATS server) or 3 (a 3-node NATS cluster)", s)
	}
	*r = replicasValue(n)
	return nil
}

// logConfig is the stream configuration of --cluster and --replicas.
func (g *globals) logConfig() natslog.Config {
	return natslog.Config{Cluster: g.cluster, Replicas: int(g.replicas)}
}

// readConfig is logConfig for the roles that only read the stream: they
// wait for a meta replica to create it (their keys may not create it).
func (g *globals) readConfig() natslog.Config {
	c := g.logConfig()
	c.Bind = true
	return c
}

// natsClusterOpts are the clustering flags of `termlog nats`.
type natsClusterOpts struct {
	name        string
	clusterName string
	clusterPort int
	routes      string
}

// serverConfig adds the clustering flags to cfg: with --routes the server
// is one node of a NATS cluster, without them a standalone server.
func (o natsClusterOpts) serverConfig(cfg natsserver.ServerConfig) (natsserver.ServerConfig, error) {
	cfg.Name = o.name
	if o.routes == "" {
		if o.clusterPort != 0 {
			return cfg, errors.New("--cluster-port needs --routes (the route URLs of the cluster's nodes)")
		}
		return cfg, nil
	}
	if o.clusterPort <= 0 {
		return cfg, errors.New("--routes needs --cluster-port: the other nodes route to it, so it must be fixed")
	}
	if cfg.Name == "" {
		// Stable across restarts: JetStream knows its peers by name.
		cfg.Name = fmt.Sprintf("termlog-nats-%d", o.clusterPort)
	}
	cfg.ClusterName, cfg.ClusterPort = o.clusterName, o.clusterPort
	for _, r := range strings.Split(o.routes, ",") {
		if r = strings.TrimSpace(r); r != "" {
			if _, err := natsserver.ParseRouteURL(r); err != nil {
				return cfg, fmt.Errorf("--routes: %w", err)
			}
			cfg.Routes = append(cfg.Routes, r)
		}
	}
	return cfg, nil
}

// embeddedNATS is the NATS of `termlog up`: one server, or with
// --replicas 3 a 3-node cluster on loopback in this process.
type embeddedNATS struct {
	srvs []*natsserver.Server
	sec  secured
	// lg gets the connections' asynchronous errors (the client would
	// print them raw).
	lg zerolog.Logger
}

// startEmbeddedNATS starts the servers: data/nats for one, data/nats-1..3
// for three, the first on port (0: a free one), the others on free ports,
// each syncing its writes as sync says.
// Routes are picked afresh each start: a node is known to its peers by its
// name, not its address.
func startEmbeddedNATS(data string, port, replicas int, sync natsserver.SyncPolicy, sec secured) (*embeddedNATS, error) {
	if replicas <= 1 {
		srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: filepath.Join(data, "nats"), Port: port, Sync: sync, Auth: sec.auth, TLS: sec.tls})
		if err != nil {
			return nil, err
		}
		return &embeddedNATS{srvs: []*natsserver.Server{srv}, sec: sec}, nil
	}
	srvs, err := natsserver.StartCluster(natsserver.ServerConfig{Port: port, ClusterName: "termlog", Sync: sync, Auth: sec.auth, TLS: sec.tls, RouteTLS: sec.routeTLS}, data, replicas)
	if err != nil {
		return nil, err
	}
	return &embeddedNATS{srvs: srvs, sec: sec}, nil
}

// URLs lists the client URLs, node first first.
func (e *embeddedNATS) URLs(first int) string {
	var out []string
	for k := range e.srvs {
		out = append(out, e.srvs[(first+k)%len(e.srvs)].ClientURL())
	}
	return strings.Join(out, ",")
}

// Connect dials every node as role, node i%n first, and keeps
// reconnecting.
func (e *embeddedNATS) Connect(i int, name string, role natsserver.Role) (*nats.Conn, error) {
	ro, err := e.sec.clientOptions(role)
	if err != nil {
		return nil, err
	}
	opts := append(roleConnOptions(name), ro...)
	lg := e.lg.With().Str("conn", name).Logger()
	opts = append(opts, nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
		ev := lg.Warn().Err(err)
		if sub != nil {
			ev = ev.Str("subject", sub.Subject)
		}
		ev.Msg("NATS error")
	}))
	// Each server gets connectAttempt (roleConnOptions); a second try, if
	// every one timed out (a loaded machine), gives each maxConnectAttempt.
	if len(e.srvs) == 1 {
		nc, err := e.srvs[0].Connect(opts...)
		if err != nil && connectTimedOut(err) {
			nc, err = e.srvs[0].Connect(append(opts, nats.Timeout(maxConnectAttempt))...)
		}
		return nc, err
	}
	urls := e.URLs(i % len(e.srvs))
	opts = append(opts, nats.DontRandomize())
	nc, err := nats.Connect(urls, opts...)
	if err != nil && connectTimedOut(err) {
		nc, err = nats.Connect(urls, append(opts, nats.Timeout(maxConnectAttempt))...)
	}
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", urls, err)
	}
	return nc, nil
}

// Shutdown stops every server.
func (e *embeddedNATS) Shutdown() {
	for _, s := range e.srvs {
		s.Shutdown()
	}
}

// leaseOpts are the lease flags of up and meta run.
type leaseOpts struct {
	ttl      time.Duration
	explicit bool // --lease was given; else the cluster's lease is used
	// update (up only): change an existing bucket's TTL to ttl.
	update bool
}

// openLease opens the cluster's lease bucket and returns the TTL the
// replica must renew by. Without an explicit --lease it is the existing
// bucket's (3s when the bucket is created); an explicit one that differs
// from the bucket is refused, saying why and how to change it (fix names
// the way for this command).
func openLease(ctx context.Context, js jetstream.JetStream, cluster string, lo leaseOpts, replicas int, fix string, lg zerolog.Logger) (*meta.KVLease, time.Duration, error) {
	lease, err := meta.OpenKVLease(ctx, js, cluster, lo.ttl, replicas)
	var te *meta.LeaseTTLError
	if !errors.As(err, &te) {
		return lease, lo.ttl, err
	}
	if !lo.explicit && te.Have > 0 {
		if lease, err = meta.OpenKVLease(ctx, js, cluster, te.Have, replicas); err != nil {
			return nil, 0, err
		}
		if te.Have != lo.ttl {
			lg.Info().Dur("lease", te.Have).Str("bucket", te.Bucket).Msg("using the cluster's lease")
		}
		return lease, te.Have, nil
	}
	if te.Have <= 0 {
		return nil, 0, fmt.Errorf("refused: lease bucket %s has no TTL (made by an older termlog with --lease 0): a lease there never expires, so a dead leader is never replaced; give it one: %s",
			te.Bucket, fmt.Sprintf(fix, lo.ttl))
	}
	return nil, 0, fmt.Errorf("refused: --lease %s, but the lease of cluster %q is %s (bucket %s). The lease is the cluster's: a replica renewing by another period than the bucket's TTL loses its lease between renewals, or holds it longer than it believes. Leave --lease out to use %s, or change the cluster's lease: %s",
		lo.ttl, cluster, te.Have, te.Bucket, te.Have, fmt.Sprintf(fix, lo.ttl))
}

// setLeaseTTL makes the TTL of the cluster's lease bucket ttl (the bucket's
// stream MaxAge), if the bucket exists. It needs a key that may update
// streams (admin). It returns the TTL the bucket had (0 and false when
// there is no bucket yet).
func setLeaseTTL(ctx context.Context, js jetstream.JetStream, cluster string, ttl time.Duration) (time.Duration, bool, error) {
	name := "KV_" + meta.LeaseBucket(cluster)
	st, err := js.Stream(ctx, name)
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		return 0, false, nil
	}
	if err != nil {
		return 0, false, fmt.Errorf("lease bucket %s: %w", meta.LeaseBucket(cluster), err)
	}
	cfg := st.CachedInfo().Config
	old := cfg.MaxAge
	if old == ttl {
		return old, true, nil
	}
	cfg.MaxAge = ttl
	// The dedupe window of a KV stream may not exceed its max age.
	if cfg.Duplicates > ttl {
		cfg.Duplicates = ttl
	}
	if _, err := js.UpdateStream(ctx, cfg); err != nil {
		return old, true, fmt.Errorf("set the TTL of lease bucket %s to %s: %w", meta.LeaseBucket(cluster), ttl, err)
	}
	return old, true, nil
}
