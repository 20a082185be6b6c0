package chaos

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"
)

// A meta-leader-pause aimed at the leader while an overlapping
// meta-leader-kill was killing it finds no process to stop (seed
// 184462882 r3, census 7 of docs/testing.md: "meta-leader-pause …:
// meta-1: not running" was reported as a violation of the cluster). The
// step is skipped, logged as such, and counted as no fault.
func TestPauseOfAKilledLeaderIsSkipped(t *testing.T) {
	gone := &Proc{Name: "meta-1"} // never started: no current run, as after Kill
	l := &stepLog{start: time.Now(), counts: map[Fault]int{}}
	err := kindOf(MetaLeaderPause).inject(context.Background(), nil, Step{Fault: MetaLeaderPause}, l, victim{p: gone, what: "meta leader meta-1"})
	if !errors.Is(err, errStepSkipped) || !strings.Contains(err.Error(), "meta-1 ended before its SIGSTOP") {
		t.Fatalf("pause of a process with no run: %v, want errStepSkipped naming meta-1", err)
	}
	if !errors.Is(gone.Pause(), ErrNotRunning) {
		t.Fatal("Pause of a process with no run is not ErrNotRunning")
	}
}
