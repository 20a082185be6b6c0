package chaos

// Network partitions between real processes of the built binary, each
// role in a network namespace of its own (chaos/netns): NATS in one, the
// three metas, the three stores and a client namespace (workers, status,
// export) in others. The embedded NATS listens on 127.0.0.1 only, so a
// relay in its namespace makes it reachable at that namespace's address
// (a cut of the NATS namespace cuts the relay with it).

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/chaos/history"
	"github.com/termlog/termlog/chaos/netns"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
)

// pcluster is a Netns Cluster (one namespace per NATS node, meta and
// store, workers in the client one; see cluster_netns.go) with what the
// scenarios need around it: its test, its probes and the history.
type pcluster struct {
	*Cluster
	t          *testing.T
	dir        string
	natsNodes  []string
	ops        *OpLog // the probes' operations and the status reads
	stopProbes func()
}

// newPCluster builds the net and starts every role of bin; t.Cleanup
// stops them and tears the net down (also when the test fails half-way).
// The caller checks netns.Available first.
func newPCluster(t *testing.T, top Topology, bin string) *pcluster {
	t.Helper()
	dir := t.TempDir()
	cfg := DefaultConfig(bin, dir, top)
	cfg.Netns, cfg.Shards, cfg.Workers = true, 1, 2
	cfg.StoreArgs = []string{"--restart-grace", "0"} // SIGTERM at the end stops a store at once
	cl, err := NewCluster(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	c := &pcluster{Cluster: cl, t: t, dir: dir, natsNodes: procNames(cl.NATS), ops: &OpLog{}, stopProbes: func() {}}
	t.Cleanup(func() {
		c.stopProbes()
		if t.Failed() {
			c.dumpLogs(t)
		}
		if err := c.Stop(); err != nil {
			t.Error(err)
		}
	})
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	if err := c.startProbes(2); err != nil {
		t.Fatal(err)
	}
	return c
}

// cutFromNATS cuts node from every NATS node.
func (c *pcluster) cutFromNATS(ctx context.Context, name string) {
	c.t.Helper()
	for _, n := range c.natsNodes {
		if err := c.Net.Cut(ctx, name, n); err != nil {
			c.t.Fatal(err)
		}
	}
}

// startProbes runs n probe workers (chaos.Probe: every RPC recorded with
// its invoke and return) from the client namespace: their NATS connection
// and their control-stream listener live there.
func (c *pcluster) startProbes(n int) error {
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	c.stopProbes = func() { cancel(); wg.Wait() }
	for i := 1; i <= n; i++ {
		p, err := newProbe(fmt.Sprintf("partition-probe-%d", i), c.Auth, c.URLs, c.Node(ClientNode), uint64(i), c.ops)
		if err != nil {
			return err
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			p.Run(ctx)
		}()
	}
	return nil
}

func (c *pcluster) dumpLogs(t *testing.T) {
	for _, p := range c.All() {
		b, _ := os.ReadFile(p.LogPath)
		t.Logf("---- %s (last lines) ----\n%s", p.Name, lastLines(string(b), 25))
	}
}

// run runs the binary inside the client namespace (Cluster.Run).
func (c *pcluster) run(ctx context.Context, args ...string) (stdout, stderr string, code int, err error) {
	r, err := c.Run(ctx, args...)
	return r.Stdout, r.Stderr, r.Code, err
}

// status reads `status -o json` from the client namespace and records the
// read in the history (exit 0 healthy, 1 degraded: both reads).
func (c *pcluster) status(ctx context.Context) (Status, int, error) {
	returned := c.ops.Invoke(Op{Client: "status", Kind: OpStatus})
	out, errOut, code, err := c.run(ctx, "status", "-o", "json", "--timeout", "3s")
	if err == nil && code != 0 && code != 1 {
		err = fmt.Errorf("status exit %d: %s", code, strings.TrimSpace(errOut))
	}
	var st Status
	if err == nil {
		err = json.Unmarshal([]byte(out), &st)
	}
	if err == nil && st.Stale != nil {
		// A copy read while the stream's leader did not answer: not a
		// read of the stream.
		err = fmt.Errorf("status exit %d, stale: %s", code, st.Stale.Reason)
	}
	if err != nil {
		// A failed (or stale) read: no output of the stream, so nothing
		// to check.
		returned(Op{Client: "status", Kind: OpStatus, Outcome: OutcomeUnknown})
		return Status{}, code, err
	}
	returned(Op{Client: "status", Kind: OpStatus, Outcome: OutcomeOK, Seq: st.Seq, Workers: st.Workers})
	return st, code, nil
}

// waitFor polls cond until it holds or within passes; it returns the time
// it took and the last word of cond.
func (c *pcluster) waitFor(what string, within time.Duration, cond func(ctx context.Context) (bool, string)) time.Duration {
	c.t.Helper()
	ctx := context.Background()
	start := time.Now()
	err := testkit.Poll(ctx, within, 200*time.Millisecond, func() error {
		if ok, why := cond(ctx); !ok {
			return errors.New(why)
		}
		return nil
	})
	if err != nil {
		c.t.Fatalf("%s: not within %v: %v", what, within, err)
	}
	return time.Since(start)
}

// waitHealthy waits for `status` to exit 0 (healthy, every shard 3/3 on
// live stores, a leader, every worker running).
func (c *pcluster) waitHealthy(within time.Duration) (Status, time.Duration) {
	c.t.Helper()
	var st Status
	took := c.waitFor("healthy cluster", within, func(ctx context.Context) (bool, string) {
		s, code, err := c.status(ctx)
		if err != nil {
			return false, err.Error()
		}
		st = s
		return code == 0 && len(s.Workers) >= 2, fmt.Sprintf("exit %d, %d workers, problems %v", code, len(s.Workers), s.Health.Problems)
	})
	return st, took
}

// metrics scrapes a role's /metrics inside its namespace.
func (c *pcluster) metrics(ctx context.Context, name string) (map[string]float64, error) {
	fams, err := c.scrape(ctx, name)
	if err != nil {
		return nil, err
	}
	// One key per series: name{label=value,...} (labels sorted), and the
	// bare name for the family's last series.
	out := map[string]float64{}
	for name, f := range fams {
		for _, m := range f.GetMetric() {
			g := m.GetGauge()
			if g == nil {
				continue
			}
			var ls []string
			for _, l := range m.GetLabel() {
				ls = append(ls, l.GetName()+"="+l.GetValue())
			}
			slices.Sort(ls)
			out[name+"{"+strings.Join(ls, ",")+"}"] = g.GetValue()
			out[name] = g.GetValue()
		}
	}
	return out, nil
}

// logLine is one JSON log line of a role.
type logLine struct {
	Time    time.Time `json:"time"`
	Message string    `json:"message"`
	Term    uint64    `json:"term"`
	Reason  string    `json:"reason"`
}

// findLog returns the first line of name's log after since matching f.
func (c *pcluster) findLog(name string, since time.Time, f func(logLine) bool) (logLine, bool) {
	b, err := os.ReadFile(c.Proc(name).LogPath)
	if err != nil {
		return logLine{}, false
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 0, 64<<10), 4<<20)
	for sc.Scan() {
		var l logLine
		if json.Unmarshal(sc.Bytes(), &l) != nil || l.Time.Before(since) {
			continue
		}
		if f(l) {
			return l, true
		}
	}
	return logLine{}, false
}

