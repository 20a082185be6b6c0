package tests

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
)

// watchReplica polls a store until stop is closed and counts the polls in
// which the replica was running on it or its term moved.
type replicaWatch struct {
	started atomic.Int64
	polls   atomic.Int64
	stop    chan struct{}
	once    sync.Once
	wg      sync.WaitGroup
}

func watchReplica(n *storeNode, shard, replica uint64) *replicaWatch {
	w := &replicaWatch{stop: make(chan struct{})}
	w.wg.Add(1)
	go func() {
		defer w.wg.Done()
		for {
			select {
			case <-w.stop:
				return
			case <-time.After(2 * time.Millisecond): // sampling interval
			}
			w.polls.Add(1)
			if n.running(shard, replica) {
				w.started.Add(1)
			}
		}
	}()
	return w
}

func (w *replicaWatch) end() { w.once.Do(func() { close(w.stop) }); w.wg.Wait() }

// TestZombieReplicaNotStarted replays the second report
// (003_efc5840065a1a3b5): a replica removed from its shard while its store
// was down is not started when the store restarts from its old data; the
// store removes that data and the scheduler adds a new replica there.
func TestZombieReplicaNotStarted(t *testing.T) {
	c := newCluster(t)
	m := c.startMeta("meta-1", schedOpts())
	stores := []*storeNode{c.newStore("store-1"), c.newStore("store-2"), c.newStore("store-3")}
	var sh0 uint64
	testkit.Eventually(t, 30*time.Second, "shard 1 at 3/3", func() bool {
		sh, ok := fullShard(m, 1, stores...)
		if ok {
			sh0 = replicaOn(sh, "store-3")
		}
		return ok
	})
	s3 := stores[2]
	old := sh0

	// Store 3 goes down; the scheduler removes its replica (committed).
	s3.stop()
	testkit.Eventually(t, 30*time.Second, "replica on store-3 removed", func() bool {
		sh := m.View().Shards[1]
		_, removed := sh.Removed[old]
		return removed && !sh.IsMember(old)
	})
	// Restart store 3 from its old data dir.
	survivor, _ := stores[0].info(1)
	restarted := time.Now()
	s3.start()
	w := watchReplica(s3, 1, old)
	var added uint64
	testkit.Eventually(t, 60*time.Second, "shard 1 back at 3/3 with a new replica on store-3", func() bool {
		sh, ok := fullShard(m, 1, stores...)
		if ok {
			added = replicaOn(sh, "store-3")
		}
		return ok && added != 0 && added != old
	})
	took := time.Since(restarted)
	w.end()
	t.Logf("store restart -> shard 3/3: %s (replica %d replaced by %d)", took.Round(time.Millisecond), old, added)

	if n := w.started.Load(); n != 0 || w.polls.Load() < 10 {
		t.Fatalf("removed replica %d was running on the restarted store in %d of %d polls", old, n, w.polls.Load())
	}
	for _, ref := range s3.store().Host().Persisted() {
		if ref.Shard == 1 && ref.Replica == old {
			t.Fatalf("removed replica %d still has data on store-3", old)
		}
	}
	// The survivors never saw a campaign: same term, same leader.
	after, _ := stores[0].info(1)
	if after.Term != survivor.Term || after.Leader != survivor.Leader {
		t.Fatalf("survivor's term/leader moved from %d/%d to %d/%d while store-3 restarted", survivor.Term, survivor.Leader, after.Term, after.Leader)
	}
	if n := countType(t, m, events.TypeOperatorFailed); n != 0 {
		t.Logf("%d operators failed before the shard recovered", n)
	}
	v := converged(t, m.log, m)
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}
