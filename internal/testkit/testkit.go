// Package testkit is what the tests of every package share: polling a
// condition with a deadline, free loopback ports, a test logger and a
// generated event log, an embedded NATS server. It is imported by _test.go
// files only.
//
// It imports events and events/eventgen, so the tests of those two
// packages (and of projections, which eventgen imports) cannot use it.
package testkit

import (
	"context"
	"errors"
	"math/rand/v2"
	"net"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/natsserver"
)

// PollEvery is how often Eventually checks its condition: a polling
// interval, not a synchronisation.
const PollEvery = 5 * time.Millisecond

// Eventually polls cond every PollEvery until it holds, and fails the test
// naming what it waited for when within passes first.
func Eventually(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	err := Poll(context.Background(), within, PollEvery, func() error {
		if cond() {
			return nil
		}
		return errNotYet
	})
	if err != nil {
		t.Fatalf("timed out after %s waiting for %s", within, what)
	}
}

var errNotYet = errors.New("not yet")

// EventuallyErr is Eventually for a condition that says why it does not
// hold yet: when within passes first it fails naming what and cond's last
// error.
func EventuallyErr(t testing.TB, within time.Duration, what string, cond func() error) {
	t.Helper()
	if err := Poll(context.Background(), within, PollEvery, cond); err != nil {
		t.Fatalf("timed out after %s waiting for %s: %v", within, what, err)
	}
}

// Poll calls cond every `every` until it returns nil, within passes or ctx
// is done: it returns nil once cond held, else cond's last error. It is
// the wait under Eventually, for callers that report the failure
// themselves (a helper that returns an error or a value, a harness
// without a testing.TB) or whose condition costs (a process started, a
// request) and is polled less often than PollEvery. cond runs at least
// once.
func Poll(ctx context.Context, within, every time.Duration, cond func() error) error {
	deadline := time.Now().Add(within)
	for {
		err := cond()
		if err == nil {
			return nil
		}
		if ctx.Err() != nil || time.Now().After(deadline) {
			return err
		}
		t := time.NewTimer(every) // polling interval
		select {
		case <-ctx.Done():
			t.Stop()
			return err
		case <-t.C:
		}
	}
}

var (
	portsMu sync.Mutex
	handed  = map[int]bool{}
)

// FreePort returns a loopback TCP port that was free a moment ago and that
// this process has not handed out before (two calls never collide, even
// when the first port is not listened on yet).
func FreePort(t testing.TB) int {
	t.Helper()
	port, err := PickPort()
	if err != nil {
		t.Fatal(err)
	}
	return port
}

// PickPort is FreePort for code without a testing.TB (the chaos
// harness): a loopback port below the kernel's ephemeral range (32768-60999
// here), free a moment ago and never handed out before by this process. A
// port from the ephemeral range is free only until the next connect or
// `Port: -1` listener of any test (a parallel package's included) takes it,
// between this check and the server's own bind, or a restarted process's
// re-bind; random, so that two test processes rarely try the same one.
func PickPort() (int, error) {
	portsMu.Lock()
	defer portsMu.Unlock()
	for range 1000 {
		port := 20000 + rand.IntN(12000)
		if handed[port] {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(port)))
		if err != nil {
			continue
		}
		ln.Close()
		handed[port] = true
		return port, nil
	}
	return 0, errors.New("testkit: no free port in 20000-31999")
}

// FreeAddr is FreePort as a 127.0.0.1:port address.
func FreeAddr(t testing.TB) string {
	t.Helper()
	return net.JoinHostPort("127.0.0.1", strconv.Itoa(FreePort(t)))
}

// Logger writes to the test's log, with timestamps, when -v is on, and
// nowhere otherwise.
func Logger(t testing.TB) zerolog.Logger {
	t.Helper()
	if !testing.Verbose() {
		return zerolog.Nop()
	}
	return zerolog.New(zerolog.NewTestWriter(t)).With().Timestamp().Logger()
}

// MixLog is a MemLog holding n events of eventgen's mix over 40
// endpoints.
func MixLog(t testing.TB, n int) *events.MemLog {
	t.Helper()
	mix, err := eventgen.Mix(n, 40)
	if err != nil {
		t.Fatal(err)
	}
	log := events.NewMemLog()
	if _, err := log.Append(context.Background(), 0, mix.Events...); err != nil {
		t.Fatal(err)
	}
	return log
}

// NATS starts an embedded JetStream server in process (no port) on a
// temporary dir and connects to it; both are closed when the test ends.
func NATS(t testing.TB) (*natsserver.Server, *nats.Conn) {
	t.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), DontListen: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	return srv, nc
}
