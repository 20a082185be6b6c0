package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
)

// buildBinary builds cmd/termlog once per test run, as a user would.
func buildBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "termlog")
	cmd := exec.Command("go", "build", "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

// authDir makes role keys with `auth init` in a new dir under dir.
func authDir(t *testing.T, bin, dir, name string) string {
	t.Helper()
	auth := filepath.Join(dir, name)
	if out, err := run(t, bin, "auth", "init", "--dir", auth); err != nil {
		t.Fatalf("auth init: %v\n%s", err, out)
	}
	return auth
}

// rolesEnv prepares a cluster of separate role processes: a temp dir, role
// keys in <dir>/auth, and a free NATS port, with TERMLOG_NATS and
// TERMLOG_AUTH_DIR set for every command the test runs.
func rolesEnv(t *testing.T, bin string) (dir string, port int) {
	t.Helper()
	dir = t.TempDir()
	auth := authDir(t, bin, dir, "auth")
	port = testkit.FreePort(t)
	t.Setenv("TERMLOG_NATS", fmt.Sprintf("nats://127.0.0.1:%d", port))
	t.Setenv("TERMLOG_AUTH_DIR", auth)
	return dir, port
}

type upProc struct {
	cmd    *exec.Cmd
	out    syncBuffer
	errOut syncBuffer
	done   chan error
}

// syncBuffer is a bytes.Buffer the test may read while the process writes.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// startUp runs up on data with extra flags.
func startUp(t *testing.T, bin, data string, port int, extra ...string) *upProc {
	t.Helper()
	return startProc(t, bin, append([]string{"up", "--data", data, "--nats-port", fmt.Sprint(port), "--log-level", "warn", "--status-every", "500ms"}, extra...)...)
}

// startProc runs the binary with args in the background; the test's
// cleanup kills it unless it was stopped.
func startProc(t *testing.T, bin string, args ...string) *upProc {
	t.Helper()
	p := &upProc{done: make(chan error, 1)}
	p.cmd = exec.Command(bin, args...)
	p.cmd.Stdout, p.cmd.Stderr = &p.out, &p.errOut
	if err := p.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() { p.done <- p.cmd.Wait() }()
	t.Cleanup(func() {
		if p.cmd.ProcessState == nil {
			_ = p.cmd.Process.Kill()
			<-p.done
		}
	})
	return p
}

// stop sends SIGTERM and waits for a clean exit.
func (p *upProc) stop(t *testing.T) {
	t.Helper()
	if err := p.cmd.Process.Signal(syscall.SIGTERM); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("up exited with %v\nstdout:\n%s\nstderr:\n%s", err, p.out.String(), p.errOut.String())
		}
	case <-time.After(60 * time.Second):
		t.Fatal("up did not exit within 60s of SIGTERM")
	}
}

// waitFor polls up's output for a line.
func (p *upProc) waitFor(t *testing.T, what string) {
	t.Helper()
	p.waitIn(t, &p.out, what)
}

// waitIn polls one of the process's outputs for a string.
func (p *upProc) waitIn(t *testing.T, b *syncBuffer, what string) {
	t.Helper()
	printed := func() error {
		if !strings.Contains(b.String(), what) {
			return errors.New("not printed")
		}
		return nil
	}
	if testkit.Poll(context.Background(), 60*time.Second, 50*time.Millisecond, printed) != nil {
		t.Fatalf("%s never printed %q:\n%s\nstderr:\n%s", p.cmd.Args[1], what, p.out.String(), p.errOut.String())
	}
}

func run(t *testing.T, bin string, args ...string) (string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, bin, args...).CombinedOutput()
	return string(out), err
}

// healthy polls status --json until a leader, 3 running workers and
// 2 shards with 3 members each are projected, and returns that status.
func healthy(t *testing.T, bin, url, auth string) Status {
	t.Helper()
	s, last, ok := pollStatus(bin, url, auth, 90*time.Second, func(s Status) bool {
		return s.LeaseHolder != "" && s.Leader == s.LeaseHolder && running(s) == 3 && fullShards(s) == 2
	})
	if !ok {
		t.Fatalf("not healthy within 90s; last status:\n%s", last)
	}
	return s
}

