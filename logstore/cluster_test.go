package logstore

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
)

type cluster struct {
	t     *testing.T
	cfgs  []Config
	hosts []*Host // nil when closed
}

// newCluster opens n NodeHosts with testConfig, changed by opts.
func newCluster(t *testing.T, n int, opts ...func(*Config)) *cluster {
	t.Helper()
	c := &cluster{t: t}
	for i := range n {
		cfg := testConfig(t, fmt.Sprintf("s%d", i+1), t.TempDir(), testkit.FreeAddr(t))
		for _, o := range opts {
			o(&cfg)
		}
		c.cfgs = append(c.cfgs, cfg)
		c.hosts = append(c.hosts, openHost(t, cfg))
	}
	t.Cleanup(c.close)
	return c
}

func (c *cluster) close() {
	for i, h := range c.hosts {
		if h != nil {
			h.Close()
			c.hosts[i] = nil
		}
	}
}

func (c *cluster) stop(i int) {
	c.hosts[i].Close()
	c.hosts[i] = nil
}

func (c *cluster) restart(i int) *Host {
	c.t.Helper()
	c.hosts[i] = openHost(c.t, c.cfgs[i])
	return c.hosts[i]
}

// initial returns {replica i+1: address of host i}.
func (c *cluster) initial() map[uint64]string {
	m := map[uint64]string{}
	for i, cfg := range c.cfgs {
		m[uint64(i+1)] = cfg.RaftAddr
	}
	return m
}

// info returns the running replica of shard on h.
func info(h *Host, shard uint64) (ShardInfo, bool) {
	for _, si := range h.ShardInfos() {
		if si.Shard == shard {
			return si, true
		}
	}
	return ShardInfo{}, false
}

// waitAgree waits until every given host runs shard with the same known
// leader, a member of want, and Raft membership equal to want's ids.
func waitAgree(t *testing.T, shard uint64, want []uint64, hosts ...*Host) uint64 {
	t.Helper()
	var leader uint64
	testkit.Eventually(t, 20*time.Second, fmt.Sprintf("one leader among %v on shard %d", want, shard), func() bool {
		leader = 0
		for _, h := range hosts {
			si, ok := info(h, shard)
			if !ok || si.Leader == 0 || !slices.Contains(want, si.Leader) {
				return false
			}
			if ids := slices.Sorted(maps.Keys(si.Replicas)); !slices.Equal(ids, want) {
				return false
			}
			if leader != 0 && si.Leader != leader {
				return false
			}
			leader = si.Leader
		}
		return true
	})
	return leader
}

func mustPropose(t *testing.T, h *Host, shard uint64, data string) uint64 {
	t.Helper()
	var (
		idx uint64
		err error
	)
	testkit.Eventually(t, 10*time.Second, "propose "+data, func() bool {
		idx, err = h.Propose(ctxTimeout(t, 2*time.Second), shard, []byte(data))
		return err == nil
	})
	return idx
}

func mustCount(t *testing.T, h *Host, shard, want uint64) {
	t.Helper()
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("count %d on %s", want, h.StoreID()), func() bool {
		v, err := h.Read(ctxTimeout(t, 2*time.Second), shard, CountQuery{})
		return err == nil && v.(uint64) == want
	})
}

