package logstore

import (
	"testing"
	"time"

	"github.com/termlog/termlog/meta/client"
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
