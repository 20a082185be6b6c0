package script_test

import (
	"bytes"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/projections/projtest/script"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// Every generated event, formatted and parsed back, is the same event.
func TestFormatParseEvent(t *testing.T) {
	mix, err := eventgen.Mix(2000, 30)
	if err != nil {
		t.Fatal(err)
	}
	odd := []events.Event{
		{Term: 3, Writer: "", At: time.Date(2026, 12, 1, 8, 0, 0, 123456789, time.UTC), Data: events.TermStarted{Term: 3, Leader: "a b"}},
		{Term: 3, Writer: `meta "x" 1`, At: script.Base(), Data: events.StoreRegistered{Store: "<s>&", RaftAddr: "a:1"}},
		{Term: 3, Writer: "tab\there", At: script.Base(), Data: events.WorkerExpired{ID: 1, Epoch: 2}},
	}
	last := uint64(0)
	for i, ev := range append(mix.Events, odd...) {
		ev.Seq = uint64(i + 1)
		if i%97 == 5 {
			ev.Seq += 3 // a gap: seq= is written
		}
		line, err := script.FormatEvent(ev, last)
		if err != nil {
			t.Fatal(err)
		}
		e, err := script.ParseEntry(line)
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		seq := e.Seq
		if seq == 0 {
			seq = last + 1
		}
		got, err := events.Decode(seq, e.Body(seq))
		if err != nil {
			t.Fatalf("%s: %v", line, err)
		}
		want, _ := events.EncodeLine(ev)
		have, _ := events.EncodeLine(got)
		if !bytes.Equal(want, have) {
			t.Fatalf("line %s\n got %s\nwant %s", line, have, want)
		}
		last = max(last, ev.Seq)
	}
}

// Raw bodies come back byte for byte, whichever form they need.
func TestFormatParseRaw(t *testing.T) {
	for _, body := range [][]byte{[]byte("not json"), {0, 1, 0xff}, []byte(" padded "), []byte("two\nlines"), {}, []byte("raw64 x")} {
		line := script.FormatRaw(7, 3, body)
		e, err := script.ParseEntry(line)
		if err != nil {
			t.Fatalf("%q: %v", line, err)
		}
		if !bytes.Equal(e.Raw, body) || e.Seq != 7 || e.Raw == nil {
			t.Errorf("%q: got %q seq %d, want %q seq 7", line, e.Raw, e.Seq, body)
		}
	}
}

func TestParseEntryErrors(t *testing.T) {
	for line, want := range map[string]string{
		`one meta-1 term.started {}`:                  "term \"one\" is not a number",
		`1 meta-1 term.started`:                       "missing the data of term.started",
		`1 term.started {"term":1,"leader":"meta-1"}`: "missing the writer: term.started is the type, and the writer",
		`1 meta-1 {"term":1,"leader":"meta-1"}`:       "missing the type after writer meta-1 (one of term.started, ",
		`1 meta-1`:                                    "missing the type and the data after writer meta-1",
		`1`:                                           "missing the writer, the type and the data",
		`1 meta-1 term.started {"term":`:              "not valid JSON",
		`seq=0 1 meta-1 term.started {}`:              "seq=\"0\"",
		`at=yesterday 1 meta-1 x {}`:                  "RFC3339",
		`raw64 !!!`:                                   "raw64",
		`1 "unterminated term.started {}`:             "writer",
	} {
		if _, err := script.ParseEntry(line); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: got %v, want %q", line, err, want)
		}
	}
}

// Write writes what Parse reads, outputs with blank lines included.
func TestWriteParse(t *testing.T) {
	ds := []script.Directive{
		{Comments: []string{"first", ""}, Cmd: "apply", Args: []script.Arg{{Key: "quiet"}}, Input: "1 m term.started {}", Output: "seq 1..1: rejected=1\n"},
		{Cmd: "state", Args: []script.Arg{{Key: "brief"}, {Key: "n", Vals: []string{"3"}}, {Key: "l", Vals: []string{"a", "b"}}}, Output: "a\n\nb\n"},
		{Cmd: "check", Output: "ok\n"},
	}
	var b bytes.Buffer
	if err := script.Write(&b, ds); err != nil {
		t.Fatal(err)
	}
	got, err := script.Parse(&b)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != len(ds) {
		t.Fatalf("got %d directives:\n%s", len(got), b.String())
	}
	for i := range ds {
		g, w := got[i], ds[i]
		g.Line = 0
		if g.Cmd != w.Cmd || g.Input != w.Input || g.Output != w.Output || strings.Join(g.Comments, "|") != strings.Join(w.Comments, "|") || len(g.Args) != len(w.Args) {
			t.Errorf("directive %d: got %+v, want %+v", i, g, w)
		}
		for j := range g.Args {
			if g.Args[j].String() != w.Args[j].String() {
				t.Errorf("directive %d arg %d: got %s, want %s", i, j, g.Args[j], w.Args[j])
			}
		}
	}
}

