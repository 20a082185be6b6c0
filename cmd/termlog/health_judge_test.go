package main

import (
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/meta"
)

// TestJudgeFencesAnOldTermsRecord: a health record written in an earlier
// term than the stream's (a deposed leader still publishing) does not make
// the cluster healthy, however fresh it is.
func TestJudgeFencesAnOldTermsRecord(t *testing.T) {
	s := Status{Term: 7, LeaseHolder: "meta-2"}
	rec := &meta.HealthRecord{Leader: "meta-1", Term: 5, At: time.Now()}
	rec.Recovery.State = meta.RecoveryComplete
	problems := judge(s, rec, 0, time.Minute)
	if len(problems) != 1 || !strings.Contains(problems[0], "from term 5") {
		t.Fatalf("problems %q, want the old term named", problems)
	}
	rec.Term = 7
	if problems := judge(s, rec, 0, time.Minute); len(problems) != 0 {
		t.Fatalf("current term's record: problems %q", problems)
	}
}

// TestLeaseReadErrorIsUnknown: a lease bucket that could not be read makes
// the holder unknown, named with the cause, in the problems and the table;
// an empty holder read cleanly is "no leader".
func TestLeaseReadErrorIsUnknown(t *testing.T) {
	rec := &meta.HealthRecord{Leader: "meta-1", Term: 7, At: time.Now()}
	rec.Recovery.State = meta.RecoveryComplete
	s := Status{Term: 7, LeaseError: "lease bucket termlog_leader: context deadline exceeded"}
	if p := judge(s, rec, 0, time.Minute); len(p) != 1 || p[0] != "lease holder unknown: "+s.LeaseError {
		t.Fatalf("problems %q, want the unknown holder and its cause only", p)
	}
	var b strings.Builder
	printStatus(&b, s)
	if !strings.Contains(b.String(), "lease holder unknown (lease bucket termlog_leader: context deadline exceeded)") {
		t.Fatalf("table:\n%s", b.String())
	}
	s.LeaseError = ""
	if p := judge(s, rec, 0, time.Minute); len(p) != 1 || !strings.HasPrefix(p[0], "no meta leader holds the lease (meta-1, ") {
		t.Fatalf("problems %q, want no leader", p)
	}
	b.Reset()
	printStatus(&b, s)
	if !strings.Contains(b.String(), "lease holder none (no leader holds the lease)") {
		t.Fatalf("table:\n%s", b.String())
	}
}

// TestStableFor: --wait-healthy passes only once every read was healthy
// for --stable-for; one degraded (or failed) read starts it over.
func TestStableFor(t *testing.T) {
	t0 := time.Date(2026, 12, 1, 3, 0, 0, 0, time.UTC)
	at := func(ms int) time.Time { return t0.Add(time.Duration(ms) * time.Millisecond) }
	var s stability
	d := 2 * time.Second
	for _, step := range []struct {
		ms      int
		healthy bool
		pass    bool
	}{
		{0, true, false}, {1000, true, false}, {1500, false, false}, // a flap
		{2000, true, false}, {3500, true, false}, {4000, true, true}, {4500, true, true},
		{5000, false, false}, {5100, true, false},
	} {
		if got := s.see(step.healthy, at(step.ms), d); got != step.pass {
			t.Fatalf("read at %dms healthy=%v: pass %v, want %v", step.ms, step.healthy, got, step.pass)
		}
	}
	var z stability
	if !z.see(true, t0, 0) {
		t.Fatal("--stable-for 0: the first healthy read passes")
	}
}
