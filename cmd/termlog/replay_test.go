package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/spf13/cobra"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections/projtest"
	"github.com/termlog/termlog/projections/projtest/script"
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
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Port: 0})
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
	// --skip-corrupt reads on, and the check still fails (exit 1): the
	// log is not intact.
	out, errOut, err := runCLI(t, "replay", "--file", bad, "--check", "--skip-corrupt")
	var ce *replay.CheckError
	if !errors.As(err, &ce) || !strings.Contains(err.Error(), "1 damaged line(s) skipped (line 3)") || exitCode(&cobra.Command{Annotations: map[string]string{readCommand: "replay"}}, err) != exitDegraded {
		t.Fatalf("--skip-corrupt: %v", err)
	}
	if strings.HasPrefix(out, "ok:") || !strings.Contains(errOut, "skipped corrupt line 3") {
		t.Errorf("--skip-corrupt: stdout %q stderr %q", out, errOut)
	}
}

// runBin runs the built binary and returns its stdout, stderr and exit code.
func runBin(t *testing.T, bin string, args ...string) (stdout, stderr string, code int) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err := cmd.Run()
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		code = ee.ExitCode()
	case err != nil:
		t.Fatalf("%v: %v", args, err)
	}
	return out.String(), errOut.String(), code
}

// writeLines writes a JSONL file made of lines of testdata/replay.jsonl
// (1-based numbers; 0 is a torn line).
func writeLines(t *testing.T, name string, pick ...int) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", "replay.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	src := strings.SplitAfter(string(b), "\n")
	var out strings.Builder
	for _, n := range pick {
		if n == 0 {
			out.WriteString("{\"seq\":4,\"v\":1,\"term\":7,\"wri\n")
			continue
		}
		out.WriteString(src[n-1])
	}
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(out.String()), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// TestCLIReplayForensics runs the built binary on damaged files: --check
// names the first gap, swapped line or duplicate and exits non-zero; a
// filter applies to a duplicate; a corrupt line fails before any output,
// naming the line and its seq.
func TestCLIReplayForensics(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	// testdata/replay.jsonl: line n holds seq n, except line 6 is blank
	// and seq 6..11 are on lines 7..12.
	for _, tc := range []struct {
		name string
		pick []int
		want string
	}{
		{"gap", []int{1, 2, 3, 5, 7}, "check failed at seq 5 (line 4), event 4: seq 5 leaves a gap: seq 4 is missing"},
		{"swapped", []int{1, 2, 3, 5, 4, 7}, "check failed at seq 5 (line 4), event 4: seq 5 is out of order: seq 4 comes after it (line 5)"},
		{"duplicate", []int{1, 2, 3, 4, 5, 2, 7}, "check failed at seq 2 (line 6), event 6: seq 2 is a duplicate: line 2 holds it; seq 6 was expected"},
	} {
		path := writeLines(t, tc.name+".jsonl", tc.pick...)
		out, errOut, code := runBin(t, bin, "replay", "--check", "--file", path)
		if code == 0 || !strings.Contains(errOut, tc.want) || out != "" {
			t.Errorf("%s: exit %d, stdout %q, stderr %q; want non-zero and %q", tc.name, code, out, errOut, tc.want)
		}
	}
	// The whole file passes.
	if out, errOut, code := runBin(t, bin, "replay", "--check", "--file", filepath.Join("testdata", "replay.jsonl")); code != 0 || !strings.HasPrefix(out, "ok: 11 events") {
		t.Errorf("intact file: exit %d\n%s%s", code, out, errOut)
	}

	// --from-seq applies to a duplicated seq as to any other.
	dup := writeLines(t, "dup.jsonl", 1, 2, 3, 4, 5, 7, 8, 9, 5)
	out, errOut, code := runBin(t, bin, "replay", "--file", dup, "--from-seq", "7")
	if code != 0 || strings.Contains(out, "duplicate") || !strings.Contains(out, "\n8 ") {
		t.Errorf("--from-seq 7 with a duplicate seq 5: exit %d\n%s%s", code, out, errOut)
	}
	out, _, _ = runBin(t, bin, "replay", "--file", dup)
	if !strings.Contains(out, "duplicate") {
		t.Errorf("without a filter the duplicate is not shown:\n%s", out)
	}

	// A torn line 4 (seq 4): the error comes first, and alone.
	torn := writeLines(t, "torn.jsonl", 1, 2, 3, 0, 5, 7)
	for _, args := range [][]string{{}, {"--state"}, {"--check"}, {"--to-script", "-"}} {
		out, errOut, code := runBin(t, bin, append([]string{"replay", "--file", torn}, args...)...)
		if code == 0 || out != "" || !strings.Contains(errOut, "line 4: seq 4: malformed event") || !strings.Contains(errOut, "--skip-corrupt") {
			t.Errorf("torn line %v: exit %d, stdout %q, stderr %q", args, code, out, errOut)
		}
	}
}