// FuzzScript: no script text makes Parse or a command panic.
func FuzzScript(f *testing.F) {
	f.Add("apply\n1 meta-1 term.started {\"term\":1,\"leader\":\"meta-1\"}\nseq=9 raw x\nraw64 AAE=\n----\n")
	f.Add("apply quiet\nat=2026-11-30T03:00:01Z 1 \"a b\" worker.expired {\"id\":1}\n----\n----\nx\n\ny\n----\n----\n")
	f.Add("stale-flood n=3 term=0\n----\n\nanomalies tail=2\n----\n")
	f.Add("apply\n1 m term.started {\"term\":1,\"leader\":\"m\"}\n----\n\nsnapshot name=x\n----\n\nreplica a from=main\n----\n\nrestore name=x\n----\n\nreplica b\n----\n\ncompare a b\n----\n\ncheck\n----\n")
	f.Fuzz(func(t *testing.T, text string) {
		ds, _ := script.Parse(strings.NewReader(text))
		fold := script.NewFold()
		for _, d := range ds {
			if len(d.Input) > 1<<16 {
				continue
			}
			for _, a := range d.Args { // keep the floods small
				for _, v := range a.Vals {
					if len(v) > 3 {
						return
					}
				}
			}
			_, _ = fold.Run(d.Cmd, d.Args, d.Input)
		}
		var b bytes.Buffer
		_ = script.Write(&b, ds)
	})
}

// A mistake in a script is an error naming the known words: an argument a
// command does not take, a field an event kind does not have, a command the
// kit does not know.
func TestUnknownWords(t *testing.T) {
	const start = `1 meta-1 term.started {"term":1,"leader":"meta-1","lease":5}`
	for _, c := range []struct {
		cmd   string
		args  []script.Arg
		input string
		want  string
	}{
		{"state", []script.Arg{{Key: "breif"}}, "", `unknown argument "breif": state takes brief`},
		{"workers", []script.Arg{{Key: "all"}}, "", `unknown argument "all": workers takes none`},
		{"apply", []script.Arg{{Key: "quiet"}, {Key: "n", Vals: []string{"3"}}}, start, `unknown argument "n=3": apply takes quiet`},
		{"stale-flood", []script.Arg{{Key: "n", Vals: []string{"3"}}, {Key: "trem", Vals: []string{"1"}}}, "", `unknown argument "trem=1": stale-flood takes n, term, writer`},
		{"apply", nil, start + "\n" + `1 meta-1 worker.registered {"id":1,"endpoint":"a:1","colour":"red"}`,
			`input line 2: worker.registered has no field "colour" (its fields: id, epoch, incarnation, endpoint, kind, parallelism; go doc ./events WorkerRegistered)`},
		{"apply", nil, `1 meta-1 term.started {"term":1,"leader":"meta-1","lese":5}`, `input line 1: term.started has no field "lese" (its fields: term, leader, lease;`},
		{"stat", nil, "", `unknown command "stat" (the kit's commands: anomalies, apply, check, compare, corrupt-flood, counters, hash, history, op-flood, replica, restore, snapshot, stale-flood, state, workers)`},
	} {
		_, err := script.NewFold().Run(c.cmd, c.args, c.input)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s %v: got %v, want %q", c.cmd, c.args, err, c.want)
		}
	}
	// A kind this build does not know is the fold's to report (corrupt),
	// and raw lines are bodies as stored.
	out, err := script.NewFold().Run("apply", nil, `1 meta-1 worker.promoted {"colour":"red"}`+"\nraw {\"v\":1,\"colour\":1}")
	if err != nil || !strings.Contains(out, "1 corrupt: seq 1: unknown event type") {
		t.Errorf("unknown kind: %q %v", out, err)
	}
}
