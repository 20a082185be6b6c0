package main

import (
	"errors"
	"fmt"
	"os"
	"strings"

	"github.com/spf13/cobra"

	"github.com/termlog/termlog/cmd/termlog/internal/bench"
)

func newBench(_ *globals) *cobra.Command {
	cfg := bench.Defaults
	var asJSON bool
	var out, only, replot string
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Measure termlog's hot paths next to raw baselines on an embedded NATS server",
		Long: `bench starts an embedded NATS JetStream server (127.0.0.1, a free port, a temporary
data dir) and measures, in one process and one run, each figure next to its raw
baseline on the same server:

  fold       Apply and DecodeApply events/s vs plain JSON decoding of the same bytes
  replay     Log.Read + fold and a Projector catching up vs a raw ordered consumer
  catchup    a new replica's Projector catching up from a snapshot vs from seq 1
  append     fenced appends (in groups as under a burst, and one at a time) vs raw async and sync publish; p50/p99
  sync       fenced appends and the registration burst on a server with --sync always vs one with --sync interval
             (its grouped series: --appends events, at least 100,000)
  register   N workers registering at once against 3 meta replicas vs a trivial responder
  heartbeat  leader CPU and p99 reply latency with N workers at 1 Hz vs a trivial responder
  failover   leader killed -> term.started -> barrier recovery complete vs a raw lease handover
  memory     bytes per worker in a projection and in a leading replica
  scale      (only with --only scale) register, failover, heartbeat and memory at each --scale
             size on R1 and R3 (--scale-replicas), --sync always, a fresh server per point;
             a table, and an SVG plot with --plot
  nodeloss   (only with --only nodeloss) a 3-node NATS cluster (termlog nats processes, --sync always):
             SIGKILL and SIGTERM of the stream leader's, the lease leader's and a follower's node;
             append blackout vs a raw publisher, time without a meta leader, term changes, status

Every group but sync runs on a server with --sync interval unless --sync always
is given; the sync group runs the same appends and burst on one server of each.
The ratio is the cost relative to the baseline (1.00 = as cheap as raw). Results
go to stdout (a table, or JSON with --json); progress goes to stderr. Every load
is bounded in count and time. The defaults take about a minute on 2 cores; the
issue's target sizes are --workers 10000 --events 1000000 (about 4 minutes).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if replot != "" {
				if cfg.Plot == "" {
					return usage(errors.New("--replot needs --plot FILE (where to write the plot)"))
				}
				return bench.Replot(replot, cfg.Plot)
			}
			if only != "" {
				cfg.Only = strings.Split(only, ",")
			}
			cfg.Progress = cmd.ErrOrStderr()
			rep, err := bench.Run(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			w := cmd.OutOrStdout()
			if out != "" {
				f, err := os.Create(out)
				if err != nil {
					return err
				}
				defer f.Close()
				w = f
			}
			if asJSON {
				err = rep.WriteJSON(w)
			} else {
				err = rep.WriteTable(w)
			}
			if err != nil {
				return err
			}
			if len(rep.Problems) > 0 {
				return fmt.Errorf("%d group(s) could not be measured: %s", len(rep.Problems), strings.Join(rep.Problems, "; "))
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.BoolVar(&asJSON, "json", false, "write the report as JSON")
	f.StringVar(&out, "out", "", "write the report to this file instead of stdout")
	f.Var((*syncValue)(&cfg.Sync), "sync", "sync policy of the server every group but sync runs on: interval (raw baselines not dominated by fsync) or always (what termlog's servers run); the sync group measures both")
	f.IntVar(&cfg.Replicas, "replicas", 1, "1: one embedded NATS server; 3: every group on an embedded 3-node cluster on loopback (streams, buckets and raw baselines at 3 replicas)")
	f.IntVar(&cfg.Workers, "workers", cfg.Workers, "workers for register, heartbeat, failover and memory (target size: 10000)")
	f.IntVar(&cfg.Events, "events", cfg.Events, "events for fold, replay and catchup (target size: 1000000)")
	f.IntVar(&cfg.Appends, "appends", 0, "appends in each append series (default min(--events, 10000))")
	f.IntVar(&cfg.GroupedAppends, "grouped-appends", 0, "sync: events of the grouped series and its raw atomic-batch baseline (default max(--appends, 100000): their ratio is steady only at that size)")
	f.StringVar(&only, "only", "", "comma-separated groups to run: "+strings.Join(bench.Groups(), ","))
	f.DurationVar(&cfg.HeartbeatFor, "heartbeat-for", cfg.HeartbeatFor, "heartbeat measuring window (once for the leader, once for the baseline)")
	f.DurationVar(&cfg.Lease, "lease", cfg.Lease, "meta lease (the failover target is lease + 1 s)")
	f.StringVar(&cfg.ProfileDir, "profile-dir", "", "write a CPU profile of each measured phase into this directory (go tool pprof)")
	f.StringVar(&cfg.Dir, "keep-dir", "", "keep the servers' data and the logs (nodeloss-nats.log, nodeloss-meta.log) in this directory instead of a temporary one removed at the end")
	f.DurationVar(&cfg.BurstTimeout, "burst-timeout", cfg.BurstTimeout, "bound of the registration burst; a burst cut short is reported as partial")
	f.IntSliceVar(&cfg.Scale, "scale", bench.DefaultScale, "scale: worker counts, each run on every --scale-replicas configuration")
	f.IntSliceVar(&cfg.ScaleReplicas, "scale-replicas", []int{1, 3}, "scale: server configurations (1: one node, 3: a 3-node cluster)")
	f.StringVar(&cfg.Plot, "plot", "", "scale: write the SVG plot of the points to this file")
	f.StringVar(&replot, "replot", "", "measure nothing: write --plot from a report saved with --json --out (its scale points)")
	f.IntVar(&cfg.NodeLoss.Kills, "kills", 5, "nodeloss: losses of each scenario (min/median/max over them)")
	f.IntVar(&cfg.NodeLoss.PortBase, "nodeloss-ports", 0, "nodeloss: the nodes' client ports are this..+2, their route ports +3..+5 (0: free ports)")
	f.DurationVar(&cfg.PhaseTimeout, "phase-timeout", cfg.PhaseTimeout, "bound of each other phase that waits on the cluster or the stream; a phase cut short is reported as partial")
	return cmd
}
