package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// result is one run of the binary.
type result struct {
	stdout, stderr string
	code           int
}

// runEnv runs the binary with extra environment variables and returns its
// outputs and exit status. The 60 s context only stops a runaway test: the
// commands under test bound themselves through their flags, and each case
// asserts the kind of error, which tells a bounded failure from a hang.
func runEnv(t *testing.T, bin string, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, args...)
	cmd.Env = append(os.Environ(), env...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	err := cmd.Run()
	r := result{stdout: stdout.String(), stderr: stderr.String()}
	var ee *exec.ExitError
	switch {
	case err == nil:
	case errors.As(err, &ee):
		r.code = ee.ExitCode()
	default:
		t.Fatalf("%v: %v", args, err)
	}
	if ctx.Err() != nil {
		t.Fatalf("%v did not end within 60s (it should bound itself):\n%s\n%s", args, r.stdout, r.stderr)
	}
	return r
}

// wantOneLineError checks that r failed with exit status 1 and a single
// "termlog: ..." line on stderr that contains every want: the cause, not
// a raw client error or a timeout of some inner retry loop.
func wantOneLineError(t *testing.T, what string, r result, want ...string) {
	t.Helper()
	wantCodeOneLine(t, what, r, 1, want...)
}

// wantUnreadable is wantOneLineError for status failing to read the
// cluster: exit status 2 (1 means it read a degraded cluster).
func wantUnreadable(t *testing.T, what string, r result, want ...string) {
	t.Helper()
	wantCodeOneLine(t, what, r, exitUnreadable, want...)
}

func wantCodeOneLine(t *testing.T, what string, r result, code int, want ...string) {
	t.Helper()
	lines := strings.Split(strings.TrimRight(r.stderr, "\n"), "\n")
	if r.code != code || len(lines) != 1 || !strings.HasPrefix(lines[0], "termlog: ") {
		t.Fatalf("%s: exit %d, want %d and one line on stderr; stderr:\n%s\nstdout:\n%s", what, r.code, code, r.stderr, r.stdout)
	}
	for _, w := range want {
		if !strings.Contains(lines[0], w) {
			t.Errorf("%s: %q does not say %q", what, lines[0], w)
		}
	}
	for _, bad := range []string{"context deadline exceeded", "attempts"} {
		if strings.Contains(lines[0], bad) {
			t.Errorf("%s: %q: a retry loop ran out instead of naming the cause", what, lines[0])
		}
	}
}

