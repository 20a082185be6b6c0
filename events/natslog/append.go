package natslog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/termlog/termlog/events"
)

// JetStream API error codes of a failed Nats-Expected-Last-Sequence check
// (server JSStreamWrongLastSequenceErrF and JSStreamWrongLastSequenceConstantErr).
const (
	codeWrongLastSeq         jetstream.ErrorCode = 10071
	codeWrongLastSeqConstant jetstream.ErrorCode = 10164
	// A failed Nats-Expected-Last-Msg-Id check (JSStreamWrongLastMsgIDErrF):
	// the event before this one of a pipelined append is not the last.
	codeWrongLastMsgID jetstream.ErrorCode = 10070
)

// Append implements events.Log. Event i gets Nats-Msg-Id
// events.MsgID(event i, expectedLast+1+i) and is stored at expectedLast+1+i.
// One event is published with Nats-Expected-Last-Sequence expectedLast.
// Several are JetStream atomic batches (up to maxBatch events each), on a
// single server as on a replicated stream, the expected last seq on each
// batch's first message: the server checks the CAS and every Msg-Id for
// the whole batch before it stores any of it, and stores all or nothing.
// A batch is synced once, at its commit, where a pipeline of single
// messages costs one fsync each on a server that syncs before it
// acknowledges (nats-server SyncAlways; a replicated stream syncs its Raft
// log once per entry, and a batch is one proposal). The ack of a batch is
// the server's ack of its commit, sent once the whole batch is stored (and
// synced): nothing of it is reported stored before.
//
// Why not a pipeline of single messages chained by
// Nats-Expected-Last-Msg-Id (termlog's grouped append on one server until
// issue 21): each message of it is its own fsync. And a replicated stream
// checks Nats-Expected-Last-Msg-Id only when it applies a message, after
// registering its Msg-Id at the proposal, so each refused event's
// <writer>-<term>-<seq> id would be refused as a duplicate for the whole
// dedupe window, and the leader's next attempt at that seq with it. An
// atomic batch does not accept that header; the CAS on its first message,
// with one batch in flight at a time (AppendAsync), fences it.
//
// An error that does not wrap events.ErrFenced leaves the outcome of the
// failed events (and of the ones after them) unknown: retry the same call,
// or re-read the log.
func (l *Log) Append(ctx context.Context, expectedLast uint64, evs ...events.Event) (uint64, error) {
	msgs, err := l.messages(evs)
	if err != nil {
		return expectedLast, err
	}
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	return l.appendBatched(ctx, expectedLast, evs, msgs)
}

// AppendAsync implements events.Log. One event on a single server is
// published asynchronously with the CAS and, when prevID is set,
// Nats-Expected-Last-Msg-Id prevID, and the returned Pending settles its
// ack: the next append can be sent chained to it at once (an idle leader's
// path: one event a decision). Several events, or one on a replicated
// stream (see Append), are appended before AppendAsync returns, as Append
// appends them, and prevID is checked against the id of the last event this
// Log stored, once the single events sent before it are settled: an append
// chained to one that this Log did not see stored completely is fenced
// without being sent.
func (l *Log) AppendAsync(ctx context.Context, expectedLast uint64, prevID string, evs ...events.Event) events.Pending {
	msgs, err := l.messages(evs)
	if err != nil {
		return events.Done{Last: expectedLast, Err: err}
	}
	if len(msgs) == 1 && !l.replicated {
		return l.send(expectedLast, prevID, evs, msgs)
	}
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	if p := l.sentBefore(prevID); p != nil {
		// Its outcome decides the chain: settle it first (its own settler
		// gets the same answer).
		_, _ = p.Wait(ctx)
	}
	if err := l.checkPrev(ctx, expectedLast, prevID); err != nil {
		return events.Done{Last: expectedLast, Err: fmt.Errorf("natslog: append %s: %w", events.MsgID(evs[0], expectedLast+1), err)}
	}
	last, err := l.appendBatched(ctx, expectedLast, evs, msgs)
	return events.Done{Last: last, Err: err}
}

