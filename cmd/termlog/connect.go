package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	neturl "net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/nats-io/nkeys"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// session is the NATS connection of an interactive command (status,
// replay, worker list, stepdown, store drain, import). It never prints the
// client's asynchronous errors: it keeps the permission violations and ends
// the request in flight at the first one, so a refused request fails at
// once and names the subject it may not use instead of timing out.
type session struct {
	nc      *nats.Conn
	g       *globals
	role    natsserver.Role
	key     string // the seed file connected with ("" for none)
	timeout time.Duration

	mu       sync.Mutex
	denied   error         // the latest permission violation
	deniedCh chan struct{} // closed by the first violation since reset
}

// dialSession connects to --nats as role within --timeout.
func (g *globals) dialSession(name string, role natsserver.Role) (*session, error) {
	s := &session{g: g, role: role, key: g.seedFile(role), timeout: g.timeout, deniedCh: make(chan struct{})}
	ro, err := g.roleOptions(role)
	if err != nil {
		return nil, err
	}
	opts := append([]nats.Option{nats.Name(name),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { s.asyncError(err) }),
		// Said once by the command's error, not by the client.
		nats.DisconnectErrHandler(func(*nats.Conn, error) {}),
	}, ro...)
	nc, err := dialWithin(g.natsURL, g.timeout, opts)
	if err != nil {
		return nil, connectError(g.natsURL, role, s.key, g.timeout, err)
	}
	s.nc = nc
	return s, nil
}

// connectAttempt bounds an interactive command's first try of each server
// of --nats. nats.go gives each server the whole connect timeout, and a
// frozen node (SIGSTOP, a hung VM) accepts the TCP connection, its kernel
// does that, but never sends its INFO: a status whose random pick was
// that node waited the whole --timeout (5 s) before it tried the next one
// (measured: 3 of 9 runs against 3 termlog nats nodes, one stopped).
const connectAttempt = time.Second

// maxConnectAttempt bounds a long-running role's wait on one server when
// every server of --nats keeps timing out (the bound nats.go's default
// gives each server is 2 s; termlog gave its roles 5 s before).
const maxConnectAttempt = 5 * time.Second

// dialWithin connects to urls within timeout: first each server for at
// most connectAttempt, then, if that timed out, each for what is left of
// timeout (a slow link or a loaded server may need longer than
// connectAttempt for its TLS handshake and INFO).
func dialWithin(urls string, timeout time.Duration, opts []nats.Option) (*nats.Conn, error) {
	start := time.Now()
	first := min(timeout, connectAttempt)
	nc, err := nats.Connect(urls, append(opts, nats.Timeout(first))...)
	if err == nil || !connectTimedOut(err) {
		return nc, err
	}
	left := timeout - time.Since(start)
	if left <= first/2 {
		return nil, err
	}
	return nats.Connect(urls, append(opts, nats.Timeout(left))...)
}

// connectTimedOut: a server of the list did not answer in time (the other
// failures, a refusal or wrong credentials, are the same on a second try).
func connectTimedOut(err error) bool {
	var opErr *net.OpError
	return errors.Is(err, nats.ErrTimeout) || errors.Is(err, context.DeadlineExceeded) || errors.As(err, &opErr) && opErr.Timeout() ||
		errors.Is(err, os.ErrDeadlineExceeded)
}

func (s *session) Close() { s.nc.Close() }

func (s *session) asyncError(err error) {
	if !errors.Is(err, nats.ErrPermissionViolation) {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.denied == nil {
		close(s.deniedCh)
	}
	s.denied = err
}

// call runs f with a context that ends after --timeout or at the first
// permission violation, whichever comes first; the violation, if any, is
// the error.
func (s *session) call(ctx context.Context, f func(context.Context) error) error {
	s.mu.Lock()
	s.denied, s.deniedCh = nil, make(chan struct{})
	denied := s.deniedCh
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, s.timeout)
	defer cancel()
	done := make(chan struct{})
	watcher := make(chan struct{})
	go func() {
		defer close(watcher)
		select {
		case <-denied:
			cancel()
		case <-done:
		}
	}()
	err := f(ctx)
	close(done)
	<-watcher
	s.mu.Lock()
	perr := s.denied
	s.mu.Unlock()
	if perr != nil {
		return perr
	}
	return err
}

// whose names the key of the session for messages.
func (s *session) whose() string {
	if s.key == "" {
		return fmt.Sprintf("the %s connection (no key)", s.role)
	}
	return "the key " + s.key
}

