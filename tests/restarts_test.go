package tests

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
)

// TestRapidRestartsDuringReplacement is the second report's reproduction:
// store 3 restarts twice in quick succession while its replacement operator
// is in progress. The shard must return to 3/3, every operator must end, and
// config change ids in the outcomes only move forward (no stale index).
func TestRapidRestartsDuringReplacement(t *testing.T) {
	c := newCluster(t)
	m := c.startMeta("meta-1", schedOpts())
	stores := []*storeNode{c.newStore("store-1"), c.newStore("store-2"), c.newStore("store-3")}
	testkit.Eventually(t, 30*time.Second, "shard 1 at 3/3", func() bool { _, ok := fullShard(m, 1, stores...); return ok })
	s3 := stores[2]

	// Hold the operator between the add intent and the config change.
	m.fp.Pause(meta.FPOperatorBeforeAdd)
	s3.stop()
	testkit.Eventually(t, 30*time.Second, "a replacement operator on shard 1", func() bool {
		return m.View().Shards[1].Operator != ""
	})
	s3.start()
	if err := m.fp.WaitPaused(t.Context(), meta.FPOperatorBeforeAdd); err != nil {
		t.Fatal(err)
	}
	// The add of a new replica on store-3 is in progress: restart store-3
	// twice in quick succession, then let the config change go.
	s3.restart()
	s3.restart()
	m.fp.Resume(meta.FPOperatorBeforeAdd)
	start := time.Now()
	testkit.Eventually(t, 90*time.Second, "shard 1 back at 3/3", func() bool { _, ok := fullShard(m, 1, stores...); return ok })
	t.Logf("after the last restart, shard 1 back at 3/3 in %s", time.Since(start).Round(time.Millisecond))

	v := converged(t, m.log, m)
	if len(v.Operators) != 0 {
		t.Fatalf("operators still running: %v", v.Operators)
	}
	checkOperatorLog(t, m)
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
}