// sentBefore returns the pipeline whose last event has msg id prevID, if it
// is the last one this Log sent.
func (l *Log) sentBefore(prevID string) *pipeline {
	if prevID == "" {
		return nil
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if p := l.lastPipe; p != nil && p.lastID() == prevID {
		return p
	}
	return nil
}

// stored records that seq holds the event with msg id id, the last this
// Log stored (AppendAsync's chain check).
func (l *Log) stored(id string, seq uint64) {
	l.mu.Lock()
	if seq >= l.lastSeq {
		l.lastID, l.lastSeq = id, seq
	}
	l.mu.Unlock()
}

// checkPrev checks, for a batch, that seq expectedLast holds the
// event with msg id prevID (AppendAsync's chain): at once when it is the
// last event this Log stored, else by reading it. With the batch's expected
// last seq, the batch then lands only right after that event.
func (l *Log) checkPrev(ctx context.Context, expectedLast uint64, prevID string) error {
	if prevID == "" {
		return nil
	}
	l.mu.Lock()
	known := l.lastID == prevID && l.lastSeq == expectedLast
	l.mu.Unlock()
	if known {
		return nil
	}
	if expectedLast == 0 {
		return fmt.Errorf("%w: chained to %s on an empty log", events.ErrFenced, prevID)
	}
	m, err := l.getMsg(ctx, expectedLast)
	switch {
	case err == nil && m.Header.Get(jetstream.MsgIDHeader) == prevID:
		return nil
	case err == nil:
		return fmt.Errorf("%w: chained to %s, and seq %d holds %q", events.ErrFenced, prevID, expectedLast, m.Header.Get(jetstream.MsgIDHeader))
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("%w: chained to %s, and seq %d holds nothing", events.ErrFenced, prevID, expectedLast)
	default:
		return fmt.Errorf("chained to %s, not sent: reading seq %d failed: %w", prevID, expectedLast, err)
	}
}

// ErrEventTooLarge is the error of an append of an event whose encoding is
// larger than MaxEventBytes: nothing of that append was sent.
var ErrEventTooLarge = errors.New("event too large")

// messages encodes evs as messages on their subjects.
func (l *Log) messages(evs []events.Event) ([]*nats.Msg, error) {
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		body, err := events.Encode(ev)
		if err != nil {
			return nil, fmt.Errorf("natslog: append: %w", err)
		}
		if len(body) > MaxEventBytes {
			return nil, fmt.Errorf("natslog: append: %w: %s event %d of %d is %d bytes, the limit is %d; nothing was sent",
				ErrEventTooLarge, ev.Type(), i+1, len(evs), len(body), MaxEventBytes)
		}
		msgs[i] = &nats.Msg{Subject: l.Subject(ev.Type()), Data: body, Header: nats.Header{}}
	}
	return msgs, nil
}

// appendBatched appends in atomic batches (one event: a single publish)
// and records the id of the last event stored (AppendAsync's chain check).
func (l *Log) appendBatched(ctx context.Context, expectedLast uint64, evs []events.Event, msgs []*nats.Msg) (uint64, error) {
	last, err := l.batches(ctx, expectedLast, evs, msgs)
	if last > expectedLast {
		l.stored(events.MsgID(evs[last-expectedLast-1], last), last)
	}
	return last, err
}

func (l *Log) batches(ctx context.Context, expectedLast uint64, evs []events.Event, msgs []*nats.Msg) (uint64, error) {
	last := expectedLast
	for len(msgs) > 0 {
		n := min(len(msgs), maxBatch)
		var err error
		if n == 1 {
			seq := last + 1
			err = l.publish(ctx, msgs[0], seq, events.MsgID(evs[0], seq))
		} else {
			err = l.publishBatch(ctx, last, evs[:n], msgs[:n])
		}
		if err != nil {
			var pe *partialError
			if errors.As(err, &pe) {
				return last + pe.stored, pe.err
			}
			return last, err
		}
		last += uint64(n)
		evs, msgs = evs[n:], msgs[n:]
	}
	return last, nil
}

