package view

import (
	"container/heap"
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/projections"
)

// Projector folds a Log into a projections.State and serves read-only views
// of it. Run owns the only goroutine; every other method is safe to call
// from any goroutine.
type Projector struct {
	log    events.Log
	logger zerolog.Logger
	clock  clock.Clock

	mu      sync.Mutex
	state   *projections.State
	view    *projections.State // clone of state, made on demand
	changed chan struct{}      // closed at the next change; made on demand
	waiters seqWaiters         // AwaitSeq calls, a min-heap by seq, released once their seq is folded
	lastErr error
	healthy bool

	snaps  events.SnapshotStore // nil: always fold from the state given
	origin Origin

	// resume ends Run's reading session, which then starts a new one at
	// the next seq at once (nil between sessions); kicked: it was called
	// in this session already (AwaitStored).
	resume context.CancelFunc
	kicked bool
}

// StoredStall is how long AwaitStored lets the fold make no progress
// towards a seq the log is known to hold before it reads again on a new
// session. A reader's session can be lost without a word: JetStream drops
// the pull requests of a consumer whose server leaves (lame duck or
// crash), and the client notices only when two idle heartbeats are missed
// (2 s here; nats.go allows no less than 1 s). On a healthy stream an
// appended event is folded within milliseconds of its ack.
const StoredStall = 300 * time.Millisecond

// seqWaiter is an AwaitSeq call waiting for seq.
type seqWaiter struct {
	seq  uint64
	done chan struct{}
}

// seqWaiters is a min-heap by seq (container/heap).
type seqWaiters []*seqWaiter

func (h seqWaiters) Len() int           { return len(h) }
func (h seqWaiters) Less(i, j int) bool { return h[i].seq < h[j].seq }
func (h seqWaiters) Swap(i, j int)      { h[i], h[j] = h[j], h[i] }
func (h *seqWaiters) Push(x any)        { *h = append(*h, x.(*seqWaiter)) }
func (h *seqWaiters) Pop() any {
	old := *h
	w := old[len(old)-1]
	old[len(old)-1] = nil
	*h = old[:len(old)-1]
	return w
}

// NewProjector returns a projector over log starting from an empty state.
func NewProjector(log events.Log, logger zerolog.Logger, clk clock.Clock, opts ...ProjectorOption) *Projector {
	return NewProjectorFrom(log, projections.New(), logger, clk, opts...)
}

// NewProjectorFrom starts from a state (a snapshot) and folds what follows it.
func NewProjectorFrom(log events.Log, st *projections.State, logger zerolog.Logger, clk clock.Clock, opts ...ProjectorOption) *Projector {
	if clk == nil {
		clk = clock.Real{}
	}
	p := &Projector{log: log, logger: logger, clock: clk, state: st}
	for _, o := range opts {
		o(p)
	}
	return p
}

// Run folds the log until ctx is done. When the log cannot be read it logs,
// reports itself unhealthy and retries with backoff; it never gives up.
func (p *Projector) Run(ctx context.Context) error {
	p.startFromSnapshot(ctx)
	backoff := 50 * time.Millisecond
	for {
		from := p.Seq() + 1
		sctx, resume := context.WithCancel(ctx)
		p.mu.Lock()
		p.resume, p.kicked = resume, false
		p.mu.Unlock()
		err := p.log.Watch(sctx, from, func(rec events.Record) error {
			p.apply(rec)
			backoff = 50 * time.Millisecond
			return nil
		})
		p.mu.Lock()
		p.resume = nil
		kicked := p.kicked // read before resume() below ends sctx in every case
		p.mu.Unlock()
		resume()
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if kicked {
			continue // AwaitStored ended the session: a new one at once (an error it ended with comes again)
		}
		if errors.Is(err, events.ErrCompacted) && p.dropSnapshot(err) {
			continue // a full fold, at once
		}
		p.setErr(err)
		p.logger.Warn().Err(err).Uint64("seq", p.Seq()).Dur("retry_in", backoff).Msg("event stream unreadable; retrying")
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.clock.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

// dropSnapshot falls back to a full fold when the events right after the
// snapshot the projector started from are gone (compacted between checking
// the snapshot and reading after it): the state goes back to empty, to be
// folded from seq 1. It reports whether it did; not when anything was
// folded since the snapshot (the events missing are not the snapshot's).
func (p *Projector) dropSnapshot(err error) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.origin.Snapshot == nil || p.origin.Folded > 0 {
		return false
	}
	p.logger.Warn().Err(err).Str("snapshot", p.origin.Snapshot.Name).Uint64("seq", p.state.Seq).
		Msg("the events after the snapshot are gone; folding from seq 1")
	p.state = projections.New()
	p.view = nil
	p.origin = Origin{}
	p.notify()
	return true
}

func (p *Projector) setErr(err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.lastErr = err
	p.healthy = false
	p.notify()
}

// notify closes the channel Changed handed out, if any. The next Changed
// makes a new one: with nobody watching, folding an event costs no channel.
func (p *Projector) notify() {
	if p.changed != nil {
		close(p.changed)
		p.changed = nil
	}
}

// release closes the channels of the waiters whose seq is folded.
func (p *Projector) release() {
	for len(p.waiters) > 0 && p.waiters[0].seq <= p.state.Seq {
		close(heap.Pop(&p.waiters).(*seqWaiter).done)
	}
}

func (p *Projector) apply(rec events.Record) {
	p.mu.Lock()
	r := p.state.ApplyRecord(rec)
	p.origin.Folded++
	p.view = nil
	p.healthy = true
	p.lastErr = nil
	p.notify()
	if len(p.waiters) > 0 {
		p.release()
	}
	term := p.state.Term
	p.mu.Unlock()
	switch r.Outcome {
	case projections.Rejected:
		p.logger.Warn().Uint64("seq", rec.Seq).Uint64("term", term).Str("kind", r.Kind).Str("reason", r.Reason).Msg("event rejected by projection")
	case projections.Corrupt:
		p.logger.Error().Uint64("seq", rec.Seq).Str("reason", r.Reason).Msg("corrupt event skipped")
	}
}

// View returns the current state. It is shared: callers must not modify it.
func (p *Projector) View() *projections.State {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.view == nil {
		p.view = p.state.Clone()
	}
	return p.view
}

// Seq is the last folded seq.
func (p *Projector) Seq() uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.state.Seq
}

