package replay_test

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/cockroachdb/datadriven"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/replay"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

// TestData runs the scripts at the top of testdata/ against the logs in
// testdata/logs. Rewrite the expected outputs with
//
//	go test ./replay -run TestData -rewrite
//
// and read every changed line. Commands:
//
//	replay <log> [mode=timeline|state|history|rejected|check|diff] [json] [skip-corrupt]
//	       [subject=worker:1] [until-seq=N] [until-time=RFC3339] [diff=A..B]
//	       [worker=ID] [endpoint=E] [store=S] [shard=N] [type=T]
//	       [from-seq=N] [to-seq=N] [from-time=T] [to-time=T]
//	    runs replay.Run on the JSONL file; prints stdout, then "stderr:" and
//	    what went to Diag, then "error:" and the error, if any
//	export <log>
//	    replay.Export of the file; "identical" when the output equals the
//	    file byte for byte, else the output
//	import <log> [into=<log>] [noraw]
//	    replay.Import into a fresh in-memory log (first filled with the
//	    into log; noraw: a log without AppendRaw), then the export of that
//	    log
func TestData(t *testing.T) {
	entries, err := os.ReadDir("testdata")
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.IsDir() || !strings.HasSuffix(e.Name(), ".txt") {
			continue
		}
		t.Run(e.Name(), func(t *testing.T) {
			datadriven.RunTest(t, filepath.Join("testdata", e.Name()), func(t *testing.T, d *datadriven.TestData) string {
				return runCmd(t, d)
			})
		})
	}
}

func logPath(t *testing.T, d *datadriven.TestData) string {
	if len(d.CmdArgs) == 0 || len(d.CmdArgs[0].Vals) > 0 {
		d.Fatalf(t, "%s: want the log file name first", d.Cmd)
	}
	return filepath.Join("testdata", "logs", d.CmdArgs[0].Key)
}

func runCmd(t *testing.T, d *datadriven.TestData) string {
	ctx := context.Background()
	switch d.Cmd {
	case "replay":
		f, err := os.Open(logPath(t, d))
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		defer f.Close()
		o, err := parseOptions(d.CmdArgs[1:])
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		var out, diag bytes.Buffer
		o.Diag = &diag
		err = replay.Run(ctx, replay.JSONL(f), o, &out)
		return result(out.String(), diag.String(), err)
	case "export":
		b, err := os.ReadFile(logPath(t, d))
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		var out bytes.Buffer
		st, err := replay.Export(ctx, replay.JSONL(bytes.NewReader(b)), &out, replay.TransferOptions{})
		s := out.String()
		if bytes.Equal(out.Bytes(), b) {
			s = "identical\n"
		}
		return result(fmt.Sprintf("%+v\n%s", st, s), "", err)
	case "import":
		b, err := os.ReadFile(logPath(t, d))
		if err != nil {
			d.Fatalf(t, "%v", err)
		}
		mem := events.NewMemLog()
		defer mem.Close()
		var l events.Log = rawMemLog{mem}
		if d.HasArg("noraw") {
			l = mem
		}
		if d.HasArg("into") {
			var into string
			d.ScanArgs(t, "into", &into)
			ib, err := os.ReadFile(filepath.Join("testdata", "logs", into))
			if err != nil {
				d.Fatalf(t, "%v", err)
			}
			if _, err := replay.Import(ctx, bytes.NewReader(ib), rawMemLog{mem}, replay.TransferOptions{}); err != nil {
				d.Fatalf(t, "%v", err)
			}
		}
		st, err := replay.Import(ctx, bytes.NewReader(b), l, replay.TransferOptions{})
		if err != nil {
			tail, _ := mem.Tail(ctx)
			return result("", "", fmt.Errorf("%w\nlog tail: %d", err, tail))
		}
		var out bytes.Buffer
		if _, err := replay.Export(ctx, replay.Stream(mem), &out, replay.TransferOptions{}); err != nil {
			d.Fatalf(t, "%v", err)
		}
		s := out.String()
		if bytes.Equal(out.Bytes(), b) {
			s = "export identical to the file\n"
		}
		return fmt.Sprintf("%+v\n%s", st, s)
	}
	d.Fatalf(t, "unknown command %q", d.Cmd)
	return ""
}