// pipeline is a pipelined append in flight: its messages are published, its
// acks not yet settled. Wait may be called by several goroutines (the
// settler, and AppendAsync chaining a batch to it): they share its
// progress, so each ack is settled once.
type pipeline struct {
	l            *Log
	expectedLast uint64
	evs          []events.Event
	msgs         []*nats.Msg
	futs         []jetstream.PubAckFuture
	sendErr      error

	mu   sync.Mutex
	next int    // futs settled so far
	last uint64 // seq of the last event settled stored
	err  error  // the settled failure, once one is
}

// lastID is the msg id of the last event p sends.
func (p *pipeline) lastID() string {
	n := len(p.evs)
	return events.MsgID(p.evs[n-1], p.expectedLast+uint64(n))
}

// send publishes msgs asynchronously with the msg-id chain (see Append),
// the first one chained to prevID when it is set.
func (l *Log) send(expectedLast uint64, prevID string, evs []events.Event, msgs []*nats.Msg) *pipeline {
	p := &pipeline{l: l, expectedLast: expectedLast, evs: evs, msgs: msgs, futs: make([]jetstream.PubAckFuture, 0, len(msgs)), last: expectedLast}
	for i, m := range msgs {
		seq := expectedLast + 1 + uint64(i)
		opts := []jetstream.PublishOpt{
			jetstream.WithExpectStream(l.name),
			jetstream.WithExpectLastSequence(seq - 1),
			jetstream.WithMsgID(events.MsgID(evs[i], seq)),
		}
		switch {
		case i > 0:
			opts = append(opts, jetstream.WithExpectLastMsgID(events.MsgID(evs[i-1], seq-1)))
		case prevID != "":
			opts = append(opts, jetstream.WithExpectLastMsgID(prevID))
		}
		f, err := l.js.PublishMsgAsync(m, opts...)
		if err != nil {
			p.sendErr = fmt.Errorf("natslog: append %s at seq %d not sent: %w", events.MsgID(evs[i], seq), seq, err)
			break
		}
		p.futs = append(p.futs, f)
	}
	l.mu.Lock()
	l.lastPipe = p
	l.mu.Unlock()
	return p
}

// Wait implements events.Pending: it settles the acks in order, stopping
// at the first failure. A wait that ends with ctx leaves the rest to the
// next one.
func (p *pipeline) Wait(ctx context.Context) (uint64, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.err != nil {
		return p.last, p.err
	}
	ctx, cancel := p.l.reqCtx(ctx)
	defer cancel()
	for p.next < len(p.futs) {
		f := p.futs[p.next]
		seq := p.expectedLast + 1 + uint64(p.next)
		id := events.MsgID(p.evs[p.next], seq)
		var (
			ack *jetstream.PubAck
			err error
		)
		select {
		case ack = <-f.Ok():
		case err = <-f.Err():
		case <-ctx.Done():
			return p.last, fmt.Errorf("natslog: append %s at seq %d, outcome unknown: %w", id, seq, ctx.Err())
		}
		p.next++
		if err := p.l.settle(ctx, p.msgs[p.next-1], seq, id, ack, err); err != nil {
			p.err = err
			return p.last, err
		}
		p.last = seq
		p.l.stored(id, seq)
	}
	return p.last, p.sendErr
}

// maxBatch is the most events one atomic batch carries: the server's
// default limit (max_batch_size 1000).
const maxBatch = 1000

// partialError is a batch retry whose first stored events were found
// stored by an earlier attempt and whose rest failed with err.
type partialError struct {
	stored uint64
	err    error
}

func (e *partialError) Error() string { return e.err.Error() }
func (e *partialError) Unwrap() error { return e.err }