// checkStream exports the stream and checks it from the outside: seqs
// contiguous, `replay --check` clean, one writer per term and no event of
// an older term after a newer term started, no config change without a
// quorum, no panic or race report in any role's log; and the recorded
// history (probes' RPCs, status reads) is linearizable.
func (c *pcluster) checkStream(ctx context.Context, label string) []Event {
	c.t.Helper()
	path := filepath.Join(c.dir, label+".jsonl")
	// Right after a heal a rejoining NATS node may still answer 503
	// (JetStream temporarily unavailable) and the CLI does not move on to
	// another server: ask again for a while.
	c.waitFor("replay export", 60*time.Second, func(ctx context.Context) (bool, string) {
		_, errOut, code, err := c.run(ctx, "replay", "export", "--out", path, "--timeout", "10s")
		if err != nil || code != 0 {
			c.t.Logf("replay export: exit %d %v: %.300s", code, err, strings.TrimSpace(errOut))
			return false, fmt.Sprintf("exit %d %v: %s", code, err, errOut)
		}
		return true, ""
	})
	f, err := os.Open(path)
	if err != nil {
		c.t.Fatal(err)
	}
	evs, err := ParseExport(f)
	f.Close()
	if err != nil {
		c.t.Fatal(err)
	}
	out, errOut, code, err := c.run(ctx, "replay", "--file", path, "--check")
	if err != nil {
		c.t.Fatal(err)
	}
	vs := append(LogContiguous(evs, code, out+errOut), OneWriterPerTerm(evs)...)
	logs := map[string]string{}
	for _, p := range c.All() {
		b, _ := os.ReadFile(p.LogPath)
		logs[p.Name] = string(b)
	}
	vs = append(vs, NoPanics(logs)...)
	qf, err := os.Open(path)
	if err != nil {
		c.t.Fatal(err)
	}
	qv, err := QuorumKept(qf)
	qf.Close()
	if err != nil {
		c.t.Fatal(err)
	}
	vs = append(vs, qv...)
	h := ToHistory(c.ops.Ops())
	if _, err := history.Check(h, history.Options{WorkerTimeout: c.Cfg.WorkerTimeout, Dir: filepath.Join(c.dir, label+"-history"), Timeout: time.Minute}); err != nil {
		vs = append(vs, Violation{CheckHistory, err.Error()})
	}
	kinds := map[string]int{}
	for _, op := range h {
		kinds[string(op.Input.Kind)+"/"+string(op.Output.Outcome)]++
	}
	c.t.Logf("%s: history of %d operations checked: %v", label, len(h), kinds)
	for _, v := range vs {
		c.t.Errorf("%s: %s", label, v)
	}
	return evs
}

