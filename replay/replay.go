package replay

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/projections/projtest/script"
)

// Mode is what Run prints.
type Mode int

// Modes.
const (
	// ModeTimeline prints one line per event that matches Options.Filter.
	ModeTimeline Mode = iota
	// ModeState prints the state at the end of the replay (bounded by
	// Options.UntilSeq and UntilTime).
	ModeState
	// ModeHistory prints every event touching Options.Subject, with its
	// outcome, then the subject's final state.
	ModeHistory
	// ModeRejected prints every rejected event (stale-term, future-term,
	// invalid), from the fold result of every event, then a summary.
	ModeRejected
	// ModeCheck checks the invariants after every event and the step rules
	// between events; it fails with a *CheckError at the first violation.
	ModeCheck
	// ModeDiff prints what changed between the state after seq
	// Options.DiffFrom and the state after seq Options.DiffTo.
	ModeDiff
)

// Options say what Run does. The zero value prints the whole timeline.
type Options struct {
	Mode Mode
	// Filter selects the events of the timeline (ModeTimeline).
	Filter Filter
	// Subject is the id ModeHistory tells the story of.
	Subject Subject
	// UntilSeq stops the replay after this seq (0: the end of the log).
	UntilSeq uint64
	// UntilTime stops the replay before the first event that happened
	// after it (zero: no bound). The state is a prefix of the log, so an
	// earlier event behind a later one (clocks of two leaders) is not folded.
	UntilTime time.Time
	// DiffFrom and DiffTo are the seqs ModeDiff compares (DiffFrom may be 0,
	// the state before the first event).
	DiffFrom, DiffTo uint64
	// Follow keeps reading the timeline as the log grows, until ctx is
	// done. The Source must be a Follower. Only with ModeTimeline.
	Follow bool
	// Tail, when not 0, prints only the last Tail matching events of the
	// timeline's history: the whole log, or with Follow the log up to its
	// end when the replay started (new events are all printed). TailNone
	// prints none of the history. Every event is folded either way.
	Tail int
	// JSON prints JSON: one object a line for timelines (ModeTimeline,
	// ModeRejected), one document otherwise.
	JSON bool
	// SkipCorrupt folds a damaged JSONL line as a corrupt event, reports it
	// on Diag and reads on; without it Run stops there with an error naming
	// the line. (Corrupt records of the log itself are always folded.)
	SkipCorrupt bool
	// Diag receives what is not the answer: skipped lines and progress of
	// long replays. Nil discards it.
	Diag io.Writer
	// Now is the clock for progress reports; nil is time.Now.
	Now func() time.Time
	// Snapshots, when set and the Source is a Seeker (the live stream),
	// lets the modes SnapshotSound allows start from the newest usable
	// snapshot at or below the seq they want and fold only the events after
	// it. A snapshot that cannot be used is reported on Diag and passed
	// over; with none usable the replay folds from seq 1.
	Snapshots events.SnapshotStore
}

// TailNone as Options.Tail prints no event of the history.
const TailNone = -1

// Tailer is a Source that knows its last seq (the live stream does).
type Tailer interface {
	Tail(ctx context.Context) (uint64, error)
}

// Filter selects timeline events; every field set must match. The zero
// value matches everything.
type Filter struct {
	Worker   uint64 // touches this worker id (0: any)
	Endpoint string // touches this endpoint
	Store    string // touches this store
	Shard    uint64 // touches this shard (0: any)
	// Type is an exact type ("worker.expired"), a prefix ending in a dot
	// ("worker.", "shard.replica.") or a family ("worker" is "worker.").
	Type string
	// Term selects the events stamped with this term (0: any).
	Term uint64
	// Writer selects the events this replica wrote ("": any).
	Writer string
	// FromSeq and ToSeq bound the seqs printed (0: unbounded).
	FromSeq, ToSeq uint64
	// FromTime and ToTime bound the event times printed (zero: unbounded).
	FromTime, ToTime time.Time
}