// handedOff polls status --json until a replica other than first's leader
// leads a newer term and holds the lease (after meta stepdown), and
// returns that status.
func handedOff(t *testing.T, bin, url, auth string, first Status) Status {
	t.Helper()
	s, last, ok := pollStatus(bin, url, auth, 30*time.Second, func(s Status) bool {
		return s.Term > first.Term && s.Leader == s.LeaseHolder && s.Leader != first.Leader
	})
	if !ok {
		t.Fatalf("no handoff after stepdown within 30s:\n%s", last)
	}
	return s
}

// pollStatus polls status --json every 200 ms until ok holds for it, or
// within passes; it returns the last status and output.
func pollStatus(bin, url, auth string, within time.Duration, ok func(Status) bool) (s Status, last string, held bool) {
	err := testkit.Poll(context.Background(), within, 200*time.Millisecond, func() error {
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
		defer cancel()
		b, err := exec.CommandContext(ctx, bin, "status", "--json", "--nats", url, "--auth-dir", auth).CombinedOutput()
		last = string(b)
		if err != nil {
			return err
		}
		s = Status{}
		if err := json.Unmarshal(b, &s); err != nil {
			return err
		}
		if !ok(s) {
			return errors.New("not yet")
		}
		return nil
	})
	return s, last, err == nil
}

func running(s Status) int {
	n := 0
	for _, w := range s.Workers {
		if w.State == "running" {
			n++
		}
	}
	return n
}

func fullShards(s Status) int {
	n := 0
	for _, sh := range s.Shards {
		if len(sh.Members) == 3 && sh.Operator == "" {
			n++
		}
	}
	return n
}

