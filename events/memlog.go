package events

import (
	"bytes"
	"context"
	"fmt"
	"sync"
)

// MemLog is an in-memory Log for projection and leader-logic unit tests. It
// stores encoded bodies, so everything read from it went through the codec.
// The zero value is an empty, usable log.
type MemLog struct {
	mu      sync.Mutex
	recs    []memRec      // seqs dropped+1 ... dropped+len(recs)
	dropped uint64        // seqs compacted away (Compact)
	changed chan struct{} // closed and replaced on every append
	closed  bool
}

type memRec struct {
	data  []byte
	msgID string
}

// NewMemLog returns an empty in-memory log.
func NewMemLog() *MemLog { return &MemLog{} }

func (l *MemLog) signalLocked() {
	if l.changed != nil {
		close(l.changed)
	}
	l.changed = make(chan struct{})
}

func (l *MemLog) waitChan() <-chan struct{} {
	if l.changed == nil {
		l.changed = make(chan struct{})
	}
	return l.changed
}

// Append implements Log.
func (l *MemLog) Append(ctx context.Context, expectedLast uint64, evs ...Event) (uint64, error) {
	return l.appendChained(ctx, expectedLast, "", evs)
}

// AppendAsync implements Log: the events are stored (or refused) before it
// returns, with the same checks as a server's: the expected last seq on
// every event and, when prevID is set, the message id chain.
func (l *MemLog) AppendAsync(ctx context.Context, expectedLast uint64, prevID string, evs ...Event) Pending {
	last, err := l.appendChained(ctx, expectedLast, prevID, evs)
	return Done{Last: last, Err: err}
}

func (l *MemLog) appendChained(ctx context.Context, expectedLast uint64, prevID string, evs []Event) (uint64, error) {
	bodies := make([][]byte, len(evs))
	for i, ev := range evs {
		b, err := Encode(ev)
		if err != nil {
			return expectedLast, err
		}
		bodies[i] = b
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return expectedLast, ErrClosed
	}
	if err := ctx.Err(); err != nil {
		return expectedLast, err
	}
	last := expectedLast
	appended := false
	defer func() {
		if appended {
			l.signalLocked()
		}
	}()
	for i, ev := range evs {
		seq := expectedLast + 1 + uint64(i)
		id := MsgID(ev, seq)
		tail := l.tailLocked()
		if tail != seq-1 {
			// A retry of an append that already landed is stored once. The
			// id alone does not prove it: another event under the same id
			// (decided again on a stale view) did not land (as natslog's
			// checkStored).
			if seq <= tail && seq > l.dropped {
				if held := l.recs[seq-1-l.dropped]; held.msgID == id {
					if !bytes.Equal(held.data, bodies[i]) {
						return last, fmt.Errorf("append seq %d: %w: it holds another event under id %s", seq, ErrFenced, id)
					}
					last = seq
					continue
				}
			}
			return last, fmt.Errorf("append seq %d: %w (last seq is %d)", seq, ErrFenced, tail)
		}
		if i == 0 && prevID != "" {
			got := "" // the last record's id ("" when none is held)
			if tail > l.dropped {
				got = l.recs[tail-1-l.dropped].msgID
			}
			if got != prevID {
				// The event this append is chained to is not the last.
				return last, fmt.Errorf("append seq %d: %w (last msg id is %q, want %q)", seq, ErrFenced, got, prevID)
			}
		}
		l.recs = append(l.recs, memRec{data: bodies[i], msgID: id})
		last, appended = seq, true
	}
	return last, nil
}

// AppendRaw appends a body as is, without CAS or codec: tests use it to put
// corrupt or forged events into the log, as another writer could.
func (l *MemLog) AppendRaw(body []byte) uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.recs = append(l.recs, memRec{data: append([]byte(nil), body...)})
	l.signalLocked()
	return l.tailLocked()
}

func (l *MemLog) tailLocked() uint64 { return l.dropped + uint64(len(l.recs)) }

// Compact drops every record below seq before, as a purge of a stream up to
// a seq does: the tail stays, and reading from a dropped seq above 1 fails
// with ErrCompacted. Tests use it to compact a log under a reader.
func (l *MemLog) Compact(before uint64) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if before <= l.dropped+1 {
		return
	}
	n := min(before-1-l.dropped, uint64(len(l.recs))) // records to drop
	if n == 0 {
		return
	}
	l.recs = append([]memRec(nil), l.recs[n:]...)
	l.dropped += n
	l.signalLocked()
}

// FirstSeq is the seq of the first record the log holds (the tail + 1 when
// it holds none).
func (l *MemLog) FirstSeq() uint64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.dropped + 1
}

// Tail implements Log.
func (l *MemLog) Tail(ctx context.Context) (uint64, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return 0, ErrClosed
	}
	return l.tailLocked(), nil
}

// Close makes every later call fail with ErrClosed and ends Watch calls.
func (l *MemLog) Close() {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.closed = true
	l.signalLocked()
}

// snapshot returns records [from, tail] and a channel closed on the next
// change. From seq 1 means from the first record held; from a seq above 1
// that is compacted away (and at most the tail) is ErrCompacted.
func (l *MemLog) snapshot(from uint64) ([]Record, <-chan struct{}, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil, nil, ErrClosed
	}
	from = max(from, 1)
	first := l.dropped + 1
	if from > 1 && from < first && from <= l.tailLocked() {
		return nil, nil, fmt.Errorf("memlog: read from seq %d: %w (its first record is seq %d)", from, ErrCompacted, first)
	}
	var out []Record
	for s := max(from, first); s <= l.tailLocked(); s++ {
		out = append(out, Record{Seq: s, Data: l.recs[s-first].data})
	}
	return out, l.waitChan(), nil
}

// Read implements Log.
func (l *MemLog) Read(ctx context.Context, from uint64, fn func(Record) error) error {
	recs, _, err := l.snapshot(from)
	if err != nil {
		return err
	}
	for _, r := range recs {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := fn(r); err != nil {
			return err
		}
	}
	return nil
}

// Watch implements Log.
func (l *MemLog) Watch(ctx context.Context, from uint64, fn func(Record) error) error {
	if from == 0 {
		from = 1
	}
	for {
		recs, changed, err := l.snapshot(from)
		if err != nil {
			return err
		}
		for _, r := range recs {
			if err := fn(r); err != nil {
				return err
			}
			from = r.Seq + 1
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		}
	}
}