// TestCLIFlagsCheckedBeforeStart: every bad flag is refused before
// anything starts (up creates no data dir, roles do not wait for NATS), a
// bare group command prints its help, and TERMLOG_* variables set the
// global flags.
func TestCLIFlagsCheckedBeforeStart(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	// Nothing listens here: a role that passed validation would wait for
	// NATS (and the 60s guard would fail the case).
	nowhere := fmt.Sprintf("nats://127.0.0.1:%d", testkit.FreePort(t))
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	for _, tc := range []struct {
		args []string
		env  []string
		want []string
		code int // 0: 2 for a flag that does not parse or a read command, else 1
	}{
		// A cluster name the stream's name cannot take: a usage error,
		// for every command, before anything connects.
		{args: []string{"status", "--cluster", "a.b"}, want: []string{`--cluster "a.b"`, "only letters, digits"}, code: exitUnreadable},
		{args: []string{"logstore", "--cluster", "a b", "--nats", nowhere}, want: []string{`--cluster "a b"`}, code: exitUnreadable},
		{args: []string{"meta", "run", "--cluster", "", "--nats", nowhere}, want: []string{"empty cluster name"}, code: exitUnreadable},
		{args: []string{"worker", "run", "--endpoint", busy.Addr().String(), "--nats", nowhere}, want: []string{"--endpoint", "address already in use"}, code: 1},
		{args: []string{"worker", "run", "--endpoint", "nohost", "--nats", nowhere}, want: []string{"nohost"}},
		{args: []string{"up", "--lease", "0"}, want: []string{`"--lease"`, "must be > 0"}},
		{args: []string{"up", "--lease", "-3s"}, want: []string{`"--lease"`, "must be > 0"}},
		{args: []string{"up", "--status-every", "0"}, want: []string{`"--status-every"`, "must be > 0"}},
		{args: []string{"up", "--worker-timeout", "0"}, want: []string{`"--worker-timeout"`, "must be > 0"}},
		{args: []string{"up", "--store-timeout", "-1s"}, want: []string{`"--store-timeout"`, "must be > 0"}},
		{args: []string{"up", "--lease", "soon"}, want: []string{`"--lease"`, "want a duration"}},
		{args: []string{"up", "--logdb", "foo"}, want: []string{`--logdb "foo"`, "tiny or default"}},
		{args: []string{"up", "--nats-port", "70000"}, want: []string{"--nats-port 70000"}},
		{args: []string{"up", "--snapshot-every", "-1"}, want: []string{"--snapshot-every -1"}},
		{args: []string{"up", "--log-format", "xml"}, want: []string{`--log-format "xml"`}},
		{args: []string{"up", "--log-level", "loud"}, want: []string{`--log-level "loud"`}},
		{args: []string{"up", "--raft-log-level", "loud"}, want: []string{"loud"}},
		{args: []string{"nats", "--server-log", "loud"}, want: []string{"--server-log", "loud", "info, warn, error or off"}},
		{args: []string{"meta", "run", "--lease", "0", "--nats", nowhere}, want: []string{`"--lease"`, "must be > 0"}},
		{args: []string{"meta", "run", "--worker-timeout", "0", "--nats", nowhere}, want: []string{`"--worker-timeout"`, "must be > 0"}},
		{args: []string{"worker", "run", "--parallelism", "0", "--nats", nowhere}, want: []string{"--parallelism 0"}},
		{args: []string{"logstore", "--logdb", "foo", "--nats", nowhere}, want: []string{`--logdb "foo"`}},
		{args: []string{"logstore", "--restart-grace", "-5s", "--nats", nowhere}, want: []string{"--restart-grace -5s"}},
		{args: []string{"logstore", "--raft-addr", "nope", "--nats", nowhere}, want: []string{"nope"}},
		{args: []string{"nats", "--port", "70000"}, want: []string{"--port 70000"}},
		{args: []string{"up", "--metas", "0"}, want: []string{"--metas must be >= 1"}},
		{args: []string{"meta", "run", "--metrics-addr", "nope", "--nats", nowhere}, want: []string{`--metrics-addr "nope"`}},
		{args: []string{"replay", "--html", "r.html", "--history", "bogus:1", "--nats", nowhere}, want: []string{"--history"}},
		{args: []string{"replay", "--html", "r.html", "--json", "--nats", nowhere}, want: []string{"does not go with --json"}},
		{args: []string{"auth", "nats-context", "--role", "king"}, want: []string{"--role"}},
		{args: []string{"store", "drain", "store-1", "--for", "0", "--nats", nowhere}, want: []string{"--for must be > 0"}},
		{args: []string{"meta", "set-lease", "0"}, want: []string{"must be > 0"}},
		{args: []string{"status", "--timeout", "0"}, want: []string{`"--timeout"`, "must be > 0"}},
		{args: []string{"shard", "recover", "--shard", "1", "--from", "store-1", "--nats", nowhere}, want: []string{"--dry-run", "--yes"}, code: exitUnreadable},
		{args: []string{"shard", "recover", "--from", "store-1", "--dry-run", "--nats", nowhere}, want: []string{"--shard and --from are required"}, code: exitUnreadable},
		{args: []string{"status", "-o", "yaml"}, want: []string{`"yaml"`, "table or json"}},
		{args: []string{"status"}, env: []string{"TERMLOG_TIMEOUT=soon"}, want: []string{`TERMLOG_TIMEOUT="soon"`, "--timeout"}},
		{args: []string{"status"}, env: []string{"TERMLOG_REPLICAS=2"}, want: []string{`TERMLOG_REPLICAS="2"`}},
	} {
		name := strings.Join(append(tc.env, tc.args...), " ")
		data := filepath.Join(t.TempDir(), "data")
		args := tc.args
		if args[0] == "up" {
			// The case's flags last: they win.
			args = append([]string{"up", "--data", data, "--nats-port", "0"}, args[1:]...)
		}
		r := runEnv(t, bin, tc.env, args...)
		// A usage error (a flag that does not parse or that its command
		// refuses) exits 2; an address in use is the machine's state: 1.
		code := tc.code
		if code == 0 {
			code = exitUnreadable
		}
		wantCodeOneLine(t, name, r, code, tc.want...)
		if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: the data dir was made before the flags were checked (%v)", name, err)
		}
	}

	// A bare group command prints its help and starts nothing.
	for group, subs := range map[string][]string{
		"worker": {"run", "list"}, "meta": {"run", "stepdown", "set-lease"}, "store": {"drain", "undrain"}, "auth": {"init", "nats-context"},
	} {
		r := runEnv(t, bin, nil, group, "--nats", nowhere)
		if r.code != 0 || !strings.Contains(r.stdout, "Available Commands:") {
			t.Fatalf("termlog %s: exit %d\n%s\n%s", group, r.code, r.stdout, r.stderr)
		}
		for _, sub := range subs {
			if !strings.Contains(r.stdout, "\n  "+sub+" ") {
				t.Errorf("termlog %s: help lacks %q:\n%s", group, sub, r.stdout)
			}
		}
	}

	// -o json on replay, as on every read command (--json is its alias).
	r1 := runEnv(t, bin, nil, "replay", "--file", filepath.Join("testdata", "replay.jsonl"), "-o", "json")
	r2 := runEnv(t, bin, nil, "replay", "--file", filepath.Join("testdata", "replay.jsonl"), "--json")
	if r1.code != 0 || r1.stdout != r2.stdout || !strings.HasPrefix(r1.stdout, `{"seq":1,`) {
		t.Fatalf("replay -o json: exit %d\n%s\n%s", r1.code, r1.stdout, r1.stderr)
	}

	// TERMLOG_NATS sets --nats; the flag wins over it.
	other := fmt.Sprintf("nats://127.0.0.1:%d", testkit.FreePort(t))
	r := runEnv(t, bin, []string{"TERMLOG_NATS=" + nowhere}, "worker", "list")
	wantUnreadable(t, "TERMLOG_NATS worker list", r, "connect "+nowhere, "nothing is listening")
	r = runEnv(t, bin, []string{"TERMLOG_NATS=" + nowhere}, "status", "--nats", other)
	wantUnreadable(t, "TERMLOG_NATS status --nats", r, "connect "+other, "nothing is listening")
	if r := runEnv(t, bin, []string{"TERMLOG_CLUSTER=east"}, "status", "--help"); !strings.Contains(r.stdout, `[$TERMLOG_CLUSTER]`) || !strings.Contains(r.stdout, `(default "east")`) {
		t.Errorf("status --help with TERMLOG_CLUSTER=east:\n%s", r.stdout)
	}
}

