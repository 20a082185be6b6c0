package health

import (
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/meta"
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