// TestPartitions runs the partition scenarios on a cluster per topology
// (standalone NATS, and three NATS nodes with R3 stream and lease), one
// after the other; each heals and must converge before the next.
func TestPartitions(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters of separate processes in network namespaces")
	}
	if err := netns.Available(); err != nil {
		t.Skipf("skipping the partition scenarios: %v", err)
	}
	bin := binary(t, t.TempDir())
	type scenario struct {
		name string
		run  func(context.Context, *pcluster)
	}
	// The store scenarios are about the stores' links; they run on the
	// standalone cluster only (the R3 one adds the NATS node's cut).
	for _, top := range []struct {
		top       Topology
		scenarios []scenario
	}{
		{Standalone, []scenario{
			{"meta leader cut from NATS", metaLeaderCut},
			{"store cut from NATS", storeCutFromNATS},
			{"store cut from its Raft peers", storeCutFromPeers},
		}},
		{R3, []scenario{
			{"meta leader cut from NATS", metaLeaderCut},
			{"NATS node cut from its peers", natsNodeCut},
		}},
	} {
		t.Run(string(top.top), func(t *testing.T) {
			c := newPCluster(t, top.top, bin)
			ctx := context.Background()
			st, took := c.waitHealthy(120 * time.Second)
			t.Logf("%s cluster healthy %.1fs after start: term %d, leader %s, seq %d", top.top, took.Seconds(), st.Term, st.Leader, st.Seq)
			for _, sc := range top.scenarios {
				if !t.Run(sc.name, func(t *testing.T) { c.t = t; sc.run(ctx, c) }) {
					return
				}
			}
		})
	}
}

// natsNodeCut: one NATS node loses the other two (R3). The majority keeps
// JetStream: a meta leader holds the lease and status reads succeed
// through it; roles connected to the cut node are cut with it. Healed,
// the cluster is healthy and the stream and history check clean.
func natsNodeCut(ctx context.Context, c *pcluster) {
	t := c.t
	st, _ := c.waitHealthy(60 * time.Second)
	cut := c.natsNodes[len(c.natsNodes)-1]
	for _, peer := range c.natsNodes[:len(c.natsNodes)-1] {
		if err := c.Net.Cut(ctx, cut, peer); err != nil {
			t.Fatal(err)
		}
	}
	cutAt := time.Now()
	took := c.waitFor("a meta leader on the majority side", 60*time.Second, func(ctx context.Context) (bool, string) {
		invoked := time.Now()
		s, _, err := c.status(ctx)
		if err != nil {
			t.Logf("read invoked %v after the cut failed after %v: %.300s", invoked.Sub(cutAt).Round(time.Millisecond), time.Since(invoked).Round(time.Millisecond), err)
			return false, err.Error()
		}
		ok := s.LeaseHolder != "" && s.LeaseHolder == s.Leader && s.Term >= st.Term
		if !ok {
			t.Logf("read invoked %v after the cut: term %d leader %s lease %q %s", invoked.Sub(cutAt).Round(time.Millisecond), s.Term, s.Leader, s.LeaseHolder, s.LeaseError)
		}
		return ok, fmt.Sprintf("term %d leader %s lease %s %s", s.Term, s.Leader, s.LeaseHolder, s.LeaseError)
	})
	t.Logf("%s cut from its peers: a leader holds the lease %v later", cut, took.Round(time.Millisecond))
	// Hold the partition past the store timeout: stores that talk to the
	// cut node are marked down, and the quorum rule keeps their shard.
	hold := time.Now().Add(2 * c.Cfg.StoreTimeout)
	for time.Now().Before(hold) {
		_, _, _ = c.status(ctx)            // reads for the history; failures (through the cut node) are expected
		time.Sleep(300 * time.Millisecond) // polling interval
	}
	if err := c.Net.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	st, took = c.waitHealthy(90 * time.Second)
	t.Logf("healed: healthy %v later (term %d, leader %s, shard 1 members %v)", took.Round(time.Millisecond), st.Term, st.Leader, st.Shards[0].Members)
	c.checkStream(ctx, "nats-node-cut")
}