// TestCLIReplayScript converts a file to a script with the built binary,
// runs the script with the kit, and converts it back: the same events.
func TestCLIReplayScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	in := filepath.Join("testdata", "replay.jsonl")
	dir := t.TempDir()
	s := filepath.Join(dir, "incident.txt")
	_, errOut, code := runBin(t, bin, "replay", "--file", in, "--to-script", s, "--state-at", "5,8")
	if code != 0 || !strings.Contains(errOut, "wrote 11 events (seq 1..11, 11 printed one by one)") {
		t.Fatalf("--to-script: exit %d: %s", code, errOut)
	}
	b, err := os.ReadFile(s)
	if err != nil {
		t.Fatal(err)
	}
	for _, want := range []string{"# the state at seq 5\nstate\n", "# the state at seq 8\nstate\n", "5 rejected stale-term: term 1 < current term 7\n"} {
		if !strings.Contains(string(b), want) {
			t.Errorf("script lacks %q", want)
		}
	}
	projtest.RunFile(t, s)

	jsonl, errOut, code := runBin(t, bin, "replay", "--from-script", s)
	if code != 0 {
		t.Fatalf("--from-script: exit %d: %s", code, errOut)
	}
	back := filepath.Join(dir, "back.jsonl")
	if err := os.WriteFile(back, []byte(jsonl), 0o644); err != nil {
		t.Fatal(err)
	}
	if got, want := normalize(t, back), normalize(t, in); got != want {
		t.Errorf("JSONL -> script -> JSONL differs:\n%s\n---\n%s", got, want)
	}
	// replay takes the converted file.
	if out, errOut, code := runBin(t, bin, "replay", "--check", "--file", back); code != 0 || !strings.HasPrefix(out, "ok: 11 events") {
		t.Errorf("replay of the converted file: exit %d\n%s%s", code, out, errOut)
	}

	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--file", in, "--to-script", "-", "--check"}, "does not go with --check"},
		{[]string{"--file", in, "--state-at", "3"}, "--state-at goes with --to-script"},
		{[]string{"--file", in, "--to-script", "-", "--state-at", "x"}, `--state-at "x"`},
		{[]string{"--from-script", s, "--file", in}, "takes no other replay flag"},
		{[]string{"--from-script", filepath.Join(dir, "missing.txt")}, "no such file"},
		{[]string{"--file", in, "--state", "--tail", "3"}, "--tail N limits the timeline"},
	} {
		out, errOut, code := runBin(t, bin, append([]string{"replay"}, tc.args...)...)
		if code == 0 || !strings.Contains(errOut, tc.want) {
			t.Errorf("%v: exit %d, stderr %q, want %q\n%s", tc.args, code, errOut, tc.want, out)
		}
	}
	// A failed conversion leaves no file under the name asked for.
	torn := writeLines(t, "torn.jsonl", 1, 2, 0)
	partial := filepath.Join(dir, "partial.txt")
	if _, _, code := runBin(t, bin, "replay", "--file", torn, "--to-script", partial); code == 0 {
		t.Error("--to-script of a torn file succeeded")
	}
	if _, err := os.Stat(partial); !os.IsNotExist(err) {
		t.Errorf("a failed --to-script left %s: %v", partial, err)
	}
}

