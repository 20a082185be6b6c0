package replay

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/projections/projtest/script"
)

// ScriptOptions say what ToScript writes. The zero value writes every event
// of the log with its outcome, then the state at the end.
type ScriptOptions struct {
	// Filter selects the events printed one by one with their outcome. The
	// fold needs every event before the last one written, so the events it
	// does not select are written too, in "apply quiet" blocks that print
	// one summary line. Its ToSeq and ToTime end the script as UntilSeq and
	// UntilTime do.
	Filter Filter
	// UntilSeq ends the script after this seq (0: the end of the log).
	UntilSeq uint64
	// UntilTime ends the script before the first event after it.
	UntilTime time.Time
	// StateAt lists seqs after which the script prints the state.
	StateAt []uint64
	// Source names the log in the script's header ("" leaves it out).
	Source string
	// Diag receives notes and progress; nil discards them.
	Diag io.Writer
	// Now is the clock for progress reports; nil is time.Now.
	Now func() time.Time
}

// ScriptStats count what ToScript wrote.
type ScriptStats struct {
	Events   uint64 `json:"events"`   // entries written
	Printed  uint64 `json:"printed"`  // of those, printed one by one
	First    uint64 `json:"first"`    // first seq (0 when none)
	Last     uint64 `json:"last"`     // last seq written
	Commands int    `json:"commands"` // commands in the script
}

// maxBlock bounds the entries of one apply block, so a failing block prints
// a readable input.
const maxBlock = 200

// ToScript writes src as a projection script (package projtest): apply
// blocks holding the events with the fold's outcome of each, the state at
// every seq of o.StateAt and at the end, and the invariant check. The
// outcomes are today's fold of these very lines, so the script passes with
// the kit as written; a later change to the rules that alters an outcome
// fails it with a diff naming the seq. A damaged JSONL line is an error (it
// has no body to keep); a stored record that does not decode is written as
// a raw line.
func ToScript(ctx context.Context, src Source, o ScriptOptions, w io.Writer) (ScriptStats, error) {
	if o.Diag == nil {
		o.Diag = io.Discard
	}
	if o.Now == nil {
		o.Now = time.Now
	}
	sw := &scriptWriter{o: o, w: w, fold: script.NewFold(), touch: NewFolder()}
	sw.stateAt = slices.Sorted(slices.Values(o.StateAt))
	sw.stateAt = slices.Compact(sw.stateAt)
	if pc, ok := src.(prechecker); ok {
		if err := pc.precheck(ctx); err != nil {
			return ScriptStats{}, fmt.Errorf("%w (a damaged line has no body to keep in a script; a corrupt record is kept as a raw line)", err)
		}
	}
	prog := newProgress(o.Diag, o.Now, "to-script")
	err := src.Read(ctx, func(it Item) error {
		if sw.stop(it) {
			return errStop
		}
		if err := sw.item(it); err != nil {
			return err
		}
		prog.tick(sw.st.Events, it.Seq)
		if sw.reached() {
			return errStop
		}
		return nil
	})
	if errors.Is(err, errStop) {
		err = nil
	}
	if err == nil {
		err = sw.finish()
	}
	prog.done(sw.st.Events, sw.st.Last)
	return sw.st, err
}

type scriptWriter struct {
	o       ScriptOptions
	w       io.Writer
	fold    *script.Fold
	touch   *Folder // for the filter: what each entry touches
	stateAt []uint64
	st      ScriptStats
	last    uint64 // highest seq written

	block      []string
	blockQuiet bool
	blockNote  string
	werr       error
}

func (sw *scriptWriter) stop(it Item) bool {
	o := sw.o
	switch {
	case o.UntilSeq > 0 && it.Seq > o.UntilSeq, o.Filter.ToSeq > 0 && it.Seq > o.Filter.ToSeq:
		return true
	case it.Err == nil && !o.UntilTime.IsZero() && it.Event.At.After(o.UntilTime):
		return true
	case it.Err == nil && !o.Filter.ToTime.IsZero() && it.Event.At.After(o.Filter.ToTime):
		return true
	}
	return false
}