// metaLeaderCut: the meta leader loses NATS. It stops acting (every
// leader task joined) within its lease, another replica takes the next
// term, nothing of the old term lands after the new term started; healed,
// the old leader follows the new term.
func metaLeaderCut(ctx context.Context, c *pcluster) {
	t := c.t
	st, _ := c.waitHealthy(60 * time.Second)
	old, oldTerm := st.Leader, st.Term
	if c.Node(old) == nil {
		t.Fatalf("leader %q is no meta of this cluster", old)
	}
	cutAt := time.Now()
	c.cutFromNATS(ctx, old)
	t.Logf("cut %s (leader of term %d) from NATS", old, oldTerm)
	var stopped logLine
	c.waitFor("the old leader stops leading", 10*time.Second, func(context.Context) (bool, string) {
		l, ok := c.findLog(old, cutAt.Add(-time.Second), func(l logLine) bool { return l.Message == "stopped leading; following" && l.Term == oldTerm })
		stopped = l
		return ok, "no 'stopped leading' line of term " + fmt.Sprint(oldTerm)
	})
	if d := stopped.Time.Sub(cutAt); d > c.Cfg.Lease {
		t.Errorf("%s stopped leading term %d %v after the cut (%s), later than its lease %v", old, oldTerm, d.Round(time.Millisecond), stopped.Reason, c.Cfg.Lease)
	} else {
		t.Logf("%s stopped leading %v after the cut: %s", old, d.Round(time.Millisecond), stopped.Reason)
	}
	var now Status
	took := c.waitFor("a new leader takes over", 20*time.Second, func(ctx context.Context) (bool, string) {
		s, _, err := c.status(ctx)
		if err != nil {
			return false, err.Error()
		}
		now = s
		return s.Term > oldTerm && s.Leader != old && s.LeaseHolder == s.Leader, fmt.Sprintf("term %d leader %s lease %s", s.Term, s.Leader, s.LeaseHolder)
	})
	t.Logf("%s leads term %d, seen %v after the cut", now.Leader, now.Term, took.Round(time.Millisecond))
	// The cut leader knows it does not lead (it cannot renew, so it
	// cannot campaign either).
	if m, err := c.metrics(ctx, old); err != nil {
		t.Fatal(err)
	} else if m["termlog_meta_is_leader"] != 0 {
		t.Fatalf("%s still says it leads while cut from NATS", old)
	}
	if err := c.Net.Heal(ctx); err != nil {
		t.Fatal(err)
	}

	st, took = c.waitHealthy(60 * time.Second)
	t.Logf("healthy %v after the heal (term %d, leader %s)", took.Round(time.Millisecond), st.Term, st.Leader)
	// Converged: every meta projects the current term (the old leader as a
	// follower).
	c.waitFor("every meta follows the current term", 30*time.Second, func(ctx context.Context) (bool, string) {
		s, _, err := c.status(ctx)
		if err != nil {
			return false, err.Error()
		}
		var terms []string
		ok := true
		for i := 1; i <= 3; i++ {
			name := fmt.Sprintf("meta-%d", i)
			m, err := c.metrics(ctx, name)
			if err != nil {
				return false, err.Error()
			}
			term, leads := uint64(m["termlog_meta_term"]), m["termlog_meta_is_leader"] == 1
			terms = append(terms, fmt.Sprintf("%s term %d leading %v", name, term, leads))
			ok = ok && term == s.Term && leads == (name == s.Leader)
		}
		return ok, fmt.Sprintf("stream term %d; %s", s.Term, strings.Join(terms, ", "))
	})
	evs := c.checkStream(ctx, "meta-cut")
	// Nothing the old leader wrote in its term after the cut took effect:
	// every event of the old term precedes the next term.started.
	var newStart uint64
	for _, e := range evs {
		if e.Type == "term.started" && e.Term > oldTerm && newStart == 0 {
			newStart = e.Seq
		}
		if newStart != 0 && e.Term == oldTerm {
			t.Errorf("seq %d: %s of term %d by %s after term.started of term %d at seq %d", e.Seq, e.Type, e.Term, e.Writer, oldTerm+1, newStart)
		}
	}
	if newStart == 0 {
		t.Errorf("no term after %d started in the stream", oldTerm)
	}

}