// refused is the one-line error of a permission violation on subject.
func (s *session) refused(err error, what string) error {
	return fmt.Errorf("refused: %s may not %s (%v): %s", s.whose(), what, err, s.roleHint())
}

// roleHint says which key the command needs.
func (s *session) roleHint() string {
	if s.g.auth.creds != "" {
		return fmt.Sprintf("this command connects as role %s; --creds %s is another role's key, or the server's keys were made for another --cluster than %q", s.role, s.g.auth.creds, s.g.cluster)
	}
	return fmt.Sprintf("this command needs the %s key (%s.nk); or the server's keys were made for another --cluster than %q", s.role, s.role, s.g.cluster)
}

// openStream checks, each request bounded by --timeout, that JetStream
// answers, the role may use it and the cluster's stream exists (unless
// mayCreate), then opens the stream. Every failure is one line naming
// its cause.
func (s *session) openStream(ctx context.Context, mayCreate bool) (*natslog.Log, error) {
	js, err := jetstream.New(s.nc, jetstream.WithDefaultTimeout(s.timeout))
	if err != nil {
		return nil, err
	}
	url := s.nc.ConnectedUrlRedacted()
	err = s.call(ctx, func(ctx context.Context) error { _, err := js.AccountInfo(ctx); return err })
	switch {
	case errors.Is(err, nats.ErrPermissionViolation):
		return nil, s.refused(err, "use JetStream")
	case errors.Is(err, jetstream.ErrJetStreamNotEnabled) || errors.Is(err, jetstream.ErrJetStreamNotEnabledForAccount) || errors.Is(err, nats.ErrNoResponders):
		return nil, fmt.Errorf("%s has no JetStream (%v): point --nats at a termlog NATS server (`termlog nats` or `termlog up`)", url, err)
	case err != nil:
		return nil, s.timeoutError(err, "JetStream at "+url+" did not answer")
	}
	stream := natslog.StreamName(s.g.cluster)
	err = s.call(ctx, func(ctx context.Context) error { _, err := js.Stream(ctx, stream); return err })
	switch {
	case errors.Is(err, nats.ErrPermissionViolation):
		// The role may use JetStream, but not this cluster's stream: the
		// server's role keys grant one cluster's stream only.
		return nil, fmt.Errorf("refused: %s may not read stream %s (%v): the server's keys are for another cluster than %q, or this is not a key of role %s: check --cluster ($TERMLOG_CLUSTER)", s.whose(), stream, err, s.g.cluster, s.role)
	case errors.Is(err, jetstream.ErrStreamNotFound) && !mayCreate:
		return nil, fmt.Errorf("no stream %s for cluster %q on %s: check --cluster ($TERMLOG_CLUSTER); a meta replica creates the stream when it first starts", stream, s.g.cluster, url)
	case errors.Is(err, jetstream.ErrStreamNotFound):
	case err != nil:
		return nil, s.timeoutError(err, "stream "+stream+" on "+url+" did not answer")
	}
	cfg := s.g.readConfig()
	cfg.Bind = !mayCreate
	cfg.RequestTimeout, cfg.OpenTimeout = s.timeout, s.timeout
	var l *natslog.Log
	err = s.call(ctx, func(ctx context.Context) error {
		var err error
		l, err = natslog.Open(ctx, s.nc, cfg)
		return err
	})
	if errors.Is(err, nats.ErrPermissionViolation) {
		return nil, s.refused(err, "open stream "+stream)
	}
	return l, err
}

// timeoutError names a request that ran out of --timeout as such.
func (s *session) timeoutError(err error, what string) error {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) {
		return fmt.Errorf("%s within --timeout %s", what, s.timeout)
	}
	return fmt.Errorf("%s: %w", what, err)
}

// leaderRPC sends one request to the meta leader within --timeout and
// returns its reply.
func (s *session) leaderRPC(ctx context.Context, rpc string, req any) (client.Reply, error) {
	b, err := json.Marshal(req)
	if err != nil {
		return client.Reply{}, err
	}
	subject := client.RPCSubject(s.g.cluster, rpc)
	var msg *nats.Msg
	err = s.call(ctx, func(ctx context.Context) error {
		var err error
		msg, err = s.nc.RequestWithContext(ctx, subject, b)
		return err
	})
	switch {
	case errors.Is(err, nats.ErrPermissionViolation):
		return client.Reply{}, s.refused(err, "send "+subject)
	case errors.Is(err, nats.ErrNoResponders):
		return client.Reply{}, fmt.Errorf("no meta leader of cluster %q answers %s (no responders): is a meta replica running, with this --cluster? A new leader takes up to one lease period", s.g.cluster, subject)
	case err != nil:
		return client.Reply{}, s.timeoutError(err, "no meta leader answered "+subject)
	}
	var rep client.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.Reply{}, fmt.Errorf("malformed reply to %s: %w", subject, err)
	}
	if rep.Error != nil {
		return rep, leaderRefusal{rep.Error}
	}
	return rep, nil
}