// TestCLIFollowTail follows the live stream with the built binary: --tail 2
// prints the last two events of the history, then the new ones.
func TestCLIFollowTail(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the binary")
	}
	bin := buildBinary(t)
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Port: 0})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	live := []string{"--nats", srv.ClientURL(), "--cluster", "tailtest", "replay"}
	if out, errOut, code := runBin(t, bin, append(live, "import", writeLines(t, "first.jsonl", 1, 2, 3, 4, 5))...); code != 0 {
		t.Fatalf("import: %s%s", out, errOut)
	}
	// --to-script reads the live stream as it reads the file: the same
	// commands with the same outcomes (the lines keep the bytes each holds:
	// the file's line 2 is spaced and has an offset, import stored it
	// re-encoded in UTC).
	fromStream, errOut, code := runBin(t, bin, append(live, "--to-script", "-")...)
	fromFile, _, _ := runBin(t, bin, "replay", "--file", writeLines(t, "same.jsonl", 1, 2, 3, 4, 5), "--to-script", "-")
	outcomes := func(s string) string {
		ds, err := script.Parse(strings.NewReader(s))
		if err != nil {
			t.Fatal(err)
		}
		var b strings.Builder
		for _, d := range ds {
			fmt.Fprintf(&b, "%s\n%s\n", d.Cmd, d.Output)
		}
		return b.String()
	}
	if code != 0 || outcomes(fromStream) != outcomes(fromFile) || !strings.Contains(fromFile, "\nat=2026-11-30T04:00:02+01:00 1 meta-1 worker.registered {\"endpoint\": \"10.0.0.5:5688\", ") {
		t.Errorf("--to-script of the stream: exit %d %s\n%s\n---\n%s", code, errOut, fromStream, fromFile)
	}
	// import takes what --from-script makes of a script.
	script := filepath.Join(t.TempDir(), "s.txt")
	if _, errOut, code := runBin(t, bin, "replay", "--file", filepath.Join("testdata", "replay.jsonl"), "--to-script", script); code != 0 {
		t.Fatal(errOut)
	}
	jsonl, errOut, code := runBin(t, bin, "replay", "--from-script", script)
	back := filepath.Join(t.TempDir(), "back.jsonl")
	if err := os.WriteFile(back, []byte(jsonl), 0o644); code != 0 || err != nil {
		t.Fatalf("--from-script: %v %s", err, errOut)
	}
	if out, errOut, code := runBin(t, bin, "--nats", srv.ClientURL(), "--cluster", "fromscript", "replay", "import", back); code != 0 || !strings.Contains(out, "imported 11 events (seq 1..11, 2 raw)") {
		t.Errorf("import of a converted script: exit %d\n%s%s", code, out, errOut)
	}
	p := startProc(t, bin, append(live, "--follow", "--tail", "2", "--json")...)
	p.waitFor(t, `"seq":5`)
	// Only the tail of the history: seq 4 and 5.
	if got := p.out.String(); strings.Contains(got, `"seq":3`) || !strings.Contains(got, `"seq":4`) {
		t.Fatalf("--tail 2 printed:\n%s", got)
	}
	// A new event is printed as it is appended.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	nc, err := nats.Connect(srv.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "tailtest", Bind: true})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Append(ctx, 5, events.Event{Term: 7, Writer: "meta-2", At: time.Now(), Data: events.WorkerExpired{ID: 1, Epoch: 2}}); err != nil {
		t.Fatal(err)
	}
	p.waitFor(t, `"seq":6`)
	if err := p.cmd.Process.Signal(syscall.SIGINT); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-p.done:
		if err != nil {
			t.Fatalf("follow ended with %v after Ctrl-C\n%s", err, p.errOut.String())
		}
	case <-time.After(30 * time.Second):
		t.Fatal("follow did not stop on Ctrl-C")
	}
	if n := strings.Count(p.out.String(), "\n"); n != 3 {
		t.Errorf("followed %d lines, want 3:\n%s", n, p.out.String())
	}
}

// TestCLIUpToScript is the README's "From incident to unit test" with the
// built binary: up, a leader handoff (meta stepdown), export, convert to a
// script, which passes with the kit as written and holds the handoff.
func TestCLIUpToScript(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	auth := filepath.Join(data, "auth")
	p := startUp(t, bin, data, port)
	first := healthy(t, bin, url, auth)
	if out, err := run(t, bin, "meta", "stepdown", "--nats", url, "--auth-dir", auth); err != nil {
		t.Fatalf("meta stepdown: %v\n%s", err, out)
	}
	handedOff(t, bin, url, auth, first)
	dir := t.TempDir()
	export := filepath.Join(dir, "incident.jsonl")
	if out, err := run(t, bin, "replay", "export", "--out", export, "--nats", url, "--auth-dir", auth); err != nil {
		t.Fatalf("replay export: %v\n%s", err, out)
	}
	p.stop(t)

	s := filepath.Join(dir, "incident.txt")
	if out, errOut, code := runBin(t, bin, "replay", "--file", export, "--to-script", s); code != 0 {
		t.Fatalf("--to-script: exit %d\n%s%s", code, out, errOut)
	}
	b, err := os.ReadFile(s)
	if err != nil {
		t.Fatal(err)
	}
	// Two terms, each opening an apply block, the second by another meta.
	if n := strings.Count(string(b), "applied: term "); n < 2 {
		t.Fatalf("the script holds %d term.started, want the handoff:\n%s", n, b)
	}
	projtest.RunFile(t, s)
	jsonl, errOut, code := runBin(t, bin, "replay", "--from-script", s)
	if code != 0 {
		t.Fatalf("--from-script: exit %d: %s", code, errOut)
	}
	back := filepath.Join(dir, "back.jsonl")
	if err := os.WriteFile(back, []byte(jsonl), 0o644); err != nil {
		t.Fatal(err)
	}
	if normalize(t, back) != normalize(t, export) {
		t.Error("the export converted to a script and back is not the export")
	}
}

