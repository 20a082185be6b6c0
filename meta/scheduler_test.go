package meta

import (
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
)

func schedLeader(t *testing.T, clk *clock.Manual) *testLeader {
	t.Helper()
	l := newTestLeader(t, "meta-1", events.NewMemLog(), clk, 1, func(c *Config) {
		c.Scheduler = SchedulerConfig{Shards: 1, StoreTimeout: 5 * time.Second}
	})
	if err := l.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	for i, st := range []string{"s1", "s2", "s3"} {
		rep := l.call(t, client.RPCStoreRegister, client.StoreRegisterRequest{Store: st, Incarnation: "i-" + st, RaftAddr: "127.0.0.1:" + string(rune('1'+i)) + "000"})
		if rep.Error != nil {
			t.Fatalf("register %s: %+v", st, rep)
		}
	}
	return l
}

func (tl *testLeader) beat(t *testing.T, store string, reports ...client.ShardReport) {
	t.Helper()
	if rep := tl.call(t, client.RPCStoreHeartbeat, client.StoreHeartbeat{Store: store, Incarnation: "i-" + store, Shards: reports}); rep.Error != nil {
		t.Fatalf("heartbeat %s: %+v", store, rep)
	}
}

// pass runs the scheduler's decisions until they append nothing and
// waits for the execs they started.
func (tl *testLeader) pass(t *testing.T, mem *sched.Memory) {
	t.Helper()
	var wg sync.WaitGroup
	results := make(chan sched.Result, 16)
	*mem = tl.duties.stores.schedulePasses(ctxT(t), &wg, *mem, results)
	wg.Wait()
	close(results)
	for r := range results {
		*mem = mem.WithResult(r)
	}
}

func TestSchedulerBootstrapsObservesAndMarksDown(t *testing.T) {
	clk := clock.NewManual(t0)
	l := schedLeader(t, clk)
	ctx := ctxT(t)
	var mem sched.Memory
	l.pass(t, &mem)
	v := l.r.proj.View()
	sh := v.Shards[1]
	if sh == nil || len(sh.Members) != 3 {
		t.Fatalf("shard 1 not bootstrapped on 3 stores: %s", v.Render())
	}

	// A heartbeat with a newer config change id becomes shard.observed.
	reps := map[uint64]string{1: "127.0.0.1:1000", 2: "127.0.0.1:2000", 3: "127.0.0.1:3000"}
	l.beat(t, "s1", client.ShardReport{Shard: 1, Replica: 1, Replicas: reps, Leader: 2, Term: 4, CCID: 7})
	l.pass(t, &mem)
	if sh := l.r.proj.View().Shards[1]; sh.CCID != 7 || sh.Leader != 2 {
		t.Fatalf("observed not applied: ccid %d leader %d", sh.CCID, sh.Leader)
	}

	// s3 drains until 1 min from now; s2 stops heartbeating: after the store
	// timeout only s2 is down.
	if err := l.mutate(ctx, "", func(v2 *projections.State) ([]events.Payload, error) {
		return []events.Payload{events.StoreState{Store: "s3", State: events.StoreDraining, Until: clk.Now().Add(time.Minute)}}, nil
	}); err != nil {
		t.Fatal(err)
	}
	advance(clk, 3*time.Second, l)
	l.beat(t, "s1")
	advance(clk, 3*time.Second, l)
	l.beat(t, "s1")
	l.pass(t, &mem)
	v = l.r.proj.View()
	if got := v.Stores["s2"].State; got != events.StoreDown {
		t.Fatalf("s2 is %s, want down", got)
	}
	if got := v.Stores["s3"].State; got != events.StoreDraining {
		t.Fatalf("draining s3 is %s, want draining", got)
	}
	if got := v.Stores["s1"].State; got != events.StoreUp {
		t.Fatalf("s1 is %s, want up", got)
	}
	// s2 heartbeats again: the next decision marks it up.
	l.beat(t, "s2")
	l.pass(t, &mem)
	if got := l.r.proj.View().Stores["s2"].State; got != events.StoreUp {
		t.Fatalf("s2 after heartbeat is %s, want up", got)
	}
}

// A leader resumed after a pause past its lease sends no config change:
// runExec refuses before the request (an error, not an unknown outcome)
// and the term ends, as for appends.
func TestPausedLeaderSendsNoExec(t *testing.T) {
	clk := clock.NewManual(t0)
	l := schedLeader(t, clk)
	clk.Advance(3 * time.Second) // SIGSTOP for a lease; no renewal
	x := sched.Exec{Store: "s1", Req: client.ExecRequest{Op: client.ExecRemove, Shard: 1, Replica: 3}, Deadline: clk.Now().Add(5 * time.Second)}
	res := l.duties.stores.runExec(ctxT(t), x)
	if res.Reply.Outcome != client.OutcomeError || !strings.Contains(res.Reply.Error, "lease lost") {
		t.Fatalf("exec after a pause past the lease: %+v, want an error naming the lost lease (nothing sent)", res.Reply)
	}
	select {
	case why := <-l.lost:
		t.Logf("term ended: %s", why)
	default:
		t.Fatal("the paused leader did not end its term")
	}
}