// Match reports whether the filter selects the step.
func (f Filter) Match(st Step) bool {
	if f.FromSeq > 0 && st.Seq < f.FromSeq || f.ToSeq > 0 && st.Seq > f.ToSeq {
		return false
	}
	at := st.Event.At
	if !f.FromTime.IsZero() && (at.IsZero() || at.Before(f.FromTime)) {
		return false
	}
	if !f.ToTime.IsZero() && (at.IsZero() || at.After(f.ToTime)) {
		return false
	}
	if f.Type != "" && !MatchType(f.Type, st.Type()) {
		return false
	}
	if f.Term != 0 && st.Event.Term != f.Term || f.Writer != "" && st.Event.Writer != f.Writer {
		return false
	}
	t := st.Touch
	return (f.Worker == 0 || t.Has(Subject{Kind: KindWorker, Num: f.Worker})) &&
		(f.Endpoint == "" || t.Has(Subject{Kind: KindEndpoint, Name: f.Endpoint})) &&
		(f.Store == "" || t.Has(Subject{Kind: KindStore, Name: f.Store})) &&
		(f.Shard == 0 || t.Has(Subject{Kind: KindShard, Num: f.Shard}))
}

// MatchType reports whether typ matches pattern: equal, a prefix ending in
// a dot, or a family name followed by a dot in typ.
func MatchType(pattern, typ string) bool {
	if pattern == typ {
		return true
	}
	if !strings.HasSuffix(pattern, ".") {
		pattern += "."
	}
	return strings.HasPrefix(typ, pattern)
}

// ParseSeqRange parses "A..B" with A < B (A may be 0).
func ParseSeqRange(v string) (from, to uint64, err error) {
	a, b, ok := strings.Cut(v, "..")
	if !ok {
		return 0, 0, fmt.Errorf("range %q: want A..B", v)
	}
	if _, err := fmt.Sscan(a, &from); err != nil {
		return 0, 0, fmt.Errorf("range %q: seq %q: want a number", v, a)
	}
	if _, err := fmt.Sscan(b, &to); err != nil {
		return 0, 0, fmt.Errorf("range %q: seq %q: want a number", v, b)
	}
	if fmt.Sprint(from) != strings.TrimSpace(a) || fmt.Sprint(to) != strings.TrimSpace(b) {
		return 0, 0, fmt.Errorf("range %q: want A..B with two seqs", v)
	}
	if from >= to {
		return 0, 0, fmt.Errorf("range %q: the first seq must be below the second", v)
	}
	return from, to, nil
}

func (o Options) validate() error {
	switch o.Mode {
	case ModeTimeline, ModeState, ModeRejected, ModeCheck:
	case ModeHistory:
		if _, err := ParseSubject(o.Subject.String()); err != nil {
			return err
		}
	case ModeDiff:
		if o.DiffFrom >= o.DiffTo {
			return fmt.Errorf("diff %d..%d: the first seq must be below the second", o.DiffFrom, o.DiffTo)
		}
		if o.UntilSeq > 0 || !o.UntilTime.IsZero() {
			return errors.New("diff takes its own bounds; until seq and until time do not apply")
		}
	default:
		return fmt.Errorf("unknown mode %d", o.Mode)
	}
	if o.Tail < TailNone {
		return fmt.Errorf("tail %d: want a count of events (or TailNone)", o.Tail)
	}
	if o.Tail != 0 && o.Mode != ModeTimeline {
		return errors.New("tail limits the timeline only")
	}
	if o.Follow && (o.Mode != ModeTimeline || o.UntilSeq > 0 || !o.UntilTime.IsZero() || o.Filter.ToSeq > 0) {
		return errors.New("follow prints the timeline only, without an upper bound")
	}
	return nil
}

// CheckError is the first invariant or step violation ModeCheck found: the
// one checker, script.Checker, which a projection script's check command
// runs too.
type CheckError = script.CheckError

// Sequence problems ModeCheck reports (SeqError.Kind).
const (
	SeqGap        = script.SeqGap
	SeqOutOfOrder = script.SeqOutOfOrder
	SeqDuplicate  = script.SeqDuplicate
)

// SeqError is a log whose seqs do not run 1, 2, 3, ...: a seq missing, two
// lines swapped, or a seq twice. It names the first offending entry.
type SeqError = script.SeqError

// errStop ends a read early once the bounds are passed.
var errStop = errors.New("replay: bound reached")

