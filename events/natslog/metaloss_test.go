package natslog_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestWatchWithoutMetaLeader: the JetStream meta group has no leader (a
// node that led it was killed and the others are electing; here, made
// lasting: 3 of 5 nodes down, the R3 stream keeping 2 of its 3 peers and
// its leader), so no consumer can be created, and the reader's connection
// moves off a lost node (its consumer gone with it). The Watch keeps
// delivering new appends in order, read from the stream's leader, while the
// meta group stays leaderless.
func TestWatchWithoutMetaLeader(t *testing.T) {
	t.Parallel()
	srvs := startN(t, 5)
	byName := map[string]*natsserver.Server{}
	for _, s := range srvs {
		byName[s.Name()] = s
	}
	setup := connectAll(t, []string{srvs[0].ClientURL()})
	wl := open(t, setup, natslog.Config{Replicas: 3})
	if _, err := wl.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		t.Fatal(err)
	}
	js, err := jetstream.New(setup)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctxT(t), wl.Stream())
	if err != nil {
		t.Fatal(err)
	}
	cl := st.CachedInfo().Cluster
	if cl == nil || cl.Leader == "" || len(cl.Replicas) != 2 {
		t.Fatalf("stream cluster info %+v: want a leader and 2 replicas", cl)
	}
	leader, follower := byName[cl.Leader], byName[cl.Replicas[0].Name]
	// The reader starts on the follower and moves to the leader's node; the
	// writer stays there.
	rnc := connectAll(t, []string{follower.ClientURL(), leader.ClientURL()}, nats.DontRandomize(),
		nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond))
	wnc := connectAll(t, []string{leader.ClientURL()})
	reader := open(t, rnc, natslog.Config{Replicas: 3})
	writer := open(t, wnc, natslog.Config{Replicas: 3})

	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan uint64)
	done := make(chan error, 1)
	go func() {
		done <- reader.Watch(ctx, 1, func(r events.Record) error {
			select {
			case got <- r.Seq:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after cancel", err)
		}
	})
	recv := func(want uint64, within time.Duration) {
		t.Helper()
		timer := time.NewTimer(within)
		defer timer.Stop()
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("Watch delivered seq %d, want %d", seq, want)
			}
		case err := <-done:
			done <- err
			t.Fatalf("Watch returned %v", err)
		case <-timer.C:
			t.Fatalf("Watch delivered nothing for %s after seq %d was acked (meta leader seen by %s: %q)",
				within, want, leader.Name(), leader.MetaLeader())
		}
	}
	recv(1, 30*time.Second)
	waitPulling(t, setup, reader.Stream())

	down := time.Now()
	for _, s := range srvs {
		if s != leader && (s == follower || !slices.ContainsFunc(cl.Replicas, func(p *jetstream.PeerInfo) bool { return p.Name == s.Name() })) {
			s.Shutdown()
		}
	}
	// 2 of 5 meta peers: no meta leader can be elected.
	testkit.EventuallyErr(t, 30*time.Second, "a leaderless meta group", func() error {
		if l := leader.MetaLeader(); l != "" {
			return fmt.Errorf("%s still sees meta leader %q", leader.Name(), l)
		}
		return nil
	})
	t.Logf("3 nodes down, meta leaderless after %s; reader on %s", time.Since(down).Round(time.Millisecond), rnc.ConnectedServerName())
	for seq := uint64(2); seq <= 4; seq++ {
		appendRetrying(t, writer, seq-1, ev(1, seq-1), 30*time.Second)
		acked := time.Now()
		recv(seq, 20*time.Second)
		t.Logf("seq %d delivered %s after its ack", seq, time.Since(acked).Round(time.Millisecond))
	}
	if l := leader.MetaLeader(); l != "" {
		t.Fatalf("meta leader %q came back: the Watch was not read without one", l)
	}
}

// startN starts an n-node JetStream cluster and waits for its meta leader.
func startN(t *testing.T, n int) []*natsserver.Server {
	t.Helper()
	var ports []int
	var routes []string
	for range n {
		ports = append(ports, testkit.FreePort(t))
		routes = append(routes, natsserver.RouteURL(ports[len(ports)-1]))
	}
	var srvs []*natsserver.Server
	for i := range n {
		s, err := natsserver.StartServer(natsserver.ServerConfig{
			DataDir: t.TempDir(), Name: fmt.Sprintf("n%d", i+1),
			ClusterName: "test", ClusterPort: ports[i], Routes: routes,
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(s.Shutdown)
		srvs = append(srvs, s)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 30*time.Second)
	defer cancel()
	for _, s := range srvs {
		if _, err := s.WaitJetStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
	return srvs
}