// leaderRefusal is the meta leader's error reply as a user reads it: its
// message, without the wire code ("bad_request: ..."), which errors.As
// still finds.
type leaderRefusal struct{ e *client.RPCError }

func (r leaderRefusal) Error() string { return "meta leader: " + r.e.Message }
func (r leaderRefusal) Unwrap() error { return r.e }

// connectError says in one line why a connection failed and what to do.
func connectError(url string, role natsserver.Role, key string, timeout time.Duration, err error) error {
	who := "as " + string(role)
	if key != "" {
		who += " (key " + key + ")"
	}
	switch {
	case errors.Is(err, nats.ErrAuthorization):
		return fmt.Errorf("connect %s %s: wrong credentials (%v): pass the auth dir the server was started with (--auth-dir DIR; `termlog up` and `termlog nats` print it) or --creds FILE", url, who, err)
	case errors.Is(err, nats.ErrSecureConnRequired) || strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), "tls:"):
		return fmt.Errorf("connect %s %s: %v: the server uses TLS: pass --tls-ca with its CA (DIR/tls/%s)", url, who, err, natsserver.TLSCAFile)
	case errors.Is(err, syscall.ECONNREFUSED):
		return fmt.Errorf("connect %s: nothing is listening there (connection refused): start NATS (`termlog up` or `termlog nats`) or point --nats ($TERMLOG_NATS) at it", url)
	case connectTimedOut(err):
		return fmt.Errorf("connect %s: no answer within --timeout %s: is the address right?", url, timeout)
	case errors.Is(err, nats.ErrNoServers):
		if refused(url, timeout) {
			return fmt.Errorf("connect %s: nothing is listening there (connection refused): start NATS (`termlog up` or `termlog nats`) or point --nats ($TERMLOG_NATS) at it", url)
		}
		return fmt.Errorf("connect %s: no server reachable (%v): start NATS or point --nats ($TERMLOG_NATS) at it", url, err)
	}
	return fmt.Errorf("connect %s %s: %w", url, who, err)
}

// fatalConnectError reports whether a failed connection cannot be mended
// by waiting: wrong credentials or TLS settings.
func fatalConnectError(err error) bool {
	return errors.Is(err, nats.ErrAuthorization) || errors.Is(err, nats.ErrSecureConnRequired) ||
		strings.Contains(err.Error(), "certificate") || strings.Contains(err.Error(), "tls:")
}

// keyRole names the role whose key seed is: the role of the auth dir
// (--auth-dir, else the seed's own dir) whose public key it has; "" when
// none matches.
func (g *globals) keyRole(seed string) natsserver.Role {
	if seed == "" {
		return ""
	}
	b, err := os.ReadFile(seed)
	if err != nil {
		return ""
	}
	kp, err := nkeys.FromSeed([]byte(strings.TrimSpace(string(b))))
	if err != nil {
		return ""
	}
	defer kp.Wipe()
	pub, err := kp.PublicKey()
	if err != nil {
		return ""
	}
	dirs := []string{filepath.Dir(seed)}
	if g.auth.authDir != "" {
		dirs = append([]string{g.auth.authDir}, dirs...)
	}
	for _, dir := range dirs {
		for _, r := range natsserver.Roles() {
			if p, err := os.ReadFile(natsserver.PublicKeyFile(dir, r)); err == nil && strings.TrimSpace(string(p)) == pub {
				return r
			}
		}
	}
	return ""
}

// permanentError is an error of a long-running role that no wait mends
// (a permissions violation, an authorization failure): the role exits
// with it, where a transient one (NATS down, an election) is waited out.
type permanentError struct{ err error }

func (e permanentError) Error() string { return e.err.Error() }
func (e permanentError) Unwrap() error { return e.err }

