package main

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/meta/client"
)

// connect dials the --nats URLs (comma separated) and keeps reconnecting.
func (g *globals) connect(name string) (*nats.Conn, error) {
	nc, err := nats.Connect(g.natsURL, nats.Name(name), nats.Timeout(5*time.Second),
		nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond))
	if err != nil {
		return nil, fmt.Errorf("connect %s: %w", g.natsURL, err)
	}
	return nc, nil
}

func newNATSCmd(g *globals) *cobra.Command {
	var data string
	var port int
	cmd := &cobra.Command{
		Use:   "nats",
		Short: "Run a standalone embedded NATS JetStream server on 127.0.0.1",
		RunE: func(cmd *cobra.Command, _ []string) error {
			srv, err := natslog.StartServer(natslog.ServerConfig{DataDir: filepath.Join(data, "nats"), Port: port})
			if err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "NATS JetStream at %s, data in %s; Ctrl-C stops it\n", srv.ClientURL(), data)
			<-cmd.Context().Done()
			srv.Shutdown()
			return nil
		},
	}
	cmd.Flags().StringVar(&data, "data", "termlog-nats", "data directory")
	cmd.Flags().IntVar(&port, "port", 4222, "client port on 127.0.0.1 (0 picks a free one)")
	return cmd
}

func newMetaCmd(g *globals) *cobra.Command {
	o := upOpts{}
	var id string
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
			nc, err := g.connect(id)
			if err != nil {
				return err
			}
			defer nc.Close()
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
	cmd.AddCommand(&cobra.Command{
		Use:   "stepdown",
		Short: "Ask the current meta leader to give up its lease (another replica takes over)",
		RunE: func(cmd *cobra.Command, _ []string) error {
			nc, err := g.connect("termlog-stepdown")
			if err != nil {
				return err
			}
			defer nc.Close()
			msg, err := nc.Request(client.RPCSubject(g.cluster, client.RPCStepDown), []byte("{}"), 5*time.Second)
			if err != nil {
				return fmt.Errorf("no leader answered: %w", err)
			}
			var rep client.Reply
			if err := json.Unmarshal(msg.Data, &rep); err != nil {
				return err
			}
			if rep.Error != nil {
				return rep.Error
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
		nc, err := g.connect("worker-" + endpoint)
		if err != nil {
			return err
		}
		defer nc.Close()
		lg = lg.With().Str("endpoint", endpoint).Logger()
		var w *client.Worker
		agent, err := client.ListenAgent(endpoint, lg, func() client.WorkerRef { return w.Ref() })
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
}