// TestCLIVersion: version names the module and the VCS revision it was
// built from.
func TestCLIVersion(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	head, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Skipf("no git checkout: %v", err)
	}
	bin := filepath.Join(t.TempDir(), "termlog")
	if out, err := exec.Command("go", "build", "-buildvcs=true", "-o", bin, ".").CombinedOutput(); err != nil {
		t.Fatalf("go build -buildvcs=true: %v\n%s", err, out)
	}
	r := runEnv(t, bin, nil, "version", "-o", "json")
	var v Version
	if r.code != 0 || json.Unmarshal([]byte(r.stdout), &v) != nil {
		t.Fatalf("version -o json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	// go stamps no revision in some checkouts (a git worktree): then
	// version says so, and what go version -m says must agree.
	m, err := exec.Command("go", "version", "-m", bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(m), "vcs.revision=") {
		if r := runEnv(t, bin, nil, "version"); v.Revision != "" || !strings.Contains(r.stdout, "revision unknown") {
			t.Fatalf("no vcs.revision in the build info, but version says %q / %+v", r.stdout, v)
		}
		t.Skip("go stamped no VCS revision into this checkout's build (a git worktree?): only the unknown case was checked")
	}
	if v.Module != "github.com/termlog/termlog" || v.Revision != strings.TrimSpace(string(head)) || !strings.HasPrefix(v.Go, "go1.") {
		t.Fatalf("version %+v, want module github.com/termlog/termlog at revision %s", v, head)
	}
	if r := runEnv(t, bin, nil, "version"); r.code != 0 || !strings.Contains(r.stdout, "revision "+v.Revision) {
		t.Fatalf("version: %s", r.stdout)
	}
}

// TestCLIFailFastNamesTheCause runs every interactive command against a
// server it cannot use: each ends within its --timeout with one line that
// names the cause.
func TestCLIFailFastNamesTheCause(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	auth := authDir(t, bin, dir, "auth")
	other := authDir(t, bin, dir, "other")
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	srv := startProc(t, bin, "nats", "--port", fmt.Sprint(port), "--data", filepath.Join(dir, "nats"), "--auth-dir", auth)
	srv.waitFor(t, "NATS JetStream at")
	nowhere := fmt.Sprintf("nats://127.0.0.1:%d", testkit.FreePort(t))
	key := func(role string) string { return filepath.Join(auth, role+".nk") }
	// --timeout 2s: a command that retried instead of naming the cause
	// would end with "did not answer within --timeout" (or the 60s guard).
	c := []string{"--nats", url, "--auth-dir", auth, "--timeout", "2s"}
	export := filepath.Join(dir, "events.jsonl")
	if err := os.WriteFile(export, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		args []string
		want []string
	}{
		// No stream yet: no meta replica ever ran for this cluster.
		{"status, no stream", []string{"status"}, []string{"no stream TERMLOG_TERMLOG", `cluster "termlog"`, "--cluster"}},
		{"worker list, no stream", []string{"worker", "list"}, []string{"no stream TERMLOG_TERMLOG"}},
		{"replay, no stream", []string{"replay"}, []string{"no stream TERMLOG_TERMLOG"}},
		{"replay export, no stream", []string{"replay", "export"}, []string{"no stream TERMLOG_TERMLOG"}},
		// Another role's key.
		{"status as worker", []string{"status", "--creds", key("worker")}, []string{"refused", key("worker"), "may not use JetStream", `"$JS.API.INFO"`, "role observer"}},
		{"replay as worker", []string{"replay", "--creds", key("worker")}, []string{"refused", "may not use JetStream"}},
		{"stepdown as observer", []string{"meta", "stepdown", "--creds", key("observer")}, []string{"refused", "may not send termlog.rpc.stepdown", "Permissions Violation", "role admin"}},
		{"drain as worker", []string{"store", "drain", "store-1", "--creds", key("worker")}, []string{"refused", "may not send termlog.rpc.store.drain"}},
		{"import as observer", []string{"replay", "import", export, "--creds", key("observer")}, []string{"refused", "may not open stream TERMLOG_TERMLOG", "STREAM.CREATE", "role admin"}},
		// A cluster name the server's keys were not made for.
		{"status --cluster wrongname", []string{"status", "--cluster", "wrongname"}, []string{"refused", "may not read stream TERMLOG_WRONGNAME", "another cluster", "check --cluster"}},
		{"worker list --cluster wrongname", []string{"worker", "list", "--cluster", "wrongname"}, []string{"TERMLOG_WRONGNAME", "check --cluster"}},
		// No meta replica runs.
		{"stepdown, no meta", []string{"meta", "stepdown"}, []string{"no meta leader", "termlog.rpc.stepdown", "no responders"}},
		{"drain, no meta", []string{"store", "drain", "store-1"}, []string{"no meta leader", "termlog.rpc.store.drain"}},
		{"undrain, no meta", []string{"store", "undrain", "store-1"}, []string{"no meta leader"}},
		// Keys the server does not know.
		{"status, wrong keys", []string{"status", "--auth-dir", other}, []string{"wrong credentials", "Authorization Violation", "--auth-dir"}},
		{"stepdown, wrong keys", []string{"meta", "stepdown", "--auth-dir", other}, []string{"wrong credentials"}},
		// Nothing listening.
		{"status, nothing listening", []string{"status", "--nats", nowhere}, []string{"connect " + nowhere, "nothing is listening", "connection refused"}},
		{"worker list, nothing listening", []string{"worker", "list", "--nats", nowhere}, []string{"nothing is listening"}},
		{"replay, nothing listening", []string{"replay", "--nats", nowhere}, []string{"nothing is listening"}},
		{"stepdown, nothing listening", []string{"meta", "stepdown", "--nats", nowhere}, []string{"nothing is listening"}},
		{"drain, nothing listening", []string{"store", "drain", "s", "--nats", nowhere}, []string{"nothing is listening"}},
		{"import, nothing listening", []string{"replay", "import", export, "--nats", nowhere}, []string{"nothing is listening"}},
	} {
		// The command words, then c, then the case's flags: the later flag
		// wins, so a case's --nats or --auth-dir overrides c's.
		i := 0
		for i < len(tc.args) && !strings.HasPrefix(tc.args[i], "-") {
			i++
		}
		args := append(append(append([]string{}, tc.args[:i]...), c...), tc.args[i:]...)
		r := runEnv(t, bin, nil, args...)
		// Read commands exit 2 when they cannot read the cluster.
		if tc.args[0] == "status" || tc.args[0] == "worker" || tc.args[0] == "replay" && (len(tc.args) == 1 || tc.args[1] != "import") {
			wantUnreadable(t, tc.name, r, tc.want...)
			continue
		}
		wantOneLineError(t, tc.name, r, tc.want...)
	}

	// status -o json answers a machine on stdout when it fails too.
	r0 := runEnv(t, bin, nil, "status", "-o", "json", "--nats", nowhere, "--timeout", "2s")
	var se statusError
	if err := json.Unmarshal([]byte(r0.stdout), &se); err != nil || r0.code != exitUnreadable || se.Exit != exitUnreadable || !strings.Contains(se.Error, "nothing is listening") {
		t.Fatalf("status -o json, nothing listening: exit %d, stdout %q (%v)", r0.code, r0.stdout, err)
	}

	// A long-running role waits for NATS, but not with keys the server
	// does not know: that does not mend itself.
	r := runEnv(t, bin, nil, "meta", "run", "--nats", url, "--auth-dir", other)
	if r.code != 1 || !strings.Contains(r.stderr, "termlog: connect "+url+" as meta (key "+filepath.Join(other, "meta.nk")+"): wrong credentials") {
		t.Fatalf("meta run with unknown keys: exit %d\n%s", r.code, r.stderr)
	}
	// Nor with another role's key: a permissions violation is permanent.
	// Each role ends at once naming the role the key belongs to and the
	// one it needs (bounded at 10 s by the issue; measured well below).
	for _, tc := range []struct {
		name       string
		args       []string
		key, needs string
	}{
		{"meta run as observer", []string{"meta", "run", "--id", "meta-x"}, "observer", "meta"},
		{"worker run as store", []string{"worker", "run", "--endpoint", fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))}, "store", "worker"},
		{"logstore as worker", []string{"logstore", "--id", "store-x", "--raft-addr", fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)), "--data", filepath.Join(dir, "store-x")}, "worker", "store"},
	} {
		began := time.Now()
		r := runEnv(t, bin, nil, append(tc.args, "--nats", url, "--creds", key(tc.key))...)
		took := time.Since(began)
		if r.code == 0 || !strings.Contains(r.stderr, "termlog: refused: ") || !strings.Contains(r.stderr, "is the "+tc.key+" role's key") || !strings.Contains(r.stderr, "needs the "+tc.needs+" key") {
			t.Fatalf("%s: exit %d after %s\n%s", tc.name, r.code, took, r.stderr)
		}
		if took > 10*time.Second {
			t.Fatalf("%s: exited after %s, want within 10s", tc.name, took)
		}
		t.Logf("%s: exit %d after %s", tc.name, r.code, took.Round(time.Millisecond))
	}

	// A lease bucket without a TTL (made by an older termlog with
	// --lease 0) is refused by a meta replica, and set-lease mends it.
	nc, err := nats.Connect(url, mustRoleOptions(t, auth, natsserver.RoleAdmin)...)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: "termlog_leader", History: 1, Storage: jetstream.FileStorage}); err != nil {
		t.Fatal(err)
	}
	r = runEnv(t, bin, nil, "meta", "run", "--nats", url, "--auth-dir", auth)
	if r.code != 1 || !strings.Contains(r.stderr, "termlog: refused: lease bucket termlog_leader has no TTL") || !strings.Contains(r.stderr, "termlog meta set-lease 3s") {
		t.Fatalf("meta run on a lease bucket without TTL: exit %d\n%s", r.code, r.stderr)
	}
	r = runEnv(t, bin, nil, "meta", "set-lease", "3s", "--nats", url, "--creds", key("observer"), "--timeout", "2s")
	wantOneLineError(t, "set-lease as observer", r, "refused", "may not update the lease bucket")
	r = runEnv(t, bin, nil, "meta", "set-lease", "3s", "--nats", url, "--auth-dir", auth)
	if r.code != 0 || !strings.Contains(r.stdout, "is now 3s (was 0s)") {
		t.Fatalf("meta set-lease 3s: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	kv, err := js.KeyValue(ctx, "termlog_leader")
	if err != nil {
		t.Fatal(err)
	}
	if st, err := kv.Status(ctx); err != nil || st.TTL() != 3*time.Second {
		t.Fatalf("lease bucket after set-lease: %v, %v", st, err)
	}
	srv.stop(t)
}

func mustRoleOptions(t *testing.T, dir string, role natsserver.Role) []nats.Option {
	t.Helper()
	o, err := natsserver.RoleOptions(dir, role)
	if err != nil {
		t.Fatal(err)
	}
	return o
}

// TestCLIRolesWaitForNATS: meta, worker and logstore started before NATS
// wait for it (and say so), run once it is there, log their start and
// stop; a standalone worker deregisters on SIGTERM.
func TestCLIRolesWaitForNATS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	// Every client finds the server and keys through the environment.
	dir, port := rolesEnv(t, bin)
	ep := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	m := startProc(t, bin, "meta", "run", "--id", "meta-1", "--lease", "1s")
	w := startProc(t, bin, "worker", "run", "--endpoint", ep)
	s := startProc(t, bin, "logstore", "--id", "store-1", "--raft-addr", fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t)), "--data", filepath.Join(dir, "store-1"))
	for _, p := range []*upProc{m, w, s} {
		p.waitIn(t, &p.errOut, `"message":"waiting for NATS"`)
	}
	srv := startProc(t, bin, "nats", "--port", fmt.Sprint(port), "--data", filepath.Join(dir, "nats"))
	srv.waitFor(t, "NATS JetStream at")
	m.waitIn(t, &m.errOut, `"message":"connected to NATS"`)
	w.waitIn(t, &w.errOut, `"message":"registered"`)
	s.waitIn(t, &s.errOut, `"message":"store registered"`)
	if r := runEnv(t, bin, nil, "worker", "list", "-o", "json"); r.code != 0 || !strings.Contains(r.stdout, `"endpoint": "`+ep+`"`) {
		t.Fatalf("worker list -o json: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}

	// SIGTERM: the worker deregisters (an event), it is not left to expire.
	w.stop(t)
	w.waitIn(t, &w.errOut, `"message":"worker stopped"`)
	var r result
	if testkit.Poll(t.Context(), 30*time.Second, 100*time.Millisecond, func() error {
		r = runEnv(t, bin, nil, "replay", "--type", "worker.deregistered", "--json")
		if r.code != 0 || !strings.Contains(r.stdout, "worker.deregistered") {
			return errors.New("no event")
		}
		return nil
	}) != nil {
		t.Fatalf("no worker.deregistered event after SIGTERM of the worker:\n%s\n%s\nworker stderr:\n%s", r.stdout, r.stderr, w.errOut.String())
	}
	if r := runEnv(t, bin, nil, "replay", "--type", "worker.expired"); strings.Contains(r.stdout, "worker.expired") {
		t.Fatalf("the worker expired instead of deregistering:\n%s", r.stdout)
	}
	s.stop(t)
	s.waitIn(t, &s.errOut, `"message":"log store stopped"`)
	m.stop(t)
	m.waitIn(t, &m.errOut, `"message":"meta replica stopped"`)
	srv.stop(t)
	if !strings.Contains(srv.out.String(), "NATS stopped") {
		t.Fatalf("nats did not say it stopped:\n%s", srv.out.String())
	}
	for name, p := range map[string]*upProc{"meta": m, "worker": w, "logstore": s} {
		checkJSONLogs(t, name, p.errOut.String())
	}
}

var msTimestamp = regexp.MustCompile(`^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}(Z|[+-]\d\d:\d\d)$`)

// checkJSONLogs checks a process's stderr written into a pipe with the
// default --log-format auto: JSON lines, millisecond timestamps, no key
// twice in a line, durations with their unit, no colours.
func checkJSONLogs(t *testing.T, name, logs string) {
	t.Helper()
	n := 0
	for _, line := range strings.Split(strings.TrimSpace(logs), "\n") {
		if line == "" || strings.HasPrefix(line, "termlog: ") {
			continue
		}
		n++
		if strings.Contains(line, "\x1b[") {
			t.Fatalf("%s: colour in a pipe: %q", name, line)
		}
		dec := json.NewDecoder(strings.NewReader(line))
		keys, err := objectKeys(dec)
		if err != nil {
			t.Fatalf("%s: not a JSON line (%v): %s", name, err, line)
		}
		seen := map[string]bool{}
		for _, k := range keys {
			if seen[k] {
				t.Errorf("%s: key %q twice: %s", name, k, line)
			}
			seen[k] = true
		}
		var doc map[string]any
		if err := json.Unmarshal([]byte(line), &doc); err != nil {
			t.Fatal(err)
		}
		if ts, _ := doc["time"].(string); !msTimestamp.MatchString(ts) {
			t.Errorf("%s: time %q is not RFC 3339 with milliseconds: %s", name, ts, line)
		}
		for _, k := range []string{"took", "retry_in", "lease", "timeout"} {
			if v, ok := doc[k]; ok {
				if _, isString := v.(string); !isString {
					t.Errorf("%s: duration %s=%v has no unit: %s", name, k, v, line)
				}
			}
		}
	}
	if n == 0 {
		t.Fatalf("%s logged nothing", name)
	}
}

// objectKeys reads one JSON object and returns its top-level keys in order,
// repeats included (encoding/json keeps only the last).
func objectKeys(dec *json.Decoder) ([]string, error) {
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fmt.Errorf("want an object, got %v (%v)", tok, err)
	}
	var keys []string
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, err
		}
		keys = append(keys, tok.(string))
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return nil, err
		}
	}
	return keys, nil
}

