package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// roleConnOptions are the options of every long-running role's connection:
// reconnect forever, and never buffer a publish while reconnecting (nats.go
// would send it when the server is back, long after the decision it carried).
func roleConnOptions(name string) []nats.Option {
	// Each server of the list gets connectAttempt to answer, on the first
	// connect and on every reconnect: a frozen node costs a second, not
	// 5 s with the connection lock held (connectRole lengthens the bound
	// when every server of the list timed out).
	return []nats.Option{nats.Name(name), nats.Timeout(connectAttempt),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectBufSize(-1),
		// A node in lame-duck mode has stopped its JetStream: move now,
		// not when it closes the connection.
		natsserver.MoveOnLameDuck()}
}

// leaderRPC sends one request to the meta leader as admin and returns its
// reply, within --timeout, naming the cause when it fails.
func (g *globals) leaderRPC(ctx context.Context, rpc string, req any) (client.Reply, error) {
	s, err := g.dialSession("termlog-admin", natsserver.RoleAdmin)
	if err != nil {
		return client.Reply{}, err
	}
	defer s.Close()
	return s.leaderRPC(ctx, rpc, req)
}

// group makes cmd a command group: run bare, it prints its help.
func group(cmd *cobra.Command) *cobra.Command {
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error { return cmd.Help() }
	return cmd
}

// runRole logs a long-running role's start and stop around run.
func runRole(lg zerolog.Logger, what string, run func() error) error {
	lg.Info().Msg(what + " starting")
	err := run()
	if err != nil && !errors.Is(err, context.Canceled) {
		lg.Error().Err(err).Msg(what + " stopped")
		return err
	}
	lg.Info().Msg(what + " stopped")
	return nil
}

