package tests

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/replay"
)

// TestRecoverShardThatLostQuorum is the pending-removal deadlock, end to
// end on real NodeHosts, and its recovery: shard 1 at 3/3 holds a value;
// store-3 dies and its removal is sent, then store-2 dies too, both for
// good: Raft has one member of three running and cannot commit the
// removal, read its membership nor anything else. The leader's health says
// lost-quorum, naming the runbook's command; the recovery's dry run shows
// the plan, --yes records shard.recovered, store-1 rebuilds the shard as a
// one-member shard and the scheduler brings it back to 3/3 on store-1 and
// two new stores. The value proposed before the loss is still there, and
// store-2 and store-3, restarted from their old data, start nothing.
func TestRecoverShardThatLostQuorum(t *testing.T) {
	c := newCluster(t)
	o := schedOpts()
	o.scheduler.LostQuorumAfter = 3 * time.Second
	o.scheduler.StepTimeout = 5 * time.Second
	m, stores := c.shardOnThreeWith(t, "meta-1", o)
	s1, s2, s3 := stores[0], stores[1], stores[2]
	if err := propose(ctxFor(t, 20*time.Second), s1, 1, "before the loss"); err != nil {
		t.Fatal(err)
	}
	sh := m.View().Shards[1]
	r1, r2, r3 := replicaOn(sh, "store-1"), replicaOn(sh, "store-2"), replicaOn(sh, "store-3")

	// store-3 dies; its removal is recorded, held before it is sent;
	// store-2 dies; the removal is sent and cannot commit.
	m.fp.Pause(meta.FPOperatorBeforeRemove)
	s3.stop()
	if err := m.fp.WaitPaused(ctxFor(t, 30*time.Second), meta.FPOperatorBeforeRemove); err != nil {
		t.Fatal(err)
	}
	s2.stop()
	m.fp.Resume(meta.FPOperatorBeforeRemove)
	var health meta.ShardHealth
	testkit.Eventually(t, 30*time.Second, "shard 1 lost-quorum in the leader's health", func() bool {
		for _, h := range m.HealthReport().Shards {
			if h.Shard == 1 && h.LostQuorum {
				health = h
				return true
			}
		}
		return false
	})
	if p, ok := m.View().Shards[1].Pending[r3]; !ok || p.Kind != "removing" {
		t.Fatalf("the removal of %d is not pending: %s", r3, m.View().Render())
	}
	if !strings.Contains(health.Why, "lost-quorum") || !strings.Contains(health.Runbook, "termlog shard recover --shard 1 --from store-1") || len(health.Gone) != 2 {
		t.Fatalf("health: %+v", health)
	}
	t.Logf("health: %s", health.Why)

	recover := func(req client.RecoverRequest) (client.Reply, error) {
		b, _ := json.Marshal(req)
		msg, err := c.conn().RequestWithContext(ctxFor(t, 20*time.Second), client.RPCSubject(cluster, client.RPCShardRecover), b)
		if err != nil {
			return client.Reply{}, err
		}
		var rep client.Reply
		return rep, json.Unmarshal(msg.Data, &rep)
	}
	// Refused from a store that does not hold the shard.
	if rep, err := recover(client.RecoverRequest{Shard: 1, From: "store-9", DryRun: true, Operator: "test"}); err != nil || rep.Error == nil || !strings.Contains(rep.Error.Message, "does not hold shard 1") {
		t.Fatalf("recovery from store-9: %+v %v", rep.Error, err)
	}
	rep, err := recover(client.RecoverRequest{Shard: 1, From: "store-1", DryRun: true, Operator: "test"})
	if err != nil || rep.Error != nil || rep.Recovery == nil {
		t.Fatalf("dry run: %+v %v", rep, err)
	}
	plan := *rep.Recovery
	if plan.Replica != r1 || plan.Applied == 0 || plan.Seq != 0 || len(plan.Gone) != 2 || plan.Gone[r2] != "store-2" || plan.Gone[r3] != "store-3" {
		t.Fatalf("plan %+v", plan)
	}
	if n := len(eventsOf(t, m, events.TypeShardRecovered)); n != 0 {
		t.Fatalf("the dry run recorded %d recoveries", n)
	}
	rep, err = recover(client.RecoverRequest{Shard: 1, From: "store-1", Yes: true, Operator: "test"})
	if err != nil || rep.Error != nil || rep.Recovery == nil || rep.Recovery.Seq == 0 {
		t.Fatalf("recovery: %+v %v", rep, err)
	}
	t.Logf("recovered at seq %d: %+v", rep.Recovery.Seq, *rep.Recovery)

	testkit.Eventually(t, 60*time.Second, "shard 1 one member, running with a leader on store-1", func() bool {
		si, ok := s1.info(1)
		return ok && si.Leader == r1 && len(si.Replicas) == 1
	})
	s4, s5 := c.spare(t, m, "store-4"), c.spare(t, m, "store-5")
	defer func() {
		if t.Failed() {
			t.Logf("view: %s", m.View().Render())
			for _, h := range m.HealthReport().Shards {
				t.Logf("health: %+v", h)
			}
		}
	}()
	testkit.Eventually(t, 90*time.Second, "shard 1 back at 3/3 on store-1, store-4, store-5", func() bool {
		_, ok := fullShard(m, 1, s1, s4, s5)
		return ok
	})
	for _, n := range []*storeNode{s1, s4, s5} {
		testkit.Eventually(t, 20*time.Second, "the value from before the loss on "+n.id, func() bool {
			v, err := n.store().Host().Read(ctxFor(t, 5*time.Second), 1, logstore.GetQuery{Index: 1})
			return err == nil && bytes.Equal(v.([]byte), []byte("before the loss"))
		})
	}
	// The gone stores come back from their old data: they start nothing.
	w2, w3 := watchReplica(s2, 1, r2), watchReplica(s3, 1, r3)
	s2.start()
	s3.start()
	testkit.Eventually(t, 30*time.Second, "the retired replicas' data removed", func() bool {
		for _, n := range []*storeNode{s2, s3} {
			for _, ref := range n.store().Host().Persisted() {
				if ref.Shard == 1 {
					return false
				}
			}
		}
		return true
	})
	w2.end()
	w3.end()
	if w2.started.Load() != 0 || w3.started.Load() != 0 {
		t.Fatalf("a retired replica ran: %d and %d samples", w2.started.Load(), w3.started.Load())
	}
	if _, ok := fullShard(m, 1, s1, s4, s5); !ok {
		t.Fatalf("shard 1 not at 3/3 after the gone stores came back: %s", m.View().Render())
	}
	// The recovery is in the stream and in the shard's history.
	recs := eventsOf(t, m, events.TypeShardRecovered)
	if len(recs) != 1 || recs[0].Data.(events.ShardRecovered).Operator != "test" {
		t.Fatalf("shard.recovered events: %+v", recs)
	}
	var out bytes.Buffer
	sub, _ := replay.ParseSubject("shard:1")
	if err := replay.Run(ctxFor(t, 20*time.Second), replay.Stream(m.log), replay.Options{Mode: replay.ModeHistory, Subject: sub}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "shard.recovered") || !strings.Contains(out.String(), "from="+"") {
		t.Fatalf("history of shard 1 without the recovery:\n%s", out.String())
	}
	t.Logf("history:\n%s", out.String())
}

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}
