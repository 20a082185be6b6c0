// Command termlog runs and inspects a termlog cluster. Sub-commands only
// parse flags and wire packages together.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/logstore"
)

func main() {
	configureZerolog()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "termlog:", err)
		code := 1
		var ee *exitError
		if errors.As(err, &ee) {
			code = ee.code
		}
		os.Exit(code)
	}
}

// configureZerolog sets the process-wide encoding of the binary's logs:
// millisecond timestamps and durations with their unit ("4.688ms"). Only
// main calls it; packages get their logger passed in.
func configureZerolog() {
	zerolog.TimeFieldFormat = logTimeFormat
	zerolog.DurationFieldFormat = zerolog.DurationFormatString
}

// logTimeFormat is RFC 3339 with milliseconds.
const logTimeFormat = "2006-01-02T15:04:05.000Z07:00"

type globals struct {
	cluster   string
	natsURL   string
	logFormat string
	logLevel  string
	replicas  replicasValue
	auth      authFlags
	// timeout bounds each step of an interactive command: connecting, each
	// JetStream request, a leader RPC.
	timeout time.Duration
	// envErr is a TERMLOG_* variable that did not parse, reported before
	// any command runs.
	envErr error
}

func newRoot() *cobra.Command {
	g := &globals{replicas: 1}
	root := &cobra.Command{
		Use:           "termlog",
		Short:         "A control plane whose every mutation is a term-stamped event in one replicated stream",
		SilenceUsage:  true,
		SilenceErrors: true,
		PersistentPreRunE: func(*cobra.Command, []string) error {
			if g.envErr != nil {
				return g.envErr
			}
			// Checked before anything starts, by every command.
			lg, err := g.logger()
			if err != nil {
				return err
			}
			// Dragonboat's own lines in the same format as termlog's.
			logstore.LogDragonboatTo(lg)
			return nil
		},
	}
	pf := root.PersistentFlags()
	pf.StringVar(&g.cluster, "cluster", "termlog", "cluster name (stream TERMLOG_<CLUSTER>)")
	pf.StringVar(&g.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	pf.StringVar(&g.logFormat, "log-format", "auto", "log format: auto (console at a terminal, else json), json or console; NO_COLOR turns colours off")
	pf.StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	pf.Var(&g.replicas, "replicas", "replicas of the event stream and the lease bucket when they are created: 1, or 3 on a 3-node NATS cluster")
	pf.Var(positiveDuration(&g.timeout, 5*time.Second), "timeout", "interactive commands (status, replay, worker list, stepdown, store drain, import): give up on NATS, a JetStream request or the leader after this long, naming the cause")
	g.auth.register(root)
	root.AddCommand(newAuthCmd(g), newUp(g), newStatus(g), newWorkerCmd(g), newReplay(g), newNATSCmd(g), newMetaCmd(g), newLogstoreCmd(g), newStoreCmd(g), newShardCmd(g), newBench(g), newVersion())
	g.envErr = applyEnv(pf)
	return root
}
