package logstore

import (
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
)

// TestRebuildFromASurvivor: shard 1 on three NodeHosts holds a value; two
// hosts are gone for good, so the survivor has no quorum (its proposals time
// out). Rebuild makes it a one-member shard from its own state: the value is
// still readable, new proposals commit, Raft itself marks the gone replicas
// removed, and a replica on a new NodeHost joins as usual.
func TestRebuildFromASurvivor(t *testing.T) {
	c := newCluster(t, 4)
	h1 := c.hosts[0]
	initial := c.initial()
	delete(initial, 4)
	for i := range 3 {
		if err := c.hosts[i].startMember(1, uint64(i+1), initial, false); err != nil {
			t.Fatal(err)
		}
	}
	waitAgree(t, 1, []uint64{1, 2, 3}, c.hosts[:3]...)
	mustPropose(t, h1, 1, "before the loss")
	for _, h := range c.hosts[:3] {
		mustCount(t, h, 1, 1)
	}
	_, before, ok := h1.Applied(1)
	if !ok || before == 0 {
		t.Fatalf("applied index of replica 1: %d %v", before, ok)
	}
	c.stop(1)
	c.stop(2)
	if _, err := h1.Propose(ctxTimeout(t, 2*time.Second), 1, []byte("no quorum")); err == nil {
		t.Fatal("a proposal committed without a quorum")
	}

	index, err := h1.Rebuild(ctxTimeout(t, 30*time.Second), 1, 1)
	if err != nil {
		t.Fatal(err)
	}
	if index < before {
		t.Fatalf("rebuilt at index %d, below the applied index %d", index, before)
	}
	waitAgree(t, 1, []uint64{1}, h1)
	v, err := h1.Read(ctxTimeout(t, 10*time.Second), 1, GetQuery{Index: 1})
	if err != nil || string(v.([]byte)) != "before the loss" {
		t.Fatalf("entry 1 after the rebuild: %q %v", v, err)
	}
	mustPropose(t, h1, 1, "after the rebuild")
	mustCount(t, h1, 1, 2)
	mem, err := h1.Membership(ctxTimeout(t, 10*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	if !mem.IsRemoved(2) || !mem.IsRemoved(3) || len(mem.Replicas) != 1 {
		t.Fatalf("membership after the rebuild: %+v", mem)
	}
	// The shard grows again: replica 5 joins on the fourth NodeHost.
	if res := h1.AddReplica(ctxTimeout(t, 20*time.Second), 1, 5, c.cfgs[3].RaftAddr); res.Outcome != Applied {
		t.Fatalf("add replica 5: %s", res)
	}
	if err := c.hosts[3].startMember(1, 5, nil, true); err != nil {
		t.Fatal(err)
	}
	waitAgree(t, 1, []uint64{1, 5}, h1, c.hosts[3])
	testkit.Eventually(t, 20*time.Second, "entry 1 on the joined replica", func() bool {
		v, err := c.hosts[3].Read(ctxTimeout(t, 2*time.Second), 1, GetQuery{Index: 1})
		return err == nil && string(v.([]byte)) == "before the loss"
	})
}