// storeCutFromNATS: store-1 loses NATS while its Raft traffic flows; then
// store-2 too. The scheduler may replace store-1's replica (2 of 3 run on
// live stores) but, once only store-3 is live, must change nothing (no
// quorum of the membership runs on live stores), and says so; the shard
// keeps a Raft leader throughout. Healed, it is 3/3 again.
func storeCutFromNATS(ctx context.Context, c *pcluster) {
	t := c.t
	c.waitHealthy(60 * time.Second)
	c.cutFromNATS(ctx, "store-1")
	storeDown := func(id string) func(ctx context.Context) (bool, string) {
		return func(ctx context.Context) (bool, string) {
			s, _, err := c.status(ctx)
			if err != nil {
				return false, err.Error()
			}
			for _, st := range s.Stores {
				if st.ID == id {
					return st.State == events.StoreDown, id + " is " + st.State
				}
			}
			return false, id + " unknown"
		}
	}
	took := c.waitFor("store-1 marked down", 20*time.Second, storeDown("store-1"))
	t.Logf("store-1 cut from NATS: down %v later", took.Round(time.Millisecond))
	// 2 of 3 run on live stores: the scheduler may remove store-1's
	// replica (with no spare store it adds none). Let it settle: the
	// replica removed (or the shard blocked), no operator, nothing pending.
	c.waitFor("shard 1 settles with store-1 down", 30*time.Second, func(ctx context.Context) (bool, string) {
		s, _, err := c.status(ctx)
		if err != nil || len(s.Shards) == 0 {
			return false, fmt.Sprint(err)
		}
		sh := s.Shards[0]
		onStore1 := false
		for _, st := range sh.Members {
			onStore1 = onStore1 || st == "store-1"
		}
		return sh.Operator == "" && len(sh.Pending) == 0 && (!onStore1 || sh.Blocked != ""),
			fmt.Sprintf("members %v operator %q pending %v blocked %q", sh.Members, sh.Operator, sh.Pending, sh.Blocked)
	})
	c.cutFromNATS(ctx, "store-2")
	took = c.waitFor("store-2 marked down", 20*time.Second, storeDown("store-2"))
	t.Logf("store-2 cut from NATS too: down %v later", took.Round(time.Millisecond))
	// Only store-3 is live now: the shard must be blocked for want of a
	// quorum, with its Raft leader still known (store-3 reports it).
	var blocked string
	if err := testkit.Poll(ctx, 20*time.Second, 200*time.Millisecond, func() error {
		s, _, err := c.status(ctx)
		if err == nil && len(s.Shards) > 0 && strings.Contains(s.Shards[0].Blocked, "no quorum") {
			blocked = s.Shards[0].Blocked
			return nil
		}
		return errors.New("not blocked")
	}); err != nil {
		// Say what the scheduler did instead.
		c.checkStream(ctx, "store-cut-unblocked")
		t.Fatalf("shard 1 not blocked for want of a quorum 20 s after store-2 went down")
	}
	t.Logf("shard 1 blocked: %s", blocked)
	c.waitFor("the shard keeps a Raft leader", 15*time.Second, func(ctx context.Context) (bool, string) {
		s, _, err := c.status(ctx)
		if err != nil || s.Health.Record == nil || len(s.Health.Record.Shards) == 0 {
			return false, fmt.Sprint("no health record ", err)
		}
		h := s.Health.Record.Shards[0]
		return h.Leader != 0, fmt.Sprintf("health %+v", h)
	})
	// Hold the partition a while longer: no change may come of it.
	hold := time.Now().Add(2 * c.Cfg.StoreTimeout)
	for time.Now().Before(hold) {
		s, _, err := c.status(ctx)
		if err == nil && len(s.Shards) > 0 && (s.Shards[0].Operator != "" || len(s.Shards[0].Pending) > 0) {
			c.checkStream(ctx, "store-cut-changed")
			t.Fatalf("shard 1 changes with one live store: operator %q pending %v", s.Shards[0].Operator, s.Shards[0].Pending)
		}
		time.Sleep(300 * time.Millisecond) // polling interval
	}
	if err := c.Net.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	st, took := c.waitHealthy(90 * time.Second)
	t.Logf("healed: healthy again %v later, shard 1 members %v", took.Round(time.Millisecond), st.Shards[0].Members)
	c.checkStream(ctx, "store-cut")
}

