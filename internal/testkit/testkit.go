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
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", within, what)
		}
		time.Sleep(PollEvery)
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