func (sw *scriptWriter) reached() bool {
	o, seq := sw.o, sw.last
	return o.UntilSeq > 0 && seq >= o.UntilSeq || o.Filter.ToSeq > 0 && seq >= o.Filter.ToSeq
}

func (sw *scriptWriter) item(it Item) error {
	if it.Damaged {
		return fmt.Errorf("corrupt line: %w (a damaged line has no body to keep in a script; a corrupt record is kept as a raw line)", it.Err)
	}
	// The state at a seq is printed once the log has passed it.
	for len(sw.stateAt) > 0 && it.Seq > sw.stateAt[0] {
		sw.printState(sw.stateAt[0])
		sw.stateAt = sw.stateAt[1:]
	}
	var line string
	if it.Err != nil {
		line = script.FormatRaw(it.Seq, sw.last, it.Body)
	} else {
		// The line keeps the stored bytes of the event; one that would not
		// read back (a field this build does not know) is re-encoded.
		var err error
		at, data, ok := it.original()
		if ok {
			line, err = script.FormatOriginal(it.Event, sw.last, at, data)
		}
		if !ok || err != nil {
			if ok {
				fmt.Fprintf(sw.o.Diag, "replay: seq %d: written as this build encodes it: %v\n", it.Seq, err)
			}
			if line, err = script.FormatEvent(it.Event, sw.last); err != nil {
				return fmt.Errorf("seq %d: %w", it.Seq, err)
			}
		}
	}
	step := sw.touch.Fold(it)
	quiet := !sw.o.Filter.Match(step)
	ts, isTerm := it.Event.Data.(events.TermStarted)
	if len(sw.block) > 0 && (quiet != sw.blockQuiet || len(sw.block) >= maxBlock || isTerm && it.Err == nil && !quiet) {
		sw.flush()
	}
	if len(sw.block) == 0 {
		sw.blockQuiet = quiet
		switch {
		case quiet:
			sw.blockNote = "not selected by the filter: folded for the state they leave"
		case isTerm && it.Err == nil && step.Result.Outcome != projections.Applied:
			// The fold refused it: say so, and which term stayed.
			now := sw.touch.State()
			sw.blockNote = fmt.Sprintf("term %d, leader %s: %s; term %d, leader %s stays", ts.Term, orDash(ts.Leader), step.Result, now.Term, orDash(now.Leader))
		case isTerm && it.Err == nil:
			sw.blockNote = fmt.Sprintf("term %d, leader %s", ts.Term, ts.Leader)
		default:
			sw.blockNote = ""
		}
	}
	sw.block = append(sw.block, line)
	sw.st.Events++
	if sw.st.Events == 1 {
		sw.st.First = it.Seq
	}
	if !quiet {
		sw.st.Printed++
	}
	sw.last = max(sw.last, it.Seq)
	sw.st.Last = it.Seq
	return sw.werr
}

// flush writes the pending apply block.
func (sw *scriptWriter) flush() {
	if len(sw.block) == 0 {
		return
	}
	d := script.Directive{Cmd: "apply", Input: strings.Join(sw.block, "\n")}
	if sw.blockQuiet {
		d.Args = []script.Arg{{Key: "quiet"}}
	}
	if sw.blockNote != "" {
		d.Comments = []string{sw.blockNote}
	}
	sw.block = sw.block[:0]
	sw.emit(d)
}

func (sw *scriptWriter) printState(at uint64) {
	sw.flush()
	note := fmt.Sprintf("the state at seq %d", at)
	if s := sw.fold.State.Seq; s != at {
		note += fmt.Sprintf(" (the last seq folded is %d)", s)
	}
	sw.emit(script.Directive{Comments: []string{note}, Cmd: "state"})
}

// emit runs d against the fold and writes it with today's output.
func (sw *scriptWriter) emit(d script.Directive) {
	if sw.werr != nil {
		return
	}
	out, err := sw.fold.Run(d.Cmd, d.Args, d.Input)
	if err != nil { // the lines were written by script.Format*: cannot happen
		sw.werr = fmt.Errorf("to-script: %s: %w", d.Cmd, err)
		return
	}
	d.Output = out
	var b bytes.Buffer
	if sw.st.Commands == 0 {
		b.WriteString(sw.header())
	}
	b.WriteString("\n")
	if err := script.Write(&b, []script.Directive{d}); err != nil {
		sw.werr = err
		return
	}
	sw.st.Commands++
	if _, err := sw.w.Write(b.Bytes()); err != nil {
		sw.werr = fmt.Errorf("write: %w", err)
	}
}

