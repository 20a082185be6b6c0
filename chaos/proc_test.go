package chaos

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestProcExitsByItselfAreReported(t *testing.T) {
	dir := t.TempDir()
	quits := &Proc{Name: "quits", Bin: "/bin/sh", Args: []string{"-c", "echo giving up; exit 3"}, LogPath: filepath.Join(dir, "quits.log")}
	if err := quits.Start(); err != nil {
		t.Fatal(err)
	}
	select {
	case <-quits.Exited():
	case <-time.After(10 * time.Second):
		t.Fatal("sh did not exit")
	}
	// Exited is closed after the exit is noted.
	if u := quits.Unasked(); len(u) != 1 || !strings.Contains(u[0], "exited by itself") || !strings.Contains(u[0], "exit status 3") {
		t.Fatalf("Unasked = %q", u)
	}
	if u := quits.Unasked(); len(u) != 0 {
		t.Fatalf("Unasked twice: %q", u)
	}

	killed := &Proc{Name: "killed", Bin: "/bin/sh", Args: []string{"-c", "sleep 60"}, LogPath: filepath.Join(dir, "killed.log")}
	if err := killed.Start(); err != nil {
		t.Fatal(err)
	}
	if err := killed.Pause(); err != nil {
		t.Fatal(err)
	}
	if err := killed.Kill(); err != nil { // a paused process dies too
		t.Fatal(err)
	}
	if killed.Running() {
		t.Fatal("running after Kill")
	}
	if u := killed.Unasked(); len(u) != 0 {
		t.Fatalf("a kill by the harness reported as an exit by itself: %q", u)
	}
	if err := killed.Start(); err != nil { // started again, same log
		t.Fatal(err)
	}
	if err := killed.Term(5 * time.Second); err != nil {
		t.Fatal(err)
	}
	b, _ := os.ReadFile(killed.LogPath)
	if n := strings.Count(string(b), "=== chaos: start"); n != 2 || killed.Starts() != 2 {
		t.Fatalf("log has %d start markers, Starts %d:\n%s", n, killed.Starts(), b)
	}
}
