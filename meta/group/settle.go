package group

import (
	"errors"
	"fmt"

	"github.com/termlog/termlog/events"
)

// Prior is the outcome of the group sent before a group (the one it is
// chained to: it lands only right after that group's last event).
type Prior struct {
	// Chained: a group was in flight before it. When false, everything up
	// to the group's base is known stored.
	Chained bool
	Stored  uint64 // as Outcome.Stored
	Err     error  // as Outcome.Err
}

// Settling is a group's append being settled: each attempt's outcome in,
// whether to send it again (with the same ids and the same expected last
// seq, so it is stored once) and, once done, the group's outcome out. The
// zero value is not useful: set Base, Events and Attempts.
type Settling struct {
	Base     uint64 // the append's expected last seq
	Events   int    // the group's events
	Prior    Prior
	Attempts int // how many times the append may be sent in all
	// Resending: the group was sent before and its outcome stayed unknown,
	// so an attempt not sent leaves it unknown.
	Resending bool

	sent   int
	last   uint64 // the last seq known stored
	first  error  // the first attempt's error
	err    error
	unsure bool
	done   bool
}

// Attempted records the outcome of the append's latest attempt: last is
// the seq of its last event known stored, err nil when all of it is. It
// returns true when the append is to be sent again: its outcome is unknown
// (neither stored, nor fenced, nor known not sent), everything before it is
// stored (so the expected last seq alone fences the retry) and attempts are
// left.
func (s *Settling) Attempted(last uint64, err error) (resend bool) {
	if s.done {
		return false
	}
	s.sent++
	s.last = max(s.last, last)
	if s.sent == 1 {
		s.first = err
	}
	s.err = err
	switch {
	case err == nil, errors.Is(err, events.ErrFenced):
	case errors.Is(err, ErrNotSent):
		if s.sent > 1 {
			// The first attempt was sent: its outcome is what is unknown.
			s.err = fmt.Errorf("append at seq %d, outcome unknown: %w (retry not sent: %v)", s.Base+1, s.first, err)
		}
		s.unsure = s.sent > 1 || s.Resending
	case s.Prior.Err != nil:
		// Chained to a group that failed: resending would not help.
	case s.sent < s.Attempts:
		return true
	default:
		s.unsure = true
	}
	s.done = true
	return false
}

// Outcome is what settling a group concluded.
type Outcome struct {
	// Stored is the seq up to which everything the group's decisions saw
	// is known stored; Err is nil iff that is all of it.
	Stored uint64
	Err    error
	// Unsure: the append's outcome stays unknown. The shell resends it
	// (same ids) before deciding anything new: deciding again on the
	// projection would reuse the ids the group may be stored under.
	Unsure bool
	// Fenced: the append was refused by the CAS (and the group before it
	// was not): the shell re-projects and steps down if a higher term is
	// there.
	Fenced bool
}

// Outcome is the group's outcome once Attempted returned false (or, for a
// group without events, at once).
func (s *Settling) Outcome() Outcome {
	floor, prevErr := s.Base, error(nil)
	if p := s.Prior; p.Chained && p.Err != nil {
		floor, prevErr = min(floor, p.Stored), p.Err
	}
	if s.Events == 0 {
		// Decided on what the group before it sent: its outcome is theirs.
		return Outcome{Stored: floor, Err: prevErr}
	}
	o := Outcome{Stored: floor, Err: s.err, Unsure: s.unsure}
	werr := s.err
	switch {
	case prevErr != nil:
		// Whatever its acks say, what its decisions saw is not known
		// stored (the failed group's ids may be held by other events of
		// this term: an earlier attempt whose outcome was not learnt).
		if werr == nil {
			werr = fmt.Errorf("%w: stored after a group that failed", events.ErrFenced)
		}
		o.Err = fmt.Errorf("%w (after the group before it failed: %v)", werr, prevErr)
	case s.last > s.Base:
		o.Stored = s.last
	}
	o.Fenced = errors.Is(werr, events.ErrFenced) && !errors.Is(prevErr, events.ErrFenced)
	return o
}

// Answer is the outcome of a decision of the group that saw seen: nil (a
// success) iff everything it saw is stored.
func (o Outcome) Answer(seen uint64) error {
	switch {
	case seen <= o.Stored:
		return nil
	case o.Err == nil:
		return fmt.Errorf("%w: seq %d not stored (stored up to %d)", events.ErrFenced, seen, o.Stored)
	}
	return o.Err
}

// Done reports whether the outcome is known: Attempted asked for no further
// attempt.
func (s *Settling) Done() bool { return s.done }