// Run replays src as o says and writes the answer to out. Diagnostics go to
// o.Diag, never to out. It returns an error for a damaged line (unless
// o.SkipCorrupt), a failed check (*CheckError), a bad option, or a failed
// read or write; a replay of any input never panics.
func Run(ctx context.Context, src Source, o Options, out io.Writer) error {
	if err := o.validate(); err != nil {
		return err
	}
	if src == nil {
		return errors.New("replay: no source")
	}
	if out == nil {
		out = io.Discard
	}
	if o.Mode == ModeHistory {
		o.Subject, _ = ParseSubject(o.Subject.String()) // validated: Num matches Name
	}
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	w := bufio.NewWriter(out)
	r := &runner{o: o, f: NewFolder(), out: w}
	sk, seeks := src.(Seeker)
	from := uint64(1)
	if o.Snapshots != nil && seeks && SnapshotSound(o) {
		r.f, from, r.snap = startFromSnapshot(ctx, o)
	}
	if !o.Follow {
		r.prog = newProgress(o.Diag, o.Now, "replay")
	}
	r.live = o.Tail == 0
	if o.Follow && o.Tail != 0 {
		tl, ok := src.(Tailer)
		if !ok {
			return errors.New("tail with follow needs a source that knows its last seq")
		}
		end, err := tl.Tail(ctx)
		if err != nil {
			return fmt.Errorf("replay: %w", err)
		}
		r.histEnd, r.live = end, end == 0
	}
	if pc, ok := src.(prechecker); ok && !o.SkipCorrupt {
		// A damaged line is reported before anything is printed.
		if err := pc.precheck(ctx); err != nil {
			return err
		}
	}
	var err error
	if o.Follow {
		fl, ok := src.(Follower)
		if !ok {
			return errors.New("follow needs the live stream, not a file")
		}
		err = fl.Follow(ctx, r.item)
		if ctx.Err() != nil && errors.Is(err, ctx.Err()) {
			err = nil
		}
	} else if from > 1 {
		err = sk.ReadFrom(ctx, from, r.item)
		if errors.Is(err, events.ErrCompacted) && r.f.Count() == 0 {
			// The events after the snapshot went between checking it and
			// reading: nothing was folded onto it yet; fold from seq 1.
			fmt.Fprintf(o.Diag, "replay: warning: %v; folding from seq 1\n", err)
			r.f, r.snap = NewFolder(), nil
			err = src.Read(ctx, r.item)
		}
	} else {
		err = src.Read(ctx, r.item)
	}
	if errors.Is(err, errStop) {
		err = nil
	}
	if err == nil {
		err = r.finish()
	}
	if ferr := w.Flush(); err == nil && ferr != nil {
		err = fmt.Errorf("write: %w", ferr)
	}
	r.prog.done(r.f.Count(), r.f.State().Seq)
	return err
}

type runner struct {
	o    Options
	f    *Folder
	out  *bufio.Writer
	prog *progress
	werr error

	matched uint64 // lines printed (timeline, history, rejected)
	// Tail: the history's last matching steps, printed once it ends.
	ring    []Step
	ringAt  int
	seen    uint64 // matching steps, printed or not
	histEnd uint64 // with Follow: the last seq of the history
	live    bool   // the history is over: print every match
	header  bool
	stopped bool // an entry past the bounds was met

	// ModeHistory
	steps   []stepJSON
	changed *Step // last step that changed whether the subject exists
	// ModeRejected
	byKind   map[string]uint64
	byWriter map[string]uint64
	// ModeDiff
	from *projections.State
	// ModeCheck
	chk     script.Checker
	skipped []string // damaged lines folded as corrupt events (SkipCorrupt)
	// snap is the snapshot the fold started from, if any.
	snap *events.SnapshotInfo
}

func (r *runner) printf(format string, a ...any) {
	if r.werr == nil {
		_, r.werr = fmt.Fprintf(r.out, format, a...)
	}
}

func (r *runner) printJSON(v any) {
	if r.werr != nil {
		return
	}
	// One line per value; "<" and ">" stay as they are (reasons say "term 1 < current term 7").
	enc := json.NewEncoder(r.out)
	enc.SetEscapeHTML(false)
	r.werr = enc.Encode(v)
}

