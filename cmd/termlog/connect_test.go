package main

import (
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/natsserver"
)

// frozenServer listens like a NATS node whose process is stopped (SIGSTOP,
// a hung VM): the kernel accepts each connection and nothing is ever
// said on it. It returns its address.
func frozenServer(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var conns []net.Conn
	var wg sync.WaitGroup
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
		}
	})
	t.Cleanup(func() {
		ln.Close()
		wg.Wait()
		mu.Lock()
		defer mu.Unlock()
		for _, c := range conns {
			c.Close()
		}
	})
	return ln.Addr().String()
}

// An interactive command tries each server of --nats for at most
// connectAttempt first: frozen nodes in the list cost it that each, not
// its whole --timeout each (with nats.go's default a status whose random
// pick was a stopped node waited its 5 s, then tried the next). The list
// is in random order, so it dials five times; the old dial waits the
// whole --timeout whenever a frozen node comes first (2 in 3).
func TestDialPassesOverFrozenServers(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs last
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Port: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	urls := strings.Join([]string{"nats://" + frozenServer(t), "nats://" + frozenServer(t), srv.ClientURL()}, ",")
	const timeout = 10 * time.Second
	for i := range 5 {
		start := time.Now()
		g := &globals{natsURL: urls, timeout: timeout}
		s, err := g.dialSession("termlog-test", natsserver.RoleObserver)
		took := time.Since(start)
		if err != nil {
			t.Fatalf("dial %d over two frozen servers and a live one: %v", i+1, err)
		}
		got := s.nc.ConnectedUrl()
		s.Close()
		// Two frozen nodes tried first cost 2 connectAttempts; the whole
		// --timeout is what a frozen node cost before.
		if took >= timeout {
			t.Fatalf("dial %d took %s, the whole --timeout %s, to reach %s: a frozen server held it", i+1, took.Round(time.Millisecond), timeout, got)
		}
		t.Logf("dial %d: %s, connected to %s", i+1, took.Round(time.Millisecond), got)
	}
}

// A server that only ever times out still fails the dial within --timeout
// (the second pass gets what is left), naming the timeout.
func TestDialFrozenOnlyFailsWithinTimeout(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) })
	g := &globals{natsURL: "nats://" + frozenServer(t), timeout: 2 * time.Second}
	start := time.Now()
	_, err := g.dialSession("termlog-test", natsserver.RoleObserver)
	took := time.Since(start)
	if err == nil || !strings.Contains(err.Error(), "no answer within --timeout 2s") {
		t.Fatalf("dial of a frozen server only: %v, want the --timeout named", err)
	}
	if took > 4*time.Second {
		t.Fatalf("dial of a frozen server only took %s with --timeout 2s", took.Round(time.Millisecond))
	}
	t.Logf("dial of a frozen server only: %s: %v", took.Round(time.Millisecond), err)
}
