package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
)

// TestStatusThroughNodeLoss: on a 3-node JetStream cluster (`termlog nats`
// processes) with a meta replica (R3 stream and buckets), one node is
// SIGKILLed (its Raft groups elect a new leader only after their election
// timeout, 4-9 s; an embedded server's Shutdown hands its leaderships over
// within half a second, so it cannot stand for a crash), and `status` runs
// in a loop from the loss until it reads the stream afresh again. Every run answers: exit 0, or 1 (a stale copy, named so);
// never 2 after waiting out its --timeout. Two losses, each on a cluster of
// its own:
//
//   - meta_leader: the node leading the JetStream meta group but not the
//     event stream. Account info and the reader's consumer (both through
//     the meta leader) go unanswered while the stream's leader answers.
//   - bucket_leader: the node leading the health and the snapshot buckets,
//     neither the stream nor the meta group. The stream's leader answers,
//     then binding the buckets (a stream info, answered by their leader
//     only) does not: status used to wait out --timeout and exit 2 (a
//     follower's crash in the nodeloss bench).
//   - stream_leader: the node leading the event stream (and the lease
//     bucket, kept with it), not the meta group. While the stream is
//     leaderless no fresh read exists: every run that ends before a new
//     leader is seen must be marked stale, naming the event stream.
//
// How long a run takes is the nodeloss bench's figure, not asserted here.
func TestStatusThroughNodeLoss(t *testing.T) {
	bin := buildBinary(t)
	for _, victim := range []string{"meta_leader", "bucket_leader", "stream_leader"} {
		t.Run(victim, func(t *testing.T) { statusThroughLoss(t, bin, victim) })
	}
}

// metaLeaderIn is who node's nats-server log last named the JetStream meta
// leader ("" none yet), and how many such lines it holds.
func metaLeaderIn(node string, log string) (string, int) {
	leader, n := "", 0
	for _, line := range strings.Split(log, "\n") {
		switch {
		case strings.Contains(line, "Self is new JetStream cluster metadata leader"):
			leader, n = node, n+1
		case strings.Contains(line, "JetStream cluster new metadata leader: "):
			_, rest, _ := strings.Cut(line, "JetStream cluster new metadata leader: ")
			end := strings.IndexFunc(rest, func(r rune) bool { return r == '/' || r == '"' || r == ' ' || r == '\\' })
			if end < 0 {
				end = len(rest)
			}
			leader, n = rest[:end], n+1
		}
	}
	return leader, n
}