// printStep prints one timeline line (or JSON object).
func (r *runner) printStep(st Step) {
	r.matched++
	if r.o.JSON {
		r.printJSON(toJSON(st))
	} else {
		if !r.header {
			r.header = true
			r.printf("%s\n", timelineHeader)
		}
		r.printf("%s\n", formatStep(st))
	}
	if r.o.Follow && r.werr == nil {
		r.werr = r.out.Flush()
	}
}

// stop reports whether it lies past the replay's bounds.
func (r *runner) stop(it Item) bool {
	o := r.o
	switch {
	case o.UntilSeq > 0 && it.Seq > o.UntilSeq:
		return true
	case !o.UntilTime.IsZero() && it.Err == nil && it.Event.At.After(o.UntilTime):
		return true
	case o.Mode == ModeDiff && it.Seq > o.DiffTo:
		return true
	case o.Mode == ModeTimeline && o.Filter.ToSeq > 0 && it.Seq > o.Filter.ToSeq:
		return true
	}
	return false
}

func (r *runner) item(it Item) error {
	if r.stop(it) {
		r.stopped = true
		return errStop
	}
	if it.Damaged {
		if !r.o.SkipCorrupt {
			return fmt.Errorf("corrupt line: %w", it.Err)
		}
		fmt.Fprintf(r.o.Diag, "replay: skipped corrupt %v (folded as a corrupt event)\n", it.Err)
		where := fmt.Sprintf("seq %d", it.Seq)
		if it.Line > 0 {
			where = fmt.Sprintf("line %d", it.Line)
		}
		r.skipped = append(r.skipped, where)
	}
	if r.o.Mode == ModeDiff && r.from == nil && it.Seq > r.o.DiffFrom {
		r.from = r.f.State().Clone()
	}
	if r.o.Mode == ModeCheck {
		if err := r.chk.Before(it.Seq, it.Line); err != nil {
			return r.checkFailed(err)
		}
	}
	existed := r.o.Mode == ModeHistory && r.exists()
	st := r.f.Fold(it)
	r.prog.tick(r.f.Count(), r.f.State().Seq)
	switch r.o.Mode {
	case ModeTimeline:
		if r.o.Filter.Match(st) {
			r.seen++
			if r.live {
				r.printStep(st)
			} else {
				r.keep(st)
			}
		}
		if !r.live && r.o.Follow && st.Seq >= r.histEnd {
			r.endHistory()
		}
	case ModeHistory:
		if st.Touch.Has(r.o.Subject) {
			r.history(st, existed)
		}
	case ModeRejected:
		if st.Result.Outcome == projections.Rejected {
			r.rejected(st)
		}
	case ModeCheck:
		if err := r.check(st); err != nil {
			return err
		}
	}
	if r.werr == nil && r.reached() {
		// The next entry can only lie past the bound: do not wait for it.
		r.stopped = true
		return errStop
	}
	return r.werr
}

// reached reports whether the state is at the replay's upper seq bound.
func (r *runner) reached() bool {
	o, seq := r.o, r.f.State().Seq
	switch {
	case o.UntilSeq > 0 && seq >= o.UntilSeq:
		return true
	case o.Mode == ModeDiff && seq >= o.DiffTo:
		return true
	case o.Mode == ModeTimeline && o.Filter.ToSeq > 0 && seq >= o.Filter.ToSeq:
		return true
	}
	return false
}

// keep remembers a step of the history for the tail.
func (r *runner) keep(st Step) {
	n := r.o.Tail
	if n <= 0 {
		return
	}
	if len(r.ring) < n {
		r.ring = append(r.ring, st)
		return
	}
	r.ring[r.ringAt] = st
	r.ringAt = (r.ringAt + 1) % n
}

// endHistory prints the tail of the history and goes live.
func (r *runner) endHistory() {
	for i := range r.ring {
		r.printStep(r.ring[(r.ringAt+i)%len(r.ring)])
	}
	r.ring, r.live = nil, true
	if r.werr == nil {
		r.werr = r.out.Flush()
	}
}