func result(out, diag string, err error) string {
	var b strings.Builder
	b.WriteString(out)
	if diag != "" {
		b.WriteString("stderr:\n" + diag)
	}
	if err != nil {
		b.WriteString("error: " + err.Error() + "\n")
	}
	if b.Len() == 0 {
		return "(no output)\n"
	}
	return b.String()
}

func parseOptions(args []datadriven.CmdArg) (replay.Options, error) {
	var o replay.Options
	modes := map[string]replay.Mode{
		"timeline": replay.ModeTimeline, "state": replay.ModeState, "history": replay.ModeHistory,
		"rejected": replay.ModeRejected, "check": replay.ModeCheck, "diff": replay.ModeDiff,
	}
	for _, a := range args {
		v := ""
		if len(a.Vals) > 0 {
			v = a.Vals[0]
		}
		var err error
		num := func() uint64 {
			n, e := strconv.ParseUint(v, 10, 64)
			if e != nil {
				err = e
			}
			return n
		}
		tm := func() time.Time {
			t, e := time.Parse(time.RFC3339, v)
			if e != nil {
				err = e
			}
			return t
		}
		switch a.Key {
		case "mode":
			m, ok := modes[v]
			if !ok {
				return o, fmt.Errorf("unknown mode %q", v)
			}
			o.Mode = m
		case "json":
			o.JSON = true
		case "skip-corrupt":
			o.SkipCorrupt = true
		case "subject":
			o.Subject, err = replay.ParseSubject(v)
		case "until-seq":
			o.UntilSeq = num()
		case "until-time":
			o.UntilTime = tm()
		case "diff":
			o.DiffFrom, o.DiffTo, err = replay.ParseSeqRange(v)
		case "worker":
			o.Filter.Worker = num()
		case "endpoint":
			o.Filter.Endpoint = v
		case "store":
			o.Filter.Store = v
		case "shard":
			o.Filter.Shard = num()
		case "type":
			o.Filter.Type = v
		case "from-seq":
			o.Filter.FromSeq = num()
		case "to-seq":
			o.Filter.ToSeq = num()
		case "from-time":
			o.Filter.FromTime = tm()
		case "to-time":
			o.Filter.ToTime = tm()
		default:
			return o, fmt.Errorf("unknown argument %q", a.Key)
		}
		if err != nil {
			return o, fmt.Errorf("%s: %w", a.Key, err)
		}
	}
	return o, nil
}

// rawMemLog is a MemLog that can store raw bodies under the CAS.
type rawMemLog struct{ *events.MemLog }

func (l rawMemLog) AppendRaw(ctx context.Context, expectedLast uint64, body []byte) (uint64, error) {
	tail, err := l.Tail(ctx)
	if err != nil {
		return 0, err
	}
	if tail != expectedLast {
		return tail, fmt.Errorf("append raw seq %d: %w (last seq is %d)", expectedLast+1, events.ErrFenced, tail)
	}
	return l.MemLog.AppendRaw(body), nil
}

// TestStreamMatchesFile replays the same log from a JSONL file and from a
// Log (the live stream's shape) and expects the same answers.
func TestStreamMatchesFile(t *testing.T) {
	ctx := context.Background()
	for _, name := range []string{"handoff.jsonl", "shards.jsonl"} {
		b, err := os.ReadFile(filepath.Join("testdata", "logs", name))
		if err != nil {
			t.Fatal(err)
		}
		mem := events.NewMemLog()
		defer mem.Close()
		if _, err := replay.Import(ctx, bytes.NewReader(b), mem, replay.TransferOptions{}); err != nil {
			t.Fatal(err)
		}
		for _, o := range []replay.Options{
			// (JSON timelines differ: a file's name their line.)
			{}, {Mode: replay.ModeState}, {Mode: replay.ModeState, JSON: true}, {Mode: replay.ModeRejected},
			{Mode: replay.ModeCheck}, {Mode: replay.ModeDiff, DiffFrom: 2, DiffTo: 8, JSON: true},
			{Mode: replay.ModeHistory, Subject: replay.Subject{Kind: replay.KindWorker, Name: "1", Num: 1}},
			{Mode: replay.ModeHistory, Subject: replay.Subject{Kind: replay.KindShard, Name: "1", Num: 1}},
		} {
			var fromFile, fromLog bytes.Buffer
			if err := replay.Run(ctx, replay.JSONL(bytes.NewReader(b)), o, &fromFile); err != nil {
				t.Fatal(err)
			}
			if err := replay.Run(ctx, replay.Stream(mem), o, &fromLog); err != nil {
				t.Fatal(err)
			}
			if fromFile.String() != fromLog.String() {
				t.Errorf("%s %+v: file and log differ:\n%s\n---\n%s", name, o, fromFile.String(), fromLog.String())
			}
		}
	}
}

