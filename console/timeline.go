package console

import (
	"fmt"
	"time"

	"github.com/termlog/termlog/events"
)

// Timeline is GET /api/v1/timeline: the terms as lanes over time and the
// rejected events marked on them.
type Timeline struct {
	Tail  uint64 `json:"tail"`
	Terms []Lane `json:"terms"`
	// Marks are the rejected (fenced on read) and corrupt events, each on
	// the lane of the term current when it arrived.
	Marks []Mark `json:"marks"`
	// From and To bound the times of the events (zero: none).
	From time.Time `json:"from,omitzero"`
	To   time.Time `json:"to,omitzero"`
}

// Lane is one term: who led it, from which event to which.
type Lane struct {
	Term    uint64    `json:"term"`
	Leader  string    `json:"leader"`
	Lease   uint64    `json:"lease,omitempty"`
	FromSeq uint64    `json:"from_seq"`
	From    time.Time `json:"from,omitzero"`
	ToSeq   uint64    `json:"to_seq"` // the last seq of the term (the tail for the current one)
	To      time.Time `json:"to,omitzero"`
	Current bool      `json:"current"`
	// Ended says how the term ended as the stream tells it: the next
	// term's start (who started it), and how many writes of this term's
	// leader arrived after that and were rejected (fenced on read).
	Ended string `json:"ended,omitempty"`
	// Events is the count of events that arrived during the term.
	Events int `json:"events"`
	// Fenced counts the writes of this term rejected after it ended.
	Fenced int `json:"fenced"`
}

// Mark is a rejected or corrupt event on the timeline.
type Mark struct {
	Seq     uint64    `json:"seq"`
	At      time.Time `json:"at,omitzero"`
	Term    uint64    `json:"term"`      // the event's own term
	Lane    uint64    `json:"lane_term"` // the term current when it arrived
	Writer  string    `json:"writer"`
	Type    string    `json:"type"`
	Outcome string    `json:"outcome"` // replay's outcome column
	Reason  string    `json:"reason"`
}

func buildTimeline(rows []Row) Timeline {
	tl := Timeline{Terms: []Lane{}, Marks: []Mark{}}
	var cur *Lane
	byTerm := map[uint64]int{}
	for _, r := range rows {
		tl.Tail = r.Seq
		if !r.At.IsZero() {
			if tl.From.IsZero() || r.At.Before(tl.From) {
				tl.From = r.At
			}
			if r.At.After(tl.To) {
				tl.To = r.At
			}
		}
		if r.Type == events.TypeTermStarted && r.Outcome == "applied" {
			ts, _ := r.Data.(events.TermStarted)
			if cur != nil {
				cur.Ended = fmt.Sprintf("term %d started by %s at seq %d", ts.Term, ts.Leader, r.Seq)
				cur.Current = false
			}
			tl.Terms = append(tl.Terms, Lane{Term: ts.Term, Leader: ts.Leader, Lease: ts.Lease, FromSeq: r.Seq, From: r.At, ToSeq: r.Seq, To: r.At, Current: true})
			cur = &tl.Terms[len(tl.Terms)-1]
			byTerm[ts.Term] = len(tl.Terms) - 1
		}
		if cur != nil {
			cur.Events++
			cur.ToSeq = r.Seq
			if !r.At.IsZero() && r.At.After(cur.To) {
				cur.To = r.At
			}
		}
		if r.Outcome == "rejected" || r.Outcome == "corrupt" {
			m := Mark{Seq: r.Seq, At: r.At, Term: r.Term, Writer: r.Writer, Type: r.Type, Outcome: r.OutcomeText, Reason: r.Reason}
			if cur != nil {
				m.Lane = cur.Term
			}
			tl.Marks = append(tl.Marks, m)
			if i, ok := byTerm[r.Term]; ok && r.Kind == "stale-term" {
				tl.Terms[i].Fenced++
			}
		}
	}
	for i := range tl.Terms {
		if tl.Terms[i].Fenced > 0 {
			tl.Terms[i].Ended += fmt.Sprintf("; %d later write(s) of term %d rejected", tl.Terms[i].Fenced, tl.Terms[i].Term)
		}
	}
	return tl
}