func (r *runner) finish() error {
	s := r.f.State()
	switch r.o.Mode {
	case ModeTimeline:
		if !r.live {
			r.endHistory()
		}
		if r.seen == 0 && !r.o.JSON {
			r.printf("no event matches (%d events read, last seq %d)\n", r.f.Count(), s.Seq)
		}
	case ModeState:
		if r.o.UntilSeq > 0 && !r.stopped && s.Seq < r.o.UntilSeq {
			fmt.Fprintf(r.o.Diag, "replay: the log ends at seq %d, before seq %d\n", s.Seq, r.o.UntilSeq)
		}
		r.printState(s)
	case ModeHistory:
		r.finishHistory()
	case ModeRejected:
		r.finishRejected()
	case ModeCheck:
		if err := r.chk.End(); err != nil {
			return r.checkFailed(err)
		}
		if n := len(r.skipped); n > 0 {
			// --skip-corrupt reads on, but a log with damaged lines does
			// not pass a check.
			return &CheckError{Seq: s.Seq, Events: r.f.Count(), Err: fmt.Errorf("%d damaged line(s) skipped (%s): the log is not intact", n, strings.Join(r.skipped, ", "))}
		}
		if r.o.JSON {
			r.printJSON(checkJSON{OK: true, Events: r.f.Count(), Seq: s.Seq, Hash: s.Hash()})
		} else {
			r.printf("ok: %d events, no invariant violated (last seq %d, hash %s)\n", r.f.Count(), s.Seq, s.Hash())
		}
	case ModeDiff:
		if !r.stopped && s.Seq < r.o.DiffTo {
			return fmt.Errorf("diff %d..%d: the log ends at seq %d", r.o.DiffFrom, r.o.DiffTo, s.Seq)
		}
		if r.from == nil {
			r.from = s.Clone()
		}
		d := Compare(r.from, s)
		if r.o.JSON {
			r.printJSON(d)
		} else {
			r.printf("%s", d.Render())
		}
	}
	return r.werr
}

type stateJSON struct {
	Hash string `json:"hash"`
	// FromSnapshot is the snapshot the fold started from (absent: seq 1).
	FromSnapshot *events.SnapshotInfo `json:"from_snapshot,omitempty"`
	State        *projections.State   `json:"state"`
}

func (r *runner) printState(s *projections.State) {
	if r.o.JSON {
		r.printJSON(stateJSON{Hash: s.Hash(), FromSnapshot: r.snap, State: s})
		return
	}
	r.printf("%shash %s\n", s.Render(), s.Hash())
	if r.snap != nil {
		r.printf("from snapshot %s at seq %d, then %d events folded\n", r.snap.Name, r.snap.Seq, r.f.Count())
	}
}

// check verifies the invariants after st and the step rules across it.
func (r *runner) check(st Step) error {
	if err := r.chk.After(st.Seq, st.Line, st.Before, r.f.State()); err != nil {
		return r.checkFailed(err)
	}
	return nil
}

// checkFailed prints a failed check (with --json) and returns it.
func (r *runner) checkFailed(err error) error {
	var ce *CheckError
	if r.o.JSON && errors.As(err, &ce) {
		var list []string
		for _, e := range unjoin(ce.Err) {
			list = append(list, e.Error())
		}
		r.printJSON(checkJSON{OK: false, Events: ce.Events, Seq: ce.Seq, Line: ce.Line, Violations: list})
	}
	return err
}

type checkJSON struct {
	OK         bool     `json:"ok"`
	Events     uint64   `json:"events"`
	Seq        uint64   `json:"seq"`
	Line       int      `json:"line,omitempty"`
	Hash       string   `json:"hash,omitempty"`
	Violations []string `json:"violations,omitempty"`
}

// unjoin flattens errors.Join trees.
func unjoin(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		var out []error
		for _, e := range j.Unwrap() {
			out = append(out, unjoin(e)...)
		}
		return out
	}
	return []error{err}
}

// exists reports whether the history subject exists in the current state.
func (r *runner) exists() bool {
	s, sub := r.f.State(), r.o.Subject
	switch sub.Kind {
	case KindWorker:
		_, ok := s.Worker(sub.Num)
		return ok
	case KindStore:
		_, ok := s.Stores[sub.Name]
		return ok
	case KindShard:
		_, ok := s.Shards[sub.Num]
		return ok
	case KindEndpoint:
		_, ok := s.WorkerAt(sub.Name)
		return ok
	}
	return false
}