// checkOperatorLog reads the stream: every operator that started ended,
// each step's outcome follows its intent, and the config change ids of
// outcomes strictly increase.
func checkOperatorLog(t *testing.T, m *metaNode) {
	t.Helper()
	started, ended := map[string]bool{}, map[string]bool{}
	intents := map[uint64]string{}
	var lastCCID uint64
	var steps []string
	err := m.log.Read(t.Context(), 1, func(rec events.Record) error {
		ev, err := rec.Decode()
		if err != nil {
			return err
		}
		switch d := ev.Data.(type) {
		case events.OperatorStarted:
			started[d.Op] = true
		case events.OperatorFinished:
			ended[d.Op] = true
			steps = append(steps, d.Op+" finished")
		case events.OperatorFailed:
			ended[d.Op] = true
			steps = append(steps, d.Op+" failed: "+d.Reason)
		case events.ShardReplicaAdding:
			intents[d.Replica] = d.Op
		case events.ShardReplicaRemoving:
			intents[d.Replica] = d.Op
		case events.ShardReplicaAdded:
			if intents[d.Replica] != d.Op {
				t.Errorf("seq %d: added replica %d without an intent of %s", rec.Seq, d.Replica, d.Op)
			}
			if d.CCID <= lastCCID {
				t.Errorf("seq %d: add outcome ccid %d not after %d", rec.Seq, d.CCID, lastCCID)
			}
			lastCCID = d.CCID
			steps = append(steps, d.Op+" added replica")
		case events.ShardReplicaRemoved:
			if intents[d.Replica] != d.Op {
				t.Errorf("seq %d: removed replica %d without an intent of %s", rec.Seq, d.Replica, d.Op)
			}
			if d.CCID <= lastCCID {
				t.Errorf("seq %d: remove outcome ccid %d not after %d", rec.Seq, d.CCID, lastCCID)
			}
			lastCCID = d.CCID
			steps = append(steps, d.Op+" removed replica")
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for op := range started {
		if !ended[op] {
			t.Errorf("operator %s never ended", op)
		}
	}
	if len(started) > 6 {
		t.Errorf("%d operators for one replacement: retrying without end? %v", len(started), steps)
	}
	t.Logf("operator log: %v", steps)
}

// TestPlannedRestartWhileDrainingReplacesNothing: a store draining for
// longer than the store timeout is not marked down and keeps its replica.
func TestPlannedRestartWhileDrainingReplacesNothing(t *testing.T) {
	c := newCluster(t)
	m, stores := c.shardOnThree(t, "meta-1")
	before := m.View().Shards[1]
	// A fourth store holds no replica; it goes down with store-3 but does not
	// drain, so once it is marked down the store timeout has passed with the
	// scheduler running.
	canary := c.spare(t, m, "store-4")
	nc := c.conn()
	if _, err := nc.Request(client.RPCSubject(cluster, client.RPCStoreDrain), []byte(`{"store":"store-3","for_ms":60000}`), 5*time.Second); err != nil {
		t.Fatal(err)
	}
	testkit.Eventually(t, 5*time.Second, "store-3 draining", func() bool { return m.View().Stores["store-3"].State == events.StoreDraining })
	stores[2].stop()
	canary.stop()
	testkit.Eventually(t, 20*time.Second, "the non-draining store-4 marked down", func() bool {
		return m.View().Stores["store-4"].State == events.StoreDown
	})
	v := m.View()
	if st := v.Stores["store-3"].State; st != events.StoreDraining {
		t.Fatalf("store-3 is %s while draining", st)
	}
	if got := v.Shards[1].Members; len(got) != 3 || v.Shards[1].Operator != "" || countType(t, m, events.TypeOperatorStarted) != 0 {
		t.Fatalf("shard 1 changed while store-3 drained: members %v operator %q", got, v.Shards[1].Operator)
	}
	stores[2].start()
	testkit.Eventually(t, 30*time.Second, "shard 1 at 3/3 with the same replicas", func() bool {
		sh, ok := fullShard(m, 1, stores...)
		return ok && replicaOn(sh, "store-3") == replicaOn(before, "store-3")
	})
}

// TestStoreStartsNothingWithoutTheStream: a store whose stream cannot be read
// starts no replica, and starts its replica once the stream is back.
func TestStoreStartsNothingWithoutTheStream(t *testing.T) {
	c := newClusterOnPort(t)
	m := c.startMeta("meta-1", schedOpts())
	stores := []*storeNode{c.newStore("store-1"), c.newStore("store-2"), c.newStore("store-3")}
	testkit.Eventually(t, 30*time.Second, "shard 1 at 3/3", func() bool { _, ok := fullShard(m, 1, stores...); return ok })
	m.stop()
	for _, s := range stores {
		s.stop()
	}
	c.stopNATS()
	// The stores start while the stream is unreachable.
	for _, s := range stores {
		s.start()
	}
	for _, s := range stores {
		s := s
		testkit.Eventually(t, 20*time.Second, s.id+" to try and fail to read the stream", func() bool {
			st := s.store().Reconciler().Status()
			return !st.Ready && st.Err != ""
		})
		if infos := s.store().Host().ShardInfos(); len(infos) != 0 {
			t.Fatalf("%s started %v without the stream", s.id, infos)
		}
	}
	c.startNATS()
	testkit.Eventually(t, 60*time.Second, "every store's replica running again", func() bool {
		for _, s := range stores {
			if len(s.store().Host().ShardInfos()) != 1 {
				return false
			}
		}
		return true
	})
}

// TestPlannedRestartsDrainThemselves: the second report's two restarts, as
// planned restarts: store-3 drains itself before it stops (what the
// logstore role does on SIGTERM), stays down past the store timeout, and
// restarts; twice in a row. The drain survives each re-registration and
// ends once the restarted store runs its replica, so nothing is replaced:
// no operator, the same replica id on store-3.
func TestPlannedRestartsDrainThemselves(t *testing.T) {
	c := newCluster(t)
	m, stores := c.shardOnThree(t, "meta-1")
	before := m.View().Shards[1]
	c.spare(t, m, "store-4") // a replacement would have somewhere to go
	s3 := stores[2]
	for round := 1; round <= 2; round++ {
		ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
		err := s3.store().Drain(ctx, time.Minute)
		cancel()
		if err != nil {
			t.Fatal(err)
		}
		testkit.Eventually(t, 5*time.Second, "store-3 draining", func() bool { return m.View().Stores["store-3"].State == events.StoreDraining })
		// A canary that does not drain goes down with it: once it is
		// marked down, store-3 has been silent past the store timeout.
		canary := c.spare(t, m, fmt.Sprintf("canary-%d", round))
		s3.stop()
		canary.stop()
		testkit.Eventually(t, 20*time.Second, "the canary marked down", func() bool {
			return m.View().Stores[fmt.Sprintf("canary-%d", round)].State == events.StoreDown
		})
		if st := m.View().Stores["store-3"].State; st != events.StoreDraining {
			t.Fatalf("round %d: store-3 is %s while it restarts", round, st)
		}
		s3.start()
		testkit.Eventually(t, 30*time.Second, "the drain over and shard 1 at 3/3 with the same replicas", func() bool {
			sh, ok := fullShard(m, 1, stores...)
			return ok && m.View().Stores["store-3"].State == events.StoreUp && replicaOn(sh, "store-3") == replicaOn(before, "store-3")
		})
	}
	if n := countType(t, m, events.TypeOperatorStarted); n != 0 {
		t.Fatalf("%d operators started during two planned restarts", n)
	}
}