// roleRefused is the error of a long-running role whose key the server
// refuses: which role the key belongs to, which one the role needs.
func (g *globals) roleRefused(role natsserver.Role, err error) error {
	seed := g.seedFile(role)
	what := "refused"
	if i := strings.Index(err.Error(), "Violation for "); i >= 0 {
		// nats.go's text, without its prefixes: "publish to X".
		d := err.Error()[i+len("Violation for "):]
		what = "refused: the server does not allow " + strings.ToLower(d[:1]) + d[1:]
	}
	if errors.Is(err, nats.ErrAuthorization) {
		what = "authorization failed"
	}
	switch kr := g.keyRole(seed); {
	case seed == "":
		return permanentError{fmt.Errorf("%s: this %s connects without a key; pass the auth dir the server was started with (--auth-dir DIR) or --creds with the %s key (%s.nk)", what, role, role, role)}
	case kr != "" && kr != role:
		return permanentError{fmt.Errorf("%s: the key %s is the %s role's key; this process runs as role %s and needs the %s key (%s.nk)", what, seed, kr, role, role, role)}
	case kr == role:
		return permanentError{fmt.Errorf("%s: the key %s is the %s key, but the server refuses it: the server's keys were made for another --cluster than %q, or for another server", what, seed, role, g.cluster)}
	}
	return permanentError{fmt.Errorf("%s: the key %s is not a key of role %s of this server (this process needs the %s key, %s.nk), or the server's keys were made for another --cluster than %q", what, seed, role, role, role, g.cluster)}
}

// refusedReply reports whether err is the server refusing one reply: a
// publish to a requester's inbox is allowed once per request it received
// (a response permission) and the permission lives in the server the
// request came through: a reply sent after the connection moved to another
// node is refused while the key is right (FACTS.md; checked with two
// clustered servers). Seen in the chaos suite: a meta leader answering a
// registration it received before a NATS node was killed, once its append
// went through on the node it reconnected to. It is not the wrong key: the
// role goes on, and the requester asks again.
func refusedReply(err error) bool {
	_, d, ok := strings.Cut(err.Error(), "Violation for Publish to ")
	d = strings.TrimLeft(d, "\"'")
	return ok && strings.HasPrefix(d, "_INBOX.")
}

// roleContext is parent, ended also by a permanent error passed to fatal;
// result is the error the role ends with: that permanent error if there
// was one, else err. stop releases the context.
func roleContext(parent context.Context) (ctx context.Context, fatal func(error), result func(error) error, stop func()) {
	ctx, cancel := context.WithCancelCause(parent)
	fatal = func(err error) { cancel(err) } // the first cause stays
	result = func(err error) error {
		if pe, ok := permanent(ctx); ok {
			return pe
		}
		return err
	}
	return ctx, fatal, result, func() { cancel(nil) }
}

// permanent is the permanent error that ended ctx, if one did.
func permanent(ctx context.Context) (permanentError, bool) {
	var pe permanentError
	ok := errors.As(context.Cause(ctx), &pe)
	return pe, ok
}

// connectRole connects a long-running role (meta, worker, logstore) to the
// --nats URLs, waiting with backoff, and saying so, while nothing answers;
// wrong credentials fail at once. The connection reconnects forever and
// logs losing and regaining NATS. A permissions violation or an
// authorization failure on the connection is permanent: fatal gets it
// (once), and the role ends with it. extra are options of the role
// (a lame-duck handler).
func (g *globals) connectRole(ctx context.Context, lg zerolog.Logger, name string, role natsserver.Role, fatal func(error), extra ...nats.Option) (*nats.Conn, error) {
	ro, err := g.roleOptions(role)
	if err != nil {
		return nil, err
	}
	opts := append(roleConnOptions(name), ro...)
	opts = append(opts,
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			if fatal != nil && (errors.Is(err, nats.ErrPermissionViolation) && !refusedReply(err) || errors.Is(err, nats.ErrAuthorization)) {
				fatal(g.roleRefused(role, err))
				return
			}
			ev := lg.Warn().Err(err)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("NATS error")
		}),
		nats.DisconnectErrHandler(func(nc *nats.Conn, err error) {
			if !nc.IsClosed() {
				lg.Warn().Err(err).Msg("lost NATS; reconnecting")
			}
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) { lg.Info().Str("url", nc.ConnectedUrlRedacted()).Msg("reconnected to NATS") }),
	)
	opts = append(opts, extra...)
	backoff := 250 * time.Millisecond
	// Each server first gets connectAttempt (a frozen node of the list
	// costs that, not the whole bound); when every server of the list
	// timed out, the next attempt gives each twice as long, up to
	// maxConnectAttempt (a loaded server or a slow TLS handshake).
	perServer := connectAttempt
	for attempt := 1; ; attempt++ {
		nc, err := nats.Connect(g.natsURL, append(opts, nats.Timeout(perServer))...)
		if err == nil {
			lg.Info().Str("url", nc.ConnectedUrlRedacted()).Str("role", string(role)).Dur("per_server", perServer).Msg("connected to NATS")
			return nc, nil
		}
		cerr := connectError(g.natsURL, role, g.seedFile(role), perServer, err)
		if fatalConnectError(err) {
			return nil, cerr
		}
		lg.Warn().Str("url", g.natsURL).Int("attempt", attempt).Dur("per_server", perServer).Dur("retry_in", backoff).Str("cause", cerr.Error()).Msg("waiting for NATS")
		if connectTimedOut(err) {
			perServer = min(2*perServer, maxConnectAttempt)
		}
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("stopped while waiting for NATS at %s: %w", g.natsURL, ctx.Err())
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, 5*time.Second)
	}
}

