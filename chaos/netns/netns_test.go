package netns

import (
	"bufio"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/internal/testkit"
)

func TestMain(m *testing.M) {
	// The test binary doubles as the listener and the dialer run inside
	// the namespaces.
	if h := os.Getenv("NETNS_HELPER"); h != "" {
		os.Exit(helper(strings.Fields(h)))
	}
	goleak.VerifyTestMain(m)
}

func helper(args []string) int {
	switch args[0] {
	case "listen": // listen ADDR: print "ready", answer every connection with "hi"
		ln, err := net.Listen("tcp", args[1])
		if err != nil {
			fmt.Println("listen:", err)
			return 1
		}
		fmt.Println("ready")
		for {
			c, err := ln.Accept()
			if err != nil {
				return 1
			}
			fmt.Fprintln(c, "hi")
			c.Close()
		}
	case "dial": // dial ADDR: exit 0 when "hi" arrives within a second
		if err := greet(args[1]); err != nil {
			fmt.Println(err)
			return 1
		}
		return 0
	}
	return 2
}

// greet dials addr and reads the listener's greeting, within a second each.
func greet(addr string) error {
	c, err := net.DialTimeout("tcp", addr, time.Second)
	if err != nil {
		return fmt.Errorf("dial: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hi\n" {
		return fmt.Errorf("read %q: %v", line, err)
	}
	return nil
}

func helperCmd(ctx context.Context, nd *Node, args string) *exec.Cmd {
	cmd := nd.Command(ctx, os.Args[0], "-test.run=^$")
	cmd.Env = append(os.Environ(), "NETNS_HELPER="+args)
	return cmd
}

func newNet(t *testing.T) *Net {
	t.Helper()
	if err := Available(); err != nil {
		t.Skipf("skipping network namespace tests: %v", err)
	}
	ctx := context.Background()
	n, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := n.Teardown(); err != nil {
			t.Error(err)
		}
	})
	return n
}

// reach reports whether from can open a TCP connection to addr and read
// the listener's greeting.
func reach(ctx context.Context, from *Node, addr string) (bool, string) {
	out, err := helperCmd(ctx, from, "dial "+addr).CombinedOutput()
	return err == nil, strings.TrimSpace(string(out))
}

