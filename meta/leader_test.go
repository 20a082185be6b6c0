package meta

import (
	"context"
	"encoding/json"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

var t0 = time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)

// testLeader is one leader term driven by hand: no loops run, the test calls
// the leader's actions directly on an in-memory log with a manual clock.
type testLeader struct {
	*leaderSession
	lost   chan string
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func newTestLeader(t *testing.T, id string, log events.Log, clk *clock.Manual, term uint64, opts ...func(*Config)) *testLeader {
	t.Helper()
	cfg := Config{ID: id, Log: log, Lease: NewMemLeaseStore(clk, 3*time.Second).Handle(), Clock: clk,
		WorkerTimeout: 10 * time.Second, Logger: zerolog.Nop()}
	for _, o := range opts {
		o(&cfg)
	}
	r, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	tl := &testLeader{lost: make(chan string, 1), cancel: cancel}
	tl.leaderSession = r.newLeaderSession(ctx, term, func(why string) {
		select {
		case tl.lost <- why:
		default:
		}
	})
	tl.wg.Add(1)
	go func() { defer tl.wg.Done(); _ = r.proj.Run(ctx) }()
	t.Cleanup(func() { cancel(); tl.wg.Wait() })
	return tl
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func (tl *testLeader) call(t *testing.T, rpc string, req any) client.Reply {
	t.Helper()
	b, _ := json.Marshal(req)
	return tl.handle(ctxT(t), rpc, b)
}

func TestStartTermAfterCatchingUp(t *testing.T) {
	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	ctx := ctxT(t)
	old := newTestLeader(t, "meta-1", log, clk, 3)
	if err := old.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	old.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "a", Endpoint: "127.0.0.1:7001"})

	l := newTestLeader(t, "meta-2", log, clk, 9)
	if err := l.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	v := l.r.proj.View()
	if v.Term != 9 || v.Leader != "meta-2" || v.Seq != 3 {
		t.Fatalf("view after term.started: seq %d term %d leader %s", v.Seq, v.Term, v.Leader)
	}
	if len(v.ListWorkers()) != 1 {
		t.Fatalf("the new leader must see the worker registered before it: %v", v.ListWorkers())
	}
	// The old leader's next action is fenced, and it steps down.
	rep := old.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "b", Endpoint: "127.0.0.1:7002"})
	if rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
		t.Fatalf("old leader's register: %+v", rep)
	}
	select {
	case why := <-old.lost:
		t.Logf("old leader lost: %s", why)
	default:
		t.Fatal("old leader did not step down")
	}
}

func TestRegisterIdempotentAndSupersedes(t *testing.T) {
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clock.NewManual(t0), 1)
	if err := l.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	a := l.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "a", Endpoint: "127.0.0.1:7001", Kind: "compute"})
	again := l.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "a", Endpoint: "127.0.0.1:7001", Kind: "compute"})
	if a.Error != nil || a.ID != 1 || again.ID != a.ID || again.Epoch != a.Epoch {
		t.Fatalf("register twice: %+v then %+v", a, again)
	}
	b := l.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "b", Endpoint: "127.0.0.1:7001", Kind: "compute"})
	if b.Error != nil || b.ID != 2 {
		t.Fatalf("new incarnation: %+v", b)
	}
	ws := l.r.proj.View().ListWorkers()
	if len(ws) != 1 || ws[0].ID != 2 {
		t.Fatalf("workers after supersession: %+v", ws)
	}
	// The superseded id must re-register.
	if rep := l.call(t, client.RPCHeartbeat, client.WorkerRef{ID: a.ID, Epoch: a.Epoch}); rep.Error == nil || rep.Error.Code != client.CodeReregister {
		t.Fatalf("heartbeat of superseded id: %+v", rep)
	}
	if rep := l.call(t, client.RPCActivate, client.WorkerRef{ID: b.ID, Epoch: b.Epoch}); rep.Error != nil {
		t.Fatalf("activate: %+v", rep)
	}
	if w, _ := l.r.proj.View().Worker(b.ID); w.State != projections.WorkerRunning {
		t.Fatalf("worker not running: %+v", w)
	}
	if rep := l.call(t, client.RPCDeregister, client.WorkerRef{ID: b.ID, Epoch: b.Epoch}); rep.Error != nil || len(l.r.proj.View().Workers) != 0 {
		t.Fatalf("deregister: %+v, workers %v", rep, l.r.proj.View().Workers)
	}
}

