package main

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// startNATS3 runs a 3-node cluster of `termlog nats` processes (names
// n1..n3, free ports, data in a temp dir) with extra flags and waits until
// each says JetStream is ready; url(i) is node i's client URL.
func startNATS3(t *testing.T, bin string, extra ...string) ([3]*upProc, func(int) string) {
	t.Helper()
	dir := t.TempDir()
	var client, route [3]int
	var routes []string
	for i := range 3 {
		client[i], route[i] = testkit.FreePort(t), testkit.FreePort(t)
		routes = append(routes, natsserver.RouteURL(route[i]))
	}
	url := func(i int) string { return fmt.Sprintf("nats://127.0.0.1:%d", client[i]) }
	var nodes [3]*upProc
	for i := range 3 {
		args := append([]string{"nats", "--name", fmt.Sprintf("n%d", i+1), "--port", fmt.Sprint(client[i]),
			"--cluster-port", fmt.Sprint(route[i]), "--routes", strings.Join(routes, ","), "--data", filepath.Join(dir, fmt.Sprintf("n%d", i+1))}, extra...)
		nodes[i] = startProc(t, bin, args...)
	}
	for i := range 3 {
		testkit.Eventually(t, 60*time.Second, "node ready", func() bool { return strings.Contains(nodes[i].out.String(), "JetStream cluster ready") })
	}
	return nodes, url
}

// TestNATSStopIsLameDuck: `termlog nats` on SIGTERM goes through lame-duck
// mode: the R3 stream its node leads has another leader before the process
// exits, and its clients were told it is going (nats.go's
// LameDuckModeHandler) before it closed them, so they move at once.
func TestNATSStopIsLameDuck(t *testing.T) {
	bin := buildBinary(t)
	nodes, url := startNATS3(t, bin, "--insecure")
	nc, err := nats.Connect(strings.Join([]string{url(0), url(1), url(2)}, ","))
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	testkit.Eventually(t, 30*time.Second, "an R3 stream", func() bool {
		_, err = js.CreateOrUpdateStream(ctx, jetstream.StreamConfig{Name: "LD", Subjects: []string{"ld.>"}, Replicas: 3, Storage: jetstream.FileStorage})
		return err == nil
	})
	leaderOf := func(js jetstream.JetStream) string {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		defer acancel()
		s, err := js.Stream(actx, "LD")
		if err != nil || s.CachedInfo().Cluster == nil {
			return ""
		}
		return s.CachedInfo().Cluster.Leader
	}
	var leader string
	testkit.Eventually(t, 30*time.Second, "the stream's leader", func() bool { leader = leaderOf(js); return leader != "" })
	var victim, other int
	fmt.Sscanf(leader, "n%d", &victim)
	victim--
	other = (victim + 1) % 3

	// A client of the stopping node only, told when it enters lame duck.
	told := make(chan time.Time, 1)
	vc, err := nats.Connect(url(victim), nats.NoReconnect(), nats.LameDuckModeHandler(func(*nats.Conn) {
		select {
		case told <- time.Now():
		default:
		}
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer vc.Close()
	// An observer on another node records who leads the stream.
	oc, err := nats.Connect(url(other), nats.NoReconnect())
	if err != nil {
		t.Fatal(err)
	}
	defer oc.Close()
	ojs, err := jetstream.New(oc)
	if err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	var moved time.Time // when another node first led the stream
	octx, ocancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Go(func() {
		for octx.Err() == nil {
			if l := leaderOf(ojs); l != "" && l != leader {
				mu.Lock()
				if moved.IsZero() {
					moved = time.Now()
				}
				mu.Unlock()
				return
			}
			time.Sleep(10 * time.Millisecond)
		}
	})
	defer func() { ocancel(); wg.Wait() }()

	if err := nodes[victim].cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	var exited time.Time
	select {
	case err := <-nodes[victim].done:
		exited = time.Now()
		if err != nil {
			t.Fatalf("%s exited with %v after SIGTERM\n%s", leader, err, nodes[victim].errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s did not exit within 30s of SIGTERM", leader)
	}
	ocancel()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if moved.IsZero() || !moved.Before(exited) {
		t.Fatalf("the stream's leadership left %s at %v, its exit at %v: want it handed over before the exit (lame duck)", leader, moved, exited)
	}
	select {
	case at := <-told:
		if !at.Before(exited) {
			t.Fatalf("clients told of lame duck at %v, after the exit at %v", at, exited)
		}
	default:
		t.Fatalf("%s's clients were not told it was going (no lame-duck mode); its output:\n%s", leader, nodes[victim].out.String())
	}
	if out := nodes[victim].out.String(); !strings.Contains(out, "lame duck") {
		t.Fatalf("%s did not say it stops in lame-duck mode:\n%s", leader, out)
	}
	t.Logf("%s: leadership moved %s before its exit", leader, exited.Sub(moved).Round(time.Millisecond))
}
