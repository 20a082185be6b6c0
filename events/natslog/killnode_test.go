package natslog_test

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// nodeEnv names the environment variable that makes the test binary a NATS
// node (a process of its own, to be SIGKILLed: an embedded server's
// Shutdown hands its Raft leaderships over, so it cannot stand for a crash).
const nodeEnv = "NATSLOG_TEST_NODE"

type nodeConfig struct {
	Name, DataDir     string
	Port, ClusterPort int
	Routes            []string
}

// runNode runs a node configured by cfg (JSON) and prints "meta <name>"
// whenever its view of the JetStream meta leader changes, until killed.
func runNode(cfg string) {
	var c nodeConfig
	if err := json.Unmarshal([]byte(cfg), &c); err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	s, err := natsserver.StartServer(natsserver.ServerConfig{
		Name: c.Name, DataDir: c.DataDir, Port: c.Port,
		ClusterName: "test", ClusterPort: c.ClusterPort, Routes: c.Routes, ReadyTimeout: 30 * time.Second,
	})
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(2)
	}
	seen := "?"
	for {
		if l := s.MetaLeader(); l != seen {
			seen = l
			fmt.Printf("meta %s\n", l)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// node is a NATS node process of the test.
type node struct {
	name, url string
	cmd       *exec.Cmd
	mu        sync.Mutex
	meta      string    // its last view of the meta leader
	elected   time.Time // when it first saw a leader other than gone
	gone      string
}

// startProcs starts a 3-node cluster of processes and waits until every
// node sees the same meta leader.
func startProcs(t *testing.T) []*node {
	t.Helper()
	var cports, ports []int
	var routes []string
	for range 3 {
		ports, cports = append(ports, testkit.FreePort(t)), append(cports, testkit.FreePort(t))
		routes = append(routes, natsserver.RouteURL(cports[len(cports)-1]))
	}
	var nodes []*node
	for i := range 3 {
		cfg, _ := json.Marshal(nodeConfig{Name: fmt.Sprintf("n%d", i+1), DataDir: t.TempDir(), Port: ports[i], ClusterPort: cports[i], Routes: routes})
		cmd := exec.Command(os.Args[0], "-test.run=^$")
		cmd.Env = append(os.Environ(), nodeEnv+"="+string(cfg))
		out, err := cmd.StdoutPipe()
		if err != nil {
			t.Fatal(err)
		}
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		n := &node{name: fmt.Sprintf("n%d", i+1), url: fmt.Sprintf("nats://127.0.0.1:%d", ports[i]), cmd: cmd}
		done := make(chan struct{})
		go func() {
			defer close(done)
			sc := bufio.NewScanner(out)
			for sc.Scan() {
				l, ok := strings.CutPrefix(sc.Text(), "meta ")
				if !ok {
					continue
				}
				n.mu.Lock()
				n.meta = l
				if n.gone != "" && l != "" && l != n.gone && n.elected.IsZero() {
					n.elected = time.Now()
				}
				n.mu.Unlock()
			}
		}()
		t.Cleanup(func() {
			_ = cmd.Process.Kill()
			_ = cmd.Wait()
			<-done
		})
		nodes = append(nodes, n)
	}
	testkit.EventuallyErr(t, 60*time.Second, "one meta leader seen by all", func() error {
		var views []string
		for _, n := range nodes {
			n.mu.Lock()
			views = append(views, n.meta)
			n.mu.Unlock()
		}
		if views[0] == "" || views[0] != views[1] || views[1] != views[2] {
			return fmt.Errorf("meta leader views %q", views)
		}
		return nil
	})
	return nodes
}

// TestWatchThroughMetaLeaderKill: the node leading the JetStream meta group
// (not the stream) is SIGKILLed while a Watch reads through it. The reader's
// connection moves, and no consumer can be made until the survivors elect
// a meta leader (4-9 s); the Watch delivers the next append before they
// do, reading by message get from the stream's leader.
func TestWatchThroughMetaLeaderKill(t *testing.T) {
	t.Parallel()
	nodes := startProcs(t)
	byName := map[string]*node{}
	var urls []string
	for _, n := range nodes {
		byName[n.name] = n
		urls = append(urls, n.url)
	}
	setup := connectAll(t, urls)
	wl := open(t, setup, natslog.Config{Replicas: 3})
	if _, err := wl.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(setup)
	if err != nil {
		t.Fatal(err)
	}
	nodes[0].mu.Lock()
	victim := byName[nodes[0].meta]
	nodes[0].mu.Unlock()
	// The stream must be led elsewhere.
	var streamLeader *node
	testkit.EventuallyErr(t, 30*time.Second, "a stream leader that is not the meta leader", func() error {
		st, err := js.Stream(ctxT(t), wl.Stream())
		if err != nil {
			return err
		}
		cl := st.CachedInfo().Cluster
		if cl == nil || cl.Leader == "" {
			return errors.New("no stream leader")
		}
		if cl.Leader == victim.name {
			_, _ = setup.Request("$JS.API.STREAM.LEADER.STEPDOWN."+wl.Stream(), nil, 2*time.Second)
			return errors.New("the stream is led by the meta leader: stepped down")
		}
		streamLeader = byName[cl.Leader]
		return nil
	})
	rnc := connectAll(t, []string{victim.url, streamLeader.url}, nats.DontRandomize(),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	wnc := connectAll(t, []string{streamLeader.url})
	reader := open(t, rnc, natslog.Config{Replicas: 3})
	writer := open(t, wnc, natslog.Config{Replicas: 3})

	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan time.Time, 8)
	done := make(chan error, 1)
	var want uint64 = 1
	go func() {
		done <- reader.Watch(ctx, 1, func(r events.Record) error {
			if r.Seq != want {
				return fmt.Errorf("delivered seq %d, want %d", r.Seq, want)
			}
			want++
			got <- time.Now()
			return nil
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after cancel", err)
		}
	})
	recv := func(seq uint64) time.Time {
		t.Helper()
		select {
		case at := <-got:
			return at
		case err := <-done:
			done <- err
			t.Fatalf("Watch returned %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("Watch did not deliver seq %d", seq)
		}
		return time.Time{}
	}
	recv(1)
	waitPulling(t, wnc, reader.Stream())
	for _, n := range nodes {
		n.mu.Lock()
		n.gone = victim.name
		n.mu.Unlock()
	}
	killed := time.Now()
	if err := victim.cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	appendRetrying(t, writer, 1, ev(1, 1), 30*time.Second)
	acked := time.Now()
	at := recv(2)
	var elected time.Time
	testkit.EventuallyErr(t, 30*time.Second, "a new meta leader", func() error {
		for _, n := range nodes {
			n.mu.Lock()
			e := n.elected
			n.mu.Unlock()
			if n != victim && !e.IsZero() && (elected.IsZero() || e.Before(elected)) {
				elected = e
			}
		}
		if elected.IsZero() {
			return errors.New("none yet")
		}
		return nil
	})
	t.Logf("meta leader %s killed; append acked after %s; seq 2 delivered %s after the kill; new meta leader seen %s after the kill",
		victim.name, acked.Sub(killed).Round(time.Millisecond), at.Sub(killed).Round(time.Millisecond), elected.Sub(killed).Round(time.Millisecond))
	if !at.Before(elected) {
		t.Fatalf("seq 2 delivered %s after a new meta leader was seen: the Watch waited for one", at.Sub(elected).Round(time.Millisecond))
	}
}