func (r *runner) history(st Step, existed bool) {
	if existed != r.exists() {
		c := st
		r.changed = &c
	}
	if r.o.JSON {
		r.matched++
		r.steps = append(r.steps, toJSON(st))
		return
	}
	if r.matched == 0 {
		r.printf("history of %s\n", r.o.Subject)
	}
	r.printStep(st)
}

type historyJSON struct {
	Subject string     `json:"subject"`
	Events  []stepJSON `json:"events"`
	Final   finalJSON  `json:"final"`
}

type finalJSON struct {
	Seq     uint64 `json:"seq"`    // the state's seq
	Exists  bool   `json:"exists"` // active worker, registered store, existing shard, endpoint with a worker
	Changed uint64 `json:"changed,omitempty"`
	Why     string `json:"why,omitempty"` // the fold's reason at Changed
	Entity  any    `json:"entity,omitempty"`
	Text    string `json:"text"`
}

func (r *runner) final() finalJSON {
	s, sub := r.f.State(), r.o.Subject
	f := finalJSON{Seq: s.Seq, Exists: r.exists()}
	if r.changed != nil {
		f.Changed, f.Why = r.changed.Seq, r.changed.Result.Reason
	}
	if f.Exists {
		switch sub.Kind {
		case KindWorker:
			w, _ := s.Worker(sub.Num)
			f.Entity, f.Text = w, workerLine(w)
		case KindStore:
			st := *s.Stores[sub.Name]
			f.Entity, f.Text = st, storeLine(st)
		case KindShard:
			for _, sh := range s.ListShards() {
				if sh.ID == sub.Num {
					f.Entity, f.Text = sh, shardLine(sh)
				}
			}
		case KindEndpoint:
			w, _ := s.WorkerAt(sub.Name)
			f.Entity, f.Text = w, fmt.Sprintf("endpoint %s: %s", sub.Name, workerLine(w))
		}
		return f
	}
	what := map[string]string{KindWorker: "is not active", KindStore: "is not registered",
		KindShard: "does not exist", KindEndpoint: "has no active worker"}[sub.Kind]
	f.Text = fmt.Sprintf("%s %s %s", sub.Kind, sub.Name, what)
	if r.changed != nil {
		f.Text += fmt.Sprintf(" since seq %d (%s)", f.Changed, r.changed.Result)
	} else if sub.Kind == KindWorker || sub.Kind == KindEndpoint {
		f.Text += " (never was)"
	}
	return f
}

func (r *runner) finishHistory() {
	f := r.final()
	if r.o.JSON {
		if r.steps == nil {
			r.steps = []stepJSON{}
		}
		r.printJSON(historyJSON{Subject: r.o.Subject.String(), Events: r.steps, Final: f})
		return
	}
	if r.matched == 0 {
		r.printf("history of %s\nno event touches %s\n", r.o.Subject, r.o.Subject)
	}
	r.printf("final (seq %d): %s\n", f.Seq, f.Text)
}

func (r *runner) rejected(st Step) {
	if r.byKind == nil {
		r.byKind, r.byWriter = map[string]uint64{}, map[string]uint64{}
	}
	r.byKind[st.Result.Kind]++
	r.byWriter[st.Event.Writer]++
	r.printStep(st)
}

func (r *runner) finishRejected() {
	if r.o.JSON {
		return
	}
	n, s := r.f.Count(), r.f.State()
	if r.matched == 0 {
		r.printf("no rejected event in %d events (last seq %d)\n", n, s.Seq)
		return
	}
	var kinds, writers []string
	for _, k := range sortedKeys(r.byKind) {
		kinds = append(kinds, fmt.Sprintf("%s %d", orDash(k), r.byKind[k]))
	}
	for _, w := range sortedKeys(r.byWriter) {
		writers = append(writers, fmt.Sprintf("%s %d", orDash(w), r.byWriter[w]))
	}
	r.printf("%d rejected of %d events (last seq %d): %s; by writer: %s\n",
		r.matched, n, s.Seq, strings.Join(kinds, ", "), strings.Join(writers, ", "))
}