func (sw *scriptWriter) header() string {
	var b strings.Builder
	b.WriteString("# A projection script written by termlog replay --to-script")
	if sw.o.Source != "" {
		fmt.Fprintf(&b, " from %s", sw.o.Source)
	}
	b.WriteString(".\n")
	b.WriteString("# Run it with projtest.RunFile (github.com/termlog/termlog/projections/projtest);\n")
	b.WriteString("# go test -rewrite writes today's outcomes into it. The grammar is in projtest's doc.\n")
	return b.String()
}

func (sw *scriptWriter) finish() error {
	sw.flush()
	for _, at := range sw.stateAt {
		fmt.Fprintf(sw.o.Diag, "replay: the log ends at seq %d, before --state-at %d\n", sw.last, at)
		sw.printState(at)
	}
	sw.stateAt = nil
	if sw.st.Events == 0 && sw.werr == nil {
		return errors.New("to-script: no event to write")
	}
	sw.emit(script.Directive{Comments: []string{fmt.Sprintf("the state at the end (seq %d)", sw.fold.State.Seq)}, Cmd: "state"})
	sw.emit(script.Directive{Comments: []string{"the check of replay --check: seqs 1, 2, 3..., the invariants after every event"}, Cmd: "check"})
	return sw.werr
}

// FromScript writes the entries a projection script folds — its apply
// lines and the events its flood commands generate — to w as JSONL, in the
// order it folds them, each with the seq it is folded at: replay and import
// take the output. It runs the script with the kit's commands, so a bad
// line is an error naming it, and nothing is written unless the whole
// script reads. Commands the kit does not know (a test's own) are skipped,
// and an output that differs from the script's, noted on diag; so are the
// entries folded into a view other than main (replica blocks): the log is
// the main view's.
func FromScript(r io.Reader, w io.Writer, diag io.Writer) (Stats, error) {
	if diag == nil {
		diag = io.Discard
	}
	ds, err := script.Parse(r)
	if err != nil {
		return Stats{}, fmt.Errorf("from-script: %w", err)
	}
	var out bytes.Buffer
	var st Stats
	var werr error
	f := script.NewFold()
	other := 0 // entries folded into views other than main
	f.OnEntry = func(seq uint64, body []byte) {
		if werr != nil {
			return
		}
		if f.View() != script.MainView {
			other++
			return
		}
		ev, err := events.Decode(seq, body)
		if err != nil {
			out.Write(encodeRaw(seq, body, err))
			out.WriteByte('\n')
		} else {
			werr = events.WriteJSONL(&out, ev)
		}
		st.add(seq, err != nil)
	}
	for _, d := range ds {
		got, err := f.Run(d.Cmd, d.Args, d.Input)
		switch {
		case errors.Is(err, script.ErrUnknownCommand):
			fmt.Fprintf(diag, "replay: line %d: %s is not a command of the kit; skipped\n", d.Line, d.Cmd)
			continue
		case err != nil:
			return Stats{}, fmt.Errorf("from-script: line %d: %s: %w", d.Line, d.Cmd, err)
		case werr != nil:
			return Stats{}, fmt.Errorf("from-script: line %d: %w", d.Line, werr)
		}
		if got != d.Output {
			fmt.Fprintf(diag, "replay: line %d: %s: today's output differs from the script's\n", d.Line, d.Cmd)
		}
		if other > 0 {
			fmt.Fprintf(diag, "replay: line %d: %s: %d entries folded into replica %s are not written (the log is the main view's)\n", d.Line, d.Cmd, other, f.View())
			other = 0
		}
	}
	if _, err := w.Write(out.Bytes()); err != nil {
		return st, fmt.Errorf("from-script: write: %w", err)
	}
	return st, nil
}