// Healthy reports whether the last read of the log succeeded, and the last error.
func (p *Projector) Healthy() (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.healthy, p.lastErr
}

// Changed returns a channel closed at the next change of the view.
func (p *Projector) Changed() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.changed == nil {
		p.changed = make(chan struct{})
	}
	return p.changed
}

// WaitSeq blocks until the view has folded seq. It compares seqs while it
// waits and makes a view only once, at the end.
func (p *Projector) WaitSeq(ctx context.Context, seq uint64) (*projections.State, error) {
	err := p.AwaitSeq(ctx, seq)
	return p.View(), err
}

// AwaitSeq blocks until the state has folded seq, without making a view.
// It is woken once, when seq is folded, not on every event before it.
func (p *Projector) AwaitSeq(ctx context.Context, seq uint64) error {
	return p.await(ctx, seq, false)
}

// AwaitStored is AwaitSeq for a seq the log is known to hold (an append
// of it was acknowledged). When the fold makes no progress towards it for
// StoredStall, the reading session is taken for lost: it ends, and a new
// one starts at the next seq at once (once per session, however many
// wait). A fold that moves, however slowly (a burst), is left alone.
func (p *Projector) AwaitStored(ctx context.Context, seq uint64) error {
	return p.await(ctx, seq, true)
}

// await waits for seq as AwaitSeq does; stored: as AwaitStored does.
func (p *Projector) await(ctx context.Context, seq uint64, stored bool) error {
	p.mu.Lock()
	if p.state.Seq >= seq {
		p.mu.Unlock()
		return nil
	}
	w := &seqWaiter{seq: seq, done: make(chan struct{})}
	heap.Push(&p.waiters, w)
	at := p.state.Seq
	p.mu.Unlock()
	for {
		var stall <-chan time.Time // nil: never, for a seq not known to be stored
		if stored {
			stall = p.clock.After(StoredStall)
		}
		select {
		case <-w.done:
			return nil
		case <-ctx.Done():
			return p.withdraw(w, ctx.Err())
		case <-stall:
			at = p.kickIfStalled(at, seq)
		}
	}
}

// kickIfStalled ends the reading session when the fold is still at at,
// below seq, and returns where the fold is.
func (p *Projector) kickIfStalled(at, seq uint64) uint64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	now := p.state.Seq
	if now != at || now >= seq || p.resume == nil || p.kicked {
		return now
	}
	p.kicked = true
	p.logger.Info().Uint64("seq", now).Uint64("stored", seq).Dur("stalled", StoredStall).
		Msg("the log holds an event the reader has not delivered: reading again on a new session")
	p.resume()
	return now
}

// withdraw removes waiter w after its caller gave up with err; nil when
// its seq was folded meanwhile.
func (p *Projector) withdraw(w *seqWaiter, err error) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	i := slices.Index(p.waiters, w)
	if i < 0 {
		return nil // folded meanwhile
	}
	heap.Remove(&p.waiters, i)
	return err
}

// Peek calls fn with the live state, holding the fold still meanwhile: fn
// must be short, must not modify the state and must not keep it. It costs
// no copy, unlike View.
func (p *Projector) Peek(fn func(*projections.State)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	fn(p.state)
}

// CatchUp waits until the view has folded everything the log held when it
// was called.
func (p *Projector) CatchUp(ctx context.Context) (*projections.State, error) {
	tail, err := p.log.Tail(ctx)
	if err != nil {
		return nil, err
	}
	err = p.AwaitStored(ctx, tail)
	return p.View(), err
}

// ErrNotProjected is returned by Load when the log could not be read.
var ErrNotProjected = errors.New("event stream not projected")

// Load folds a log from an empty state up to its tail and returns the state:
// the one-shot read used by status and worker list.
func Load(ctx context.Context, log events.Log) (*projections.State, error) {
	st, _, err := LoadFrom(ctx, log, nil, zerolog.Nop(), nil)
	return st, err
}
