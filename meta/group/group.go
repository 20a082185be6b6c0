// Package group plans the meta leader's groups of mutations, as pure
// functions: which of the waiting mutations go into the next group, the
// events that group appends (one atomic batch, the CAS on its first
// message, Msg-Id <writer>-<term>-<seq>), what each decision is answered
// once the append's outcome is known, and whether an append whose outcome
// is unknown is sent again with the same ids. Nothing here reads a clock, a
// lock, a connection or a logger; the leader's committer (package meta)
// gathers the inputs, appends, waits for the acks and answers.
//
// The scripts in testdata pin the planner and the settling (see
// group_test.go).
package group

import (
	"errors"
	"fmt"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// MaxGroup bounds the mutations decided and appended together: about one
// JetStream atomic batch (at most 1000 messages, the server's default
// max_batch_size) when each mutation appends one event, so one append
// attempt carries one batch, not several in a row. Measured on a loaded
// 2-core machine with sync always: groups of 2048 (three batches an
// attempt) ran out of the 2 s attempt and the leader lost its lease.
const MaxGroup = 1000

// ErrRefused is a decision whose events the fold refuses: they are not
// appended.
var ErrRefused = errors.New("the projection refuses the leader's own event")

// ErrNotSent marks an append that was never handed to the log: its outcome
// is known, nothing of it is stored.
var ErrNotSent = errors.New("not sent")

// Mutation is one decision waiting to be made and appended.
type Mutation struct {
	// Decide is the decision: the events to append on the state it is
	// given (which it must not keep), or an error (nothing appended).
	Decide func(v *projections.State) ([]events.Payload, error)
	// Gone, when set, is why its submitter no longer waits (its context
	// ended before it was decided): it is answered with it, undecided.
	Gone error
	// Gated: the shell stops between this decision and the append (a
	// failpoint), so a group that decides events for it ends with it.
	Gated bool
}

// Stamp is what every event of a group carries: the term, the writer (the
// leader's id) and the time it was decided.
type Stamp struct {
	Term   uint64
	Writer string
	At     time.Time
}

// Answer is the decision on one mutation of a group.
type Answer struct {
	// Seen is the scratch seq after the mutation's events (its own events
	// included): once everything up to it is stored, the mutation
	// succeeded and the projection holds what it saw at Seen.
	Seen uint64
	// Err: the mutation failed and nothing of it is appended.
	Err error
	// Refused is the fold's result for a refused event (Err wraps
	// ErrRefused), for the shell's log.
	Refused string
}

// Group is the plan of one group: the mutations it took from the head of
// the queue (len(Answers) of them; the rest wait for the next group), the
// events to append and what each taken mutation is answered.
type Group struct {
	// Base is the expected last seq of the append: the scratch seq before
	// the group.
	Base uint64
	// Batch are the events, sealed (each encoded once: the body folded
	// into the scratch state is the one the log stores), in order.
	Batch   []events.Event
	Answers []Answer
	// DropScratch: the scratch state folded events that are not in the
	// batch (a refused decision): the shell discards it and decides the
	// next group on the projection.
	DropScratch bool
	// Gate is the index in Answers of a Gated mutation that decided
	// events (the group's last one), -1 when none did.
	Gate int
}

// Plan decides the next group on the scratch state st (the projection plus
// every event this term sent; Plan folds the group's events into it) from
// pending, the mutations waiting in submission order, at most MaxGroup of
// them: each decision sees the events of those before it. A decision
// whose events the fold refuses (Rejected or Corrupt on st) fails with
// ErrRefused and ends the group: st folded them, so the group's answers
// stand but the shell drops st, and the mutations after it are decided on
// a fresh state.
func Plan(st *projections.State, pending []Mutation, s Stamp) Group {
	g := Group{Base: st.Seq, Gate: -1}
	for i := range pending[:min(len(pending), MaxGroup)] {
		m := &pending[i]
		if m.Gone != nil {
			g.Answers = append(g.Answers, Answer{Err: m.Gone})
			continue
		}
		mine, err := decide(st, m, s)
		if err != nil {
			g.Answers = append(g.Answers, Answer{Err: err})
			continue
		}
		if r := fold(st, mine); r != nil {
			g.Answers = append(g.Answers, Answer{Err: fmt.Errorf("%w: %s", ErrRefused, r), Refused: r.String()})
			g.DropScratch = true
			return g
		}
		g.Batch = append(g.Batch, mine...)
		g.Answers = append(g.Answers, Answer{Seen: st.Seq})
		if m.Gated && len(mine) > 0 {
			g.Gate = i
			return g
		}
	}
	return g
}

// decide runs m's decision and seals its events.
func decide(st *projections.State, m *Mutation, s Stamp) ([]events.Event, error) {
	payloads, err := m.Decide(st)
	if err != nil {
		return nil, err
	}
	mine := make([]events.Event, 0, len(payloads))
	for _, p := range payloads {
		ev, _, err := events.Seal(events.Event{Term: s.Term, Writer: s.Writer, At: s.At, Data: p})
		if err != nil {
			return nil, err
		}
		mine = append(mine, ev)
	}
	return mine, nil
}

// fold folds evs into st exactly as the projection will: later decisions
// of the group see them. It returns the result of the first one the fold
// refuses, nil when it applies them all.
func fold(st *projections.State, evs []events.Event) *projections.Result {
	for _, ev := range evs {
		body, _ := events.Encode(ev) // sealed: its body, not encoded again
		if r := st.DecodeApply(st.Seq+1, body); r.Outcome == projections.Rejected || r.Outcome == projections.Corrupt {
			return &r
		}
	}
	return nil
}

// MsgIDs are the Nats-Msg-Id of a group's events appended after base: the
// ids every attempt of the append carries, so it is stored once.
func MsgIDs(base uint64, batch []events.Event) []string {
	ids := make([]string, len(batch))
	for i, ev := range batch {
		ids[i] = events.MsgID(ev, base+1+uint64(i))
	}
	return ids
}

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
