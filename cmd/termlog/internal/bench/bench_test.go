package bench

import (
	"bufio"
	"context"
	"runtime/pprof"
	"testing"
	"time"

	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// TestWorkloadApplies keeps the fold figures honest: every event of the
// workload applies, and the invariants hold.
func TestWorkloadApplies(t *testing.T) {
	w, err := makeWorkload(20_000, workloadEndpoints)
	if err != nil {
		t.Fatal(err)
	}
	s := projections.New()
	for i, b := range w.bodies {
		if r := s.DecodeApply(uint64(i+1), b); r.Outcome != projections.Applied {
			t.Fatalf("seq %d (%s): %s", i+1, w.events[i].Type(), r)
		}
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if len(s.Workers) < 1000 || len(s.Shards) != 200 || s.Term < 2 {
		t.Fatalf("workload too thin: %d workers, %d shards, term %d", len(s.Workers), len(s.Shards), s.Term)
	}
}

// TestSeedEventsApply: the stream heartbeat and failover start from holds
// the fleet's workers, running, with their epochs.
func TestSeedEventsApply(t *testing.T) {
	evs, bodies, err := seedEvents(3, 50)
	if err != nil {
		t.Fatal(err)
	}
	s := projections.New()
	for i, b := range bodies {
		if r := s.DecodeApply(uint64(i+1), b); r.Outcome != projections.Applied {
			t.Fatalf("seq %d (%s): %s", i+1, evs[i].Type(), r)
		}
	}
	for i := range 50 {
		w, ok := s.WorkerAt(fakeEndpoint(i))
		if !ok || w.Incarnation != fleetIncarnation(i) || w.Epoch != uint64(i+2) || w.State != projections.WorkerRunning {
			t.Fatalf("worker %d: %+v %v", i, w, ok)
		}
	}
}

// TestCPUByLabel reads a real CPU profile: busy work under a label is found
// under it.
func TestCPUByLabel(t *testing.T) {
	u := measureCPU(func() {
		pprof.Do(context.Background(), pprof.Labels(labelKey, "spinner"), func(context.Context) {
			// 300 ms of this process's CPU, however long that takes on a
			// loaded machine (wall time would measure the machine's load).
			start, ok := processCPU()
			x := 0
			for ok {
				for range 100000 {
					x++
				}
				now, _ := processCPU()
				if now-start >= 300*time.Millisecond {
					break
				}
			}
			_ = x
		})
	})
	if u.err != nil {
		t.Skipf("no CPU profile here: %v", u.err)
	}
	if got := u.byLabel["spinner"]; got < 100*time.Millisecond {
		t.Fatalf("spinner CPU %s, want most of 300ms; by label: %v", got, u.byLabel)
	}
	if u.process < u.byLabel["spinner"]/2 {
		t.Fatalf("process CPU %s below the sampled %s", u.process, u.byLabel["spinner"])
	}
}

// TestAgentConn: the in-memory agent acks barriers as client.Agent does and
// ends the leader's reader on close.
func TestAgentConn(t *testing.T) {
	c, err := dialAgent(context.Background(), "10.0.0.1:5688")
	if err != nil {
		t.Fatal(err)
	}
	if err := client.WriteControl(c, client.ControlMsg{Type: client.MsgHello, Worker: 1, Epoch: 2, Term: 3}); err != nil {
		t.Fatal(err)
	}
	if err := client.WriteControl(c, client.ControlMsg{Type: client.MsgBarrier, Barrier: 7}); err != nil {
		t.Fatal(err)
	}
	sc := bufio.NewScanner(c)
	if !sc.Scan() {
		t.Fatal("no ack")
	}
	m, err := client.DecodeControl(sc.Bytes())
	if err != nil || m.Type != client.MsgAck || m.Barrier != 7 {
		t.Fatalf("ack: %+v %v", m, err)
	}
	done := make(chan bool)
	go func() { done <- sc.Scan() }()
	c.Close()
	select {
	case more := <-done:
		if more {
			t.Fatal("read after close")
		}
	case <-time.After(5 * time.Second):
		t.Fatal("reader not ended by close")
	}
}

func TestConfigChecks(t *testing.T) {
	for _, c := range []Config{{Workers: -1}, {Events: 10}, {Only: []string{"nope"}}, {Lease: time.Millisecond}, {HeartbeatFor: time.Millisecond}, {Replicas: 2}, {Replicas: -1}} {
		if _, err := c.withDefaults(); err == nil {
			t.Errorf("%+v accepted", c)
		}
	}
	c, err := Config{Only: []string{"fold.apply", "memory"}}.withDefaults()
	if err != nil || !c.wants(GroupFold) || !c.wants(GroupMemory) || c.wants(GroupReplay) {
		t.Fatalf("only: %+v %v", c, err)
	}
}
