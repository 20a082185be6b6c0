package replay_test

import (
	"bytes"
	"context"
	"errors"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/projections/projtest"
	"github.com/termlog/termlog/projections/projtest/script"
	"github.com/termlog/termlog/replay"
)

// toScript converts a JSONL log to a script.
func toScript(t *testing.T, jsonl []byte, o replay.ScriptOptions) string {
	t.Helper()
	var out bytes.Buffer
	if _, err := replay.ToScript(context.Background(), replay.JSONL(bytes.NewReader(jsonl)), o, &out); err != nil {
		t.Fatal(err)
	}
	return out.String()
}

// fromScript converts a script back to JSONL.
func fromScript(t *testing.T, s string) (jsonl, diag string) {
	t.Helper()
	var out, d bytes.Buffer
	if _, err := replay.FromScript(strings.NewReader(s), &out, &d); err != nil {
		t.Fatalf("%v\n%s", err, s)
	}
	return out.String(), d.String()
}

// canonical is the export of a JSONL log: equal for logs holding the same
// entries in the same order.
func canonical(t *testing.T, jsonl []byte) string {
	t.Helper()
	var b bytes.Buffer
	if _, err := replay.Export(context.Background(), replay.JSONL(bytes.NewReader(jsonl)), &b, replay.TransferOptions{}); err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func writeScript(t *testing.T, s string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "script.txt")
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

// logs are the test logs a script can hold (damaged lines cannot be kept),
// the real `up` export with a stepdown among them, and a generated mix.
func scriptLogs(t *testing.T) map[string][]byte {
	t.Helper()
	logs := map[string][]byte{}
	for _, name := range []string{"handoff", "raw", "shards", "order", "gap", "late", "up-stepdown"} {
		b, err := os.ReadFile(filepath.Join("testdata", "logs", name+".jsonl"))
		if err != nil {
			t.Fatal(err)
		}
		logs[name] = b
	}
	mix, err := eventgen.Mix(3000, 40)
	if err != nil {
		t.Fatal(err)
	}
	var b bytes.Buffer
	for i, ev := range mix.Events {
		ev.Seq = uint64(i + 1)
		if err := events.WriteJSONL(&b, ev); err != nil {
			t.Fatal(err)
		}
	}
	logs["eventgen"] = b.Bytes()
	return logs
}

// JSONL -> script -> JSONL is the identity on the entries (raw records,
// duplicates, gaps and out-of-order seqs included), and the script passes
// with the kit as written.
func TestScriptRoundTrip(t *testing.T) {
	for name, jsonl := range scriptLogs(t) {
		t.Run(name, func(t *testing.T) {
			s := toScript(t, jsonl, replay.ScriptOptions{StateAt: []uint64{2, 5}})
			back, diag := fromScript(t, s)
			if diag != "" {
				t.Errorf("from-script noted:\n%s", diag)
			}
			if got, want := canonical(t, []byte(back)), canonical(t, jsonl); got != want {
				t.Fatalf("round trip differs:\n%s\n---\n%s", got, want)
			}
			projtest.RunFile(t, writeScript(t, s))
		})
	}
}

// The real export of `termlog up` with a `meta stepdown` (replay/testdata/
// logs/up-stepdown.jsonl): the script holds the handoff, passes with the
// kit, and ends with the new leader's state.
func TestScriptOfUpExport(t *testing.T) {
	jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", "up-stepdown.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s := toScript(t, jsonl, replay.ScriptOptions{Source: "up-stepdown.jsonl", StateAt: []uint64{14}})
	for _, want := range []string{
		"# term 15, leader meta-2\napply\nat=2026-12-01T08:57:41.197",
		"15 applied: term 15 leader meta-2\n",
		"# the state at seq 14\nstate\n----\nseq=14 term=1 leader=meta-1",
		"# the state at the end (seq 15)\nstate\n----\nseq=15 term=15 leader=meta-2",
		"check\n----\nok\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	projtest.RunFile(t, writeScript(t, s))
}

// The first report's interleaving as a log converts to a script with the
// rejection, the no-op and the final state of projections/testdata/handoff,
// the hand-written script of that report.
func TestScriptReproducesHandoff(t *testing.T) {
	jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", "handoff.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	got := outputs(t, toScript(t, jsonl, replay.ScriptOptions{}))
	f, err := os.Open(filepath.Join("..", "projections", "testdata", "handoff"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	hand, err := script.Parse(f)
	if err != nil {
		t.Fatal(err)
	}
	var want []string
	var finalState string
	for _, d := range hand {
		switch d.Cmd {
		case "apply":
			for _, l := range strings.SplitAfter(d.Output, "\n") {
				if strings.Contains(l, " rejected ") || strings.Contains(l, " noop") {
					want = append(want, l)
				}
			}
		case "state":
			finalState = d.Output
		}
	}
	if len(want) != 2 || !strings.Contains(want[0], "5 rejected stale-term: term 1 < current term 7") {
		t.Fatalf("handoff's rejections: %q", want)
	}
	for _, l := range want {
		if !strings.Contains(got["apply"], l) {
			t.Errorf("converted script lacks %q:\n%s", l, got["apply"])
		}
	}
	if got["state"] != finalState {
		t.Errorf("final state:\n%s\nhandoff's:\n%s", got["state"], finalState)
	}
}

// outputs joins the outputs of a script's commands by command.
func outputs(t *testing.T, s string) map[string]string {
	t.Helper()
	ds, err := script.Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	m := map[string]string{}
	for _, d := range ds {
		m[d.Cmd] += d.Output
	}
	return m
}

// A filter prints the events it selects one by one; the others are folded
// in quiet blocks, so the selected outcomes are those of the whole log.
func TestScriptFilter(t *testing.T) {
	jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", "handoff.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s := toScript(t, jsonl, replay.ScriptOptions{Filter: replay.Filter{Worker: 1, FromSeq: 4}, UntilSeq: 7})
	got := outputs(t, s)
	want := "seq 1..4: applied=4\n" + "5 rejected stale-term: term 1 < current term 7\n" +
		"6 applied: worker 2 epoch 6 at 10.0.0.5:5688, supersedes worker 1\n" + "7 noop: no active worker 1 epoch 2\n"
	if got["apply"] != want {
		t.Errorf("apply outputs:\n%s\nwant:\n%s\nscript:\n%s", got["apply"], want, s)
	}
	if !strings.HasPrefix(got["state"], "seq=7 ") {
		t.Errorf("the script does not end at seq 7:\n%s", got["state"])
	}
	projtest.RunFile(t, writeScript(t, s))
}

// TestScriptHelper runs the script named by $PROJTEST_SCRIPT with the kit;
// TestScriptChangedOutcome runs it as a child process, as `go test` would.
func TestScriptHelper(t *testing.T) {
	path := os.Getenv("PROJTEST_SCRIPT")
	if path == "" {
		t.Skip("run by TestScriptChangedOutcome")
	}
	projtest.RunFile(t, path)
}

// A change that alters an outcome fails the converted script with a diff
// naming the seq: here the stale expiry of the handoff is rewritten as if it
// had been stamped with the new term — what a rule that stopped rejecting it
// would fold (and, since meta-1 did not start term 7, a writer-mismatch).
func TestScriptChangedOutcome(t *testing.T) {
	if testing.Short() {
		t.Skip("runs the test binary")
	}
	jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", "handoff.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	s := toScript(t, jsonl, replay.ScriptOptions{})
	const stale = "1 meta-1 worker.expired {\"id\":1,\"epoch\":2}\n"
	if strings.Count(s, stale) != 1 {
		t.Fatalf("the stale expiry is not in the script once:\n%s", s)
	}
	changed := strings.Replace(s, stale, "7 meta-1 worker.expired {\"id\":1,\"epoch\":2}\n", 1)
	run := func(s string) (string, error) {
		cmd := exec.Command(os.Args[0], "-test.run=^TestScriptHelper$", "-test.count=1")
		cmd.Env = append(os.Environ(), "PROJTEST_SCRIPT="+writeScript(t, s))
		out, err := cmd.CombinedOutput()
		return string(out), err
	}
	if out, err := run(s); err != nil {
		t.Fatalf("the script as written fails: %v\n%s", err, out)
	}
	out, err := run(changed)
	if err == nil {
		t.Fatalf("the changed script passed:\n%s", out)
	}
	for _, want := range []string{
		"output didn't match expected",
		"-5 rejected stale-term: term 1 < current term 7",
		"+5 applied: worker 1 epoch 2 removed",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("failure output lacks %q:\n%s", want, out)
		}
	}
	// from-script reads it and notes where today's outcome differs.
	if _, diag := fromScript(t, changed); !strings.Contains(diag, "line 16: apply: today's output differs from the script's") {
		t.Errorf("from-script did not note the changed outcome: %q", diag)
	}
	// -rewrite writes today's outcomes into the file; then it passes.
	path := writeScript(t, changed)
	cmd := exec.Command(os.Args[0], "-test.run=^TestScriptHelper$", "-test.count=1", "-rewrite")
	cmd.Env = append(os.Environ(), "PROJTEST_SCRIPT="+path)
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("-rewrite: %v\n%s", err, out)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(string(b), "\n5 applied: worker 1 epoch 2 removed; warning writer-mismatch: writer meta-1 did not start term 7 (its leader is meta-2)\n") {
		t.Errorf("-rewrite did not write the new outcome:\n%s", b)
	}
	if out, err := run(string(b)); err != nil {
		t.Errorf("the rewritten script fails: %v\n%s", err, out)
	}
}

// BenchmarkToScript converts a generated log of 20k events to a script.
func BenchmarkToScript(b *testing.B) {
	mix, err := eventgen.Mix(20000, 500)
	if err != nil {
		b.Fatal(err)
	}
	var in bytes.Buffer
	for i, ev := range mix.Events {
		ev.Seq = uint64(i + 1)
		if err := events.WriteJSONL(&in, ev); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(in.Len()))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := replay.ToScript(context.Background(), replay.JSONL(bytes.NewReader(in.Bytes())), replay.ScriptOptions{}, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(mix.Events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// A damaged line cannot be kept in a script: the conversion fails naming it.
func TestScriptRefusesDamagedLine(t *testing.T) {
	jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", "corrupt.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	_, err = replay.ToScript(context.Background(), replay.JSONL(bytes.NewReader(jsonl)), replay.ScriptOptions{}, &bytes.Buffer{})
	if err == nil || !strings.Contains(err.Error(), "line 3") {
		t.Fatalf("got %v, want an error naming line 3", err)
	}
}

// A script line that does not parse fails from-script naming its command's
// line, and nothing is written.
func TestFromScriptBadLine(t *testing.T) {
	var out bytes.Buffer
	_, err := replay.FromScript(strings.NewReader("apply\n1 meta-1 term.started {\"term\":1,\"leader\":\"meta-1\"}\n----\n1 applied: term 1 leader meta-1\n\napply\none meta-1 worker.expired {}\n----\n"), &out, nil)
	if err == nil || !strings.Contains(err.Error(), "line 6: apply: input line 1") || out.Len() != 0 {
		t.Fatalf("got %v with output %q", err, out.String())
	}
}

// A script's check reports a log's seq problems in the words of replay
// --check (one checker): the same failure, without the file's lines.
func TestScriptCheckIsReplayCheck(t *testing.T) {
	for _, name := range []string{"gap", "order", "dup", "swapped", "handoff"} {
		t.Run(name, func(t *testing.T) {
			jsonl, err := os.ReadFile(filepath.Join("testdata", "logs", name+".jsonl"))
			if err != nil {
				t.Fatal(err)
			}
			want := "ok\n"
			err = replay.Run(context.Background(), replay.JSONL(bytes.NewReader(jsonl)), replay.Options{Mode: replay.ModeCheck}, io.Discard)
			var ce *replay.CheckError
			if errors.As(err, &ce) {
				c := *ce
				c.Line = 0
				if se, ok := c.Err.(*replay.SeqError); ok {
					s := *se
					s.Line, s.OtherLine = 0, 0
					c.Err = &s
				}
				want = c.Error() + "\n"
			} else if err != nil {
				t.Fatal(err)
			}
			if name != "handoff" && want == "ok\n" {
				t.Fatalf("replay --check passes %s", name)
			}
			ds, err := script.Parse(strings.NewReader(toScript(t, jsonl, replay.ScriptOptions{})))
			if err != nil {
				t.Fatal(err)
			}
			f := script.NewFold()
			got := ""
			for _, d := range ds {
				if got, err = f.Run(d.Cmd, d.Args, d.Input); err != nil {
					t.Fatal(err)
				}
			}
			if ds[len(ds)-1].Cmd != "check" || got != want {
				t.Errorf("the script's check says %q, replay --check %q", got, want)
			}
		})
	}
}

// A mistake in a script names its line and the known words.
func TestFromScriptUnknownWords(t *testing.T) {
	for s, want := range map[string]string{
		"apply\n1 meta-1 term.started {\"term\":1,\"leader\":\"meta-1\"}\n----\n1 applied: term 1 leader meta-1\n\nstate breif\n----\n": `line 6: state: unknown argument "breif": state takes brief`,
		"# a comment\napply\n1 meta-1 term.started {\"term\":1,\"leader\":\"meta-1\",\"colour\":\"red\"}\n----\n":                       `line 2: apply: input line 1: term.started has no field "colour" (its fields: term, leader, lease`,
	} {
		_, err := replay.FromScript(strings.NewReader(s), io.Discard, io.Discard)
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("got %v, want %q", err, want)
		}
	}
}

// A script keeps the events' stored bytes: the data as written (no
// "epoch":0 added, none taken away) and the time with its offset and
// precision; it folds to the hash of the log itself.
func TestScriptKeepsOriginalBytes(t *testing.T) {
	const log = `{"seq":1,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T04:00:01.500+01:00","type":"term.started","data":{"term":1,"leader":"meta-1","lease":5}}
{"seq":2,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:02Z","type":"worker.registered","data":{"id":1,"incarnation":"cn-a","endpoint":"10.0.0.5:5688","kind":"compute","parallelism":4}}
{"seq":3,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:03.000Z","type":"worker.registered","data":{"epoch":0,"endpoint":"10.0.0.6:5688","id":2}}
`
	s := toScript(t, []byte(log), replay.ScriptOptions{})
	for _, want := range []string{
		"\nat=2026-11-30T04:00:01.500+01:00 1 meta-1 term.started {\"term\":1,\"leader\":\"meta-1\",\"lease\":5}\n",
		"\n1 meta-1 worker.registered {\"id\":1,\"incarnation\":\"cn-a\",\"endpoint\":\"10.0.0.5:5688\",\"kind\":\"compute\",\"parallelism\":4}\n",
		"\nat=2026-11-30T03:00:03.000Z 1 meta-1 worker.registered {\"epoch\":0,\"endpoint\":\"10.0.0.6:5688\",\"id\":2}\n",
	} {
		if !strings.Contains(s, want) {
			t.Errorf("script lacks %q:\n%s", want, s)
		}
	}
	projtest.RunFile(t, writeScript(t, s))
	var st bytes.Buffer
	if err := replay.Run(context.Background(), replay.JSONL(strings.NewReader(log)), replay.Options{Mode: replay.ModeCheck}, &st); err != nil {
		t.Fatal(err)
	}
	ds, err := script.Parse(strings.NewReader(s))
	if err != nil {
		t.Fatal(err)
	}
	f := script.NewFold()
	for _, d := range ds {
		if _, err := f.Run(d.Cmd, d.Args, d.Input); err != nil {
			t.Fatal(err)
		}
	}
	if !strings.Contains(st.String(), f.State.Hash()) {
		t.Errorf("the script folds to hash %s, the log: %s", f.State.Hash(), st.String())
	}
}

// A term.started the fold rejected is titled as rejected, naming the term
// that stayed.
func TestScriptTitlesRejectedTerm(t *testing.T) {
	const log = `{"seq":1,"v":1,"term":1,"writer":"meta-1","at":"2026-11-30T03:00:01Z","type":"term.started","data":{"term":1,"leader":"meta-1","lease":5}}
{"seq":2,"v":1,"term":8,"writer":"meta-z","at":"2026-11-30T03:00:02Z","type":"term.started","data":{"term":8,"leader":"meta-z","lease":3}}
`
	s := toScript(t, []byte(log), replay.ScriptOptions{})
	if !strings.Contains(s, "\n# term 1, leader meta-1\napply\n") {
		t.Errorf("the applied term's title:\n%s", s)
	}
	want := "\n# term 8, leader meta-z: rejected stale-lease: term 8 lease 3 <= current term 1's lease 5; term 1, leader meta-1 stays\napply\n"
	if !strings.Contains(s, want) {
		t.Errorf("script lacks %q:\n%s", want, s)
	}
}

// from-script writes the main view's log: a replica's entries are noted,
// not written.
func TestFromScriptViews(t *testing.T) {
	s := `apply
1 meta-1 term.started {"term":1,"leader":"meta-1","lease":5}
----
1 applied: term 1 leader meta-1 lease 5

replica b
----
replica b opened at seq 0

apply
1 meta-1 term.started {"term":1,"leader":"meta-1","lease":5}
1 meta-1 store.registered {"store":"s1","incarnation":"i1","raft_addr":"a:1"}
----
1 applied: term 1 leader meta-1 lease 5
2 applied: store s1 at a:1
`
	jsonl, diag := fromScript(t, s)
	if strings.Count(jsonl, "\n") != 1 || !strings.Contains(jsonl, `"type":"term.started"`) {
		t.Errorf("want the main view's one entry, got:\n%s", jsonl)
	}
	if !strings.Contains(diag, "line 10: apply: 2 entries folded into replica b are not written") {
		t.Errorf("diag: %q", diag)
	}
}
