package main

import (
	"context"
	"fmt"
	"net"
	"strings"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/termlog/termlog/console"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/natsserver"
)

// webOpts are the console's flags: where it listens and its certificate.
type webOpts struct {
	addr, cert, key string
	// certFlags names the certificate flags in errors.
	certFlags string
}

// check refuses a non-loopback address without a certificate before
// anything starts.
func (w webOpts) check(flag string) error {
	if w.addr == "" {
		return nil
	}
	if err := console.CheckAddr(w.addr, w.cert, w.key); err != nil {
		hint := w.certFlags
		if hint == "" {
			hint = "--web-tls-cert and --web-tls-key"
		}
		return fmt.Errorf("%s %s: %w: pass %s, or a loopback address", flag, w.addr, err, hint)
	}
	return nil
}

func (w *webOpts) tlsFlags(f *pflag.FlagSet) {
	f.StringVar(&w.cert, "web-tls-cert", "", "the console's TLS certificate (PEM); needed for a non-loopback address")
	f.StringVar(&w.key, "web-tls-key", "", "the console's TLS key (PEM)")
}

// consoleProbe reads the lease and health buckets for the console, as
// status does.
func consoleProbe(nc *nats.Conn, cluster string, lg zerolog.Logger) console.Probe {
	return func(ctx context.Context) health.Read {
		var r health.Read
		var wg sync.WaitGroup
		var herr error
		wg.Go(func() { r.Holder, r.TTL, r.LeaseErr = leaseHolder(ctx, nc, cluster) })
		wg.Go(func() { r.Record, herr = readHealth(ctx, nc, cluster) })
		wg.Wait()
		if herr != nil && ctx.Err() == nil {
			lg.Warn().Err(herr).Msg("console: health bucket unreadable")
		}
		return r
	}
}

// serveConsole runs a console over l (and nc's buckets) on w.addr until
// ctx ends or stop is called; url is where it answers.
func serveConsole(ctx context.Context, w webOpts, cluster string, nc *nats.Conn, l events.Log, lg zerolog.Logger) (url string, stop func(), err error) {
	ln, err := console.Listen(w.addr, w.cert, w.key)
	if err != nil {
		return "", nil, err
	}
	c := console.New(console.Config{Cluster: cluster, Log: l, Probe: consoleProbe(nc, cluster, lg), Logger: lg})
	ctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	wg.Go(func() {
		if err := ln.Serve(ctx, c.Handler(), lg); err != nil {
			lg.Warn().Err(err).Msg("console stopped")
		}
	})
	lg.Info().Str("url", ln.URL()).Msg("serving the web console")
	return ln.URL(), func() { cancel(); wg.Wait() }, nil
}

// freeLoopback is a free port on 127.0.0.1 for up's console.
func freeLoopback() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func newWeb(g *globals) *cobra.Command {
	w := webOpts{certFlags: "--tls-cert and --tls-key"}
	cmd := &cobra.Command{
		Use:   "web",
		Short: "Serve the read-only web console (observer key): health, workers, shards and stores, timeline, events",
		Long: `web serves the console at http://ADDR/ with the observer key: the health
verdict status judges (same problems, same exit meaning), the workers (paged),
the shards and stores, the terms as a timeline, and every event with the
outcome and reason replay prints. Pages follow the stream live and read only
the JSON API under /api/v1/ (see the README). Nothing on it writes.

It listens on loopback by default; any other address needs --tls-cert and
--tls-key and is refused without them.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := w.check("--addr"); err != nil {
				return err
			}
			lg, err := g.logger()
			if err != nil {
				return err
			}
			return runRole(lg, "web console", func() error {
				ctx, fatal, result, cancel := roleContext(cmd.Context())
				defer cancel()
				nc, err := g.connectRole(ctx, lg, "termlog-web", natsserver.RoleObserver, fatal)
				if err != nil {
					return err
				}
				defer nc.Close()
				defer watchJetStream(ctx, nc, lg)()
				cfg := g.logConfig()
				cfg.Bind = true
				l, err := openLogWaiting(ctx, lg, nc, cfg)
				if err != nil {
					return err
				}
				url, stop, err := serveConsole(ctx, w, g.cluster, nc, l, lg)
				if err != nil {
					return err
				}
				defer stop()
				fmt.Fprintln(cmd.OutOrStdout(), "web console at", url)
				<-ctx.Done()
				return result(nil)
			})
		},
	}
	f := cmd.Flags()
	f.StringVar(&w.addr, "addr", "127.0.0.1:8080", "listen address (a non-loopback one needs --tls-cert and --tls-key)")
	f.StringVar(&w.cert, "tls-cert", "", "TLS certificate (PEM) of the console")
	f.StringVar(&w.key, "tls-key", "", "TLS key (PEM) of the console")
	return cmd
}

// upWeb parses up's --web: "off", "" (a free loopback port) or an address.
func upWeb(v string) (addr string, err error) {
	switch strings.ToLower(v) {
	case "off", "none", "false":
		return "", nil
	case "", "auto", "on":
		return freeLoopback()
	}
	if _, _, err := net.SplitHostPort(v); err != nil {
		return "", fmt.Errorf("--web %q: want off, or host:port: %v", v, err)
	}
	return v, nil
}
