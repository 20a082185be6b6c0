package events

import (
	"context"
	"errors"
	"fmt"
)

// ErrFenced means an append's expected last seq did not match the log: another
// writer appended first. The caller must re-project, and step down if a higher
// term is there. JetStream answers this with error codes 10071 and 10164.
var ErrFenced = errors.New("fenced: log moved past the expected last seq")

// ErrClosed is returned by a log that was closed.
var ErrClosed = errors.New("log closed")

// ErrCompacted means a Read or Watch from a seq above 1 cannot start there:
// the log no longer holds that seq (it was compacted away, as a purge of
// the stream does), so continuing a state folded up to the seq before it
// would silently skip events. A reader that started from a snapshot falls
// back to a full fold. A read from seq 0 or 1 starts at the first record
// the log holds and never fails with it.
var ErrCompacted = errors.New("compacted: the log no longer holds the seq to read from")

// Record is one stored event body at its stream sequence.
type Record struct {
	Seq  uint64
	Data []byte
}

// Decode decodes the record's body.
func (r Record) Decode() (Event, error) { return Decode(r.Seq, r.Data) }

// Log is the replicated, totally ordered event stream.
//
// Implementations: the in-memory MemLog here, and the JetStream log in
// events/natslog. Both pass the conformance suite in events/logtest.
type Log interface {
	// Append appends evs in order, provided the log's last seq is expectedLast.
	// Event i gets seq expectedLast+1+i and the message id MsgID(event, seq), so
	// retrying an append whose outcome is unknown is safe: an event the log
	// already holds under that id is stored once and its seq returned. It
	// returns the seq of the last event, or an error wrapping ErrFenced when
	// the log moved on. An append of several events stops at the first
	// failure; the events before it stay appended.
	Append(ctx context.Context, expectedLast uint64, evs ...Event) (uint64, error)
	// AppendAsync is Append that returns once evs are sent, so that the
	// next append can be sent before this one is answered; Wait on the
	// returned Pending gives what Append would have returned. Appends sent
	// one after another are stored in the order they were sent.
	//
	// prevID chains the append to the one sent before it: when it is not
	// empty, the first event is stored only if the log's last event is at
	// expectedLast AND has message id prevID (the id of that earlier
	// append's last event). Every later event of evs is chained to the one
	// before it the same way. So if any event of an append is not stored,
	// no event of a later append chained to it can be stored either —
	// whatever another writer appended meanwhile, even if its seqs make the
	// later expected last seqs match the log again. A retry of an event
	// already stored under its id is stored once, as for Append.
	//
	// ctx bounds the sending; Wait's ctx bounds the wait. A log that cannot
	// keep appends in flight (a replicated stream, MemLog) stores evs before
	// AppendAsync returns and hands back a Pending that is already answered.
	AppendAsync(ctx context.Context, expectedLast uint64, prevID string, evs ...Event) Pending
	// Tail is the seq of the last event, 0 for an empty log.
	Tail(ctx context.Context) (uint64, error)
	// Read calls fn for every record from seq from up to the tail as it was
	// when Read was called, in order, then returns nil. It stops early with
	// fn's error. When from (> 1, at most the tail) is no longer held, it
	// returns an error wrapping ErrCompacted before calling fn.
	Read(ctx context.Context, from uint64, fn func(Record) error) error
	// Watch calls fn for every record from seq from on, in order, waiting
	// for new ones, until ctx is done (it returns ctx.Err()) or fn fails (it
	// returns that error). It fails with ErrCompacted as Read does.
	Watch(ctx context.Context, from uint64, fn func(Record) error) error
}

// Pending is an append in flight (Log.AppendAsync).
type Pending interface {
	// Wait returns what Append would have: the seq of the last event, or
	// an error and the seq of the last event known stored. Call it once.
	Wait(ctx context.Context) (uint64, error)
}

// Done is a Pending that is already answered.
type Done struct {
	Last uint64
	Err  error
}

// Wait implements Pending.
func (d Done) Wait(context.Context) (uint64, error) { return d.Last, d.Err }

// MsgID is the idempotency key of ev when it is to get seq: its writer, term
// and seq. The writer is in it because terms count leaders: two candidates
// that projected the same tail both start the term after it at the same
// seq, and with a key of term and seq alone the stream would answer the
// loser's term.started as a duplicate of the winner's, an ack for an event
// the loser did not write. (The leader also checks that the term it started
// carries its own lease: see meta's startTerm.)
func MsgID(ev Event, seq uint64) string {
	if ev.Writer == "" {
		return fmt.Sprintf("%d-%d", ev.Term, seq)
	}
	return fmt.Sprintf("%s-%d-%d", ev.Writer, ev.Term, seq)
}
