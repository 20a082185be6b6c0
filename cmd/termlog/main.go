// Command termlog runs and inspects a termlog cluster. Sub-commands only
// parse flags and wire packages together.
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := newRoot().ExecuteContext(ctx); err != nil {
		fmt.Fprintln(os.Stderr, "termlog:", err)
		os.Exit(1)
	}
}

type globals struct {
	cluster   string
	natsURL   string
	logFormat string
	logLevel  string
	replicas  replicasValue
	auth      authFlags
}

func newRoot() *cobra.Command {
	g := &globals{replicas: 1}
	root := &cobra.Command{
		Use:           "termlog",
		Short:         "A control plane whose every mutation is a term-stamped event in one replicated stream",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.PersistentFlags().StringVar(&g.cluster, "cluster", "termlog", "cluster name (stream TERMLOG_<CLUSTER>)")
	root.PersistentFlags().StringVar(&g.natsURL, "nats", "nats://127.0.0.1:4222", "NATS server URL(s), comma separated")
	root.PersistentFlags().StringVar(&g.logFormat, "log-format", "json", "log format: json or console")
	root.PersistentFlags().StringVar(&g.logLevel, "log-level", "info", "log level: debug, info, warn, error")
	root.PersistentFlags().Var(&g.replicas, "replicas", "replicas of the event stream and the lease bucket when they are created: 1, or 3 on a 3-node NATS cluster")
	g.auth.register(root)
	root.AddCommand(newAuthCmd(), newUp(g), newStatus(g), newWorkerCmd(g), newReplay(g), newNATSCmd(g), newMetaCmd(g), newLogstoreCmd(g), newStoreCmd(g), newBench(g))
	return root
}

func (g *globals) logger() (zerolog.Logger, error) {
	lvl, err := zerolog.ParseLevel(g.logLevel)
	if err != nil {
		return zerolog.Nop(), fmt.Errorf("--log-level: %w", err)
	}
	var lg zerolog.Logger
	switch g.logFormat {
	case "json":
		lg = zerolog.New(os.Stderr)
	case "console":
		lg = zerolog.New(zerolog.ConsoleWriter{Out: os.Stderr, TimeFormat: "15:04:05.000"})
	default:
		return zerolog.Nop(), fmt.Errorf("--log-format %q: want json or console", g.logFormat)
	}
	return lg.Level(lvl).With().Timestamp().Logger(), nil
}
