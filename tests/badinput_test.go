package tests

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// TestForgedAndCorruptEventsSkippedAlike: a stale-term event appended
// straight to the stream (as an admin with direct access could) is rejected
// by every replica's projection and listed by `replay --rejected`; a body
// that is not an event is reported as corrupt with its seq by every replica
// alike; nothing after either is lost.
func TestForgedAndCorruptEventsSkippedAlike(t *testing.T) {
	c := newCluster(t)
	opts := metaOpts{workerTimeout: 10 * time.Second}
	nodes := []*metaNode{c.startMeta("meta-1", opts), c.startMeta("meta-2", opts), c.startMeta("meta-3", opts)}
	first := c.startWorker(testkit.FreeAddr(t), "w1", 100*time.Millisecond)
	var leader *metaNode
	var term uint64
	testkit.Eventually(t, 15*time.Second, "a leader with a running worker", func() bool {
		leader, term = leaderOf(nodes...)
		if leader == nil {
			return false
		}
		w, ok := leader.View().Worker(first.w.Ref().ID)
		return ok && w.State == projections.WorkerRunning
	})
	victim, _ := leader.View().Worker(first.w.Ref().ID)
	admin := c.conn()
	lg := c.openLog(admin)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()

	// A forged deletion of the running worker, in the term before this one.
	stale := term - 1
	forged := forceAppend(t, lg, events.Event{Term: stale, Writer: "admin-forger", At: time.Now(),
		Data: events.WorkerExpired{ID: victim.ID, Epoch: victim.Epoch}})
	// A body that is no event at all, on a subject of the stream.
	garbage := publishRaw(t, admin, lg, cluster+".ev.garbage", []byte("\x00\xffnot an event {"))
	if garbage <= forged {
		t.Fatalf("garbage at seq %d, forged event at %d", garbage, forged)
	}

	// Events after both still count: a second worker registers.
	second := c.startWorker(testkit.FreeAddr(t), "w2", 100*time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "the second worker to register", func() bool { return second.w.Ref().ID != 0 })
	if reg := second.w.Ref(); reg.Epoch <= garbage {
		t.Fatalf("second worker registered at seq %d, before the garbage at %d", reg.Epoch, garbage)
	}

	v := converged(t, lg, nodes...)
	for _, n := range nodes {
		nv := n.View()
		a, ok := anomalyAt(nv, forged)
		if !ok || a.Kind != projections.AnomalyStaleTerm || a.Writer != "admin-forger" || a.Term != stale || a.Type != events.TypeWorkerExpired {
			t.Errorf("%s: forged event at seq %d: anomaly %+v (found %v), want stale-term by admin-forger in term %d", n.ID(), forged, a, ok, stale)
		}
		a, ok = anomalyAt(nv, garbage)
		if !ok || a.Kind != projections.AnomalyCorrupt {
			t.Errorf("%s: garbage at seq %d: anomaly %+v (found %v), want corrupt", n.ID(), garbage, a, ok)
		}
		if nv.Counters.StaleTerm != 1 || nv.Counters.Corrupt != 1 {
			t.Errorf("%s: counters %+v, want 1 stale-term and 1 corrupt", n.ID(), nv.Counters)
		}
		for _, w := range []*workerNode{first, second} {
			if got, ok := nv.Worker(w.w.Ref().ID); !ok || got.Epoch != w.w.Ref().Epoch {
				t.Errorf("%s: worker %d missing: %v", n.ID(), w.w.Ref().ID, workerIDs(nv))
			}
		}
	}
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}

	// `termlog replay --rejected` on the live stream names the forgery.
	var found bool
	for _, e := range rejectedListing(t, lg) {
		if e.Seq == garbage {
			t.Errorf("replay --rejected lists the corrupt record as rejected: %+v", e)
		}
		if e.Seq == forged {
			found = true
			if e.Kind != projections.AnomalyStaleTerm || e.Writer != "admin-forger" || e.Term != stale ||
				e.Type != events.TypeWorkerExpired || e.Outcome != "rejected" {
				t.Errorf("replay --rejected entry for seq %d: %+v", forged, e)
			}
		}
	}
	if !found {
		t.Fatalf("replay --rejected does not list the forged event at seq %d", forged)
	}
	// A fresh one-shot fold of the stream, up to the seq the replicas
	// converged at, sees the same. Not to the tail: the cluster goes on
	// appending (the second worker's activation may land after the views
	// converged), and a fold of more events has another hash.
	fresh := projections.New()
	if err := lg.Read(ctx, 1, func(rec events.Record) error {
		if rec.Seq <= v.Seq {
			fresh.ApplyRecord(rec)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if fresh.Seq != v.Seq || fresh.Hash() != v.Hash() {
		t.Fatalf("a fresh fold of the stream to seq %d (at seq %d) differs from the replicas' views", v.Seq, fresh.Seq)
	}
	allRunning(t, nodes...)
}

// TestGarbageRPCsGetClearErrors: every RPC subject, and an unknown one,
// answers garbage with a bad_request reply (never a timeout or no
// responders); the garbage changes nothing, the leader keeps its term and
// still serves a valid registration, and every replica keeps running with
// the same view.
func TestGarbageRPCsGetClearErrors(t *testing.T) {
	c := newCluster(t)
	nodes := []*metaNode{c.startMeta("meta-1", metaOpts{}), c.startMeta("meta-2", metaOpts{}), c.startMeta("meta-3", metaOpts{})}
	var term uint64
	testkit.Eventually(t, 15*time.Second, "a leader that completed recovery", func() bool {
		l, tm := leaderOf(nodes...)
		if l == nil {
			return false
		}
		term = tm
		r, ok := currentRecovery(l)
		return ok && r.Term == tm && r.State == meta.RecoveryComplete && l.View().Term == tm
	})
	nc := c.conn()
	lg := c.openLog(nc)
	tailBefore, err := lg.Tail(t.Context())
	if err != nil {
		t.Fatal(err)
	}

	pad := func(valid string) string { return valid + strings.Repeat(" ", client.MaxRequestBytes) }
	huge := strings.Repeat("x", 64<<10)
	cases := []struct {
		rpc         string
		wrongTypes  string
		extraFields string
		oversized   string // valid but for its size ("" when the size limit is larger)
	}{
		{client.RPCRegister, `{"incarnation":7,"endpoint":["127.0.0.1:7001"]}`,
			`{"incarnation":"a","endpoint":"127.0.0.1:7001","kind":"compute","parallelism":1,"admin":true}`,
			pad(`{"incarnation":"a","endpoint":"127.0.0.1:7001"}`)},
		{client.RPCActivate, `{"id":"1","epoch":2,"incarnation":"a"}`, `{"id":1,"epoch":2,"incarnation":"a","force":true}`,
			pad(`{"id":1,"epoch":2,"incarnation":"a"}`)},
		{client.RPCHeartbeat, `{"id":1,"epoch":-2,"incarnation":"a"}`, `{"id":1,"epoch":2,"incarnation":"a","until":"forever"}`,
			pad(`{"id":1,"epoch":2,"incarnation":"a"}`)},
		{client.RPCDeregister, `{"id":1.5,"epoch":2,"incarnation":"a"}`, `{"id":1,"epoch":2,"incarnation":"a","all":true}`,
			pad(`{"id":1,"epoch":2,"incarnation":"a"}`)},
		{client.RPCStoreRegister, `{"store":1,"incarnation":"i","raft_addr":"127.0.0.1:9001"}`,
			`{"store":"s1","incarnation":"i","raft_addr":"127.0.0.1:9001","voter":true}`,
			pad(`{"store":"s1","incarnation":"i","raft_addr":"127.0.0.1:9001"}`)},
		{client.RPCStoreHeartbeat, `{"store":"s1","incarnation":"i","shards":{"1":2}}`,
			`{"store":"s1","incarnation":"i","shards":[],"healthy":true}`, ""},
		{client.RPCStoreDrain, `{"store":"s1","for_ms":"1h"}`, `{"store":"s1","for_ms":1000,"force":true}`,
			pad(`{"store":"s1","for_ms":1000}`)},
		{client.RPCStepDown, `[]`, `{"now":true}`, ""},
		{"nope", `{}`, `{"x":1}`, ""},
		{"store.nope", `{}`, `{"x":1}`, ""},
		{"a.b.c.d", `{}`, `{"x":1}`, ""},
	}
	for _, tc := range cases {
		bodies := map[string]string{
			"empty": "", "huge": huge, "invalid json": `{"id":`, "not an object": `null`, "binary": "\x00\xff\xfe",
			"wrong types": tc.wrongTypes, "extra fields": tc.extraFields,
		}
		if tc.oversized != "" {
			bodies["oversized"] = tc.oversized
		}
		for what, body := range bodies {
			rep, err := rpc(nc, tc.rpc, []byte(body))
			if err != nil {
				t.Errorf("%s with %s body: no reply: %v", tc.rpc, what, err)
				continue
			}
			if rep.Error == nil || rep.Error.Code != client.CodeBadRequest || rep.Error.Message == "" {
				t.Errorf("%s with %s body: reply %+v, want %s", tc.rpc, what, rep, client.CodeBadRequest)
				continue
			}
			if rep.Term != term || rep.Leader == "" {
				t.Errorf("%s with %s body: reply from term %d leader %q, want term %d", tc.rpc, what, rep.Term, rep.Leader, term)
			}
			if what == "oversized" && !strings.Contains(rep.Error.Message, "exceeds") {
				t.Errorf("%s with an oversized body: %q does not say it is too large", tc.rpc, rep.Error.Message)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// Nothing changed: no event, same leader and term.
	if tail, err := lg.Tail(t.Context()); err != nil || tail != tailBefore {
		t.Fatalf("garbage reached the stream: tail %d -> %d (%v)", tailBefore, tail, err)
	}
	if l, tm := leaderOf(nodes...); l == nil || tm != term {
		t.Fatalf("leader after the garbage: term %d, want term %d", tm, term)
	}
	// The leader still serves a valid registration.
	body := []byte(fmt.Sprintf(`{"incarnation":"after-garbage","endpoint":%q,"kind":"compute","parallelism":2}`, testkit.FreeAddr(t)))
	rep, err := rpc(nc, client.RPCRegister, body)
	if err != nil || rep.Error != nil || rep.ID == 0 || rep.Term != term {
		t.Fatalf("valid registration after the garbage: %+v, %v", rep, err)
	}
	v := converged(t, lg, nodes...)
	if _, ok := v.Worker(rep.ID); !ok {
		t.Fatalf("registered worker %d not in the converged view: %s", rep.ID, workerIDs(v))
	}
	if v.Counters.Corrupt != 0 || v.Counters.Rejected != 0 {
		t.Fatalf("counters after garbage RPCs: %+v", v.Counters)
	}
	allRunning(t, nodes...)
}

// TestImpersonatedWorkerRefused: requests naming a running worker's id and
// epoch with another incarnation are refused as forbidden, and the worker
// is untouched: still registered and running, its heartbeats accepted, its
// control session never reset.
func TestImpersonatedWorkerRefused(t *testing.T) {
	c := newCluster(t)
	opts := metaOpts{workerTimeout: 2 * time.Second, expiry: 100 * time.Millisecond}
	nodes := []*metaNode{c.startMeta("meta-1", opts), c.startMeta("meta-2", opts)}
	real := c.startWorker(testkit.FreeAddr(t), "real-incarnation", 100*time.Millisecond)
	var leader *metaNode
	testkit.Eventually(t, 15*time.Second, "the worker running with its control session", func() bool {
		leader, _ = leaderOf(nodes...)
		if leader == nil {
			return false
		}
		w, ok := leader.View().Worker(real.w.Ref().ID)
		r, _ := currentRecovery(leader)
		return ok && w.State == projections.WorkerRunning && r.State == meta.RecoveryComplete && real.agent.Stats().Active
	})
	ref := real.w.Ref()
	stats := real.agent.Stats()

	nc := c.conn()
	forged := client.WorkerRef{ID: ref.ID, Epoch: ref.Epoch, Incarnation: "mallory"}
	for range 3 {
		for _, name := range []string{client.RPCDeregister, client.RPCActivate, client.RPCHeartbeat} {
			rep, err := rpc(nc, name, mustJSON(t, forged))
			if err != nil {
				t.Fatalf("forged %s: no reply: %v", name, err)
			}
			if rep.Error == nil || rep.Error.Code != client.CodeForbidden {
				t.Fatalf("forged %s: %+v, want %s", name, rep, client.CodeForbidden)
			}
		}
	}
	// Without an incarnation the request is not even well formed.
	if rep, err := rpc(nc, client.RPCDeregister, mustJSON(t, map[string]uint64{"id": ref.ID, "epoch": ref.Epoch})); err != nil || rep.Error == nil || rep.Error.Code != client.CodeBadRequest {
		t.Fatalf("deregister without an incarnation: %+v, %v", rep, err)
	}

	// Once a canary that died after the forgeries is expired, a full worker
	// timeout has passed with expiry running: the real worker is still
	// there, unchanged.
	c.expiredCanary(t, leader)
	v := converged(t, leader.log, nodes...)
	w, ok := v.Worker(ref.ID)
	if !ok || w.Epoch != ref.Epoch || w.Incarnation != "real-incarnation" || w.State != projections.WorkerRunning {
		t.Fatalf("real worker after the forgeries: %+v (found %v)", w, ok)
	}
	if got := real.w.Ref(); got != ref {
		t.Fatalf("real worker re-registered: %+v -> %+v", ref, got)
	}
	if n := countType(t, leader, events.TypeWorkerDeregistered); n != 0 {
		t.Fatalf("%d %s events", n, events.TypeWorkerDeregistered)
	}
	if n := countType(t, leader, events.TypeWorkerExpired); n != 1 {
		t.Fatalf("%d %s events, want 1 (the canary)", n, events.TypeWorkerExpired)
	}
	if after := real.agent.Stats(); !after.Active || after.Resets != stats.Resets || after.Accepted != stats.Accepted || after.Refused != stats.Refused {
		t.Fatalf("real worker's control stream changed: %+v -> %+v", stats, after)
	}
	if rep, err := rpc(nc, client.RPCHeartbeat, mustJSON(t, ref)); err != nil || rep.Error != nil {
		t.Fatalf("the real registration's heartbeat: %+v, %v", rep, err)
	}
	allRunning(t, nodes...)
}

// TestNATSOutage: NATS stops for 10 s and comes back. Leader actions stop
// while it is down (the term ends, no replica leads), no worker is expired
// for the heartbeats it could not send, a leader resumes with a new term and
// completes recovery, and every replica keeps running with the same view.
//
// The lease (9 s) outlives the worker timeout (2 s) by far, so a leader
// that kept deciding on its in-memory deadlines while disconnected would
// expire every worker before it noticed the lost lease, and the nats client
// would deliver that append, buffered while reconnecting, after the outage.
func TestNATSOutage(t *testing.T) {
	const lease = 9 * time.Second
	c := newClusterOnPort(t)
	opts := metaOpts{workerTimeout: 2 * time.Second, expiry: 100 * time.Millisecond, lease: lease}
	var nodes []*metaNode
	for i := range 3 {
		id := fmt.Sprintf("meta-%d", i+1)
		nodes = append(nodes, c.startMeta(id, opts))
	}
	var workers []*workerNode
	for i := range 3 {
		name := fmt.Sprintf("w%d", i+1)
		workers = append(workers, c.startWorker(testkit.FreeAddr(t), name, 100*time.Millisecond))
	}
	testkit.Eventually(t, 20*time.Second, "3 running workers and a recovered leader", func() bool {
		l, term := leaderOf(nodes...)
		if l == nil || len(l.View().ListWorkers()) != 3 {
			return false
		}
		for _, w := range l.View().ListWorkers() {
			if w.State != projections.WorkerRunning {
				return false
			}
		}
		r, ok := currentRecovery(l)
		return ok && r.Term == term && r.State == meta.RecoveryComplete && len(r.Sessions) == 3
	})
	old, oldTerm := leaderOf(nodes...)
	before := workerIDs(old.View())

	c.stopNATS()
	stopped := time.Now()
	testkit.Eventually(t, lease, "the leader's term to end", func() bool { l, _ := leaderOf(nodes...); return l == nil })
	t.Logf("term %d ended %s into the outage: %s", oldTerm, time.Since(stopped).Round(time.Millisecond), lastTermReason(old))
	for time.Since(stopped) < 10*time.Second {
		if l, term := leaderOf(nodes...); l != nil {
			t.Fatalf("%s leads term %d while NATS is down", l.ID(), term)
		}
		allRunning(t, nodes...)
		time.Sleep(50 * time.Millisecond)
	}
	c.startNATS()
	restarted := time.Now()

	var leader *metaNode
	var term uint64
	testkit.Eventually(t, 30*time.Second, "a leader with a new term, 3 running workers and recovery complete", func() bool {
		leader, term = leaderOf(nodes...)
		if leader == nil || term <= oldTerm || leader.View().Term != term {
			return false
		}
		r, ok := currentRecovery(leader)
		return ok && r.Term == term && r.State == meta.RecoveryComplete && len(r.Sessions) == 3
	})
	t.Logf("%s leads term %d, recovered %s after NATS came back", leader.ID(), term, time.Since(restarted).Round(time.Millisecond))
	// Once a canary that died under the new leader is expired, a full worker
	// timeout has passed with expiry running: still no other worker expired.
	c.expiredCanary(t, leader)
	v := converged(t, leader.log, nodes...)
	if got := workerIDs(v); got != before {
		t.Fatalf("workers changed across the outage: %s -> %s", before, got)
	}
	if n := countType(t, leader, events.TypeWorkerExpired); n != 1 {
		t.Fatalf("%d worker.expired events across the outage, want 1 (the canary)", n)
	}
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if s := w.agent.Stats(); !s.Active || s.Hello.Term != term {
			t.Fatalf("worker %s: control session %+v, want one of term %d", w.agent.Addr(), s, term)
		}
	}
	allRunning(t, nodes...)
}

func lastTermReason(n *metaNode) string {
	terms := n.Terms()
	if len(terms) == 0 {
		return ""
	}
	return terms[len(terms)-1].Reason
}

func mustJSON(t *testing.T, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
