package main

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/replay"
)

// runCLI runs the termlog command in-process and returns what it printed.
func runCLI(t *testing.T, args ...string) (stdout, stderr string, err error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	var out, errOut bytes.Buffer
	root := newRoot()
	root.SetArgs(args)
	root.SetOut(&out)
	root.SetErr(&errOut)
	err = root.ExecuteContext(ctx)
	return out.String(), errOut.String(), err
}

// normalize is the canonical export of a JSONL file: equal for two files
// that hold the same events and raw records, however they are formatted.
func normalize(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var b bytes.Buffer
	if _, err := replay.Export(context.Background(), replay.JSONL(f), &b, replay.TransferOptions{}); err != nil {
		t.Fatalf("%s: %v", path, err)
	}
	return b.String()
}

// TestReplayImportExport runs `termlog replay` against an embedded NATS
// server: import a JSONL file, export it again (same events and raw records),
// check it, replay it as the file and as the stream (same state), and refuse
// a second import into the now non-empty stream.
func TestReplayImportExport(t *testing.T) {
	t.Cleanup(func() { goleak.VerifyNone(t) }) // registered first: runs last
	srv, err := natslog.StartServer(natslog.ServerConfig{DataDir: t.TempDir(), Port: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	live := []string{"--nats", srv.ClientURL(), "--cluster", "replaytest", "replay"}
	in := filepath.Join("testdata", "replay.jsonl")

	out, _, err := runCLI(t, append(live, "import", in)...)
	if err != nil {
		t.Fatalf("import: %v", err)
	}
	if want := "imported 11 events (seq 1..11, 2 raw) into stream TERMLOG_REPLAYTEST\n"; out != want {
		t.Errorf("import printed %q, want %q", out, want)
	}

	exported := filepath.Join(t.TempDir(), "export.jsonl")
	out, _, err = runCLI(t, append(live, "export", "--out", exported)...)
	if err != nil {
		t.Fatalf("export: %v", err)
	}
	if want := "exported 11 events (seq 1..11, 2 raw) to " + exported + "\n"; out != want {
		t.Errorf("export printed %q, want %q", out, want)
	}
	if got, want := normalize(t, exported), normalize(t, in); got != want {
		t.Errorf("export differs from the imported file:\n%s\n---\n%s", got, want)
	}
	// The export is canonical already: it is its own normal form.
	if b, _ := os.ReadFile(exported); string(b) != normalize(t, exported) {
		t.Errorf("export is not in canonical form:\n%s", b)
	}

	out, _, err = runCLI(t, append(live, "--check")...)
	if err != nil {
		t.Fatalf("check: %v", err)
	}
	if !strings.HasPrefix(out, "ok: 11 events, no invariant violated") {
		t.Errorf("check printed %q", out)
	}

	// The stream and the file fold to the same state, hash included.
	fromStream, _, err := runCLI(t, append(live, "--state")...)
	if err != nil {
		t.Fatal(err)
	}
	fromFile, _, err := runCLI(t, "replay", "--file", in, "--state")
	if err != nil {
		t.Fatal(err)
	}
	if fromStream != fromFile {
		t.Errorf("stream and file states differ:\n%s\n---\n%s", fromStream, fromFile)
	}
	for _, want := range []string{"seq=11 term=7 leader=meta-2", "corrupt=2", "anomaly seq=5 term=1 writer=meta-1 type=worker.expired stale-term"} {
		if !strings.Contains(fromStream, want) {
			t.Errorf("state lacks %q:\n%s", want, fromStream)
		}
	}

	out, _, err = runCLI(t, append(live, "--rejected")...)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "1 rejected of 11 events (last seq 11): stale-term 1; by writer: meta-1 1") {
		t.Errorf("rejected printed:\n%s", out)
	}

	// Stopping early on the stream gives what the file gives.
	untilStream, _, err := runCLI(t, append(live, "--until-seq", "5")...)
	if err != nil {
		t.Fatal(err)
	}
	untilFile, _, err := runCLI(t, "replay", "--file", in, "--until-seq", "5")
	if err != nil {
		t.Fatal(err)
	}
	if untilStream != untilFile || !strings.HasPrefix(untilStream, "seq=5 term=7") {
		t.Errorf("--until-seq 5: stream and file differ:\n%s\n---\n%s", untilStream, untilFile)
	}

	follow(t, live)

	_, _, err = runCLI(t, append(live, "import", in)...)
	if !errors.Is(err, replay.ErrNotEmpty) {
		t.Fatalf("second import: got %v, want ErrNotEmpty", err)
	}
	if !strings.Contains(err.Error(), "its last seq is 11") {
		t.Errorf("refusal does not say why: %v", err)
	}
}

// follow runs `replay --follow --json` until it printed the last event, then
// stops it as Ctrl-C would.
func follow(t *testing.T, live []string) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	lines := make(chan string, 64)
	root := newRoot()
	root.SetArgs(append(live, "--follow", "--json", "--type", "worker."))
	root.SetOut(lineWriter(lines))
	root.SetErr(io.Discard)
	done := make(chan error, 1)
	go func() { done <- root.ExecuteContext(ctx) }()
	n := 0
	for n < 8 { // worker.* among the 11, the corrupt worker.promoted included
		select {
		case l := <-lines:
			n++
			if n == 8 && !strings.Contains(l, `"seq":11`) {
				t.Errorf("last followed line: %s", l)
			}
		case err := <-done:
			t.Fatalf("follow ended early: %v", err)
		case <-time.After(30 * time.Second):
			t.Fatalf("follow printed %d lines, want 8", n)
		}
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Errorf("follow ended with %v, want nil after Ctrl-C", err)
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not stop")
	}
}