// publishBatch stores msgs at expected+1... as one atomic batch, or finds a
// prefix of them stored by an earlier attempt and appends the rest.
func (l *Log) publishBatch(ctx context.Context, expected uint64, evs []events.Event, msgs []*nats.Msg) error {
	for i, m := range msgs {
		m.Header.Del(jetstream.ExpectedStreamHeader)
		m.Header.Set(jetstream.MsgIDHeader, events.MsgID(evs[i], expected+1+uint64(i)))
	}
	// The expected stream and last seq on the first message fence the
	// whole batch: a batch is one stream's (a message of it that another
	// stream captured would leave a gap, and the server abandons a batch
	// with a gap whole). The expected stream on every message cost about
	// 15% of a batch's time on R3 (a 256-message batch, 23 vs 27 ms).
	msgs[0].Header.Set(jetstream.ExpectedStreamHeader, l.name)
	msgs[0].Header.Set(jetstream.ExpectedLastSeqHeader, strconv.FormatUint(expected, 10))
	ack, err := l.sendBatch(ctx, msgs)
	want := expected + uint64(len(msgs))
	first := events.MsgID(evs[0], expected+1)
	switch {
	case err == nil && ack.Sequence == want:
		return nil
	case err == nil:
		return fmt.Errorf("natslog: append batch from %s: %w: last acked at seq %d, want %d", first, events.ErrFenced, ack.Sequence, want)
	case !isWrongLastSeq(err) && !isBatchDuplicate(err):
		return fmt.Errorf("natslog: append batch from %s (%d events), outcome unknown: %w", first, len(msgs), err)
	}
	// Refused as a whole: an earlier attempt may have stored a prefix (or
	// all) of it. Find how much, then append the rest once.
	for i, m := range msgs {
		seq := expected + 1 + uint64(i)
		ours, err := l.storedAt(ctx, m, seq)
		if err != nil {
			return &partialError{uint64(i), err}
		}
		if ours {
			continue
		}
		if i == 0 {
			return fmt.Errorf("natslog: append batch from %s: %w: seq %d does not hold it", first, events.ErrFenced, seq)
		}
		rest := msgs[i:]
		for _, m := range rest {
			m.Header.Del(jetstreamext.BatchIDHeader)
			m.Header.Del(jetstreamext.BatchSeqHeader)
			m.Header.Del(jetstreamext.BatchCommitHeader)
			m.Header.Del(jetstream.ExpectedLastSeqHeader)
		}
		if len(rest) == 1 {
			err = l.publish(ctx, rest[0], seq, events.MsgID(evs[i], seq))
		} else {
			err = l.publishBatch(ctx, seq-1, evs[i:], rest)
		}
		if err != nil {
			var pe *partialError
			if errors.As(err, &pe) {
				return &partialError{uint64(i) + pe.stored, pe.err}
			}
			return &partialError{uint64(i), err}
		}
		return nil
	}
	return nil
}

