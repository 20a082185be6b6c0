package health

import (
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/projections"
)

// TestAssembleStale: a status from a copy is never healthy, states the
// copy's seq, term, leader and age, names the server it was read through
// and why, and keeps a lease holder that could not be read unknown.
func TestAssembleStale(t *testing.T) {
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	c := Copy{Record: meta.HealthRecord{Leader: "meta-2", Term: 4, Seq: 812, At: at}, LeaseErr: "lease copy: timeout", Via: "nats-2"}
	s := AssembleStale("termlog", c, "the event stream's leader did not answer for 500ms", at.Add(3200*time.Millisecond))
	if s.Health.Healthy || s.Stale == nil || len(s.Health.Problems) != 1 {
		t.Fatalf("a copy must be stale and unhealthy with one problem: %+v", s)
	}
	if s.Seq != 812 || s.Term != 4 || s.Leader != "meta-2" || s.Stale.Seq != 812 || s.Stale.AgeMS != 3200 || s.LeaseError != "lease copy: timeout" || s.LeaseHolder != "" {
		t.Fatalf("provenance lost: %+v, stale %+v", s, s.Stale)
	}
	want := "STALE: the event stream's leader did not answer for 500ms; state as of seq 812 from the health record of term 4 by meta-2, read through nats-2 (3.2s old)"
	if got := s.Stale.String(); got != want || s.Health.Problems[0] != want || !strings.HasPrefix(got, "STALE: ") {
		t.Fatalf("stale line:\n got %s\nwant %s", got, want)
	}
	// A record from a clock ahead of the reader's is not of negative age.
	if s := AssembleStale("termlog", c, "why", at.Add(-time.Second)); s.Stale.AgeMS != 0 {
		t.Fatalf("age %d ms, want 0", s.Stale.AgeMS)
	}
}

// TestAssembleRecordTooOldIsStale: a health record is trusted only while
// its age (the reader's now minus the record's time) is within Stale of
// the lease: the leader rewrites it every second, so an older one means no
// leader is publishing, however healthy it says the cluster is. At the
// bound it is current; past it, it is the one problem.
func TestAssembleRecordTooOldIsStale(t *testing.T) {
	at := time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC)
	st := projections.New()
	if r := st.Apply(events.Event{Term: 4, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 4, Leader: "meta-1", Lease: 1}}); r.Outcome != projections.Applied {
		t.Fatalf("term.started: %s", r)
	}
	rec := &meta.HealthRecord{Leader: "meta-1", Term: 4, Seq: 1, At: at}
	rec.Recovery.State = meta.RecoveryComplete
	r := Read{Holder: "meta-1", TTL: 3 * time.Second, Record: rec}
	if s := Assemble("termlog", st, nil, r, at.Add(Stale(r.TTL))); !s.Health.Healthy {
		t.Fatalf("a record %s old (the bound): problems %q, want healthy", Stale(r.TTL), s.Health.Problems)
	}
	s := Assemble("termlog", st, nil, r, at.Add(Stale(r.TTL)+100*time.Millisecond))
	want := "health record is 6.1s old (written by meta-1 in term 4): no leader is publishing"
	if s.Health.Healthy || s.Health.AgeMS != 6100 || len(s.Health.Problems) != 1 || s.Health.Problems[0] != want {
		t.Fatalf("a record past the bound: healthy %v, age %d ms, problems %q; want unhealthy, 6100 ms, only %q", s.Health.Healthy, s.Health.AgeMS, s.Health.Problems, want)
	}
}

// TestStreamReplicasJudge: a replica of the event stream is gone when its
// leader knows its server offline or has not heard from it for
// ReplicaGoneAfter, whatever "current" says (the leader keeps a dead
// follower current while nothing is appended); the table names it.
func TestStreamReplicasJudge(t *testing.T) {
	r := &StreamReplicas{Stream: "TERMLOG_TERMLOG", Leader: "n1", Replicas: []StreamReplica{
		{Name: "n2", Current: true, LastSeenMS: 400},
		{Name: "n3", Current: true, LastSeenMS: ReplicaGoneAfter.Milliseconds()},
		{Name: "n4", Current: false, Offline: true, LastSeenMS: 200},
		{Name: "n5", Current: false, Lag: 7, LastSeenMS: 2999},
		{Name: "n6", Unheard: true, LastSeenMS: 4000},
	}}
	gone := r.Judge()
	if strings.Join(gone, " ") != "n3 n4 n6" || r.Replicas[0].Gone || r.Replicas[3].Gone {
		t.Fatalf("gone %v, replicas %+v: want n3 (silent %s) and n4 (offline)", gone, r.Replicas, ReplicaGoneAfter)
	}
	want := "event stream TERMLOG_TERMLOG: leader n1, n2 current, n3 GONE (not heard from for 3s), n4 GONE (offline, last heard 200ms ago), n5 behind (lag 7), n6 GONE (not heard from since this leader took over, 4s ago)"
	if got := r.String(); got != want {
		t.Fatalf("line:\n got %s\nwant %s", got, want)
	}
	if (*StreamReplicas)(nil).Judge() != nil {
		t.Fatal("no replicas: none gone")
	}
}
