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