// TestExecutorConfigChanges: bootstrap, propose and read on three NodeHosts,
// remove replica 3 with the fresh config change id, reject a stale one,
// reuse the freed address for a new replica id that joins.
func TestExecutorConfigChanges(t *testing.T) {
	c := newCluster(t, 3)
	h1, h2, h3 := c.hosts[0], c.hosts[1], c.hosts[2]
	for i, h := range c.hosts {
		if err := h.startMember(1, uint64(i+1), c.initial(), false); err != nil {
			t.Fatal(err)
		}
	}
	// Starting again is a no-op; starting another replica of the shard is refused.
	if err := h1.startMember(1, 1, nil, false); err != nil {
		t.Fatalf("idempotent start: %v", err)
	}
	if err := h1.startMember(1, 9, nil, true); err == nil {
		t.Fatal("second replica of a shard on one NodeHost started")
	}
	waitAgree(t, 1, []uint64{1, 2, 3}, h1, h2, h3)

	if idx := mustPropose(t, h1, 1, "a"); idx != 1 {
		t.Fatalf("first entry index %d", idx)
	}
	mustPropose(t, h2, 1, "b")
	for _, h := range c.hosts {
		mustCount(t, h, 1, 2)
		v, err := h.Read(ctxTimeout(t, 5*time.Second), 1, "get 2")
		if err != nil || string(v.([]byte)) != "b" {
			t.Fatalf("get 2 on %s: %v %v", h.StoreID(), v, err)
		}
	}

	m0, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("bootstrap membership: %v ccid=%d", m0.Replicas, m0.CCID)

	// Remove replica 3 through replica 1, with the fresh ccid.
	res := h1.RemoveReplica(ctxTimeout(t, 10*time.Second), 1, 3)
	if res.Outcome != Applied || res.Already || res.UsedCCID != m0.CCID || res.CCID <= m0.CCID {
		t.Fatalf("remove 3: %v (before ccid %d)", res, m0.CCID)
	}
	if res.Membership.IsMember(3) || !res.Membership.IsRemoved(3) {
		t.Fatalf("membership after removal: %+v", res.Membership)
	}
	// Removing it again is already applied, nothing proposed.
	if again := h2.RemoveReplica(ctxTimeout(t, 10*time.Second), 1, 3); again.Outcome != Applied || !again.Already || again.Attempts != 0 {
		t.Fatalf("remove 3 again: %v", again)
	}
	// A change decided on the membership before the removal (base ccid
	// m0) is rejected without a proposal: Raft moved since the decision.
	if moved := h2.AddReplicaOn(ctxTimeout(t, 10*time.Second), 1, 7, testkit.FreeAddr(t), m0.CCID); moved.Outcome != Rejected || moved.Attempts != 0 || !strings.Contains(moved.Reason, "moved since") {
		t.Fatalf("add on a stale base: %v", moved)
	}
	// A stale config change id is rejected by Raft, and the fresh one is reported.
	stale := h1.removeReplicaWithCCID(ctxTimeout(t, 10*time.Second), 1, 2, m0.CCID)
	if stale.Outcome != Rejected || stale.CCID != res.CCID {
		t.Fatalf("stale ccid: %v (fresh %d)", stale, res.CCID)
	}
	if m, err := h1.Membership(ctxTimeout(t, 5*time.Second), 1); err != nil || !m.IsMember(2) {
		t.Fatalf("replica 2 must still be a member: %+v %v", m, err)
	}
	// A removed id never comes back; an address held by a member is refused.
	if r := h1.AddReplica(ctxTimeout(t, 5*time.Second), 1, 3, c.cfgs[2].RaftAddr); r.Outcome != Rejected {
		t.Fatalf("re-add removed id: %v", r)
	}
	if r := h1.AddReplica(ctxTimeout(t, 5*time.Second), 1, 5, c.cfgs[1].RaftAddr); r.Outcome != Rejected {
		t.Fatalf("add at a member's address: %v", r)
	}

	// Store 3 stops the removed replica and removes its data. It does not
	// wait for replica 3 to apply its own removal first: Raft does not
	// promise a removed replica ever learns of it (the leader drops it
	// from its followers when it applies the change, and a commit index
	// that had not reached it by then never will). That is the second
	// report's zombie, and why a store stops what its projection of the
	// stream lists as removed; it is not what this test is about. (Waiting
	// for it failed once in ~40 runs, on a quiet machine: census 11 of
	// docs/testing.md.)
	if err := h3.removeData(ctxTimeout(t, 10*time.Second), 1, 3); err != nil {
		t.Fatal(err)
	}
	if h3.Running(1, 3) || len(h3.Persisted()) != 0 {
		t.Fatalf("after removeData: running=%v persisted=%v", h3.Running(1, 3), h3.Persisted())
	}
	// Its id can never start again here.
	if err := h3.startMember(1, 3, c.initial(), false); !errors.Is(err, ErrReplicaDataRemoved) {
		t.Fatalf("removed replica restarted: %v", err)
	}
	if h3.Running(1, 3) || len(h3.Persisted()) != 0 {
		t.Fatalf("removed replica: running=%v persisted=%v", h3.Running(1, 3), h3.Persisted())
	}

	// Enough entries for snapshots and a compacted log: the joiner needs a snapshot.
	for i := range 20 {
		mustPropose(t, h1, 1, fmt.Sprintf("x%d", i))
	}
	// Replica 4 takes store 3's address, then joins.
	add := h2.AddReplica(ctxTimeout(t, 10*time.Second), 1, 4, c.cfgs[2].RaftAddr)
	if add.Outcome != Applied || add.UsedCCID != res.CCID || add.CCID <= res.CCID {
		t.Fatalf("add 4: %v", add)
	}
	if err := h3.startMember(1, 4, nil, true); err != nil {
		t.Fatal(err)
	}
	waitAgree(t, 1, []uint64{1, 2, 4}, h1, h2, h3)
	mustPropose(t, h3, 1, "c")
	for _, h := range c.hosts {
		mustCount(t, h, 1, 23)
		v, err := h.Read(ctxTimeout(t, 5*time.Second), 1, GetQuery{Index: 3})
		if err != nil || string(v.([]byte)) != "x0" {
			t.Fatalf("entry 3 on %s: %q %v", h.StoreID(), v, err)
		}
	}
	if got := h3.Persisted(); !slices.Equal(got, []projections.ReplicaRef{{Shard: 1, Replica: 4}}) {
		t.Fatalf("store 3 persisted %v", got)
	}

	// Restarting a NodeHost restarts nothing by itself; the member restarts from its data.
	c.stop(2)
	h3 = c.restart(2)
	if h3.Running(1, 4) {
		t.Fatal("replica started without being asked")
	}
	if err := h3.startMember(1, 4, nil, false); err != nil {
		t.Fatalf("restart 4: %v", err)
	}
	waitAgree(t, 1, []uint64{1, 2, 4}, c.hosts...)
	mustCount(t, h3, 1, 23)

	// Without a quorum nothing can be decided: the step ends as Retry
	// (nothing was sent, so nothing can apply later).
	c.stop(1)
	c.stop(2)
	noQuorum := c.hosts[0].RemoveReplica(ctxTimeout(t, 1500*time.Millisecond), 1, 2)
	if noQuorum.Outcome != Retry || noQuorum.Attempts != 0 {
		t.Fatalf("remove without quorum: %v", noQuorum)
	}
}

