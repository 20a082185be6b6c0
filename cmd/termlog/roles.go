package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta/client"
)

// connect dials the --nats URLs (comma separated) as role and keeps
// reconnecting.
func (g *globals) connect(name string, role natslog.Role) (*nats.Conn, error) {
	return g.dial(role, roleConnOptions(name)...)
}

// roleConnOptions are the options of every long-running role's connection:
// reconnect forever, and never buffer a publish while reconnecting (nats.go
// would send it when the server is back, long after the decision it carried).
func roleConnOptions(name string) []nats.Option {
	return []nats.Option{nats.Name(name), nats.Timeout(5 * time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(250 * time.Millisecond), nats.ReconnectBufSize(-1)}
}

// leaderRPC sends one request to the meta leader and returns its reply.
func (g *globals) leaderRPC(rpc string, req any) (client.Reply, error) {
	nc, err := g.connect("termlog-admin", natslog.RoleAdmin)
	if err != nil {
		return client.Reply{}, err
	}
	defer nc.Close()
	b, err := json.Marshal(req)
	if err != nil {
		return client.Reply{}, err
	}
	msg, err := nc.Request(client.RPCSubject(g.cluster, rpc), b, 5*time.Second)
	if err != nil {
		if perr := nc.LastError(); errors.Is(perr, nats.ErrPermissionViolation) {
			return client.Reply{}, fmt.Errorf("refused (%s needs the admin key): %w", rpc, perr)
		}
		return client.Reply{}, fmt.Errorf("no leader answered: %w", err)
	}
	var rep client.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.Reply{}, fmt.Errorf("malformed reply: %w", err)
	}
	if rep.Error != nil {
		return rep, rep.Error
	}
	return rep, nil
}

func newNATSCmd(g *globals) *cobra.Command {
	var data string
	var port int
	var co natsClusterOpts
	var sec serverSecurity
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
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := co.serverConfig(natslog.ServerConfig{DataDir: filepath.Join(data, "nats"), Port: port})
			if err != nil {
				return err
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
			srv, err := natslog.StartServer(cfg)
			if err != nil {
				return err
			}
			if cfg.ClusterName != "" {
				fmt.Fprintf(cmd.OutOrStdout(), "NATS JetStream node %s at %s, routes at %s (cluster %s, peers %s), data in %s; Ctrl-C stops it\n",
					srv.Name(), srv.ClientURL(), srv.ClusterURL(), cfg.ClusterName, strings.Join(cfg.Routes, ","), data)
				go func() {
					// The cluster serves JetStream once a quorum of nodes runs.
					if leader, err := srv.WaitJetStream(cmd.Context()); err == nil {
						fmt.Fprintf(cmd.OutOrStdout(), "JetStream cluster ready: meta leader %s\n", leader)
					}
				}()
			} else {
				fmt.Fprintf(cmd.OutOrStdout(), "NATS JetStream at %s, data in %s; Ctrl-C stops it\n", srv.ClientURL(), data)
			}
			<-cmd.Context().Done()
			srv.Shutdown()
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "termlog-nats", "data directory")
	cmd.Flags().IntVar(&port, "port", 4222, "client port on 127.0.0.1 (0 picks a free one)")
	cmd.Flags().StringVar(&co.name, "name", "", "server name, unique and stable in the cluster (default termlog-nats-<cluster-port>)")
	cmd.Flags().StringVar(&co.clusterName, "cluster-name", "termlog", "NATS cluster name (the same on every node)")
	cmd.Flags().IntVar(&co.clusterPort, "cluster-port", 0, "route port on 127.0.0.1 the other nodes connect to (with --routes)")
	sec.register(cmd)
	cmd.Flags().StringVar(&co.routes, "routes", "", "route URLs of the cluster's nodes, comma separated, e.g. nats-route://127.0.0.1:6222,nats-route://127.0.0.1:6223,nats-route://127.0.0.1:6224")
	return cmd
}