// openLogWaiting opens the stream for a long-running role, waiting (and
// saying so) while JetStream or the stream is not there yet; a
// configuration error fails at once.
func openLogWaiting(ctx context.Context, lg zerolog.Logger, nc *nats.Conn, cfg natslog.Config) (*natslog.Log, error) {
	for attempt := 1; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 10*time.Second)
		l, err := natslog.Open(octx, nc, cfg)
		cancel()
		if err == nil {
			return l, nil
		}
		if ctx.Err() != nil {
			return nil, fmt.Errorf("stopped while waiting for the event stream: %w", ctx.Err())
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return nil, err
		}
		what := "waiting for JetStream"
		if cfg.Bind {
			what = "waiting for a meta replica to create the event stream"
		}
		lg.Warn().Str("stream", natslog.StreamName(cfg.Cluster)).Int("attempt", attempt).Str("cause", err.Error()).Msg(what)
	}
}

// waitJetStream runs open, each attempt bounded by 30 s, until it
// succeeds, fails for another reason than a deadline, or ctx ends: a
// long-running role waits for JetStream (an election, a node down) and
// says what it waits for, where an interactive command fails.
func waitJetStream(ctx context.Context, lg zerolog.Logger, what string, open func(context.Context) error) error {
	for attempt := 1; ; attempt++ {
		octx, cancel := context.WithTimeout(ctx, 30*time.Second)
		err := open(octx)
		cancel()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("stopped while waiting for %s: %w", what, ctx.Err())
		}
		if !errors.Is(err, context.DeadlineExceeded) {
			return err
		}
		lg.Warn().Int("attempt", attempt).Str("cause", err.Error()).Msg("waiting for " + what)
	}
}

// refused reports whether every server of the comma-separated urls
// refuses a TCP connection: nothing listens there.
func refused(urls string, timeout time.Duration) bool {
	for _, u := range strings.Split(urls, ",") {
		u = strings.TrimSpace(u)
		if u == "" {
			continue
		}
		if !strings.Contains(u, "://") {
			u = "nats://" + u
		}
		pu, err := neturl.Parse(u)
		if err != nil {
			return false
		}
		host := pu.Host
		if pu.Port() == "" {
			host = net.JoinHostPort(pu.Hostname(), "4222")
		}
		c, err := net.DialTimeout("tcp", host, min(timeout, time.Second))
		if err == nil {
			c.Close()
			return false
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return false
		}
	}
	return true
}

// watchServer moves a long-running role's connection off a NATS server
// through which probe gets no answer (natslog.WatchServer); the returned
// stop cancels the watch and waits for it.
func watchServer(ctx context.Context, nc *nats.Conn, probe func(context.Context) error, lg zerolog.Logger) (stop func()) {
	ctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		natslog.WatchServer(ctx, nc, natslog.DefaultServerWatch, probe, clock.Real{}, lg)
	}()
	return func() { cancel(); <-done }
}

// watchJetStream is watchServer probing JetStream (meta, logstore).
func watchJetStream(ctx context.Context, nc *nats.Conn, lg zerolog.Logger) (stop func()) {
	probe, err := natslog.AccountInfoProbe(nc)
	if err != nil {
		lg.Warn().Err(err).Msg("NATS server watch not started")
		return func() {}
	}
	return watchServer(ctx, nc, probe, lg)
}