// eventually polls reach until it says want or 10 s pass.
func eventually(t *testing.T, from *Node, addr string, want bool) {
	t.Helper()
	ctx := context.Background()
	start := time.Now()
	err := testkit.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error {
		if got, out := reach(ctx, from, addr); got != want {
			return fmt.Errorf("reachable %v, want %v (%s)", got, want, out)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("%s -> %s: %v", from.Name, addr, err)
	}
	t.Logf("%s -> %s: reachable %v after %v", from.Name, addr, want, time.Since(start).Round(time.Millisecond))
}

func TestCutIsolateHeal(t *testing.T) {
	n := newNet(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	var nodes []*Node
	for _, name := range []string{"a", "b", "c"} {
		nd, err := n.Add(ctx, name)
		if err != nil {
			t.Fatal(err)
		}
		nodes = append(nodes, nd)
	}
	a, b, c := nodes[0], nodes[1], nodes[2]
	addr := a.IP + ":7000"
	ln := helperCmd(ctx, a, "listen "+addr)
	stdout, err := ln.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cancel(); _ = ln.Wait() }()
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("listener: %q %v", line, err)
	}

	// The root namespace does not reach the net (its default route may
	// lead to a proxy that accepts any connection: no greeting comes).
	if err := greet(addr); err == nil {
		t.Fatal("the root namespace reaches a node's address")
	}
	if ok, out := reach(ctx, b, addr); !ok {
		t.Fatalf("b cannot reach a before any cut: %s", out)
	}
	if ok, out := reach(ctx, c, addr); !ok {
		t.Fatalf("c cannot reach a before any cut: %s", out)
	}

	if err := n.Cut(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	// A cut is silence: the dial times out (no reset, no refusal).
	if ok, out := reach(ctx, b, addr); ok || !strings.Contains(out, "timeout") {
		t.Fatalf("b -> a after Cut(a, b): reachable %v (%s), want a timeout", ok, out)
	}
	if ok, out := reach(ctx, c, addr); !ok {
		t.Fatalf("c -> a after Cut(a, b): %s", out)
	}
	if got := n.Cuts(); len(got) != 1 || got[0] != [2]string{"a", "b"} {
		t.Fatalf("Cuts() = %v", got)
	}

	if err := n.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, b, addr, true)

	if err := n.Isolate(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, from := range []*Node{b, c} {
		if ok, out := reach(ctx, from, addr); ok {
			t.Fatalf("%s -> a after Isolate(a): reachable (%s)", from.Name, out)
		}
	}
	if err := n.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	eventually(t, b, addr, true)
	eventually(t, c, addr, true)

	// Two overlapping faults cut the same pair: the first Uncut releases
	// only its own, the link stays cut until the second.
	for range 2 {
		if err := n.Cut(ctx, "a", "b"); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Uncut(ctx, "b", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, out := reach(ctx, b, addr); ok {
		t.Fatalf("b -> a after two Cuts and one Uncut: reachable (%s)", out)
	}
	if err := n.Uncut(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	eventually(t, b, addr, true)
	if got := n.Cuts(); len(got) != 0 {
		t.Fatalf("Cuts() after the last Uncut = %v", got)
	}
	if err := n.Uncut(ctx, "a", "b"); err != nil {
		t.Fatalf("Uncut of a pair not cut: %v", err)
	}
}

func TestTeardownLeavesNothing(t *testing.T) {
	n := newNet(t)
	ctx := context.Background()
	for _, name := range []string{"x", "y"} {
		if _, err := n.Add(ctx, name); err != nil {
			t.Fatal(err)
		}
	}
	if err := n.Cut(ctx, "x", "y"); err != nil {
		t.Fatal(err)
	}
	if err := n.Teardown(); err != nil {
		t.Fatal(err)
	}
	if err := n.Teardown(); err != nil {
		t.Fatalf("second Teardown: %v", err)
	}
	names, err := List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if strings.HasPrefix(name, n.ID()) {
			t.Fatalf("namespace %s left after Teardown (all: %v)", name, names)
		}
	}
	if _, err := n.Add(ctx, "z"); err == nil {
		t.Fatal("Add after Teardown accepted")
	}
}

func TestRemoveStale(t *testing.T) {
	if err := Available(); err != nil {
		t.Skipf("skipping network namespace tests: %v", err)
	}
	ctx := context.Background()
	// A namespace named as a dead process's would be (pid 0x7ffffffe is
	// above any pid_max).
	stale := fmt.Sprintf("%s%d-9-1", prefix, 0x7ffffffe)
	if out, err := run(ctx, "ip", "netns", "add", stale); err != nil {
		t.Fatalf("%v: %s", err, out)
	}
	t.Cleanup(func() { _, _ = run(ctx, "ip", "netns", "del", stale) })
	n, err := New(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer n.Teardown()
	names, err := List(ctx)
	if err != nil {
		t.Fatal(err)
	}
	for _, name := range names {
		if name == stale {
			t.Fatalf("stale namespace %s survived New", stale)
		}
	}
}

func TestBadArguments(t *testing.T) {
	n := newNet(t)
	ctx := context.Background()
	if _, err := n.Add(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	if _, err := n.Add(ctx, "a"); err == nil {
		t.Fatal("duplicate node accepted")
	}
	if err := n.Cut(ctx, "a", "nope"); err == nil {
		t.Fatal("cut to an unknown node accepted")
	}
	if err := n.Cut(ctx, "a", "a"); err == nil {
		t.Fatal("cut of a node from itself accepted")
	}
	if err := n.Isolate(ctx, "nope"); err == nil {
		t.Fatal("isolate of an unknown node accepted")
	}
}

// startListener runs the helper listener at addr inside nd until the test ends.
func startListener(t *testing.T, nd *Node, addr string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	ln := helperCmd(ctx, nd, "listen "+addr)
	stdout, err := ln.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := ln.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = ln.Wait() })
	if line, err := bufio.NewReader(stdout).ReadString('\n'); err != nil || line != "ready\n" {
		t.Fatalf("listener: %q %v", line, err)
	}
}

// greetFrom is greet, dialled from inside nd by this process.
func greetFrom(nd *Node, addr string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	c, err := nd.Dial(ctx, addr)
	if err != nil {
		return err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(time.Second))
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil || line != "hi\n" {
		return fmt.Errorf("read %q: %v", line, err)
	}
	return nil
}

func TestRelay(t *testing.T) {
	n := newNet(t)
	ctx := context.Background()
	a, err := n.Add(ctx, "a")
	if err != nil {
		t.Fatal(err)
	}
	b, err := n.Add(ctx, "b")
	if err != nil {
		t.Fatal(err)
	}
	// A server on a's loopback only, and a relay on a's address.
	startListener(t, a, "127.0.0.1:7000")
	r, err := a.Relay(a.IP+":7001", "127.0.0.1:7000")
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	if err := greetFrom(b, "127.0.0.1:7000"); err == nil {
		t.Fatal("b reaches a's loopback")
	}
	if err := greetFrom(b, r.Addr()); err != nil {
		t.Fatalf("b through the relay: %v", err)
	}
	if ok, out := reach(ctx, b, r.Addr()); !ok {
		t.Fatalf("a process in b through the relay: %s", out)
	}
	if err := n.Cut(ctx, "a", "b"); err != nil {
		t.Fatal(err)
	}
	if err := greetFrom(b, r.Addr()); err == nil {
		t.Fatal("b reaches the relay after Cut(a, b)")
	}
	if err := n.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	if err := testkit.Poll(ctx, 10*time.Second, 100*time.Millisecond, func() error { return greetFrom(b, r.Addr()) }); err != nil {
		t.Fatalf("b does not reach the relay 10 s after Heal: %v", err)
	}
	if err := r.Close(); err != nil {
		t.Fatal(err)
	}
	if err := greetFrom(b, r.Addr()); err == nil {
		t.Fatal("the relay answers after Close")
	}
}