// sendBatch publishes msgs as one atomic batch. A batch nobody received
// (no responders: the stream has no leader yet, or is electing one) stored
// nothing, so it is sent again, as the client does for a single publish.
func (l *Log) sendBatch(ctx context.Context, msgs []*nats.Msg) (*jetstreamext.BatchAck, error) {
	backoff := restartBackoffMin
	for {
		ack, err := jetstreamext.PublishMsgBatch(ctx, l.js, msgs)
		if !errors.Is(err, nats.ErrNoResponders) {
			return ack, err
		}
		if werr := wait(ctx, backoff); werr != nil {
			return nil, err
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

// storedAt reports whether seq holds m (same Msg-Id, subject and bytes):
// false with an error wrapping ErrFenced when it holds anything else or
// nothing, and an outcome-unknown error when it cannot be read.
func (l *Log) storedAt(ctx context.Context, m *nats.Msg, seq uint64) (bool, error) {
	id := m.Header.Get(jetstream.MsgIDHeader)
	if err := l.checkStored(ctx, m, seq, id, errors.New("batch refused")); err != nil {
		if errors.Is(err, events.ErrFenced) {
			return false, nil
		}
		return false, err
	}
	return true, nil
}

func isBatchDuplicate(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && apiErr.ErrorCode == jetstreamext.JSErrCodeBatchPublishDuplicateMsgID
}

// publish stores m at seq with message id id, or finds it already there.
func (l *Log) publish(ctx context.Context, m *nats.Msg, seq uint64, id string) error {
	ack, err := l.js.PublishMsg(ctx, m,
		jetstream.WithExpectStream(l.name),
		jetstream.WithExpectLastSequence(seq-1),
		jetstream.WithMsgID(id))
	return l.settle(ctx, m, seq, id, ack, err)
}

// settle decides the outcome of publishing m at seq under id from the
// server's answer (ack or err).
//
// The message id alone does not prove that seq holds m: ids are
// <term>-<seq>, so a leader that decides again on a stale view (after an
// append whose outcome it did not learn) sends a different event under the
// id its earlier attempt was stored with. Only m's own bytes at seq are
// "stored by an earlier attempt"; anything else there is fenced.
func (l *Log) settle(ctx context.Context, m *nats.Msg, seq uint64, id string, ack *jetstream.PubAck, err error) error {
	switch {
	case err == nil && ack.Sequence != seq:
		// A duplicate ack (a clustered stream checks the Msg-Id before the
		// expected seq) names the seq the id was stored at.
		return fmt.Errorf("natslog: append %s: %w: acked at seq %d (duplicate %v), want %d",
			id, events.ErrFenced, ack.Sequence, ack.Duplicate, seq)
	case err == nil && !ack.Duplicate:
		return nil
	case err == nil:
		// Our id is at seq (clustered: Msg-Id checked first); is our event?
		return l.checkStored(ctx, m, seq, id, fmt.Errorf("duplicate ack at seq %d", seq))
	case isWrongLastSeq(err):
		// A standalone stream checks the expected last seq before the
		// Msg-Id, so the retry of an append that landed is refused too.
		return l.checkStored(ctx, m, seq, id, err)
	default:
		return fmt.Errorf("natslog: append %s at seq %d, outcome unknown: %w", id, seq, err)
	}
}

// checkStored decides an append that the server did not store now (why):
// nil if seq holds m's id and m's bytes (an earlier attempt stored it),
// ErrFenced if seq holds anything else or nothing, and an outcome-unknown
// error if seq cannot be read.
func (l *Log) checkStored(ctx context.Context, m *nats.Msg, seq uint64, id string, why error) error {
	stored, err := l.getMsg(ctx, seq)
	switch {
	case err == nil && stored.Header.Get(jetstream.MsgIDHeader) == id && stored.Subject == m.Subject && bytes.Equal(stored.Data, m.Data):
		return nil // stored by an earlier attempt
	case err == nil && stored.Header.Get(jetstream.MsgIDHeader) == id:
		return fmt.Errorf("natslog: append %s: %w: seq %d holds another event under the same msg id (%w)",
			id, events.ErrFenced, seq, why)
	case err == nil:
		return fmt.Errorf("natslog: append %s: %w: seq %d holds %q (%w)",
			id, events.ErrFenced, seq, stored.Header.Get(jetstream.MsgIDHeader), why)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("natslog: append %s: %w: seq %d not stored (%w)", id, events.ErrFenced, seq, why)
	default:
		return fmt.Errorf("natslog: append %s at seq %d, outcome unknown: %v; reading seq %d failed: %w", id, seq, why, seq, err)
	}
}

// isWrongLastSeq reports a failed CAS: the expected last seq or, in a
// pipeline, the expected last msg id did not match.
func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == codeWrongLastSeq || apiErr.ErrorCode == codeWrongLastSeqConstant || apiErr.ErrorCode == codeWrongLastMsgID)
}
