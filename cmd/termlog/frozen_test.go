package main

import (
	"context"
	"encoding/json"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestFrozenNATSNodePassedOver is issue 32's "a frozen NATS server is
// passed over", on a 3-node cluster of `termlog nats` processes with one
// node SIGSTOPped (its kernel still accepts connections; nothing answers):
//   - the long-running roles (meta, store, worker: each connects through
//     connectRole) given the frozen node first connect to a live node,
//     and the bound each server gets, on this connect and on every
//     reconnect, is connectAttempt, not the 5 s they had before;
//   - a role whose only server is frozen waits, saying so, and connects
//     once the node is continued;
//   - `status` with the frozen node in its --nats list answers from the
//     live nodes within its --timeout, wherever the frozen node falls in
//     its random order.
func TestFrozenNATSNodePassedOver(t *testing.T) {
	bin := buildBinary(t)
	auth := authDir(t, bin, t.TempDir(), "auth")
	nodes, url := startNATS3(t, bin, "--auth-dir", auth)
	t.Setenv("TERMLOG_AUTH_DIR", auth)
	t.Setenv("TERMLOG_REPLICAS", "3")
	// The meta replica knows only the nodes that stay up.
	t.Setenv("TERMLOG_NATS", url(1)+","+url(2))
	startProc(t, bin, "meta", "run", "--id", "meta-1")
	testkit.Eventually(t, 60*time.Second, "meta-1 leads and status answers", func() bool {
		code, st, _ := statusJSON(t, bin)
		return (code == 0 || code == 1) && st.Leader == "meta-1"
	})

	frozen := nodes[0]
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// Registered after startProc's kill: runs first, so the node is
	// running again when it is killed and its data dir removed.
	t.Cleanup(func() { _ = frozen.cmd.Process.Signal(syscall.SIGCONT) })
	frozenFirst := strings.Join([]string{url(0), url(1), url(2)}, ",")

	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	for _, role := range []natsserver.Role{natsserver.RoleMeta, natsserver.RoleStore, natsserver.RoleWorker} {
		g := &globals{natsURL: frozenFirst}
		g.auth.authDir = auth
		var logs syncBuffer
		start := time.Now()
		// DontRandomize: the frozen node is tried first, every time.
		nc, err := g.connectRole(ctx, zerolog.New(&logs), "frozen-test-"+string(role), role, nil, nats.DontRandomize())
		took := time.Since(start)
		if err != nil {
			t.Fatalf("%s over a frozen first node: %v\n%s", role, err, logs.String())
		}
		got, bound := nc.ConnectedUrl(), nc.Opts.Timeout
		nc.Close()
		if got == url(0) {
			t.Fatalf("%s connected to the frozen node %s", role, got)
		}
		if bound != connectAttempt {
			t.Fatalf("%s connected with %s per server, want connectAttempt %s: a frozen node of --nats holds each connect and reconnect that long", role, bound, connectAttempt)
		}
		t.Logf("%s: passed over the frozen %s to %s in %s (per server %s)", role, url(0), got, took.Round(time.Millisecond), bound)
	}

	// Only the frozen node: the role waits, says so, and connects once the
	// node runs again.
	g := &globals{natsURL: url(0)}
	g.auth.authDir = auth
	var logs syncBuffer
	type dialed struct {
		nc  *nats.Conn
		err error
	}
	res := make(chan dialed, 1)
	go func() {
		nc, err := g.connectRole(ctx, zerolog.New(&logs), "frozen-test-wait", natsserver.RoleStore, nil)
		res <- dialed{nc, err}
	}()
	testkit.Eventually(t, 30*time.Second, "the role to say it waits for NATS", func() bool {
		return strings.Contains(logs.String(), "waiting for NATS")
	})
	if err := frozen.cmd.Process.Signal(syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	d := <-res // bounded by ctx
	if d.err != nil {
		t.Fatalf("after SIGCONT: %v\n%s", d.err, logs.String())
	}
	d.nc.Close()
	if err := frozen.cmd.Process.Signal(syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}

	// status, in its random order: the frozen node costs connectAttempt
	// when it comes first, never the whole --timeout.
	const timeout = 10 * time.Second
	for i := range 3 {
		start := time.Now()
		r := runEnv(t, bin, []string{"TERMLOG_NATS=" + frozenFirst}, "status", "-o", "json", "--timeout", timeout.String())
		took := time.Since(start)
		var st Status
		if err := json.Unmarshal([]byte(r.stdout), &st); err != nil || st.Leader != "meta-1" {
			t.Fatalf("status %d with a frozen node in --nats: exit %d, %v\nstdout: %s\nstderr: %s", i+1, r.code, err, r.stdout, r.stderr)
		}
		if took >= timeout {
			t.Fatalf("status %d took %s, its whole --timeout %s: the frozen node held it", i+1, took.Round(time.Millisecond), timeout)
		}
		t.Logf("status %d: exit %d in %s", i+1, r.code, took.Round(time.Millisecond))
	}
}
