package main

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// lockFileName is the lock a process holds on its data dir while it runs.
const lockFileName = "termlog.lock"

// dirLock is an exclusive advisory lock (flock) on a data dir. The kernel
// drops it when the process ends, however it ends, so a crash leaves
// nothing to clean up.
type dirLock struct{ f *os.File }

// lockDataDir creates dir if missing and locks it for what (for example
// "termlog up"), before anything (NATS, a NodeHost) opens its files. A dir
// another process holds is refused at once, naming that process.
func lockDataDir(dir, what string) (*dirLock, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("data dir: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		holder, _ := os.ReadFile(path)
		f.Close()
		if errors.Is(err, syscall.EWOULDBLOCK) {
			who := strings.TrimSpace(string(holder))
			if who == "" {
				who = "another process"
			}
			return nil, fmt.Errorf("data dir %s is in use by %s: stop it first, or give this one another --data", dir, who)
		}
		return nil, fmt.Errorf("lock data dir %s: %w", dir, err)
	}
	if err := f.Truncate(0); err == nil {
		_, _ = f.WriteAt([]byte(fmt.Sprintf("%s (pid %s)\n", what, strconv.Itoa(os.Getpid()))), 0)
	}
	return &dirLock{f: f}, nil
}

// Unlock releases the lock (the file stays: removing it would race with
// another process locking it).
func (l *dirLock) Unlock() {
	_ = syscall.Flock(int(l.f.Fd()), syscall.LOCK_UN)
	l.f.Close()
}

// stopHolder stops the process that holds dir's lock: SIGTERM to the pid
// it wrote in the lock file, then it waits until the lock is free (the
// process is gone) or wait passes. It returns the holder's line.
func stopHolder(dir string, wait time.Duration) (string, error) {
	path := filepath.Join(dir, lockFileName)
	f, err := os.OpenFile(path, os.O_RDWR, 0)
	if errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("%s: no process has run on this data dir (no %s)", dir, lockFileName)
	}
	if err != nil {
		return "", err
	}
	defer f.Close()
	free := func() bool {
		if syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB) == nil {
			_ = syscall.Flock(int(f.Fd()), syscall.LOCK_UN)
			return true
		}
		return false
	}
	if free() {
		return "", fmt.Errorf("%s: no process holds this data dir: nothing to stop", dir)
	}
	b, _ := os.ReadFile(path)
	who := strings.TrimSpace(string(b))
	i := strings.LastIndex(who, "(pid ")
	pid := 0
	if i >= 0 {
		pid, _ = strconv.Atoi(strings.TrimSuffix(who[i+len("(pid "):], ")"))
	}
	if pid <= 0 {
		return who, fmt.Errorf("%s: the lock file names no pid (%q)", dir, who)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return who, fmt.Errorf("stop %s: %w", who, err)
	}
	deadline := time.Now().Add(wait)
	for !free() {
		if time.Now().After(deadline) {
			return who, fmt.Errorf("%s did not stop within %s (SIGTERM sent)", who, wait)
		}
		time.Sleep(20 * time.Millisecond) // polling the lock: the kernel frees it when the process ends
	}
	return who, nil
}