func TestGarbageRequestsGetClearErrors(t *testing.T) {
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clock.NewManual(t0), 1)
	if err := l.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ rpc, body string }{
		{client.RPCRegister, ``},
		{client.RPCRegister, `{"incarnation":"a","endpoint":"nohostport"}`},
		{client.RPCRegister, `{"incarnation":"","endpoint":"127.0.0.1:1"}`},
		{client.RPCRegister, `{"incarnation":"a","endpoint":"127.0.0.1:1","extra":1}`},
		{client.RPCHeartbeat, `{"id":"x"}`},
		{client.RPCHeartbeat, `{}`},
		{"nope", `{}`},
	} {
		rep := l.handle(ctxT(t), tc.rpc, []byte(tc.body))
		if rep.Error == nil || rep.Error.Code != client.CodeBadRequest || rep.Error.Message == "" {
			t.Errorf("%s %q: %+v", tc.rpc, tc.body, rep)
		}
	}
	if seq := l.r.proj.View().Seq; seq != 1 {
		t.Fatalf("garbage changed the stream: seq %d", seq)
	}
}

func TestExpiryByIDAndEpochWithFreshTimeoutForNewLeader(t *testing.T) {
	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	ctx := ctxT(t)
	l := newTestLeader(t, "meta-1", log, clk, 1)
	if err := l.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	a := l.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "a", Endpoint: "127.0.0.1:7001"})
	b := l.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "b", Endpoint: "127.0.0.1:7002"})
	clk.Advance(6 * time.Second)
	l.call(t, client.RPCHeartbeat, client.WorkerRef{ID: b.ID, Epoch: b.Epoch})
	clk.Advance(5 * time.Second) // a: 11 s without heartbeat; b: 5 s
	if err := l.expireOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := workerList(l.r.proj.View()); got != "[2]" {
		t.Fatalf("after expiry: %s, want [2]", got)
	}
	if rep := l.call(t, client.RPCHeartbeat, client.WorkerRef{ID: a.ID, Epoch: a.Epoch}); rep.Error == nil || !errors.Is(rep.Error, client.ErrReregister) {
		t.Fatalf("expired worker's heartbeat: %+v", rep)
	}

	// A new leader, long after b's last heartbeat, first grants a full timeout.
	clk.Advance(time.Hour)
	l2 := newTestLeader(t, "meta-2", log, clk, 2)
	if err := l2.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	if err := l2.expireOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := workerList(l2.r.proj.View()); got != "[2]" {
		t.Fatalf("new leader expired without a full timeout: %s", got)
	}
	clk.Advance(11 * time.Second)
	if err := l2.expireOnce(ctx); err != nil {
		t.Fatal(err)
	}
	if got := workerList(l2.r.proj.View()); got != "[]" {
		t.Fatalf("after a full timeout: %s, want []", got)
	}
}

// TestStaleDecisionIsFenced is the first report's race in memory: a decision
// made on a view is appended after someone else appended, so the CAS fences it.
func TestStaleDecisionIsFenced(t *testing.T) {
	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	ctx := ctxT(t)
	old := newTestLeader(t, "meta-1", log, clk, 1)
	if err := old.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	a := old.call(t, client.RPCRegister, client.RegisterRequest{Incarnation: "a", Endpoint: "127.0.0.1:7001"})
	clk.Advance(11 * time.Second)
	old.collectExpired(old.r.proj.View()) // first look sets deadlines
	clk.Advance(11 * time.Second)

	_, err := old.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		expired := old.collectExpired(v)
		if len(expired) != 1 {
			t.Fatalf("collected %v", expired)
		}
		// Between the decision and the append, a new leader starts its term.
		nl := newTestLeader(t, "meta-2", log, clk, 2)
		if err := nl.startTerm(ctx); err != nil {
			t.Fatal(err)
		}
		return expired, nil
	})
	if !errors.Is(err, events.ErrFenced) {
		t.Fatalf("stale expiry append: %v, want ErrFenced", err)
	}
	if why := <-old.lost; why == "" {
		t.Fatal("no step-down reason")
	}
	if _, ok := old.r.proj.View().Worker(a.ID); !ok {
		t.Fatal("the fenced deletion removed the worker")
	}
}

func workerList(v *projections.State) string {
	ids := []uint64{}
	for _, w := range v.ListWorkers() {
		ids = append(ids, w.ID)
	}
	b, _ := json.Marshal(ids)
	return string(b)
}