// TestCLIUpStatusReplayRestart runs the binary as a user would: up on a temp
// dir, status until healthy, export and check the log, SIGTERM, up again.
func TestCLIUpStatusReplayRestart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	auth := filepath.Join(data, "auth") // up generates the role keys there

	p := startUp(t, bin, data, port)
	first := healthy(t, bin, url, auth)
	p.waitFor(t, "healthy after")
	// up serves the console on a free loopback port, its URL next to the
	// healthy line; it answers with status's judgement.
	p.waitFor(t, "web console: http://127.0.0.1:")
	_, web, _ := strings.Cut(p.out.String(), "web console: ")
	web, _, _ = strings.Cut(web, "\n")
	testkit.Eventually(t, 10*time.Second, "the console sees the leader", func() bool {
		resp, err := http.Get(web + "api/v1/status?brief=1")
		if err != nil {
			return false
		}
		defer resp.Body.Close()
		var s struct {
			Leader      string `json:"leader"`
			LeaseHolder string `json:"lease_holder"`
		}
		return json.NewDecoder(resp.Body).Decode(&s) == nil && s.Leader == first.Leader && s.LeaseHolder == first.Leader
	})
	if out, err := run(t, bin, "web", "--addr", "0.0.0.0:0", "--nats", url, "--auth-dir", auth); err == nil || !strings.Contains(out, "needs a TLS certificate and key") {
		t.Fatalf("web on every interface without TLS: %v\n%s", err, out)
	}
	if !strings.Contains(p.out.String(), "credentials: generated role keys in "+auth) {
		t.Fatalf("up did not say where the credentials are:\n%s", p.out.String())
	}
	for _, role := range []string{"admin", "meta", "worker", "store", "observer"} {
		if fi, err := os.Stat(filepath.Join(auth, role+".nk")); err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s key: %v (mode %v), want mode 0600", role, err, fi)
		}
	}
	// The server is not open: no keys, or keys it does not know, are refused.
	other := filepath.Join(t.TempDir(), "other")
	if out, err := run(t, bin, "auth", "init", "--dir", other); err != nil {
		t.Fatalf("auth init: %v\n%s", err, out)
	}
	if out, err := run(t, bin, "status", "--nats", url, "--auth-dir", other); err == nil || !strings.Contains(out, "Authorization Violation") {
		t.Fatalf("status with unknown keys: %v\n%s", err, out)
	}
	// An observer may not step the leader down; the admin may (below).
	if out, err := run(t, bin, "meta", "stepdown", "--nats", url, "--creds", filepath.Join(auth, "observer.nk")); err == nil || !strings.Contains(out, "Permissions Violation") {
		t.Fatalf("an observer stepped the leader down:\n%s", out)
	}

	// A header and one line per worker.
	out, err := run(t, bin, "worker", "list", "--nats", url, "--auth-dir", auth)
	if err != nil || strings.Count(strings.TrimSpace(out), "\n") != 3 || !strings.HasPrefix(out, "ID ") {
		t.Fatalf("worker list: %v\n%s", err, out)
	}
	// Kill the leader from another terminal: another replica takes over.
	if out, err := run(t, bin, "meta", "stepdown", "--nats", url, "--auth-dir", auth); err != nil || !strings.Contains(out, "stepping down") {
		t.Fatalf("meta stepdown: %v\n%s", err, out)
	}
	first = handedOff(t, bin, url, auth, first)

	export := filepath.Join(t.TempDir(), "events.jsonl")
	if out, err := run(t, bin, "replay", "export", "--out", export, "--nats", url, "--auth-dir", auth); err != nil {
		t.Fatalf("replay export: %v\n%s", err, out)
	}
	if out, err := run(t, bin, "replay", "--check", "--file", export); err != nil || !strings.HasPrefix(out, "ok:") {
		t.Fatalf("replay --check: %v\n%s", err, out)
	}
	report := filepath.Join(t.TempDir(), "report.html")
	if out, err := run(t, bin, "replay", "--html", report, "--file", export, "--history", "worker:1"); err != nil || !strings.Contains(out, "wrote "+report) {
		t.Fatalf("replay --html: %v\n%s", err, out)
	}
	if b, err := os.ReadFile(report); err != nil || !strings.HasPrefix(string(b), "<!doctype html>") || !strings.Contains(string(b), "data-z=") {
		t.Fatalf("report.html: %v", err)
	}
	if out, err := run(t, bin, "replay", "--history", fmt.Sprintf("worker:%d", first.Workers[0].ID), "--file", export); err != nil || !strings.Contains(out, "worker.registered") {
		t.Fatalf("replay --history: %v\n%s", err, out)
	}
	p.stop(t)
	if !strings.Contains(p.out.String(), "healthy after") || !strings.Contains(p.out.String(), "stopped; data kept in") {
		t.Fatalf("up output:\n%s", p.out.String())
	}

	// Up again on the same data: the same stream, a later term.
	p2 := startUp(t, bin, data, port)
	second := healthy(t, bin, url, auth)
	p2.waitFor(t, "healthy after")
	if second.Term <= first.Term || second.Seq <= first.Seq {
		t.Fatalf("restart did not resume: term %d -> %d, seq %d -> %d", first.Term, second.Term, first.Seq, second.Seq)
	}
	out, err = run(t, bin, "replay", "--type", "term.started", "--nats", url, "--auth-dir", auth)
	if err != nil || strings.Count(out, "term.started") < 2 {
		t.Fatalf("term history after restart: %v\n%s", err, out)
	}
	// The first up's leader stored a snapshot on its clean shutdown; status
	// and replay of a seq start from it and agree with a full fold.
	if si := second.FromSnapshot; si == nil || si.Seq < first.Seq || si.Seq >= second.Seq {
		t.Fatalf("status after restart: from snapshot %+v, want one between seq %d and %d", si, first.Seq, second.Seq)
	}
	type stateDoc struct {
		Hash         string          `json:"hash"`
		FromSnapshot json.RawMessage `json:"from_snapshot"`
	}
	var hashes []string
	for _, extra := range []string{"--state", "--no-snapshot"} {
		cmd := exec.Command(bin, "replay", "--until-seq", fmt.Sprint(second.Seq), "--json", extra, "--nats", url, "--auth-dir", auth)
		var stderr bytes.Buffer
		cmd.Stderr = &stderr
		out, err := cmd.Output()
		var doc stateDoc
		if err != nil || json.Unmarshal(out, &doc) != nil {
			t.Fatalf("replay --until-seq %d %s: %v\n%s\n%s", second.Seq, extra, err, out, stderr.String())
		}
		if fromSnap := len(doc.FromSnapshot) > 0; fromSnap != (extra != "--no-snapshot") || fromSnap != strings.Contains(stderr.String(), "starting from snapshot") {
			t.Fatalf("replay --until-seq %d %s: from snapshot %s, stderr %q", second.Seq, extra, doc.FromSnapshot, stderr.String())
		}
		hashes = append(hashes, doc.Hash)
	}
	if hashes[0] != hashes[1] || hashes[0] == "" {
		t.Fatalf("replay from a snapshot: hash %s, from seq 1: %s", hashes[0], hashes[1])
	}
	p2.stop(t)
	if _, err := os.Stat(filepath.Join(data, "nats")); err != nil {
		t.Fatalf("data dir: %v", err)
	}
}
