package meta

import (
	"context"
	"encoding/json"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// TestTermEndedWhileReconnectingLeavesNoSubscription: a term that ends
// while the replica's connection is reconnecting (the usual way a term
// ends when NATS goes away) must not leave its RPC subscription on the
// server. nats.go resends every subscription it still holds at a
// reconnect, a draining one included, and drops it locally afterwards
// without an UNSUB; the server then delivers each request twice to the
// connection, and with the meta role's one-response permission (MaxMsgs
// 1, counted at each delivery) the next term's only answer is refused as
// a permissions violation. Every heartbeat of every worker then went
// unanswered and the leader expired them all (chaos seed 100055500,
// standalone schedule 2, CI stop 37).
func TestTermEndedWhileReconnectingLeavesNoSubscription(t *testing.T) {
	const cluster = "reconn"
	port := testkit.FreePort(t)
	opts := &server.Options{Host: "127.0.0.1", Port: port, NoSigs: true, NoLog: true,
		Users: []*server.User{
			{Username: "meta", Password: "m", Permissions: natsserver.Permissions(cluster, natsserver.RoleMeta, "META")},
			{Username: "admin", Password: "a"},
		}}
	start := func() *server.Server {
		s, err := server.NewServer(opts)
		if err != nil {
			t.Fatal(err)
		}
		s.Start()
		if !s.ReadyForConnections(10 * time.Second) {
			t.Fatal("NATS server not ready")
		}
		return s
	}
	srv := start()
	var mu sync.Mutex
	var asyncErrs []string
	leaderNC, err := nats.Connect(srv.ClientURL(), nats.UserInfo("meta", "m"), nats.CustomInboxPrefix("_INBOX.META"),
		nats.ReconnectWait(20*time.Millisecond), nats.MaxReconnects(-1),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			mu.Lock()
			defer mu.Unlock()
			asyncErrs = append(asyncErrs, err.Error())
		}))
	if err != nil {
		t.Fatal(err)
	}
	defer leaderNC.Close()

	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	cfg := func(c *Config) { c.NC, c.Cluster = leaderNC, cluster }
	serve := func(tl *testLeader) (end func()) {
		if err := tl.startTerm(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		served := make(chan struct{})
		go func() { defer close(served); tl.rpcs().serve(ctx) }()
		return func() { cancel(); <-served }
	}
	end1 := serve(newTestLeader(t, "meta-1", log, clk, 1, cfg))
	testkit.Eventually(t, 10*time.Second, "term 1 subscribed", func() bool { return rpcSubs(srv, cluster) == 1 })

	// NATS goes away; the term ends while the connection reconnects.
	srv.Shutdown()
	testkit.Eventually(t, 10*time.Second, "the connection notices", func() bool { return !leaderNC.IsConnected() })
	end1()
	srv = start()
	defer srv.Shutdown()
	testkit.Eventually(t, 10*time.Second, "the connection is back", leaderNC.IsConnected)
	if err := leaderNC.Flush(); err != nil {
		t.Fatal(err)
	}
	if n := rpcSubs(srv, cluster); n != 0 {
		t.Errorf("after the term ended, the server holds %d RPC subscriptions of the replica's connection, want 0", n)
	}

	// A later term on the same connection answers.
	end2 := serve(newTestLeader(t, "meta-1", log, clk, 2, cfg))
	defer end2()
	cl, err := nats.Connect(srv.ClientURL(), nats.UserInfo("admin", "a"))
	if err != nil {
		t.Fatal(err)
	}
	defer cl.Close()
	hb, _ := json.Marshal(client.WorkerRef{ID: 1 << 40, Epoch: 2, Incarnation: "w0"})
	testkit.EventuallyErr(t, 10*time.Second, "term 2 answers a heartbeat", func() error {
		m, err := cl.Request(client.RPCSubject(cluster, client.RPCHeartbeat), hb, 500*time.Millisecond)
		if err != nil {
			return err
		}
		var rep client.Reply
		if err := json.Unmarshal(m.Data, &rep); err != nil {
			return err
		}
		if rep.Term != 2 {
			return &replyErr{string(m.Data)}
		}
		return nil
	})
	mu.Lock()
	defer mu.Unlock()
	for _, e := range asyncErrs {
		if strings.Contains(e, "ermissions") {
			t.Errorf("the replica's connection was refused an answer: %s", e)
		}
	}
}

type replyErr struct{ s string }

func (e *replyErr) Error() string { return "reply not from term 2: " + e.s }

// rpcSubs counts the subscriptions on cluster's RPC subjects the server
// holds for all its client connections.
func rpcSubs(s *server.Server, cluster string) int {
	cz, err := s.Connz(&server.ConnzOptions{Subscriptions: true})
	if err != nil {
		return -1
	}
	n := 0
	for _, c := range cz.Conns {
		for _, sub := range c.Subs {
			if strings.HasPrefix(sub, client.RPCSubject(cluster, "")) {
				n++
			}
		}
	}
	return n
}