func newNATSCmd(g *globals) *cobra.Command {
	var data string
	var port int
	var co natsClusterOpts
	var sec serverSecurity
	var syncPolicy natsserver.SyncPolicy
	var serverLogLevel string
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Run an embedded NATS JetStream server on 127.0.0.1, standalone or one node of a cluster (--routes)",
		Long: `nats runs an embedded NATS JetStream server on 127.0.0.1.

With --cluster-port and --routes it is one node of a NATS cluster: start three,
each with its own --data, --port, --cluster-port and --name, all with the same
--routes (the three route URLs), then run the roles with --replicas 3 and
--nats listing the three client URLs.

Clients must authenticate with the role keys in --auth-dir (default
<data>/auth; generated there on first start). All nodes of a cluster need the
same keys: create them once with 'termlog auth init --dir DIR' and start every
node with --auth-dir DIR. --insecure runs an open server.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := co.serverConfig(natsserver.ServerConfig{DataDir: filepath.Join(data, "nats"), Port: port, Sync: syncPolicy})
			if err != nil {
				return err
			}
			lg, err := g.logger()
			if err != nil {
				return err
			}
			if cfg.Log, err = serverLogger(lg, serverLogLevel); err != nil {
				return err
			}
			if port < 0 || port > 65535 {
				return usage(fmt.Errorf("--port %d: want 0 (a free port) to 65535", port))
			}
			// Before the server opens its store: one server per data dir.
			lock, err := lockDataDir(data, "termlog nats")
			if err != nil {
				return err
			}
			defer lock.Unlock()
			if err := portFree(port); err != nil {
				return fmt.Errorf("--port: %w", err)
			}
			authDir := g.auth.authDir
			if authDir == "" {
				authDir = filepath.Join(data, "auth")
			}
			s, err := sec.setup(g.cluster, authDir, g.auth.tlsCA, cmd.OutOrStdout())
			if err != nil {
				return err
			}
			cfg.Auth, cfg.TLS = s.auth, s.tls
			if cfg.ClusterName != "" {
				cfg.RouteTLS = s.routeTLS
			}
			srv, err := natsserver.StartServer(cfg)
			if err != nil {
				return err
			}
			if cfg.ClusterName != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "NATS JetStream node %s at %s, routes at %s (cluster %s, peers %s), data in %s; Ctrl-C stops it\n",
					srv.Name(), srv.ClientURL(), srv.ClusterURL(), cfg.ClusterName, strings.Join(cfg.Routes, ","), data)
				fmt.Fprintf(cmd.OutOrStdout(), "waiting for a quorum of the cluster's nodes (%d of %d) to serve JetStream\n", len(cfg.Routes)/2+1, len(cfg.Routes))
				var wg sync.WaitGroup
				defer wg.Wait()
				wg.Add(1)
				go func() {
					defer wg.Done()
					// The cluster serves JetStream once a quorum of nodes runs.
					if leader, err := srv.WaitJetStream(cmd.Context()); err == nil {
						fmt.Fprintf(cmd.OutOrStdout(), "JetStream cluster ready: meta leader %s\n", leader)
					}
				}()
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "NATS JetStream at %s, data in %s; Ctrl-C stops it\n", srv.ClientURL(), data)
			}
			<-cmd.Context().Done()
			if cfg.ClusterName != "" {
				// Hand the Raft leaderships over first, so the cluster
				// loses no election timeout (4-9 s) to this node's stop.
				fmt.Fprintf(cmd.OutOrStdout(), "NATS stopping: lame duck (handing over this node's Raft leaderships, then closing its clients within %s)\n", natsserver.DefaultLameDuck)
				srv.LameDuckShutdown()
			} else {
				fmt.Fprintln(cmd.OutOrStdout(), "NATS stopping")
				srv.Shutdown()
			}
			fmt.Fprintln(cmd.OutOrStdout(), "NATS stopped; data kept in", data)
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "termlog-nats", "data directory")
	cmd.Flags().StringVar(&serverLogLevel, "server-log", "warn", "nats-server's own log (routes, JetStream elections, slow consumers) on stderr in termlog's format: info, warn, error or off")
	cmd.Flags().IntVar(&port, "port", 4222, "client port on 127.0.0.1 (0 picks a free one)")
	cmd.Flags().StringVar(&co.name, "name", "", "server name, unique and stable in the cluster (default termlog-nats-<cluster-port>)")
	cmd.Flags().StringVar(&co.clusterName, "cluster-name", "termlog", "NATS cluster name (the same on every node)")
	cmd.Flags().IntVar(&co.clusterPort, "cluster-port", 0, "route port on 127.0.0.1 the other nodes connect to (with --routes)")
	sec.register(cmd)
	syncFlag(cmd.Flags(), &syncPolicy)
	cmd.Flags().StringVar(&co.routes, "routes", "", "route URLs of the cluster's nodes, comma separated, e.g. nats-route://127.0.0.1:6222,nats-route://127.0.0.1:6223,nats-route://127.0.0.1:6224")
	return cmd
}

func newMetaCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{Use: "meta", Short: "Meta replicas: run one, step the leader down, set the cluster's lease"})
	cmd.AddCommand(newMetaRunCmd(g), newStepdownCmd(g), newSetLeaseCmd(g))
	return cmd
}

func newMetaRunCmd(g *globals) *cobra.Command {
	o := upOpts{}
	var id string
	var pt peerTLSFlags
	var web webOpts
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Run one meta replica against a NATS server (waits for NATS; Ctrl-C or SIGTERM stops it, releasing the lease)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if o.shards < 0 || o.snapEvery < 0 {
				return errors.New("--shards and --snapshot-every must be >= 0")
			}
			if err := validMetricsAddr(o.metricsAddr); err != nil {
				return err
			}
			if err := web.check("--web-addr"); err != nil {
				return err
			}
			lg, err := g.logger()
			if err != nil {
				return err
			}
			fps, err := failpoint.Parse(os.Getenv(failpoint.EnvVar))
			if err != nil {
				return err
			}
			if o.peer, err = g.peerTLS(pt); err != nil {
				return err
			}
			o.lease.explicit = cmd.Flags().Changed("lease")
			o.replicas = int(g.replicas)
			rlg := lg.With().Str("replica", id).Logger()
			return runRole(rlg, "meta replica", func() error {
				ctx, fatal, result, cancel := roleContext(cmd.Context())
				defer cancel()
				// Its server going into lame-duck mode: the replica lets its
				// appends in flight be answered before it moves.
				var rep atomic.Pointer[meta.Replica]
				nc, err := g.connectRole(ctx, rlg, id, natsserver.RoleMeta, fatal, nats.LameDuckModeHandler(func(nc *nats.Conn) {
					if r := rep.Load(); r != nil {
						r.ServerLeaving(nc)
						return
					}
					_ = nc.ForceReconnect()
				}))
				if err != nil {
					return err
				}
				defer nc.Close()
				defer watchJetStream(ctx, nc, rlg)()
				r, err := startMeta(ctx, nc, g.cluster, id, o, fps, lg)
				if err != nil {
					return result(err)
				}
				rep.Store(r)
				stop, err := metricsFor(ctx, o.metricsAddr, rlg, metaCollector{r: r})
				if err != nil {
					return err
				}
				defer stop()
				if web.addr != "" {
					cfg := g.logConfig()
					cfg.Bind = true
					l, err := openLogWaiting(ctx, rlg, nc, cfg)
					if err != nil {
						return err
					}
					_, stopWeb, err := serveConsole(ctx, web, g.cluster, nc, l, rlg.With().Str("role", "web").Logger())
					if err != nil {
						return err
					}
					defer stopWeb()
				}
				return result(r.Run(ctx))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "meta-1", "replica name (unique in the cluster)")
	leaseFlag(f, &o.lease.ttl)
	durationFlag(f, &o.timeout, "worker-timeout", 10*time.Second, "worker heartbeat timeout")
	f.IntVar(&o.shards, "shards", 0, "Raft shards the scheduler keeps (3 replicas each) once 3 stores are up")
	durationFlag(f, &o.storeTO, "store-timeout", 10*time.Second, "a store silent this long is down and its replicas are replaced")
	lostQuorumFlag(f, &o.lostQuorum)
	snapshotFlag(f, &o.snapEvery)
	metricsFlag(f, &o.metricsAddr)
	f.StringVar(&web.addr, "web-addr", "", "also serve the read-only web console at this address, e.g. 127.0.0.1:8080 (default off)")
	web.tlsFlags(f)
	pt.register(cmd, "the control streams to the workers are")
	return cmd
}

func newStepdownCmd(g *globals) *cobra.Command {
	var wait bool
	var asJSON bool
	var waitFor time.Duration
	cmd := &cobra.Command{
		Use:   "stepdown",
		Short: "Ask the current meta leader to give up its lease (another replica takes over); --wait prints the new leader",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := g.leaderRPC(cmd.Context(), client.RPCStepDown, struct{}{})
			if err != nil {
				return err
			}
			if !wait {
				if asJSON {
					return json.NewEncoder(cmd.OutOrStdout()).Encode(stepdownResult{Old: rep.Leader, OldTerm: rep.Term})
				}
				fmt.Fprintf(cmd.OutOrStdout(), "%s (term %d) is stepping down\n", rep.Leader, rep.Term)
				return nil
			}
			res, err := g.waitNewLeader(cmd.Context(), rep.Leader, rep.Term, waitFor)
			if err != nil {
				return err
			}
			if asJSON {
				return json.NewEncoder(cmd.OutOrStdout()).Encode(res)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s (term %d) stepped down; %s leads in term %d (after %s)\n", res.Old, res.OldTerm, res.Leader, res.Term, time.Duration(res.TookMS)*time.Millisecond)
			return nil
		},
	}
	cmd.Flags().BoolVar(&wait, "wait", false, "wait until another replica leads (read from the stream, as status does), its barrier recovery is complete and it published a health record built after its stores reported; print it and its term")
	durationFlag(cmd.Flags(), &waitFor, "wait-timeout", 30*time.Second, "with --wait: give up after this long (a new leader takes up to one lease period)")
	outputFlags(cmd.Flags(), &asJSON)
	return cmd
}

// stepdownResult is what `meta stepdown --wait -o json` prints.
type stepdownResult struct {
	Old     string `json:"old_leader"`
	OldTerm uint64 `json:"old_term"`
	Leader  string `json:"leader,omitempty"`
	Term    uint64 `json:"term,omitempty"`
	TookMS  int64  `json:"took_ms,omitempty"`
}

// waitNewLeader polls the stream's projection until a leader other than old
// holds a term above oldTerm and the lease, within waitFor.
func (g *globals) waitNewLeader(ctx context.Context, old string, oldTerm uint64, waitFor time.Duration) (stepdownResult, error) {
	start := time.Now()
	res := stepdownResult{Old: old, OldTerm: oldTerm}
	s, err := g.dialSession("termlog-stepdown", natsserver.RoleObserver)
	if err != nil {
		return res, err
	}
	defer s.Close()
	l, err := s.openStream(ctx, false)
	if err != nil {
		return res, err
	}
	wctx, cancel := context.WithTimeout(ctx, waitFor)
	defer cancel()
	last := "no new term yet"
	for {
		st, err := loadStatusFrom(wctx, s, l, zerolog.Nop())
		switch {
		case err == nil && st.Term > oldTerm && st.Leader != "" && st.Leader == st.LeaseHolder:
			// The new leader leads once its barrier recovery is complete
			// and it published a record built after its stores reported:
			// a status right after then judges the new leader's view.
			if why := newLeaderReady(st); why != "" {
				last = fmt.Sprintf("%s leads in term %d; %s", st.Leader, st.Term, why)
				break
			}
			res.Leader, res.Term, res.TookMS = st.Leader, st.Term, time.Since(start).Milliseconds()
			return res, nil
		case err == nil:
			last = fmt.Sprintf("leader %q term %d, lease held by %q", st.Leader, st.Term, st.LeaseHolder)
		case wctx.Err() == nil:
			last = err.Error()
		}
		select {
		case <-wctx.Done():
			return res, fmt.Errorf("%s (term %d) stepped down, but no other replica led within --wait-timeout %s (last seen: %s): are other meta replicas running?", old, oldTerm, waitFor, last)
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// newLeaderReady says what the leader of st's term has yet to do before it
// leads in full ("" when nothing): publish its health record, complete
// barrier recovery, hear from every store.
func newLeaderReady(st Status) string {
	rec := st.Health.Record
	switch {
	case rec == nil || rec.Term < st.Term:
		return "no health record of its term yet"
	case rec.Recovery.State != meta.RecoveryComplete:
		return "barrier recovery " + rec.Recovery.State
	case len(rec.Collecting) > 0:
		return "collecting reports from " + strings.Join(rec.Collecting, ", ")
	}
	return ""
}

func newSetLeaseCmd(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "set-lease DURATION",
		Short: "Change the cluster's lease (the TTL of its lease bucket), with the admin key; then restart the meta replicas with it",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var ttl time.Duration
			if err := positiveDuration(&ttl, 0).Set(args[0]); err != nil {
				return usage(fmt.Errorf("lease %w", err))
			}
			s, err := g.dialSession("termlog-set-lease", natsserver.RoleAdmin)
			if err != nil {
				return err
			}
			defer s.Close()
			js, err := jetstream.New(s.nc)
			if err != nil {
				return err
			}
			var old time.Duration
			var found bool
			err = s.call(cmd.Context(), func(ctx context.Context) error {
				var err error
				old, found, err = setLeaseTTL(ctx, js, g.cluster, ttl)
				return err
			})
			switch {
			case errors.Is(err, nats.ErrPermissionViolation):
				return s.refused(err, "update the lease bucket")
			case err != nil:
				return s.timeoutError(err, "set-lease")
			case !found:
				return fmt.Errorf("cluster %q has no lease bucket %s yet: the first meta replica creates it with its --lease", g.cluster, meta.LeaseBucket(g.cluster))
			case old == ttl:
				fmt.Fprintf(cmd.OutOrStdout(), "the lease of cluster %s is already %s\n", g.cluster, ttl)
			default:
				fmt.Fprintf(cmd.OutOrStdout(), "the lease of cluster %s is now %s (was %s); restart every meta replica (leave --lease out, or pass --lease %s): one still renewing by %s may lose its lease or hold it longer than it believes\n", g.cluster, ttl, old, ttl, old)
			}
			return nil
		},
	}
}

func newWorkerRunCmd(g *globals) *cobra.Command {
	var endpoint, kind, metricsAddr string
	var parallelism int
	var pt peerTLSFlags
	run := &cobra.Command{
		Use:   "run",
		Short: "Run a worker: a control-stream agent on --endpoint; it registers and heartbeats with meta (waits for NATS; Ctrl-C or SIGTERM deregisters it)",
		Args:  cobra.NoArgs,
	}
	run.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := client.ValidateEndpoint(endpoint); err != nil {
			return usage(err)
		}
		if parallelism < 1 {
			return usage(fmt.Errorf("--parallelism %d: want >= 1", parallelism))
		}
		if err := validMetricsAddr(metricsAddr); err != nil {
			return err
		}
		lg, err := g.logger()
		if err != nil {
			return err
		}
		peer, err := g.peerTLS(pt)
		if err != nil {
			return err
		}
		agentTLS, err := peer.config()
		if err != nil {
			return err
		}
		inc := newIncarnation()
		wlg := lg.With().Str("incarnation", inc).Logger()
		// Listen before anything else: an --endpoint in use is refused
		// before the worker connects (the process ends right after, which
		// closes the listener).
		var w *client.Worker
		agent, err := client.ListenAgentTLS(endpoint, agentTLS, lg.With().Str("endpoint", endpoint).Logger(), func() client.WorkerRef { return w.Ref() })
		if err != nil {
			return fmt.Errorf("--endpoint: %w", err)
		}
		return runRole(wlg.With().Str("endpoint", endpoint).Logger(), "worker", func() error {
			ctx, fatal, result, cancel := roleContext(cmd.Context())
			defer cancel()
			nc, err := g.connectRole(ctx, wlg, "worker-"+endpoint, natsserver.RoleWorker, fatal)
			if err != nil {
				return err
			}
			defer nc.Close()
			// The worker names its endpoint where it matters ("registered");
			// on Ctrl-C or SIGTERM it deregisters, as up's workers do.
			w, err = client.NewWorker(nc, client.WorkerConfig{Cluster: g.cluster, Incarnation: inc, Endpoint: endpoint,
				Kind: kind, Parallelism: parallelism, Logger: wlg, DeregisterOnStop: true})
			if err != nil {
				return err
			}
			stop, err := metricsFor(ctx, metricsAddr, wlg, workerCollector{agent: agent, w: w})
			if err != nil {
				return err
			}
			defer stop()
			// A worker does not use JetStream: its probe is whether meta
			// answered any of its requests lately (it heartbeats every
			// second).
			defer watchServer(ctx, nc, w.AnsweredWithin(3*time.Second), wlg)()
			var wg sync.WaitGroup
			errs := make([]error, 2)
			wg.Add(2)
			go func() { defer wg.Done(); errs[0] = agent.Run(ctx) }()
			go func() { defer wg.Done(); errs[1] = w.Run(ctx) }()
			wg.Wait()
			return result(errors.Join(errs...))
		})
	}
	metricsFlag(run.Flags(), &metricsAddr)
	run.Flags().StringVar(&endpoint, "endpoint", "127.0.0.1:5688", "host:port of this worker's control-stream listener")
	run.Flags().StringVar(&kind, "kind", "compute", "worker kind")
	run.Flags().IntVar(&parallelism, "parallelism", 4, "parallelism")
	pt.register(run, "the control stream from the meta leader is")
	return run
}

func newLogstoreCmd(g *globals) *cobra.Command {
	o := upOpts{}
	var id, addr, data string
	var pt peerTLSFlags
	useSnaps := true
	cmd := &cobra.Command{
		Use:   "logstore",
		Short: "Run one log store (a dragonboat NodeHost whose replicas follow the projected membership; waits for NATS)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			lg, err := g.logger()
			if err != nil {
				return err
			}
			if err := validLogDB(o.logDB); err != nil {
				return err
			}
			if err := logstore.SetDragonboatLogLevel(o.raftLog); err != nil {
				return err
			}
			if err := logstore.ValidateRaftAddr(addr); err != nil {
				return usage(err)
			}
			if o.restartGrace < 0 {
				return usage(fmt.Errorf("--restart-grace %s: want >= 0 (0: do not drain on SIGTERM)", o.restartGrace))
			}
			if err := validMetricsAddr(o.metricsAddr); err != nil {
				return err
			}
			if o.peer, err = g.peerTLS(pt); err != nil {
				return err
			}
			lock, err := lockDataDir(data, "termlog logstore --id "+id)
			if err != nil {
				return err
			}
			defer lock.Unlock()
			o.replicas = int(g.replicas)
			slg := lg.With().Str("store", id).Logger()
			return runRole(slg, "log store", func() error {
				ctx, fatal, result, cancel := roleContext(cmd.Context())
				defer cancel()
				nc, err := g.connectRole(ctx, slg, id, natsserver.RoleStore, fatal)
				if err != nil {
					return err
				}
				defer nc.Close()
				defer watchJetStream(ctx, nc, slg)()
				st, err := startStore(ctx, nc, g.cluster, id, data, addr, useSnaps, o, lg)
				if err != nil {
					return result(err)
				}
				defer st.Close()
				stop, err := metricsFor(ctx, o.metricsAddr, slg, storeCollector{s: st})
				if err != nil {
					return err
				}
				defer stop()
				return result(runStore(ctx, st, o.restartGrace, slg))
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "store-1", "store id (persisted in the data dir; [A-Za-z0-9_-])")
	f.StringVar(&addr, "raft-addr", "127.0.0.1:63001", "Raft address host:port (the replicas' identity: keep it across restarts)")
	f.StringVar(&data, "data", "termlog-store", "data directory")
	f.StringVar(&o.logDB, "logdb", "tiny", "LogDB profile: tiny or default")
	f.StringVar(&o.raftLog, "raft-log-level", "error", "dragonboat log level")
	pt.register(cmd, "the Raft traffic between the stores is")
	f.BoolVar(&useSnaps, "snapshots", true, "start the store's projection from the newest usable snapshot in <cluster>_snapshots")
	f.DurationVar(&o.restartGrace, "restart-grace", 15*time.Minute, "on SIGTERM or Ctrl-C the store drains itself this long before it stops, so a planned restart replaces nothing (0: it does not drain; a SIGKILLed store is replaced after --store-timeout)")
	metricsFlag(f, &o.metricsAddr)
	return cmd
}

// runStore runs st until ctx ends; then, before stopping it, the store
// drains itself for grace (a planned restart: its replicas are not
// replaced meanwhile). Only then does the NodeHost stop.
func runStore(ctx context.Context, st *logstore.Store, grace time.Duration, lg zerolog.Logger) error {
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- st.Run(sctx) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	if _, ok := permanent(ctx); ok {
		grace = 0 // the server refuses this store: no drain to ask for
	}
	if grace > 0 {
		dctx, dcancel := context.WithTimeout(sctx, 5*time.Second)
		if err := st.Drain(dctx, grace); err != nil {
			lg.Warn().Err(err).Msg("could not drain before stopping: the store may be replaced after --store-timeout")
		}
		dcancel()
	}
	cancel()
	return <-done
}

func newStoreCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{Use: "store", Short: "Log store administration"})
	drain := func(ctx context.Context, id string, d time.Duration, out func(string)) error {
		rep, err := g.leaderRPC(ctx, client.RPCStoreDrain, client.DrainRequest{Store: id, ForMS: d.Milliseconds()})
		if err != nil {
			return err
		}
		if d == 0 {
			out(fmt.Sprintf("store %s is up (term %d)", id, rep.Term))
		} else {
			out(fmt.Sprintf("store %s drains for %s: it is not marked down meanwhile (term %d)", id, d, rep.Term))
		}
		return nil
	}
	var d time.Duration
	dc := &cobra.Command{
		Use:   "drain ID",
		Short: "Mark a store draining for a planned restart (its replicas are not replaced meanwhile)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if d <= 0 {
				return usage(errors.New("--for must be > 0"))
			}
			return drain(cmd.Context(), args[0], d, func(s string) { fmt.Fprintln(cmd.OutOrStdout(), s) })
		},
	}
	dc.Flags().DurationVar(&d, "for", 15*time.Minute, "how long")
	var stopData string
	var stopWait time.Duration
	sc := &cobra.Command{
		Use:   "stop --data DIR",
		Short: "Stop the log store running on this machine with --data DIR (SIGTERM: it drains itself first) and wait until it has exited",
		Long: `stop sends SIGTERM to the process holding the data dir's lock (its pid is in
DIR/termlog.lock) and returns once the process is gone and the lock is free, so
the store can be started again at once: a rolling restart's stop step.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if stopData == "" {
				return usage(errors.New("--data DIR: the stopped store's data dir"))
			}
			who, err := stopHolder(stopData, stopWait)
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "stopped %s\n", who)
			return nil
		},
	}
	sc.Flags().StringVar(&stopData, "data", "", "the store's data directory")
	sc.Flags().DurationVar(&stopWait, "wait", time.Minute, "give up waiting for the process to exit after this long")
	cmd.AddCommand(sc)
	cmd.AddCommand(dc, &cobra.Command{
		Use:   "undrain ID",
		Short: "End a store's draining period",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return drain(cmd.Context(), args[0], 0, func(s string) { fmt.Fprintln(cmd.OutOrStdout(), s) })
		},
	})
	return cmd
}
