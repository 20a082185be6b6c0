package main

import (
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// goneMarker is the marker of a run that no longer runs: a process that
// started and ended.
func goneMarker(t *testing.T) (string, int) {
	t.Helper()
	c := exec.Command("true")
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	st := startTime(c.Process.Pid)
	if err := c.Wait(); err != nil {
		t.Fatal(err)
	}
	if st == "" {
		st = "1"
	}
	return fmt.Sprintf("%d.%s", c.Process.Pid, st), c.Process.Pid
}

// marked starts `sleep 60` carrying marker, killed at the test's end.
func marked(t *testing.T, marker string) *exec.Cmd {
	t.Helper()
	c := exec.Command("sleep", "60")
	c.Env = append(os.Environ(), markerVar+"="+marker)
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = c.Wait(); close(done) }()
	t.Cleanup(func() { _ = c.Process.Kill(); <-done })
	return c
}

func exited(c *exec.Cmd) bool {
	// Reaped by the goroutine, or a zombie: either way no longer running.
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", c.Process.Pid))
	return err != nil || strings.Contains(string(b), ") Z ")
}

func TestOwnMarkerIsLive(t *testing.T) {
	if !markerLive(ownMarker()) {
		t.Fatalf("this process's marker %s is not live", ownMarker())
	}
	if m, _ := goneMarker(t); markerLive(m) {
		t.Fatalf("the marker %s of an ended process is live", m)
	}
}

// A process of an earlier run that is gone is killed before the run; one
// of a live run (this one) is left alone.
func TestSweepBeforeKillsOnlyProcessesOfGoneRuns(t *testing.T) {
	gone, _ := goneMarker(t)
	old := marked(t, gone)
	live := marked(t, ownMarker())
	var b strings.Builder
	killGoneRuns(func(s string) { fmt.Fprintln(&b, s) })
	waitUntil(t, func() bool { return exited(old) }, "the earlier run's process is killed")
	if exited(live) {
		t.Fatalf("the live run's process was killed")
	}
	if !strings.Contains(b.String(), fmt.Sprintf("killing pid %d (sleep 60)", old.Process.Pid)) {
		t.Errorf("sweep did not say what it killed:\n%s", b.String())
	}
}

// A process of this run still running after go test is named and killed
// (and the run fails: TestSummaryOfARunThatLeftSomething).
func TestCheckAfterNamesAndKillsWhatTheRunLeft(t *testing.T) {
	own := "run-" + fmt.Sprint(time.Now().UnixNano())
	c := marked(t, own)
	left := killOwn(own, 200*time.Millisecond)
	if len(left) != 1 || !strings.Contains(left[0], fmt.Sprintf("pid %d (sleep 60)", c.Process.Pid)) {
		t.Fatalf("left %q, want the sleep process", left)
	}
	waitUntil(t, func() bool { return exited(c) }, "the leftover process is killed")
}

// A namespace of a gone test process is found and removed.
func TestCheckAfterRemovesNamespacesOfGoneProcesses(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("network namespaces need root")
	}
	_, pid := goneMarker(t)
	name := fmt.Sprintf("%s%d-9-br", netnsPrefix, pid)
	if out, err := exec.Command("ip", "netns", "add", name).CombinedOutput(); err != nil {
		t.Fatalf("ip netns add %s: %v: %s", name, err, out)
	}
	t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", name).Run() })
	left := removeDeadNamespaces()
	found := false
	for _, l := range left {
		found = found || strings.Contains(l, name+" (its test process is gone); removed")
	}
	if !found {
		t.Fatalf("left %q, want namespace %s", left, name)
	}
	if _, err := os.Stat("/run/netns/" + name); err == nil {
		t.Fatalf("namespace %s still there", name)
	}
}

func waitUntil(t *testing.T, cond func() bool, what string) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("not within 10s: %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