// lineWriter sends every written line to a channel.
type lineWriter chan string

func (w lineWriter) Write(p []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if l != "" {
			w <- l
		}
	}
	return len(p), nil
}

// TestReplayFlags covers flag parsing and file replays (no NATS needed).
func TestReplayFlags(t *testing.T) {
	in := filepath.Join("testdata", "replay.jsonl")
	for _, tc := range []struct {
		args []string
		want string // substring of stdout, or of the error when err
		err  bool
	}{
		{args: []string{"--until-seq", "5"}, want: "worker 1 epoch=2 running endpoint=10.0.0.5:5688"},
		{args: []string{"--until-time", "2026-11-30T03:00:05Z", "--json"}, want: `"seq":5`},
		{args: []string{"--history", "worker:1"}, want: "final (seq 11): worker 1 is not active since seq 6"},
		{args: []string{"--diff", "5..8"}, want: "+ worker 2 epoch=6 running"},
		{args: []string{"--worker", "2", "--type", "worker.deregistered"}, want: "worker.deregistered     applied               id=2 epoch=6  # worker 2 epoch 6 removed"},
		{args: []string{"--check", "--json"}, want: `{"ok":true,"events":11`},
		{args: []string{"--check", "--rejected"}, want: "pick one of", err: true},
		{args: []string{"--check", "--worker", "1"}, want: "filter the timeline only", err: true},
		{args: []string{"--follow"}, want: "does not work with --file", err: true},
		{args: []string{"--until-time", "yesterday"}, want: "RFC3339", err: true},
		{args: []string{"--diff", "8..5"}, want: "--diff", err: true},
		{args: []string{"--history", "node:1"}, want: "unknown kind", err: true},
	} {
		args := append([]string{"replay", "--file", in}, tc.args...)
		out, _, err := runCLI(t, args...)
		switch {
		case tc.err && err == nil:
			t.Errorf("%v: want an error, got output:\n%s", tc.args, out)
		case tc.err && !strings.Contains(err.Error(), tc.want):
			t.Errorf("%v: error %q lacks %q", tc.args, err, tc.want)
		case !tc.err && err != nil:
			t.Errorf("%v: %v", tc.args, err)
		case !tc.err && !strings.Contains(out, tc.want):
			t.Errorf("%v: output lacks %q:\n%s", tc.args, tc.want, out)
		}
	}

	// A damaged line: a clear error naming it, and the way on.
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	b, err := os.ReadFile(in)
	if err != nil {
		t.Fatal(err)
	}
	lines := strings.SplitAfter(string(b), "\n")
	lines[2] = "{\"seq\":3,\"v\":1,\"ter\n"
	if err := os.WriteFile(bad, []byte(strings.Join(lines, "")), 0o644); err != nil {
		t.Fatal(err)
	}
	_, _, err = runCLI(t, "replay", "--file", bad, "--check")
	if err == nil || !strings.Contains(err.Error(), "line 3: ") || !strings.Contains(err.Error(), "--skip-corrupt") {
		t.Errorf("damaged line: got %v", err)
	}
	out, errOut, err := runCLI(t, "replay", "--file", bad, "--check", "--skip-corrupt")
	if err != nil {
		t.Fatalf("--skip-corrupt: %v", err)
	}
	if !strings.HasPrefix(out, "ok: 11 events") || !strings.Contains(errOut, "skipped corrupt line 3") {
		t.Errorf("--skip-corrupt: stdout %q stderr %q", out, errOut)
	}
}
