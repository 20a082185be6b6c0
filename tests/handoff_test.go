package tests

import (
	"context"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/projections"
)

// TestHandoffStaleExpiry replays the first report's test plan
// (000_152df8e950350615): the outgoing leader finishes an expired-worker
// deletion after leadership moved, and the compute node re-registers at the
// same host:port.
func TestHandoffStaleExpiry(t *testing.T) {
	c := newCluster(t)

	// 1. Two meta replicas; meta-1 leads. It expires workers after 1 s;
	// meta-2 gives them a long timeout so only supersession can remove one.
	m1 := c.startMeta("meta-1", metaOpts{workerTimeout: time.Second, expiry: 100 * time.Millisecond})
	testkit.Eventually(t, 10*time.Second, "meta-1 to lead", func() bool { ok, _ := m1.Leading(); return ok })
	_, term1 := m1.Leading()
	m2 := c.startMeta("meta-2", metaOpts{workerTimeout: time.Minute})

	// 2. One streaming compute worker registers and runs.
	endpoint := testkit.FreeAddr(t)
	w1 := c.startWorker(endpoint, "cn-incarnation-1", 100*time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "worker 1 running", func() bool {
		w, ok := m1.View().WorkerAt(endpoint)
		return ok && w.State == projections.WorkerRunning
	})
	old, _ := m1.View().WorkerAt(endpoint)
	lease1 := m1.View().Lease // term 1's fencing token, the lease revision meta-1 took

	// 3. Freeze meta-1's expiry after it collected the expired worker and
	// before it appends (the process stalls, then carries on).
	m1.fp.Freeze(meta.FPExpiryAfterCollect)
	w1.stop() // the compute node goes away: no more heartbeats
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Second)
	defer cancel()
	if err := m1.fp.WaitPaused(ctx, meta.FPExpiryAfterCollect); err != nil {
		t.Fatal(err)
	}

	// 4. Force the handoff: meta-1's renewals stop, its lease lapses.
	m1.fp.Pause(meta.FPBeforeRenewal)

	// 5. The new leader initialises: term.started is projected.
	testkit.Eventually(t, 15*time.Second, "meta-2 to lead and start its term", func() bool {
		ok, term := m2.Leading()
		return ok && term > term1 && m2.View().Term == term
	})
	_, term2 := m2.Leading()
	// Terms count leaders; the lease revision is the fencing token.
	if lease2 := m2.View().Lease; term1 != 1 || term2 != 2 || lease1 == 0 || lease2 <= lease1 {
		t.Fatalf("terms %d then %d with leases %d then %d; want terms 1, 2 and a newer lease", term1, term2, lease1, lease2)
	}
	if got, ok := m2.View().Worker(old.ID); !ok || got.Epoch != old.Epoch {
		t.Fatalf("new leader's view lost worker %d before anything deleted it: %v", old.ID, workerIDs(m2.View()))
	}

	// 6. Resume the old leader's deletion. Its lease was last renewed
	// more than lease*2/3 ago, so the append is not even sent (were it
	// sent, the CAS would fence it: the new term.started took the seq).
	seqBefore, _ := m2.log.Tail(ctx)
	m1.fp.Resume(meta.FPExpiryAfterCollect)
	testkit.Eventually(t, 10*time.Second, "the stale deletion to be refused for the lease's age", func() bool {
		return m1.StaleLeaseRefusals() >= 1
	})
	if f := m1.Fenced(); f != 0 {
		t.Fatalf("the old leader's deletion was sent and fenced (%d) instead of refused before sending", f)
	}
	testkit.Eventually(t, 10*time.Second, "meta-1 to follow", func() bool { ok, _ := m1.Leading(); return !ok })
	m1.fp.Resume(meta.FPBeforeRenewal)
	if tail, _ := m2.log.Tail(ctx); tail != seqBefore {
		t.Fatalf("the fenced deletion reached the stream: tail %d -> %d", seqBefore, tail)
	}

	// Forced through without the CAS, the same deletion is a rejected
	// stale-term event in every projection.
	tail, err := m1.log.Tail(ctx)
	if err != nil {
		t.Fatal(err)
	}
	forcedSeq, err := m1.log.Append(ctx, tail, events.Event{Term: term1, Writer: "meta-1", At: time.Now(),
		Data: events.WorkerExpired{ID: old.ID, Epoch: old.Epoch}})
	if err != nil {
		t.Fatalf("forced append: %v", err)
	}
	for _, n := range []*metaNode{m1, m2} {
		v, err := n.Projector().WaitSeq(ctx, forcedSeq)
		if err != nil {
			t.Fatal(err)
		}
		if !hasStaleAnomaly(v, forcedSeq, term1) {
			t.Fatalf("%s: forced stale deletion at seq %d not rejected as stale-term: %+v", n.ID(), forcedSeq, v.Anomalies)
		}
		if _, ok := v.Worker(old.ID); !ok {
			t.Fatalf("%s: stale-term deletion removed worker %d", n.ID(), old.ID)
		}
	}

	// 7. The compute node re-registers at the same host:port.
	w2 := c.startWorker(endpoint, "cn-incarnation-2", 100*time.Millisecond)
	testkit.Eventually(t, 10*time.Second, "worker re-registered", func() bool { return w2.w.Ref().ID > old.ID })
	newID := w2.w.Ref().ID

	// 8. The new leader's view holds only the current worker id.
	testkit.Eventually(t, 10*time.Second, "only the new id in the view", func() bool {
		ws := m2.View().ListWorkers()
		return len(ws) == 1 && ws[0].ID == newID && ws[0].Endpoint == endpoint
	})

	// 10. Initial barrier recovery completes.
	testkit.Eventually(t, 10*time.Second, "barrier recovery to complete", func() bool {
		r, ok := currentRecovery(m2)
		return ok && r.Term == term2 && r.State == meta.RecoveryComplete
	})
	// 9. Exactly one control session to the endpoint, for the new id, and the
	// worker saw no reset after it, across further reconcile rounds.
	rec, _ := currentRecovery(m2)
	if len(rec.Sessions) != 1 || rec.Sessions[endpoint] != newID {
		t.Fatalf("sessions = %v, want exactly {%s: %d}", rec.Sessions, endpoint, newID)
	}
	stats := w2.agent.Stats()
	if !stats.Active || stats.Hello.Worker != newID || stats.Hello.Term != term2 || stats.Acked != term2 {
		t.Fatalf("worker agent: %+v", stats)
	}
	rounds := rec.Rounds
	testkit.Eventually(t, 10*time.Second, "five more reconcile rounds", func() bool {
		r, _ := currentRecovery(m2)
		return r.Rounds >= rounds+5
	})
	if after := w2.agent.Stats(); after.Resets != stats.Resets || after.Accepted != stats.Accepted || !after.Active {
		t.Fatalf("control stream churned: before %+v after %+v", stats, after)
	}
	if stats.Resets != 0 || stats.Accepted != 1 {
		t.Fatalf("worker agent accepted %d sessions with %d resets, want 1 and 0", stats.Accepted, stats.Resets)
	}

	// Every replica has the same state hash at the same seq.
	v := converged(t, m2.log, m1, m2)
	if err := v.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	if v.Term != term2 || v.Leader != "meta-2" {
		t.Fatalf("view term %d leader %s, want %d meta-2", v.Term, v.Leader, term2)
	}
}

func hasStaleAnomaly(v *projections.State, seq, term uint64) bool {
	for _, a := range v.Anomalies {
		if a.Seq == seq && a.Term == term && a.Kind == projections.AnomalyStaleTerm && a.Type == events.TypeWorkerExpired {
			return true
		}
	}
	return false
}
