package tests

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
)

// TestLeaderKilledWhileWorkersHeartbeat: a new leader takes over within a
// bounded time, no worker that kept heartbeating is expired, views converge.
func TestLeaderKilledWhileWorkersHeartbeat(t *testing.T) {
	c := newCluster(t)
	opts := metaOpts{workerTimeout: 2 * time.Second, expiry: 100 * time.Millisecond}
	nodes := []*metaNode{c.startMeta("meta-1", opts), c.startMeta("meta-2", opts), c.startMeta("meta-3", opts)}
	var workers []*workerNode
	for i := range 3 {
		workers = append(workers, c.startWorker(testkit.FreeAddr(t), fmt.Sprintf("w%d", i), 200*time.Millisecond))
	}
	old, oldTerm := recoveredLeader(t, 15*time.Second, 3, nodes...)
	before := workerIDs(old.View())

	killed := time.Now()
	old.kill()
	var rest []*metaNode
	for _, n := range nodes {
		if n != old {
			rest = append(rest, n)
		}
	}
	var newLeader *metaNode
	testkit.Eventually(t, 15*time.Second, "a new leader with recovery complete", func() bool {
		l, term := leaderOf(rest...)
		if l == nil || term <= oldTerm {
			return false
		}
		r, ok := currentRecovery(l)
		if ok && r.State == meta.RecoveryComplete {
			newLeader = l
			return true
		}
		return false
	})
	t.Logf("failover: leader killed -> new leader's recovery complete in %s", time.Since(killed).Round(time.Millisecond))

	// A canary registers under the new leader and dies. Once the new leader
	// has expired it, a full worker timeout has passed with expiry running:
	// the workers that kept heartbeating must all still be there.
	c.expiredCanary(t, newLeader)
	v := converged(t, rest[0].log, rest...)
	if got := workerIDs(v); got != before {
		t.Fatalf("workers changed across failover: %s -> %s", before, got)
	}
	if n := countType(t, rest[0], events.TypeWorkerExpired); n != 1 {
		t.Fatalf("%d worker.expired events, want 1 (the canary)", n)
	}
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	for _, w := range workers {
		if s := w.agent.Stats(); !s.Active {
			t.Fatalf("worker %s has no control session: %+v", w.agent.Addr(), s)
		}
	}
}

func countType(t *testing.T, n *metaNode, typ string) int {
	t.Helper()
	count := 0
	ctx := t.Context()
	err := n.log.Read(ctx, 1, func(rec events.Record) error {
		ev, err := rec.Decode()
		if err == nil && ev.Type() == typ {
			count++
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return count
}

// TestStepDownJoinsLeaderTasks: a replica that steps down has no leader
// goroutine left, keeps following, and can lead again with a higher term.
func TestStepDownJoinsLeaderTasks(t *testing.T) {
	c := newCluster(t)
	m := c.startMeta("meta-1", metaOpts{})
	w := c.startWorker(testkit.FreeAddr(t), "w1", 200*time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "leader with a recovered worker", func() bool {
		r, ok := currentRecovery(m)
		return ok && r.State == meta.RecoveryComplete && len(r.Sessions) == 1
	})
	if n := leaderGoroutines(); n == 0 {
		t.Fatal("no leader goroutines found while leading: the check below could not fail")
	}
	_, term := m.Leading()
	m.StepDown()
	testkit.Eventually(t, 5*time.Second, "meta-1 to follow", func() bool { ok, _ := m.Leading(); return !ok })
	// Leading turns false the moment the term ends; the term's record is
	// closed once every leader task has been joined. From then on none may
	// be left.
	testkit.Eventually(t, 5*time.Second, "the term's tasks joined", func() bool { return termEnded(m) })
	if n := leaderGoroutines(); n != 0 {
		buf := make([]byte, 1<<20)
		t.Fatalf("%d leader goroutines left after stepping down:\n%s", n, buf[:runtime.Stack(buf, true)])
	}
	// The deposed leader's control session went with its tasks.
	testkit.Eventually(t, 5*time.Second, "control session closed", func() bool { return !w.agent.Stats().Active })
	testkit.Eventually(t, 15*time.Second, "meta-1 to lead again", func() bool {
		ok, t2 := m.Leading()
		return ok && t2 > term
	})
}

// leaderGoroutines counts goroutines running leader code.
func leaderGoroutines() int {
	buf := make([]byte, 4<<20)
	n := 0
	for _, g := range strings.Split(string(buf[:runtime.Stack(buf, true)]), "\n\n") {
		if strings.Contains(g, "meta.(*leaderSession)") {
			n++
		}
	}
	return n
}