func statusThroughLoss(t *testing.T, bin, victim string) {
	auth := authDir(t, bin, t.TempDir(), "auth")
	nodes, nodeURL := startNATS3(t, bin, "--auth-dir", auth, "--server-log", "info")
	url := strings.Join([]string{nodeURL(0), nodeURL(1), nodeURL(2)}, ",")
	t.Setenv("TERMLOG_NATS", url)
	t.Setenv("TERMLOG_AUTH_DIR", auth)
	t.Setenv("TERMLOG_REPLICAS", "3")
	startProc(t, bin, "meta", "run", "--id", "meta-1")

	type run struct {
		start, end time.Time
		code       int
		st         Status
		out, err   string
	}
	status := func() run {
		r := run{start: time.Now()}
		stdout, stderr, err := runCLI(t, "status", "-o", "json", "--timeout", "5s")
		r.end, r.out, r.err = time.Now(), stdout, stderr
		var ee *exitError
		switch {
		case err == nil:
		case errors.As(err, &ee):
			r.code = ee.code
		default:
			r.code = exitUnreadable
		}
		if err != nil {
			r.err += err.Error()
		}
		_ = json.Unmarshal([]byte(stdout), &r.st)
		return r
	}
	var before run
	testkit.Eventually(t, 60*time.Second, "a fresh status naming meta-1's health record", func() bool {
		before = status()
		return (before.code == 0 || before.code == 1) && before.st.Stale == nil && before.st.Health.Record != nil && before.st.Leader == "meta-1"
	})

	js := adminJetStream(t, url, auth)
	stream := natslog.StreamName("termlog")
	streamLeader := func() string {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil || st.CachedInfo().Cluster == nil {
			return ""
		}
		return st.CachedInfo().Cluster.Leader
	}
	metaLeader := func() string {
		seen := map[string]int{}
		for i, n := range nodes {
			if l, _ := metaLeaderIn(fmt.Sprintf("n%d", i+1), n.errOut.String()); l != "" {
				seen[l]++
			}
		}
		for l, c := range seen {
			if c == 3 {
				return l
			}
		}
		return ""
	}
	leaderOf := func(name string) string {
		ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
		defer cancel()
		st, err := js.Stream(ctx, name)
		if err != nil || st.CachedInfo().Cluster == nil {
			return ""
		}
		return st.CachedInfo().Cluster.Leader
	}
	// moveTo asks stream name's leader to hand over to node.
	moveTo := func(name, node string) {
		_, _ = js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+name, fmt.Appendf(nil, `{"placement":{"preferred":%q}}`, node), time.Second)
	}
	buckets := []string{"KV_" + meta.HealthBucket("termlog"), "OBJ_" + natslog.SnapshotBucket("termlog")}
	var lost string
	testkit.Eventually(t, 30*time.Second, "the victim ("+victim+") chosen and leading what it should", func() bool {
		ml, sl := metaLeader(), streamLeader()
		if ml == "" || sl == "" {
			return false
		}
		if ml == sl {
			// The stream led apart from the meta group.
			_, _ = js.Conn().Request("$JS.API.STREAM.LEADER.STEPDOWN."+stream, nil, time.Second)
			return false
		}
		switch victim {
		case "meta_leader":
			lost = ml
			return true
		case "stream_leader":
			lost = sl
			return true
		}
		// The third node: it leads the health and snapshot buckets.
		for i := range 3 {
			if n := fmt.Sprintf("n%d", i+1); n != ml && n != sl {
				lost = n
			}
		}
		whole := true
		for _, b := range buckets {
			if l := leaderOf(b); l != lost {
				moveTo(b, lost)
				whole = false
			}
		}
		return whole
	})
	var dead int
	if _, err := fmt.Sscanf(lost, "n%d", &dead); err != nil || dead < 1 || dead > 3 {
		t.Fatalf("leader %q: %v", lost, err)
	}
	dead--
	// A meta group led elsewhere has no election to wait for.
	metaElects := metaLeader() == lost
	metaLines := [3]int{}
	for i, n := range nodes {
		_, metaLines[i] = metaLeaderIn(fmt.Sprintf("n%d", i+1), n.errOut.String())
	}

	// Who leads, seen every 50 ms from the loss on: the first time another
	// node leads the stream (resp. the meta group: a survivor logs a new
	// meta leader).
	var mu sync.Mutex
	// newStream: the stream's new leader (bucket_leader: the health bucket's).
	var newStream, newMeta time.Time
	var leaderless time.Time // the start of the last look that saw the stream without a new leader
	wctx, wcancel := context.WithCancel(context.Background())
	var watch sync.WaitGroup
	defer func() { wcancel(); watch.Wait() }()
	t0 := time.Now()
	if err := nodes[dead].cmd.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	<-nodes[dead].done
	watch.Go(func() {
		for wctx.Err() == nil {
			asked := time.Now()
			sl := streamLeader()
			if victim == "bucket_leader" {
				sl = leaderOf(buckets[0]) // the health bucket's
			}
			ml := false
			for i, n := range nodes {
				if i != dead {
					if _, c := metaLeaderIn(fmt.Sprintf("n%d", i+1), n.errOut.String()); c > metaLines[i] {
						ml = true
					}
				}
			}
			now := time.Now()
			mu.Lock()
			if newStream.IsZero() && sl != "" && sl != lost {
				newStream = now
			}
			if newStream.IsZero() {
				leaderless = asked
			}
			if newMeta.IsZero() && (ml || !metaElects) {
				newMeta = now
			}
			mu.Unlock()
			select {
			case <-wctx.Done():
			case <-time.After(50 * time.Millisecond):
			}
		}
	})

	// status, again and again, until a fresh read after both groups have
	// a leader again.
	var runs []run
	for deadline := time.Now().Add(45 * time.Second); ; {
		r := status()
		runs = append(runs, r)
		if r.code != 0 && r.code != 1 {
			t.Fatalf("status %.1fs after %s (%s) was shut down: exit %d, want 0 or 1 (a stale copy when nothing fresh answers)\nstdout: %s\nstderr: %s",
				r.start.Sub(t0).Seconds(), lost, victim, r.code, r.out, r.err)
		}
		if r.code == 1 && r.st.Stale == nil && r.st.Seq == 0 {
			t.Fatalf("status exited 1 without a status: %s", r.err)
		}
		if s := r.st.Stale; s != nil {
			if r.code != 1 || r.st.Health.Healthy || s.Seq == 0 || r.st.Term < before.st.Term || !strings.Contains(r.err, "STALE") {
				t.Fatalf("a stale answer must exit 1, unhealthy, naming the copy's seq and saying STALE: exit %d, healthy %v, stale %+v, term %d (before %d), stderr %s",
					r.code, r.st.Health.Healthy, s, r.st.Term, before.st.Term, r.err)
			}
		}
		mu.Lock()
		ns, nm := newStream, newMeta
		mu.Unlock()
		if r.st.Stale == nil && !ns.IsZero() && !nm.IsZero() && r.start.After(ns) && r.start.After(nm) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("no fresh status within 45 s of the loss (new stream (or health bucket) leader seen %v, new meta leader %v)", !ns.IsZero(), !nm.IsZero())
		}
	}
	mu.Lock()
	ns, nm, leaderless := newStream, newMeta, leaderless
	mu.Unlock()
	// A run that ended before a look saw the stream still without a new
	// leader ran while it had none (once led, it stays led here).
	stale, during, longest := 0, 0, time.Duration(0)
	var lines []string
	for _, r := range runs {
		longest = max(longest, r.end.Sub(r.start))
		kind := "fresh"
		if r.st.Stale != nil {
			stale++
			kind = "stale: " + r.st.Stale.Reason
		}
		lines = append(lines, fmt.Sprintf("+%.2fs %.2fs exit %d %s", r.start.Sub(t0).Seconds(), r.end.Sub(r.start).Seconds(), r.code, kind))
		elected := ns
		if victim == "meta_leader" {
			elected = nm
		}
		if r.end.Before(elected) {
			during++
		}
		// No fresh read exists while the stream has no leader.
		if victim == "stream_leader" && r.end.Before(leaderless) && (r.st.Stale == nil || !strings.Contains(r.st.Stale.Reason, "event stream")) {
			t.Errorf("status ended %.2fs after the stream leader's node was lost, while the stream had no leader (seen so at %.2fs), and is not marked stale naming the event stream: stale %+v",
				r.end.Sub(t0).Seconds(), leaderless.Sub(t0).Seconds(), r.st.Stale)
		}
	}
	if during == 0 {
		t.Fatalf("no status run ended during the election (stream (or health bucket) leader after %.2fs, meta leader after %.2fs): the test did not test it", ns.Sub(t0).Seconds(), nm.Sub(t0).Seconds())
	}
	if victim == "stream_leader" && stale == 0 {
		t.Errorf("no stale answer while the stream was leaderless for %.2fs", ns.Sub(t0).Seconds())
	}
	t.Logf("lost %s (%s); new stream (or health bucket) leader seen after %.2fs, new meta leader after %.2fs; %d runs, %d stale, %d during the election, longest %s:\n%s",
		lost, victim, ns.Sub(t0).Seconds(), nm.Sub(t0).Seconds(), len(runs), stale, during, longest.Round(time.Millisecond), strings.Join(lines, "\n"))

	// A fresh status names the lost node's copy of the event stream gone
	// (its leader has not heard from it for health.ReplicaGoneAfter), in
	// its JSON and in its table.
	var named run
	testkit.Eventually(t, 30*time.Second, "a fresh status naming "+lost+"'s copy of the event stream gone", func() bool {
		named = status()
		if named.st.Stale != nil || named.st.Stream == nil {
			return false
		}
		for _, rp := range named.st.Stream.Replicas {
			if rp.Name == lost {
				return rp.Gone
			}
		}
		return false
	})
	t.Logf("%.1fs after the loss: %s", time.Since(t0).Seconds(), named.st.Stream)
	stdout, _, _ := runCLI(t, "status", "--timeout", "5s")
	if !strings.Contains(stdout, lost+" GONE") {
		t.Fatalf("status's table does not name %s gone:\n%s", lost, stdout)
	}
}