// TestStreamCorruptRecords: a record of the log that does not decode is
// folded as a corrupt anomaly, without SkipCorrupt, and exported as a raw
// line that imports back byte for byte.
func TestStreamCorruptRecords(t *testing.T) {
	ctx := context.Background()
	mem := events.NewMemLog()
	defer mem.Close()
	at := time.Date(2026, 11, 30, 3, 0, 1, 0, time.UTC)
	if _, err := mem.Append(ctx, 0, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 1, Leader: "meta-1"}}); err != nil {
		t.Fatal(err)
	}
	bodies := [][]byte{[]byte("not json"), {0xff, 0xfe, '{'}, []byte(`{"v":2,"type":"worker.registered"}`), {}}
	for _, b := range bodies {
		mem.AppendRaw(b)
	}
	var out bytes.Buffer
	if err := replay.Run(ctx, replay.Stream(mem), replay.Options{Mode: replay.ModeState}, &out); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out.String(), "corrupt=4") {
		t.Errorf("want 4 corrupt events folded:\n%s", out.String())
	}
	var exp bytes.Buffer
	st, err := replay.Export(ctx, replay.Stream(mem), &exp, replay.TransferOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if st.Events != 5 || st.Raw != 4 || st.First != 1 || st.Last != 5 {
		t.Errorf("export stats %+v", st)
	}
	mem2 := events.NewMemLog()
	defer mem2.Close()
	if _, err := replay.Import(ctx, bytes.NewReader(exp.Bytes()), rawMemLog{mem2}, replay.TransferOptions{}); err != nil {
		t.Fatalf("%v\n%s", err, exp.String())
	}
	var got [][]byte
	if err := mem2.Read(ctx, 2, func(r events.Record) error { got = append(got, r.Data); return nil }); err != nil {
		t.Fatal(err)
	}
	if len(got) != len(bodies) {
		t.Fatalf("got %d raw records, want %d", len(got), len(bodies))
	}
	for i := range bodies {
		if !bytes.Equal(got[i], bodies[i]) {
			t.Errorf("raw record %d: got %q, want %q", i+2, got[i], bodies[i])
		}
	}
	// The export, replayed as a file, gives the same state (and hash).
	var fromFile bytes.Buffer
	if err := replay.Run(ctx, replay.JSONL(bytes.NewReader(exp.Bytes())), replay.Options{Mode: replay.ModeState}, &fromFile); err != nil {
		t.Fatal(err)
	}
	if out.String() != fromFile.String() {
		t.Errorf("stream and its export differ:\n%s\n---\n%s", out.String(), fromFile.String())
	}
	// And the imported log replays to the same state.
	var out2 bytes.Buffer
	if err := replay.Run(ctx, replay.Stream(mem2), replay.Options{Mode: replay.ModeState}, &out2); err != nil {
		t.Fatal(err)
	}
	if out.String() != out2.String() {
		t.Errorf("states differ:\n%s\n---\n%s", out.String(), out2.String())
	}
}

// TestFollow prints the timeline of a growing log until ctx is done.
func TestFollow(t *testing.T) {
	mem := events.NewMemLog()
	defer mem.Close()
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	at := time.Date(2026, 11, 30, 3, 0, 1, 0, time.UTC)
	if _, err := mem.Append(ctx, 0, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 1, Leader: "meta-1"}}); err != nil {
		t.Fatal(err)
	}
	out := &syncBuffer{lines: make(chan string, 16)}
	done := make(chan error, 1)
	go func() {
		done <- replay.Run(ctx, replay.Stream(mem), replay.Options{Follow: true, JSON: true}, out)
	}()
	wait := func(want string) {
		t.Helper()
		select {
		case l := <-out.lines:
			if !strings.Contains(l, want) {
				t.Fatalf("got %q, want it to contain %q", l, want)
			}
		case <-time.After(10 * time.Second):
			t.Fatalf("no line with %q", want)
		}
	}
	wait(`"type":"term.started"`)
	if _, err := mem.Append(ctx, 1, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.WorkerRegistered{ID: 1, Endpoint: "a:1"}}); err != nil {
		t.Fatal(err)
	}
	wait(`"type":"worker.registered"`)
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("follow ended with %v, want nil on cancel", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("follow did not end on cancel")
	}
	if err := replay.Run(ctx, replay.JSONL(strings.NewReader("")), replay.Options{Follow: true}, &bytes.Buffer{}); err == nil {
		t.Error("follow of a file: want an error")
	}
}

