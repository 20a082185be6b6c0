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
