// Command termlog runs and inspects a termlog cluster. Sub-commands only
// parse flags and wire packages together.
package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/internal/wire"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/replay"
)

func main() {
	configureZerolog()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if cmd, err := newRoot().ExecuteContextC(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "termlog:", err)
		os.Exit(exitCode(cmd, err))
	}
}

// Exit statuses. A read command (status, worker list, replay and its
// export: annotated readCommand) exits 0 when all is well, 1 when what it
// read is degraded (status) or fails its check (replay --check), 2 when it
// could not read; a usage error is 2 for every command, never 1, so a gate
// script never takes a typo for a degraded cluster.
const (
	exitDegraded   = 1 // the cluster is readable and not healthy
	exitUnreadable = 2 // the cluster could not be read, or a usage error
)

// readCommand is the annotation that marks a read command.
const readCommand = "termlog-read"

// usageError is a command line that cannot run: exit 2.
type usageError struct{ err error }

func (e usageError) Error() string { return e.err.Error() }
func (e usageError) Unwrap() error { return e.err }

// usage makes err a usage error.
func usage(err error) error {
	if err == nil {
		return nil
	}
	return usageError{err}
}

// exitCode is the exit status of cmd's err.
func exitCode(cmd *cobra.Command, err error) int {
	var ee *exitError
	var ue usageError
	switch {
	case errors.As(err, &ee):
		return ee.code
	case errors.As(err, &ue), strings.HasPrefix(err.Error(), "unknown command"):
		return exitUnreadable
	}
	if cmd != nil && cmd.Annotations[readCommand] != "" {
		var ce *replay.CheckError
		if errors.As(err, &ce) {
			return exitDegraded
		}
		return exitUnreadable
	}
	return 1
}

// usageErrors makes every command's flag and argument errors usage errors.
func usageErrors(cmd *cobra.Command) {
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usage(err) })
	if args := cmd.Args; args != nil {
		cmd.Args = func(c *cobra.Command, a []string) error { return usage(args(c, a)) }
	}
	for _, c := range cmd.Commands() {
		usageErrors(c)
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
				return usage(g.envErr)
			}
			// The cluster name is part of every subject and of the
			// stream's name: checked here, not by a server's refusal.
			if err := wire.ValidCluster(g.cluster); err != nil {
				return usage(fmt.Errorf("--cluster %q: %w", g.cluster, err))
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
	root.AddCommand(newAuthCmd(g), newUp(g), newStatus(g), newWorkerCmd(g), newReplay(g), newNATSCmd(g), newMetaCmd(g), newLogstoreCmd(g), newStoreCmd(g), newShardCmd(g), newWeb(g), newBench(g), newVersion())
	usageErrors(root)
	g.envErr = applyEnv(pf)
	return root
}