// TestCLIUpDataDirLeaseAndConventions: a second up on the same data dir is
// refused before it starts NATS; stepdown --wait names the new leader;
// -o json and natscli with the role keys work; an explicit --lease other
// than the cluster's is refused, --update-lease changes it and a later up
// without --lease keeps it.
func TestCLIUpDataDirLeaseAndConventions(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	auth := filepath.Join(data, "auth")
	c := []string{"--nats", url, "--auth-dir", auth}
	upArgs := []string{"up", "--data", data, "--nats-port", fmt.Sprint(port), "--status-every", "500ms"}

	p := startProc(t, bin, upArgs...)
	p.waitFor(t, "healthy after")
	// The same data dir: refused by its lock, before a second NATS opens
	// the store, whatever the port.
	r := runEnv(t, bin, nil, "up", "--data", data, "--nats-port", "0")
	wantOneLineError(t, "second up", r, "data dir "+data+" is in use by termlog up (pid", "another --data")
	if strings.Contains(r.stdout, "NATS JetStream at") {
		t.Fatalf("the second up started NATS:\n%s", r.stdout)
	}
	r = runEnv(t, bin, nil, "nats", "--data", data, "--port", "0")
	wantOneLineError(t, "nats on up's data dir", r, "is in use by termlog up")
	// Another data dir on the same port: the port is named.
	r = runEnv(t, bin, nil, "up", "--data", t.TempDir(), "--nats-port", fmt.Sprint(port))
	wantOneLineError(t, "up on a used port", r, fmt.Sprintf("--nats-port %d", port), "address already in use")
	// A first up that failed leaves no data dir behind.
	fresh := filepath.Join(t.TempDir(), "fresh")
	r = runEnv(t, bin, nil, "up", "--data", fresh, "--nats-port", fmt.Sprint(port))
	wantOneLineError(t, "first up on a used port", r, "address already in use")
	if _, err := os.Stat(fresh); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a failed first up left its data dir %s behind (%v)", fresh, err)
	}

	first := healthy(t, bin, url, auth)
	r = runEnv(t, bin, nil, append([]string{"meta", "stepdown", "--wait"}, c...)...)
	want := regexp.MustCompile(`^` + first.Leader + ` \(term (\d+)\) stepped down; (meta-\d) leads in term (\d+) \(after .+\)\n$`)
	if r.code != 0 || !want.MatchString(r.stdout) {
		t.Fatalf("meta stepdown --wait: exit %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	m := want.FindStringSubmatch(r.stdout)
	var st Status
	// Right after a handover status may say degraded (exit 1: the new
	// leader's health record or recovery is not there yet); it is read.
	if r := runEnv(t, bin, nil, append([]string{"status", "-o", "json"}, c...)...); r.code == exitUnreadable || json.Unmarshal([]byte(r.stdout), &st) != nil {
		t.Fatalf("status -o json: %d\n%s\n%s", r.code, r.stdout, r.stderr)
	}
	newTerm, _ := strconv.ParseUint(m[3], 10, 64)
	if m[2] == first.Leader || newTerm <= first.Term || st.Term < newTerm {
		t.Fatalf("after stepdown --wait (%q): status term %d leader %s; before: term %d leader %s", r.stdout, st.Term, st.Leader, first.Term, first.Leader)
	}
	// Terms count leaders; the lease revision is shown as the fencing token.
	if newTerm != first.Term+1 || first.TermLease == 0 || st.TermLease <= first.TermLease {
		t.Fatalf("stepdown from term %d (lease rev %d) to term %d (status: term %d lease rev %d): want the next term and a newer lease", first.Term, first.TermLease, newTerm, st.Term, st.TermLease)
	}
	if r := runEnv(t, bin, nil, append([]string{"status"}, c...)...); !strings.Contains(r.stdout, fmt.Sprintf("term %d (lease rev %d)", st.Term, st.TermLease)) {
		t.Fatalf("status table does not show the term and its lease revision:\n%s", r.stdout)
	}
	var ws1, ws2 []map[string]any
	r1 := runEnv(t, bin, nil, append([]string{"worker", "list", "-o", "json"}, c...)...)
	r2 := runEnv(t, bin, nil, append([]string{"worker", "list", "--json"}, c...)...)
	if json.Unmarshal([]byte(r1.stdout), &ws1) != nil || json.Unmarshal([]byte(r2.stdout), &ws2) != nil || len(ws1) != 3 || len(ws2) != 3 {
		t.Fatalf("worker list -o json / --json:\n%s\n%s", r1.stdout, r2.stdout)
	}
	natscli(t, bin, c)

	p.stop(t)
	checkJSONLogs(t, "up", p.errOut.String())

	// The cluster's lease is 3s: an explicit 10s is refused, saying why.
	r = runEnv(t, bin, nil, append(upArgs, "--lease", "10s")...)
	if r.code != 1 || !strings.Contains(r.stderr, `termlog: refused: --lease 10s, but the lease of cluster "termlog" is 3s (bucket termlog_leader)`) || !strings.Contains(r.stderr, "--update-lease") {
		t.Fatalf("up --lease 10s on a 3s cluster: exit %d\n%s", r.code, r.stderr)
	}
	p = startProc(t, bin, append(upArgs, "--lease", "10s", "--update-lease")...)
	p.waitFor(t, "lease of cluster termlog changed from 3s to 10s (--update-lease)")
	p.waitFor(t, "healthy after")
	p.stop(t)
	// Without --lease, up runs with the cluster's lease.
	p = startProc(t, bin, upArgs...)
	p.waitFor(t, "healthy after")
	p.waitIn(t, &p.errOut, `"lease":"10s","bucket":"termlog_leader"`)
	p.stop(t)
}

// natscli checks the documented use of natscli with a role's key, when a
// nats binary is on PATH (go install github.com/nats-io/natscli/nats@v0.5.0).
func natscli(t *testing.T, bin string, c []string) {
	t.Helper()
	nats, err := exec.LookPath("nats")
	if err != nil {
		t.Log("natscli (nats) not on PATH: not checked")
		return
	}
	r := runEnv(t, bin, nil, append([]string{"auth", "nats-context", "--role", "observer", "--flags"}, c...)...)
	if r.code != 0 {
		t.Fatalf("auth nats-context --flags: %s", r.stderr)
	}
	flags := strings.Fields(r.stdout)
	out, err := exec.Command(nats, append(flags, "stream", "info", "TERMLOG_TERMLOG", "--json")...).CombinedOutput()
	if err != nil || !strings.Contains(string(out), `"name": "TERMLOG_TERMLOG"`) {
		t.Fatalf("nats %v stream info: %v\n%s", flags, err, out)
	}
	// The observer may read, not write.
	if out, err := exec.Command(nats, append(flags, "stream", "rm", "-f", "TERMLOG_TERMLOG")...).CombinedOutput(); err == nil {
		t.Fatalf("natscli as observer removed the stream:\n%s", out)
	}
	// A saved context (in a private config dir) does the same.
	env := append(os.Environ(), "XDG_CONFIG_HOME="+t.TempDir(), "HOME="+t.TempDir())
	r = runEnv(t, bin, nil, append([]string{"auth", "nats-context", "--role", "admin"}, c...)...)
	save := exec.Command("sh", "-c", strings.Replace(r.stdout, "nats ", nats+" ", 1))
	save.Env = env
	if out, err := save.CombinedOutput(); r.code != 0 || err != nil {
		t.Fatalf("%s: %v\n%s", r.stdout, err, out)
	}
	ls := exec.Command(nats, "--context", "termlog-admin", "stream", "ls", "--names")
	ls.Env = env
	if out, err := ls.CombinedOutput(); err != nil || !strings.Contains(string(out), "TERMLOG_TERMLOG") {
		t.Fatalf("nats --context termlog-admin stream ls: %v\n%s", err, out)
	}
}
