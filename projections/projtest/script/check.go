package script

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/termlog/termlog/projections"
)

// Checker is the one check of a log: `termlog replay --check` runs it over a
// file or the stream, and a script's check command reports what it found
// over the entries the script folded. It checks that the seqs run 1, 2,
// 3, ... (no gap, no swap, no duplicate), the step rules across every entry
// (projections.CheckStep) and the invariants after it. The zero value
// expects seq 1 first.
type Checker struct {
	seqs seqCheck
	n    uint64 // entries seen
}

// Before checks the seq of the next entry before it is folded; line is its
// JSONL line (0 when it has none). A sequence problem is a *CheckError
// wrapping a *SeqError.
func (c *Checker) Before(seq uint64, line int) error {
	c.n++
	if err := c.seqs.see(seq, line, c.n); err != nil {
		return c.seqError(err)
	}
	return nil
}

// After checks the step rules across the entry just folded (before is the
// provenance of the state it was folded into) and the invariants of s.
func (c *Checker) After(seq uint64, line int, before projections.Provenance, s *projections.State) error {
	err := errors.Join(projections.CheckStep(before, s), s.CheckInvariants())
	if err == nil {
		return nil
	}
	ce := &CheckError{Seq: s.Seq, Line: line, Events: c.n, Err: err}
	if seq != 0 {
		ce.Seq = seq
	}
	return ce
}

// Step checks the step rules only across the entry just folded (After
// without the invariants, for a caller that checks those itself).
func (c *Checker) Step(seq uint64, line int, before projections.Provenance, s *projections.State) error {
	if err := projections.CheckStep(before, s); err != nil {
		ce := &CheckError{Seq: s.Seq, Line: line, Events: c.n, Err: err}
		if seq != 0 {
			ce.Seq = seq
		}
		return ce
	}
	return nil
}

// End reports a jump in the seqs that no later entry explained (a gap at
// the end of what was checked). It does not change the checker.
func (c *Checker) End() error {
	if c.seqs.jump != nil {
		return c.seqError(c.seqs.jump)
	}
	return nil
}

// Count is the number of entries checked.
func (c *Checker) Count() uint64 { return c.n }

// Restart makes the checker expect seq next: the state was restored from a
// snapshot of the state after seq next-1.
func (c *Checker) Restart(next uint64) {
	*c = Checker{}
	c.seqs.next = next
}

// clone returns a checker that goes on from where c is, sharing nothing.
func (c *Checker) clone() Checker {
	d := *c
	d.seqs.lines = slices.Clone(c.seqs.lines)
	if j := c.seqs.jump; j != nil {
		jc := *j
		d.seqs.jump = &jc
	}
	return d
}

func (c *Checker) seqError(se *SeqError) error {
	return &CheckError{Seq: se.Seq, Line: se.Line, Events: se.n, Err: se}
}

// CheckError is the first invariant or step violation a check found.
type CheckError struct {
	Seq    uint64 // the event after which it was found
	Line   int    // its JSONL line, 0 for the live stream and scripts
	Events uint64 // events folded, that one included
	Err    error  // joins projections.Violation errors, or a *SeqError
}

func (e *CheckError) Error() string {
	where := fmt.Sprintf("seq %d", e.Seq)
	if e.Line > 0 {
		where += fmt.Sprintf(" (line %d)", e.Line)
	}
	when := "after"
	var se *SeqError
	if errors.As(e.Err, &se) {
		when = "at"
	}
	return fmt.Sprintf("check failed %s %s, event %d: %s", when, where, e.Events, strings.ReplaceAll(e.Err.Error(), "\n", "; "))
}

func (e *CheckError) Unwrap() error { return e.Err }

// Sequence problems a check reports (SeqError.Kind).
const (
	SeqGap        = "gap"
	SeqOutOfOrder = "out-of-order"
	SeqDuplicate  = "duplicate"
)

// SeqError is a log whose seqs do not run 1, 2, 3, ...: a seq missing, two
// entries swapped, or a seq twice. It names the first offending entry.
type SeqError struct {
	Kind string
	Seq  uint64 // the offending entry's seq
	Line int    // and its line (0 for the live stream and scripts)
	// Want is the seq expected in its place.
	Want uint64
	// Other is, for out-of-order, the missing seq that came later, and for
	// a duplicate the seq itself; OtherLine is where it is (the later line,
	// or the first line that held the seq).
	Other     uint64
	OtherLine int

	n uint64 // the entry's place in the log (1 for the first)
}

func (e *SeqError) Error() string {
	at := func(line int) string {
		if line > 0 {
			return fmt.Sprintf(" (line %d)", line)
		}
		return ""
	}
	switch e.Kind {
	case SeqOutOfOrder:
		return fmt.Sprintf("seq %d is out of order: seq %d comes after it%s", e.Seq, e.Other, at(e.OtherLine))
	case SeqDuplicate:
		held := "an earlier entry holds it"
		if e.OtherLine > 0 {
			held = fmt.Sprintf("line %d holds it", e.OtherLine)
		}
		return fmt.Sprintf("seq %d is a duplicate: %s; seq %d was expected", e.Seq, held, e.Want)
	}
	if e.Seq-e.Want == 1 {
		return fmt.Sprintf("seq %d leaves a gap: seq %d is missing", e.Seq, e.Want)
	}
	return fmt.Sprintf("seq %d leaves a gap: seqs %d..%d are missing", e.Seq, e.Want, e.Seq-1)
}

// seqCheck follows the seqs of a checked log. A jump past the next seq is
// a gap or the first of two swapped entries: the entry after it tells.
type seqCheck struct {
	next  uint64 // the seq expected next
	lines []int  // lines[i] is the line of seq i+1 (JSONL)
	jump  *SeqError
}

// see checks seq, the n-th entry, at line.
func (c *seqCheck) see(seq uint64, line int, n uint64) *SeqError {
	if c.next == 0 {
		c.next = 1
	}
	if seq == 0 { // a damaged line folded as corrupt (skip-corrupt): it holds the next seq
		seq = c.next
	}
	if j := c.jump; j != nil {
		c.jump = nil
		if seq >= j.Want && seq < j.Seq {
			j.Kind, j.Other, j.OtherLine = SeqOutOfOrder, seq, line
		}
		return j
	}
	switch {
	case seq > c.next:
		c.jump = &SeqError{Kind: SeqGap, Seq: seq, Line: line, Want: c.next, n: n}
	case seq < c.next:
		e := &SeqError{Kind: SeqDuplicate, Seq: seq, Line: line, Want: c.next, Other: seq, n: n}
		if seq > 0 && int(seq) <= len(c.lines) {
			e.OtherLine = c.lines[seq-1]
		}
		return e
	}
	if line > 0 && seq == c.next {
		c.lines = append(c.lines, line)
	}
	c.next = max(c.next, seq+1)
	return nil
}