// syncBuffer hands every written line to a channel.
type syncBuffer struct{ lines chan string }

func (b *syncBuffer) Write(p []byte) (int, error) {
	for _, l := range strings.SplitAfter(string(p), "\n") {
		if l != "" {
			b.lines <- l
		}
	}
	return len(p), nil
}

// TestProgress: long replays report progress on Diag, never on out.
func TestProgress(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("testdata", "logs", "shards.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	clock := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	now := func() time.Time { clock = clock.Add(700 * time.Millisecond); return clock }
	for _, mode := range []replay.Mode{replay.ModeTimeline, replay.ModeState, replay.ModeCheck} {
		var out, diag bytes.Buffer
		o := replay.Options{Mode: mode, Diag: &diag, Now: now}
		if err := replay.Run(context.Background(), replay.JSONL(bytes.NewReader(b)), o, &out); err != nil {
			t.Fatal(err)
		}
		if !strings.Contains(diag.String(), "replay: done, 19 events up to seq 19") || !strings.Contains(diag.String(), "events/s") {
			t.Errorf("mode %d: no progress on diag:\n%s", mode, diag.String())
		}
		if strings.Contains(out.String(), "events/s") || strings.Contains(out.String(), "replay:") {
			t.Errorf("mode %d: progress on out:\n%s", mode, out.String())
		}
	}
	// A short replay says nothing.
	var out, diag bytes.Buffer
	if err := replay.Run(context.Background(), replay.JSONL(bytes.NewReader(b)), replay.Options{Diag: &diag}, &out); err != nil {
		t.Fatal(err)
	}
	if diag.Len() != 0 {
		t.Errorf("short replay wrote to diag:\n%s", diag.String())
	}
}

func TestParse(t *testing.T) {
	for _, tc := range []struct {
		in, want string
	}{
		{"worker:1", "worker:1"}, {"store:s1", "store:s1"}, {"shard:3", "shard:3"},
		{"endpoint:10.0.0.5:5688", "endpoint:10.0.0.5:5688"},
		{"worker:x", "error"}, {"worker:0", "error"}, {"node:1", "error"}, {"worker", "error"}, {"store:", "error"},
	} {
		s, err := replay.ParseSubject(tc.in)
		got := s.String()
		if err != nil {
			got = "error"
		}
		if got != tc.want {
			t.Errorf("ParseSubject(%q) = %q (%v), want %q", tc.in, got, err, tc.want)
		}
	}
	for _, tc := range []struct {
		in       string
		from, to uint64
		ok       bool
	}{
		{"3..8", 3, 8, true}, {"0..1", 0, 1, true}, {"8..3", 0, 0, false}, {"3..3", 0, 0, false},
		{"3-8", 0, 0, false}, {"a..8", 0, 0, false}, {"3..8x", 0, 0, false}, {"..8", 0, 0, false}, {"-1..8", 0, 0, false},
	} {
		from, to, err := replay.ParseSeqRange(tc.in)
		if (err == nil) != tc.ok || from != tc.from || to != tc.to {
			t.Errorf("ParseSeqRange(%q) = %d, %d, %v", tc.in, from, to, err)
		}
	}
	for _, tc := range []struct {
		pattern, typ string
		want         bool
	}{
		{"worker.expired", "worker.expired", true}, {"worker.", "worker.expired", true}, {"worker", "worker.expired", true},
		{"shard.replica", "shard.replica.added", true}, {"shard", "shard.replica.added", true},
		{"work", "worker.expired", false}, {"worker.exp", "worker.expired", false}, {"store", "worker.expired", false},
	} {
		if got := replay.MatchType(tc.pattern, tc.typ); got != tc.want {
			t.Errorf("MatchType(%q, %q) = %v", tc.pattern, tc.typ, got)
		}
	}
}

func TestBadOptions(t *testing.T) {
	for _, o := range []replay.Options{
		{Mode: replay.ModeDiff, DiffFrom: 5, DiffTo: 5},
		{Mode: replay.ModeDiff, DiffFrom: 1, DiffTo: 5, UntilSeq: 3},
		{Mode: replay.ModeHistory},
		{Mode: replay.ModeState, Follow: true},
		{Mode: replay.Mode(99)},
	} {
		err := replay.Run(context.Background(), replay.JSONL(strings.NewReader("")), o, &bytes.Buffer{})
		if err == nil {
			t.Errorf("%+v: want an error", o)
		}
	}
}

// TestFollowTail prints only the last N events of the history, then every
// new one; TailNone prints only the new ones.
func TestFollowTail(t *testing.T) {
	for _, tc := range []struct {
		tail int
		want []string // seqs printed from the history
	}{{2, []string{`"seq":4`, `"seq":5`}}, {replay.TailNone, nil}, {0, []string{`"seq":1`, `"seq":2`, `"seq":3`, `"seq":4`, `"seq":5`}}} {
		t.Run(fmt.Sprint(tc.tail), func(t *testing.T) {
			mem := events.NewMemLog()
			defer mem.Close()
			ctx, cancel := context.WithCancel(context.Background())
			defer cancel()
			at := time.Date(2026, 11, 30, 3, 0, 1, 0, time.UTC)
			if _, err := mem.Append(ctx, 0, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 1, Leader: "meta-1"}}); err != nil {
				t.Fatal(err)
			}
			for i := uint64(1); i <= 4; i++ {
				if _, err := mem.Append(ctx, i, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.StoreRegistered{Store: fmt.Sprint("s", i), RaftAddr: "a:1"}}); err != nil {
					t.Fatal(err)
				}
			}
			out := &syncBuffer{lines: make(chan string, 16)}
			done := make(chan error, 1)
			src := tailSignal{Follower: replay.Stream(mem), log: mem, read: make(chan struct{})}
			go func() {
				done <- replay.Run(ctx, src, replay.Options{Follow: true, JSON: true, Tail: tc.tail}, out)
			}()
			if tc.tail != 0 {
				<-src.read // the history ends where the log ended then
			}
			next := func() string {
				t.Helper()
				select {
				case l := <-out.lines:
					return l
				case <-time.After(10 * time.Second):
					t.Fatal("no line")
				}
				return ""
			}
			for _, want := range tc.want {
				if l := next(); !strings.Contains(l, want) {
					t.Fatalf("got %s, want %s", l, want)
				}
			}
			// A new event is printed at once: the history is over.
			if _, err := mem.Append(ctx, 5, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.StoreRegistered{Store: "s9", RaftAddr: "a:9"}}); err != nil {
				t.Fatal(err)
			}
			if l := next(); !strings.Contains(l, `"seq":6`) {
				t.Fatalf("got %s, want seq 6", l)
			}
			cancel()
			if err := <-done; err != nil {
				t.Fatal(err)
			}
			select {
			case l := <-out.lines:
				t.Fatalf("extra line %s", l)
			default:
			}
		})
	}
}

// TestTailFile prints the last N matching events of a file.
func TestTailFile(t *testing.T) {
	f, err := os.Open(filepath.Join("testdata", "logs", "handoff.jsonl"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var out bytes.Buffer
	if err := replay.Run(context.Background(), replay.JSONL(f), replay.Options{Tail: 2, Filter: replay.Filter{Type: "worker."}}, &out); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	if len(lines) != 3 || !strings.HasPrefix(lines[1], "7 ") || !strings.HasPrefix(lines[2], "8 ") {
		t.Fatalf("tail 2 of worker events:\n%s", out.String())
	}
}

// tailSignal says when the replay has read the log's last seq.
type tailSignal struct {
	replay.Follower
	log  *events.MemLog
	read chan struct{}
}

func (s tailSignal) Tail(ctx context.Context) (uint64, error) {
	defer close(s.read)
	return s.log.Tail(ctx)
}