// --term and --writer select the timeline's events by their envelope, and
// --file - reads the export from stdin.
func TestReplayTermWriterStdin(t *testing.T) {
	in, err := os.ReadFile(filepath.Join("testdata", "replay.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	seqs := func(out string) string {
		var got []string
		for _, l := range strings.Split(strings.TrimSpace(out), "\n")[1:] { // after the header
			got = append(got, strings.Fields(l)[0])
		}
		return strings.Join(got, ",")
	}
	run := func(stdin []byte, args ...string) (string, error) {
		var out, errOut bytes.Buffer
		root := newRoot()
		root.SetArgs(append([]string{"replay"}, args...))
		root.SetOut(&out)
		root.SetErr(&errOut)
		root.SetIn(bytes.NewReader(stdin))
		err := root.ExecuteContext(context.Background())
		return out.String(), err
	}
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--term", "1"}, "1,2,3,5"},
		{[]string{"--writer", "meta-2"}, "4,6,7,8,11"},
		{[]string{"--term", "7", "--writer", "meta-x"}, "9"},
		{[]string{"--term", "7", "--type", "worker.expired"}, "7"},
	} {
		out, err := run(in, append([]string{"--file", "-"}, tc.args...)...)
		if err != nil {
			t.Fatalf("%v: %v", tc.args, err)
		}
		if got := seqs(out); got != tc.want {
			t.Errorf("%v: seqs %s, want %s\n%s", tc.args, got, tc.want, out)
		}
	}
	if out, err := run(in, "--file", "-", "--check"); err != nil || !strings.HasPrefix(out, "ok: 11 events") {
		t.Errorf("--check from stdin: %v\n%s", err, out)
	}
	if _, err := run(in, "--file", "-", "--check", "--term", "1"); err == nil || !strings.Contains(err.Error(), "--term, --writer") {
		t.Errorf("--term with --check: %v", err)
	}
}

// replay diff A B names the first seq after which two views differ, the
// entry each folded there and how; a snapshot is compared at its seq.
func TestReplayDiffViews(t *testing.T) {
	a := filepath.Join("testdata", "replay.jsonl")
	in, err := os.ReadFile(a)
	if err != nil {
		t.Fatal(err)
	}
	// B: meta-1's late expiry (seq 5) carries the new term, as if a rule
	// had stopped fencing it.
	stale := `"seq":5,"v":1,"term":1,`
	if !bytes.Contains(in, []byte(stale)) {
		t.Fatal("no stale expiry at seq 5")
	}
	dir := t.TempDir()
	b := filepath.Join(dir, "b.jsonl")
	if err := os.WriteFile(b, bytes.Replace(in, []byte(stale), []byte(`"seq":5,"v":1,"term":7,`), 1), 0o644); err != nil {
		t.Fatal(err)
	}
	out, _, err := runCLI(t, "replay", "diff", a, b)
	if err == nil || !strings.Contains(err.Error(), "the views differ after seq 5") {
		t.Fatalf("want the views to differ after seq 5, got %v\n%s", err, out)
	}
	for _, want := range []string{
		"the views differ first after seq 5\n",
		"replay.jsonl: 5 ", "- anomaly seq=5 term=1 writer=meta-1 type=worker.expired stale-term", "+ anomaly seq=5 term=7 writer=meta-1 type=worker.expired writer-mismatch", "rejected stale-term", "# term 1 < current term 7",
		"b.jsonl:      5 ", "applied", "# worker 1 epoch 2 removed; warning writer-mismatch: writer meta-1 did not start term 7 (its leader is meta-2)",
		"how b.jsonl differs from replay.jsonl:\n",
		"- worker 1 epoch=2 running endpoint=10.0.0.5:5688",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if out, _, err := runCLI(t, "replay", "diff", a, a); err != nil || !strings.HasPrefix(out, "same: ") || !strings.Contains(out, "up to seq 11") {
		t.Errorf("a file and itself: %v\n%s", err, out)
	}
	// A replica's snapshot after seq 8 against each log.
	f := replay.NewFolder()
	if err := replay.JSONL(bytes.NewReader(in)).Read(context.Background(), func(it replay.Item) error {
		if it.Seq <= 8 {
			f.Fold(it)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	snap := filepath.Join(dir, "snap.json")
	if err := os.WriteFile(snap, f.State().EncodeSnapshot(), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, _, err := runCLI(t, "replay", "diff", snap, a); err != nil || !strings.Contains(out, "same: ") || !strings.Contains(out, "seq 8") {
		t.Errorf("snapshot vs its log: %v\n%s", err, out)
	}
	if out, _, err := runCLI(t, "replay", "diff", snap, b); err == nil || !strings.Contains(out, "the views differ first after seq 8") {
		t.Errorf("snapshot vs the other log: %v\n%s", err, out)
	}
}
