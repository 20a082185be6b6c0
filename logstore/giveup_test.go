package logstore

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/view"
)

// TestGiveUpFencesALateChange, on three real NodeHosts: a give-up at the
// config change id a step was decided on moves Raft's id past it without
// changing a member, so the step's change, arriving late (through the
// executor, or proposed raw at that id), can never apply; a give-up again
// is idempotent; a give-up after the step's own change applied proposes
// nothing and shows that change; the shard keeps serving; and a restarted
// replica still has the fence in its membership (the fence id is removed
// for good).
func TestGiveUpFencesALateChange(t *testing.T) {
	c := newCluster(t, 3)
	h1, h2 := c.hosts[0], c.hosts[1]
	for i, h := range c.hosts {
		if err := h.startMember(1, uint64(i+1), c.initial(), false); err != nil {
			t.Fatal(err)
		}
	}
	waitAgree(t, 1, []uint64{1, 2, 3}, c.hosts...)
	mustPropose(t, h1, 1, "before")
	m0, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	base := m0.CCID

	// The leader gives up the step decided at base (remove replica 3).
	g := h2.GiveUp(ctxTimeout(t, 10*time.Second), 1, base)
	if g.Outcome != Applied || g.Membership == nil || !g.Membership.IsRemoved(client.FenceReplica(base)) || g.CCID <= base {
		t.Fatalf("give-up at ccid %d: %v %+v", base, g, g.Membership)
	}
	if len(g.Membership.Replicas) != 3 {
		t.Fatalf("the fence changed the members: %v", g.Membership.Replicas)
	}
	// The step's change arrives late: the executor proposes nothing ...
	late := h1.RemoveReplicaOn(ctxTimeout(t, 10*time.Second), 1, 3, base)
	if late.Outcome != Rejected || late.Attempts != 0 {
		t.Fatalf("a late change at the fenced ccid %d through the executor: %v", base, late)
	}
	// ... and a proposal at base that was already on its way is rejected by Raft.
	raw := h1.removeReplicaWithCCID(ctxTimeout(t, 10*time.Second), 1, 3, base)
	if raw.Outcome != Rejected {
		t.Fatalf("a raw proposal at the fenced ccid %d: %v", base, raw)
	}
	if m, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1); err != nil || !m.IsMember(3) {
		t.Fatalf("replica 3 must still be a member after its fenced removal: %+v %v", m, err)
	}
	// Giving up again is idempotent.
	if again := h1.GiveUp(ctxTimeout(t, 10*time.Second), 1, base); again.Outcome != Applied || !again.Already {
		t.Fatalf("give-up again: %v", again)
	}

	// A step whose own change applied first: the give-up proposes nothing
	// and its membership shows the change.
	m1, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if r := h1.RemoveReplicaOn(ctxTimeout(t, 10*time.Second), 1, 3, m1.CCID); r.Outcome != Applied {
		t.Fatalf("remove 3 at ccid %d: %v", m1.CCID, r)
	}
	moved := h2.GiveUp(ctxTimeout(t, 10*time.Second), 1, m1.CCID)
	if moved.Outcome != Rejected || moved.Attempts != 0 || moved.Membership == nil || moved.Membership.IsMember(3) || moved.Membership.IsRemoved(client.FenceReplica(m1.CCID)) {
		t.Fatalf("give-up after the step's change applied: %v %+v", moved, moved.Membership)
	}

	// The shard serves after its fences, and a restarted replica keeps them.
	mustPropose(t, h2, 1, "after")
	mustCount(t, h1, 1, 2)
	c.stop(1)
	h2 = c.restart(1)
	if err := h2.startMember(1, 2, nil, false); err != nil {
		t.Fatal(err)
	}
	mustCount(t, h2, 1, 2)
	if m, err := h2.Membership(ctxTimeout(t, 10*time.Second), 1); err != nil || !m.IsRemoved(client.FenceReplica(base)) || m.IsMember(3) {
		t.Fatalf("membership on the restarted replica: %+v %v", m, err)
	}
}

// TestStoreExecGiveUp: the store's executor runs a give-up for the pending
// intent of a running operator of the current term (the fence applies:
// given-up, with the membership after it and the fence's index), after
// which the step's change is refused by Raft's moved config change id; a
// give-up of an ended term is refused by the store's fence.
func TestStoreExecGiveUp(t *testing.T) {
	c := newCluster(t, 3)
	for i, h := range c.hosts {
		if err := h.startMember(1, uint64(i+1), c.initial(), false); err != nil {
			t.Fatal(err)
		}
	}
	waitAgree(t, 1, []uint64{1, 2, 3}, c.hosts...)
	m0, err := c.hosts[0].Membership(ctxTimeout(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	mem := events.NewMemLog()
	ctx := context.Background()
	app := func(term uint64, writer string, ps ...events.Payload) uint64 {
		t.Helper()
		tail, _ := mem.Tail(ctx)
		var evs []events.Event
		for _, p := range ps {
			evs = append(evs, events.Event{Term: term, Writer: writer, At: time.Unix(0, 0), Data: p})
		}
		seq, err := mem.Append(ctx, tail, evs...)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	app(1, "meta-1", append([]events.Payload{events.TermStarted{Term: 1, Leader: "meta-1"}}, with(created(),
		events.OperatorStarted{Op: "op-1-6", Shard: 1, Remove: 3})...)...)
	intent := app(1, "meta-1", events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: m0.CCID, Op: "op-1-6"})
	proj := view.NewProjector(mem, testkit.Logger(t), nil)
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = proj.Run(pctx) }()
	defer func() { cancel(); <-done }()

	s := &Store{host: c.hosts[0], proj: proj, logger: testkit.Logger(t)}
	exec := func(req client.ExecRequest) client.ExecReply {
		t.Helper()
		req.TimeoutMS = 10_000
		b, err := json.Marshal(req)
		if err != nil {
			t.Fatal(err)
		}
		return s.exec(ctx, b)
	}
	giveUp := client.ExecRequest{Op: client.ExecGiveUp, Shard: 1, Replica: 3, CCID: m0.CCID, Term: 1, Operator: "op-1-6", Intent: intent}
	rep := exec(giveUp)
	if rep.Outcome != client.OutcomeGivenUp || rep.Index <= m0.CCID || rep.CCID != rep.Index || len(rep.Replicas) != 3 || !slices.Contains(rep.Removed, client.FenceReplica(m0.CCID)) {
		t.Fatalf("give-up of the pending intent: %+v (ccid before %d)", rep, m0.CCID)
	}
	change := giveUp
	change.Op = client.ExecRemove
	if late := exec(change); late.Outcome != client.OutcomeRejected || len(late.Replicas) != 3 {
		t.Fatalf("the step's change after its give-up: %+v", late)
	}
	app(2, "meta-2", events.TermStarted{Term: 2, Leader: "meta-2"})
	if old := exec(giveUp); old.Outcome != client.OutcomeRefused || !strings.Contains(old.Error, "term 1 is over") {
		t.Fatalf("a give-up of an ended term: %+v", old)
	}
}