func newMetaCmd(g *globals) *cobra.Command {
	o := upOpts{}
	var id string
	var pt peerTLSFlags
	cmd := &cobra.Command{
		Use:   "meta",
		Short: "Run one meta replica against a NATS server",
		RunE: func(cmd *cobra.Command, _ []string) error {
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
			nc, err := g.connect(id, natslog.RoleMeta)
			if err != nil {
				return err
			}
			defer nc.Close()
			o.replicas = int(g.replicas)
			r, err := startMeta(cmd.Context(), nc, g.cluster, id, o, fps, lg)
			if err != nil {
				return err
			}
			return r.Run(cmd.Context())
		},
	}
	f := cmd.Flags()
	f.StringVar(&id, "id", "meta-1", "replica name (unique in the cluster)")
	f.DurationVar(&o.lease, "lease", 3*time.Second, "leader lease")
	f.DurationVar(&o.timeout, "worker-timeout", 10*time.Second, "worker heartbeat timeout")
	f.IntVar(&o.shards, "shards", 0, "Raft shards the scheduler keeps (3 replicas each) once 3 stores are up")
	f.DurationVar(&o.storeTO, "store-timeout", 10*time.Second, "a store silent this long is down and its replicas are replaced")
	snapshotFlag(f, &o.snapEvery)
	pt.register(cmd, "the control streams to the workers are")
	cmd.AddCommand(&cobra.Command{
		Use:   "stepdown",
		Short: "Ask the current meta leader to give up its lease (another replica takes over)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			rep, err := g.leaderRPC(client.RPCStepDown, struct{}{})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s (term %d) is stepping down\n", rep.Leader, rep.Term)
			return nil
		},
	})
	return cmd
}

func newWorkerRoleCmd(g *globals, parent *cobra.Command) {
	var endpoint, kind string
	var parallelism int
	var pt peerTLSFlags
	run := parent
	run.Short = "Run a worker (control-stream agent on --endpoint, registers and heartbeats with meta); `worker list` lists them"
	run.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := client.ValidateEndpoint(endpoint); err != nil {
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
		nc, err := g.connect("worker-"+endpoint, natslog.RoleWorker)
		if err != nil {
			return err
		}
		defer nc.Close()
		lg = lg.With().Str("endpoint", endpoint).Logger()
		var w *client.Worker
		agent, err := client.ListenAgentTLS(endpoint, agentTLS, lg, func() client.WorkerRef { return w.Ref() })
		if err != nil {
			return err
		}
		w, err = client.NewWorker(nc, client.WorkerConfig{Cluster: g.cluster, Incarnation: newIncarnation(), Endpoint: endpoint,
			Kind: kind, Parallelism: parallelism, Logger: lg})
		if err != nil {
			return err
		}
		ctx := cmd.Context()
		var wg sync.WaitGroup
		errs := make([]error, 2)
		wg.Add(2)
		go func() { defer wg.Done(); errs[0] = agent.Run(ctx) }()
		go func() { defer wg.Done(); errs[1] = w.Run(ctx) }()
		wg.Wait()
		return errors.Join(errs...)
	}
	run.Flags().StringVar(&endpoint, "endpoint", "127.0.0.1:5688", "host:port of this worker's control-stream listener")
	run.Flags().StringVar(&kind, "kind", "compute", "worker kind")
	run.Flags().IntVar(&parallelism, "parallelism", 4, "parallelism")
	pt.register(run, "the control stream from the meta leader is")
}

func newLogstoreCmd(g *globals) *cobra.Command {
	o := upOpts{}
	var id, addr, data string
	var pt peerTLSFlags
	useSnaps := true
	cmd := &cobra.Command{
		Use:   "logstore",
		Short: "Run one log store (a dragonboat NodeHost whose replicas follow the projected membership)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			lg, err := g.logger()
			if err != nil {
				return err
			}
			if err := logstore.SetDragonboatLogLevel(o.raftLog); err != nil {
				return err
			}
			if err := logstore.ValidateRaftAddr(addr); err != nil {
				return err
			}
			if o.peer, err = g.peerTLS(pt); err != nil {
				return err
			}
			nc, err := g.connect(id, natslog.RoleStore)
			if err != nil {
				return err
			}
			defer nc.Close()
			o.replicas = int(g.replicas)
			st, err := startStore(cmd.Context(), nc, g.cluster, id, data, addr, useSnaps, o, lg)
			if err != nil {
				return err
			}
			defer st.Close()
			return st.Run(cmd.Context())
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
	return cmd
}

func newStoreCmd(g *globals) *cobra.Command {
	cmd := &cobra.Command{Use: "store", Short: "Log store administration"}
	drain := func(id string, d time.Duration, out func(string)) error {
		rep, err := g.leaderRPC(client.RPCStoreDrain, client.DrainRequest{Store: id, ForMS: d.Milliseconds()})
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
				return errors.New("--for must be > 0")
			}
			return drain(args[0], d, func(s string) { fmt.Fprintln(cmd.OutOrStdout(), s) })
		},
	}
	dc.Flags().DurationVar(&d, "for", 15*time.Minute, "how long")
	cmd.AddCommand(dc, &cobra.Command{
		Use:   "undrain ID",
		Short: "End a store's draining period",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return drain(args[0], 0, func(s string) { fmt.Fprintln(cmd.OutOrStdout(), s) })
		},
	})
	return cmd
}