func TestStartMemberRefusesWithoutBootstrap(t *testing.T) {
	c := newCluster(t, 1)
	h := c.hosts[0]
	if err := h.startMember(1, 1, nil, false); err == nil {
		t.Fatal("started a replica with no bootstrap record, no members and no join")
	}
	if err := h.startMember(1, 1, map[uint64]string{2: "127.0.0.1:1"}, false); err == nil {
		t.Fatal("bootstrapped a replica not among the initial members")
	}
	if err := h.startMember(1, 1, map[uint64]string{1: "127.0.0.1:1"}, false); err == nil {
		t.Fatal("bootstrapped at another NodeHost's address")
	}
	if err := h.startMember(1, 1, map[uint64]string{1: h.RaftAddr()}, true); err == nil {
		t.Fatal("join with initial members accepted")
	}
	if h.Running(1, 1) || len(h.Persisted()) != 0 {
		t.Fatal("refused start left state behind")
	}
	// A config change through a store that does not run the shard fails.
	if r := h.RemoveReplica(ctxTimeout(t, 5*time.Second), 1, 2); r.Outcome != Failed {
		t.Fatalf("remove through a non-member store: %v", r)
	}
	// A single-replica shard bootstraps and elects itself.
	if err := h.startMember(1, 1, map[uint64]string{1: h.RaftAddr()}, false); err != nil {
		t.Fatal(err)
	}
	waitAgree(t, 1, []uint64{1}, h)
	if err := h.stopMember(1, 1); err != nil || h.Running(1, 1) {
		t.Fatalf("stop: %v", err)
	}
	if err := h.stopMember(1, 1); err != nil {
		t.Fatalf("stop of a stopped replica: %v", err)
	}
	if got := h.Persisted(); len(got) != 1 {
		t.Fatalf("persisted after stop: %v", got)
	}
}