// storeCutFromPeers: the store holding the shard's Raft leader loses its
// Raft peers but keeps NATS. Leadership moves to the two others (CheckQuorum
// deposes the cut one) and stays there while the cut lasts; healed, the
// cut store runs its replica again as a member and the shard is healthy.
func storeCutFromPeers(ctx context.Context, c *pcluster) {
	t := c.t
	st, _ := c.waitHealthy(60 * time.Second)
	if st.Health.Record == nil || len(st.Health.Record.Shards) == 0 || st.Health.Record.Shards[0].LeaderStore == "" {
		t.Fatalf("no Raft leader in the health record: %+v", st.Health)
	}
	cut := st.Health.Record.Shards[0].LeaderStore
	var peers []string
	for i := 1; i <= 3; i++ {
		if p := fmt.Sprintf("store-%d", i); p != cut {
			peers = append(peers, p)
			if err := c.Net.Cut(ctx, cut, p); err != nil {
				t.Fatal(err)
			}
		}
	}
	cutSeq := st.Seq
	leaderOnMajority := func(ctx context.Context) (bool, string) {
		s, _, err := c.status(ctx)
		if err != nil || s.Health.Record == nil || len(s.Health.Record.Shards) == 0 {
			return false, fmt.Sprint("no health record ", err)
		}
		h := s.Health.Record.Shards[0]
		return h.Leader != 0 && slices.Contains(peers, h.LeaderStore), fmt.Sprintf("leader %d on %q", h.Leader, h.LeaderStore)
	}
	took := c.waitFor("a leader on the majority side", 20*time.Second, leaderOnMajority)
	t.Logf("%s (the Raft leader) cut from %v: a leader on the majority side %v later", cut, peers, took.Round(time.Millisecond))
	// It stays there while the cut lasts.
	hold := time.Now().Add(2 * c.Cfg.StoreTimeout)
	for time.Now().Before(hold) {
		if ok, why := leaderOnMajority(ctx); !ok {
			t.Fatalf("during the cut: %s", why)
		}
		time.Sleep(300 * time.Millisecond) // polling interval
	}
	if err := c.Net.Heal(ctx); err != nil {
		t.Fatal(err)
	}
	st, took = c.waitHealthy(90 * time.Second)
	t.Logf("healed: healthy %v later, shard 1 members %v", took.Round(time.Millisecond), st.Shards[0].Members)
	// Converged: the cut store runs the replica the projection lists for it.
	var want uint64
	for r, s := range st.Shards[0].Members {
		if s == cut {
			want = r
		}
	}
	c.waitFor(cut+" runs its replica of shard 1", 30*time.Second, func(ctx context.Context) (bool, string) {
		m, err := c.metrics(ctx, cut)
		if err != nil {
			return false, err.Error()
		}
		key := fmt.Sprintf("termlog_store_replica_running{replica=%d,shard=1,store=%s}", want, cut)
		return want != 0 && m[key] == 1, fmt.Sprintf("want replica %d; metrics %v", want, m)
	})
	evs := c.checkStream(ctx, "store-peers-cut")
	// The stream recorded the move: a shard.observed after the cut (after
	// the last read before it) names a leader on the majority side.
	moved := false
	for _, e := range evs {
		if e.Type != events.TypeShardObserved || e.Seq <= cutSeq {
			continue
		}
		var d struct {
			Leader   uint64            `json:"leader"`
			Replicas map[uint64]string `json:"replicas"`
		}
		if json.Unmarshal(e.Data, &d) == nil && slices.Contains(peers, d.Replicas[d.Leader]) {
			moved = true
		}
	}
	if !moved {
		t.Errorf("no shard.observed names a leader on %v", peers)
	}
}
