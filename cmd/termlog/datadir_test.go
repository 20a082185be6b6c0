package main

import (
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
)

// TestMain runs the tests, or, with $TERMLOG_TEST_HOLD set, is the helper
// process of TestStopHolder: it locks that data dir and holds it until
// SIGTERM, as a store does.
func TestMain(m *testing.M) {
	if dir := os.Getenv("TERMLOG_TEST_HOLD"); dir != "" {
		sig := make(chan os.Signal, 1)
		signal.Notify(sig, syscall.SIGTERM)
		lock, err := lockDataDir(dir, "termlog logstore --id store-9")
		if err != nil {
			os.Exit(3)
		}
		<-sig
		// A store drains before it stops: the lock stays held a while
		// after SIGTERM, which stopHolder must wait out.
		time.Sleep(300 * time.Millisecond)
		lock.Unlock()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestStopHolder: store stop's core signals the process that holds the
// data dir and returns once it is gone; a dir nobody holds, or that no
// process ever used, is an error that says so.
func TestStopHolder(t *testing.T) {
	dir := t.TempDir()
	if _, err := stopHolder(dir, time.Second); err == nil || !strings.Contains(err.Error(), "no process has run on this data dir") {
		t.Fatalf("a dir without a lock file: %v", err)
	}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), "TERMLOG_TEST_HOLD="+dir)
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	t.Cleanup(func() {
		if cmd.ProcessState == nil {
			_ = cmd.Process.Kill()
			<-done
		}
	})
	testkit.Eventually(t, 10*time.Second, "the helper holds the lock", func() bool {
		b, _ := os.ReadFile(filepath.Join(dir, lockFileName))
		return strings.Contains(string(b), "(pid ")
	})
	who, err := stopHolder(dir, 10*time.Second)
	if err != nil || !strings.HasPrefix(who, "termlog logstore --id store-9 (pid ") {
		t.Fatalf("stopHolder: %q, %v", who, err)
	}
	// The lock is free: the dir can be locked at once.
	lock, err := lockDataDir(dir, "again")
	if err != nil {
		t.Fatalf("after stopHolder returned: %v", err)
	}
	lock.Unlock()
	if err := <-done; err != nil {
		t.Fatalf("the helper ended with %v", err)
	}
	if _, err := stopHolder(dir, time.Second); err == nil || !strings.Contains(err.Error(), "nothing to stop") {
		t.Fatalf("a dir nobody holds: %v", err)
	}
}
