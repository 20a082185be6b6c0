package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/console"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

type replayFlags struct {
	file        string
	skipCorrupt bool
	untilSeq    uint64
	untilTime   string
	state       bool
	history     string
	rejected    bool
	check       bool
	diff        string
	follow      bool
	json        bool
	worker      uint64
	endpoint    string
	store       string
	shard       uint64
	typ         string
	term        uint64
	writer      string
	fromSeq     uint64
	toSeq       uint64
	fromTime    string
	toTime      string
	noSnapshot  bool
	toScript    string
	stateAt     []string
	fromScript  string
	tail        int
	html        string
}

func newReplay(g *globals) *cobra.Command {
	f := &replayFlags{}
	cmd := &cobra.Command{
		Use:   "replay",
		Short: "Fold the event log (live stream or JSONL export): timeline, state at a seq, histories, rejections, checks, diffs",
		Long: `replay reads the live stream (--nats, --cluster) or a JSONL export (--file F,
or --file - for stdin) and folds it with the same projection every replica runs.

Default: the timeline, one line per event with the fold's outcome (filters:
--worker --endpoint --store --shard --type --term --writer --from-seq --to-seq
--from-time --to-time; --tail N keeps the last N; --follow keeps tailing the live stream,
after the last 10 events of its history by default). Or one of:
  --until-seq N / --until-time T   the projected state at that point
  --state                          the state at the end of the log
  --history worker:ID|store:S|shard:N|endpoint:H:P
  --rejected                       every rejected event (stale-term, future-term, invalid)
  --check                          seqs 1, 2, 3... without gap, swap or duplicate, and the
                                   invariants after every event; non-zero exit naming the
                                   first offending line and seq
  --diff A..B                      what changed between the state after seq A and after seq B
  --to-script OUT                  a projection script of the log (package projtest):
                                   the events with today's outcomes, the state at the
                                   end and at each --state-at seq; the filters choose
                                   the events printed one by one, the others are kept
                                   in "apply quiet" blocks; --until-seq, --to-seq,
                                   --until-time and --to-time end it
  --from-script S                  the JSONL of the events a script folds (stdout)
--json prints JSON (a line per event for timelines, a document otherwise).
The state at a seq and a diff of the live stream start from the newest usable
snapshot at or below the seq they need and fold only the events after it
(--no-snapshot folds from seq 1); the other modes need every event.
Progress of long replays goes to stderr. "replay diff A B" compares two views
(two exports, or a snapshot and an export) and names the first seq after
which they differ.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{readCommand: "replay"},
		RunE:        func(cmd *cobra.Command, _ []string) error { return runReplay(cmd, g, f) },
	}
	fl := cmd.Flags()
	fl.StringVar(&f.file, "file", "", "read this JSONL export instead of the live stream (- for stdin)")
	fl.BoolVar(&f.skipCorrupt, "skip-corrupt", false, "fold a damaged JSONL line as a corrupt event and read on (reported on stderr)")
	fl.Uint64Var(&f.untilSeq, "until-seq", 0, "stop after this seq; alone, print the state there")
	fl.StringVar(&f.untilTime, "until-time", "", "stop before the first event after this RFC3339 time; alone, print the state there")
	fl.BoolVar(&f.state, "state", false, "print the projected state (at the end, or at --until-seq/--until-time)")
	fl.StringVar(&f.history, "history", "", "tell the story of one id: worker:ID, store:S, shard:N or endpoint:HOST:PORT")
	fl.BoolVar(&f.rejected, "rejected", false, "list every rejected event with its writer, term and reason")
	fl.BoolVar(&f.check, "check", false, "check the invariants after every event; fail at the first violation")
	fl.StringVar(&f.diff, "diff", "", "print what changed between the state after seq A and after seq B (A..B)")
	fl.BoolVar(&f.follow, "follow", false, "keep printing the timeline of the live stream until Ctrl-C")
	outputFlags(fl, &f.json)
	fl.Uint64Var(&f.worker, "worker", 0, "timeline: events touching this worker id")
	fl.StringVar(&f.endpoint, "endpoint", "", "timeline: events touching this worker endpoint (host:port)")
	fl.StringVar(&f.store, "store", "", "timeline: events touching this store")
	fl.Uint64Var(&f.shard, "shard", 0, "timeline: events touching this shard")
	fl.StringVar(&f.typ, "type", "", "timeline: this event type, or a prefix such as worker. or shard.replica")
	fl.Uint64Var(&f.term, "term", 0, "timeline: events stamped with this term")
	fl.StringVar(&f.writer, "writer", "", "timeline: events written by this replica (meta-1, ...)")
	fl.Uint64Var(&f.fromSeq, "from-seq", 0, "timeline: from this seq")
	fl.Uint64Var(&f.toSeq, "to-seq", 0, "timeline: up to this seq")
	fl.StringVar(&f.fromTime, "from-time", "", "timeline: events at or after this RFC3339 time")
	fl.StringVar(&f.toTime, "to-time", "", "timeline: events at or before this RFC3339 time")
	fl.BoolVar(&f.noSnapshot, "no-snapshot", false, "state and diff of the live stream: fold from seq 1 instead of starting from the newest usable snapshot")
	fl.StringVar(&f.toScript, "to-script", "", "write the log as a projection script to this file (- for stdout)")
	fl.StringSliceVar(&f.stateAt, "state-at", nil, "with --to-script: also print the state after these seqs (repeat or comma-separate)")
	fl.StringVar(&f.fromScript, "from-script", "", "print the JSONL of the events this projection script folds (- for stdin)")
	fl.IntVar(&f.tail, "tail", -1, "timeline: print only the last N matching events of the history (with --follow: default 10, then every new one; -1: all)")
	fl.StringVar(&f.html, "html", "", "write one self-contained HTML report to this file: timeline, event table (the filters choose its rows), rejections, final state (at --until-seq/--until-time) and the --history of chosen ids (comma separated)")
	cmd.AddCommand(newReplayExport(g), newReplayImport(g), newReplayDiff())
	return cmd
}

// options turns the flags into replay.Options.
func (f *replayFlags) options(cmd *cobra.Command) (replay.Options, error) {
	o := replay.Options{UntilSeq: f.untilSeq, Follow: f.follow, JSON: f.json, SkipCorrupt: f.skipCorrupt, Diag: cmd.ErrOrStderr()}
	var err error
	parseTime := func(name, v string) time.Time {
		if v == "" || err != nil {
			return time.Time{}
		}
		t, perr := time.Parse(time.RFC3339Nano, v)
		if perr != nil {
			err = fmt.Errorf("--%s %q: want an RFC3339 time such as 2026-11-30T03:00:00Z", name, v)
		}
		return t
	}
	o.UntilTime = parseTime("until-time", f.untilTime)
	o.Filter = replay.Filter{
		Worker: f.worker, Endpoint: f.endpoint, Store: f.store, Shard: f.shard, Type: f.typ, Term: f.term, Writer: f.writer,
		FromSeq: f.fromSeq, ToSeq: f.toSeq,
		FromTime: parseTime("from-time", f.fromTime), ToTime: parseTime("to-time", f.toTime),
	}
	if err != nil {
		return o, err
	}
	modes := 0
	for _, set := range []bool{f.state, f.history != "", f.rejected, f.check, f.diff != ""} {
		if set {
			modes++
		}
	}
	if modes > 1 {
		return o, errors.New("pick one of --state, --history, --rejected, --check, --diff")
	}
	switch {
	case f.history != "":
		o.Mode = replay.ModeHistory
		o.Subject, err = replay.ParseSubject(f.history)
	case f.rejected:
		o.Mode = replay.ModeRejected
	case f.check:
		o.Mode = replay.ModeCheck
	case f.diff != "":
		o.Mode = replay.ModeDiff
		o.DiffFrom, o.DiffTo, err = replay.ParseSeqRange(f.diff)
		if err != nil {
			err = fmt.Errorf("--diff: %w", err)
		}
	case f.state || f.untilSeq > 0 || f.untilTime != "":
		o.Mode = replay.ModeState
	}
	if err != nil {
		return o, err
	}
	if cmd.Flags().Changed("tail") && (f.tail < -1 || o.Mode != replay.ModeTimeline) {
		return o, errors.New("--tail N limits the timeline to its last N events (-1: all)")
	}
	if f.toScript == "" && o.Mode != replay.ModeTimeline && o.Filter != (replay.Filter{}) {
		return o, errors.New("--worker, --endpoint, --store, --shard, --type, --term, --writer, --from-*/--to-* filter the timeline only")
	}
	if f.follow && f.file != "" {
		return o, errors.New("--follow tails the live stream; it does not work with --file")
	}
	return o, nil
}

// scriptFlags checks --to-script, --state-at and --from-script against the
// other flags; it returns the --state-at seqs.
func (f *replayFlags) scriptFlags(cmd *cobra.Command) ([]uint64, error) {
	changed := func(names ...string) []string {
		var set []string
		for _, n := range names {
			if cmd.Flags().Changed(n) {
				set = append(set, "--"+n)
			}
		}
		return set
	}
	modes := []string{"state", "history", "rejected", "check", "diff", "follow", "json", "tail", "skip-corrupt"}
	if f.fromScript != "" {
		if set := changed(append(modes, "file", "to-script", "state-at", "until-seq", "until-time", "worker", "endpoint", "store", "shard", "type", "term", "writer", "from-seq", "to-seq", "from-time", "to-time", "no-snapshot")...); len(set) > 0 {
			return nil, fmt.Errorf("--from-script converts a script to JSONL on stdout; it takes no other replay flag (got %s)", strings.Join(set, " "))
		}
		return nil, nil
	}
	if f.toScript == "" {
		if len(f.stateAt) > 0 {
			return nil, errors.New("--state-at goes with --to-script (for the state at one seq, use --until-seq)")
		}
		return nil, nil
	}
	if set := changed(modes...); len(set) > 0 {
		return nil, fmt.Errorf("--to-script writes a script; it does not go with %s", strings.Join(set, " "))
	}
	var at []uint64
	for _, v := range f.stateAt {
		n, err := strconv.ParseUint(strings.TrimSpace(v), 10, 64)
		if err != nil || n == 0 {
			return nil, fmt.Errorf("--state-at %q: want a seq (a positive integer)", v)
		}
		at = append(at, n)
	}
	return at, nil
}

// runFromScript prints the JSONL of the events a script folds.
func runFromScript(cmd *cobra.Command, path string) error {
	in := cmd.InOrStdin()
	if path != "-" {
		fh, err := os.Open(path)
		if err != nil {
			return err
		}
		defer fh.Close()
		in = fh
	}
	st, err := replay.FromScript(in, cmd.OutOrStdout(), cmd.ErrOrStderr())
	if err != nil {
		return fmt.Errorf("%s: %w", path, err)
	}
	fmt.Fprintf(cmd.ErrOrStderr(), "converted %s from %s\n", describe(st), path)
	return nil
}

// runToScript writes src as a script to f.toScript: next to it and renamed
// at the end, so a failed conversion leaves no partial file.
func runToScript(cmd *cobra.Command, f *replayFlags, o replay.Options, stateAt []uint64, src replay.Source, name string) error {
	so := replay.ScriptOptions{Filter: o.Filter, UntilSeq: o.UntilSeq, UntilTime: o.UntilTime, StateAt: stateAt, Source: name, Diag: cmd.ErrOrStderr()}
	ctx := cmd.Context()
	report := func(st replay.ScriptStats, to string) {
		fmt.Fprintf(cmd.ErrOrStderr(), "wrote %d events (seq %d..%d, %d printed one by one) as %d commands to %s\n",
			st.Events, st.First, st.Last, st.Printed, st.Commands, to)
	}
	if f.toScript == "-" {
		st, err := replay.ToScript(ctx, src, so, cmd.OutOrStdout())
		if err == nil {
			report(st, "stdout")
		}
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.toScript), filepath.Base(f.toScript)+".*.tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	st, err := replay.ToScript(ctx, src, so, tmp)
	if cerr := tmp.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), f.toScript); err != nil {
		return err
	}
	report(st, f.toScript)
	return nil
}

func runReplay(cmd *cobra.Command, g *globals, f *replayFlags) error {
	stateAt, err := f.scriptFlags(cmd)
	if err != nil {
		return usage(err)
	}
	if f.fromScript != "" {
		return runFromScript(cmd, f.fromScript)
	}
	if f.html != "" {
		return runHTML(cmd, g, f)
	}
	o, err := f.options(cmd)
	if err != nil {
		return usage(err)
	}
	// --tail -1 (all) is Tail 0, --tail 0 is TailNone.
	switch tail := f.tail; {
	case f.follow && !cmd.Flags().Changed("tail"):
		o.Tail = 10
	case tail == 0:
		o.Tail = replay.TailNone
	case tail > 0:
		o.Tail = tail
	}
	ctx := cmd.Context()
	var src replay.Source
	name := "the live stream"
	if f.file == "-" {
		src, name = replay.JSONL(cmd.InOrStdin()), "stdin"
	} else if f.file != "" {
		fh, err := os.Open(f.file)
		if err != nil {
			return err
		}
		defer fh.Close()
		src = replay.JSONL(fh)
		name = filepath.Base(f.file)
	} else {
		nc, l, err := connectStream(ctx, g, "termlog-replay", natsserver.RoleObserver)
		if err != nil {
			return err
		}
		defer nc.Close()
		src = replay.Stream(l)
		if f.toScript == "" && !f.noSnapshot && replay.SnapshotSound(o) {
			o.Snapshots = bindSnapshots(ctx, l, cmd.ErrOrStderr())
		}
	}
	if f.toScript != "" {
		err = runToScript(cmd, f, o, stateAt, src, name)
	} else {
		err = replay.Run(ctx, src, o, cmd.OutOrStdout())
	}
	var de *events.DecodeError
	if errors.As(err, &de) && de.Line > 0 && !f.skipCorrupt {
		return fmt.Errorf("%s: %w; --skip-corrupt folds the line as a corrupt event and reads on", f.file, err)
	}
	return err
}

// runHTML writes replay --html: the report of the file or the live
// stream, through a temporary file renamed into place (a failed report
// leaves nothing under the name asked for).
func runHTML(cmd *cobra.Command, g *globals, f *replayFlags) error {
	for _, n := range []string{"state", "rejected", "check", "diff", "follow", "json", "tail", "to-script", "state-at"} {
		if cmd.Flags().Changed(n) {
			return usage(fmt.Errorf("--html writes a whole report; it does not go with --%s", n))
		}
	}
	o, err := (&replayFlags{untilTime: f.untilTime, fromTime: f.fromTime, toTime: f.toTime, worker: f.worker, endpoint: f.endpoint, store: f.store, shard: f.shard, typ: f.typ, fromSeq: f.fromSeq, toSeq: f.toSeq, untilSeq: f.untilSeq}).options(cmd)
	if err != nil {
		return err
	}
	ro := console.ReportOptions{Filter: o.Filter, UntilSeq: f.untilSeq, UntilTime: o.UntilTime, SkipCorrupt: f.skipCorrupt}
	if f.history != "" {
		for _, v := range strings.Split(f.history, ",") {
			s, err := replay.ParseSubject(strings.TrimSpace(v))
			if err != nil {
				return usage(fmt.Errorf("--history: %w", err))
			}
			ro.History = append(ro.History, s)
		}
	}
	ctx := cmd.Context()
	var src replay.Source
	if f.file != "" {
		fh, err := os.Open(f.file)
		if err != nil {
			return err
		}
		defer fh.Close()
		src, ro.Title = replay.JSONL(fh), filepath.Base(f.file)
	} else {
		nc, l, err := connectStream(ctx, g, "termlog-replay", natsserver.RoleObserver)
		if err != nil {
			return err
		}
		defer nc.Close()
		src, ro.Title = replay.Stream(l), "stream "+l.Stream()
	}
	tmp, err := os.CreateTemp(filepath.Dir(f.html), ".report-*.html")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if err := console.Report(ctx, src, ro, tmp); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	if err := os.Chmod(tmp.Name(), 0o644); err != nil {
		return err
	}
	if err := os.Rename(tmp.Name(), f.html); err != nil {
		return err
	}
	fi, _ := os.Stat(f.html)
	fmt.Fprintf(cmd.ErrOrStderr(), "wrote %s (%d bytes): open it in a browser, no network needed\n", f.html, fi.Size())
	return nil
}

// bindSnapshots binds the cluster's snapshot bucket for a replay; nil when
// there is none (reported on diag unless it simply does not exist).
func bindSnapshots(ctx context.Context, l *natslog.Log, diag io.Writer) events.SnapshotStore {
	octx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	s, err := natslog.BindSnapshots(octx, l)
	switch {
	case err == nil:
		return s
	case !errors.Is(err, jetstream.ErrBucketNotFound):
		fmt.Fprintf(diag, "replay: warning: %v; folding from seq 1\n", err)
	}
	return nil
}

func newReplayExport(g *globals) *cobra.Command {
	var out string
	cmd := &cobra.Command{
		Use:         "export",
		Short:       "Write the live stream to JSONL (one event a line with its seq; corrupt records kept as raw lines)",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{readCommand: "replay export"},
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			l, closeLog, err := openStream(ctx, g, "termlog-replay-export", natsserver.RoleObserver)
			if err != nil {
				return err
			}
			defer closeLog()
			o := replay.TransferOptions{Diag: cmd.ErrOrStderr()}
			if out == "" || out == "-" {
				st, err := replay.Export(ctx, replay.Stream(l), cmd.OutOrStdout(), o)
				if err == nil {
					fmt.Fprintf(cmd.ErrOrStderr(), "exported %s\n", describe(st))
				}
				return err
			}
			// Write next to the target and rename, so a failed export leaves
			// no partial file under the name asked for.
			tmp, err := os.CreateTemp(filepath.Dir(out), filepath.Base(out)+".*.tmp")
			if err != nil {
				return err
			}
			defer os.Remove(tmp.Name())
			st, err := replay.Export(ctx, replay.Stream(l), tmp, o)
			if cerr := tmp.Close(); err == nil {
				err = cerr
			}
			if err != nil {
				return err
			}
			if err := os.Rename(tmp.Name(), out); err != nil {
				return err
			}
			fmt.Fprintf(cmd.OutOrStdout(), "exported %s to %s\n", describe(st), out)
			return nil
		},
	}
	cmd.Flags().StringVar(&out, "out", "-", "output file (- for stdout)")
	return cmd
}

func newReplayImport(g *globals) *cobra.Command {
	return &cobra.Command{
		Use:   "import FILE.jsonl",
		Short: "Append a JSONL export to a fresh, empty stream, each event at the seq it has in the file",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			fh, err := os.Open(args[0])
			if err != nil {
				return err
			}
			defer fh.Close()
			nc, l, err := connectStream(ctx, g, "termlog-replay-import", natsserver.RoleAdmin)
			if err != nil {
				return err
			}
			defer nc.Close()
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			st, err := replay.Import(ctx, fh, rawLog{Log: l, js: js}, replay.TransferOptions{Diag: cmd.ErrOrStderr()})
			if err != nil {
				return fmt.Errorf("%s into stream %s: %w", args[0], l.Stream(), err)
			}
			fmt.Fprintf(cmd.OutOrStdout(), "imported %s into stream %s\n", describe(st), l.Stream())
			return nil
		},
	}
}

func describe(st replay.Stats) string {
	if st.Events == 0 {
		return "0 events"
	}
	return fmt.Sprintf("%d events (seq %d..%d, %d raw)", st.Events, st.First, st.Last, st.Raw)
}

// openStream connects to --nats as role and opens the --cluster stream.
func openStream(ctx context.Context, g *globals, name string, role natsserver.Role) (events.Log, func(), error) {
	nc, l, err := connectStream(ctx, g, name, role)
	if err != nil {
		return nil, nil, err
	}
	return l, nc.Close, nil
}

// connectStream connects as role and opens the stream; an admin creates it
// when missing (import), any other role waits for it.
func connectStream(ctx context.Context, g *globals, name string, role natsserver.Role) (*nats.Conn, *natslog.Log, error) {
	// Fails within --timeout, naming the cause (session.openStream).
	s, err := g.dialSession(name, role)
	if err != nil {
		return nil, nil, err
	}
	l, err := s.openStream(ctx, role == natsserver.RoleAdmin)
	if err != nil {
		s.Close()
		return nil, nil, err
	}
	return s.nc, l, nil
}

// rawLog lets an import store a corrupt record byte for byte, fenced like
// natslog.Log.Append: Nats-Expected-Last-Sequence and a Msg-Id. It is
// published on <cluster>.ev.corrupt (the export does not keep subjects).
type rawLog struct {
	*natslog.Log
	js jetstream.JetStream
}

var _ replay.RawAppender = rawLog{}

func (l rawLog) AppendRaw(ctx context.Context, expectedLast uint64, body []byte) (uint64, error) {
	seq := expectedLast + 1
	ctx, cancel := context.WithTimeout(ctx, natslog.DefaultRequestTimeout)
	defer cancel()
	ack, err := l.js.PublishMsg(ctx, &nats.Msg{Subject: l.Subject("corrupt"), Data: body},
		jetstream.WithExpectStream(l.Stream()),
		jetstream.WithExpectLastSequence(expectedLast),
		jetstream.WithMsgID(fmt.Sprintf("raw-%d", seq)))
	var apiErr *jetstream.APIError
	switch {
	case errors.As(err, &apiErr) && (apiErr.ErrorCode == 10071 || apiErr.ErrorCode == 10164):
		return expectedLast, fmt.Errorf("append raw seq %d: %w: %v", seq, events.ErrFenced, err)
	case err != nil:
		return expectedLast, fmt.Errorf("append raw seq %d: %w", seq, err)
	case ack.Sequence != seq:
		return ack.Sequence, fmt.Errorf("append raw seq %d: %w: stored at seq %d", seq, events.ErrFenced, ack.Sequence)
	}
	return seq, nil
}

func newReplayDiff() *cobra.Command {
	return &cobra.Command{
		Use:   "diff A B",
		Short: "Where two views of the log first differ: two JSONL exports (two replicas', or before and after a fix), or a replica's snapshot and an export",
		Long: `diff folds A and B side by side and prints the first seq after which their
states differ, the entry each folded there, and how B's state differs from A's
(in the lines of --diff); exit 1 when they differ. A file holding a snapshot
(the encoding replicas store) is a state: it is compared with the other log's
state at the snapshot's seq.`,
		Args: cobra.ExactArgs(2),
		RunE: func(cmd *cobra.Command, args []string) error {
			var views [2]replay.View
			for i, path := range args {
				b, err := os.ReadFile(path)
				if err != nil {
					return err
				}
				views[i].Name = filepath.Base(path)
				st, err := projections.DecodeSnapshot(b)
				switch {
				case err == nil:
					views[i].State = st
					continue
				case bytes.HasPrefix(bytes.TrimSpace(b), []byte(`{"format"`)):
					return fmt.Errorf("%s: %w", path, err)
				}
				views[i].Log = replay.JSONL(bytes.NewReader(b))
			}
			if views[0].Name == views[1].Name {
				views[0].Name, views[1].Name = args[0], args[1]
			}
			_, err := replay.DiffViews(cmd.Context(), views[0], views[1], cmd.OutOrStdout())
			return err
		},
	}
}
