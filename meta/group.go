package meta

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/meta/group"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// Groups in flight: the next group is decided and sent while earlier
// groups' acks are outstanding, up to maxFlights groups and
// maxFlightEvents events (or one group of any size). The events bound
// stays under the JetStream client's async publish window (4,000).
// While a group is in flight, the next one is taken only once at least
// minPipelined mutations wait (or the group in flight settled): a burst's
// groups stay large, where many small groups in flight would cost more
// leader CPU (one combining hand-off each) than they save in stream idle
// time.
const (
	maxFlights      = 16
	maxFlightEvents = 2048
	minPipelined    = 64
)

// mutation is one decision waiting to be made and appended.
type mutation struct {
	ctx    context.Context
	fp     string
	decide func(v *projections.State) ([]events.Payload, error)
	done   chan mutationResult // buffered; exactly one result is sent
}

// mutationResult: on success, seen is the seq of the state the decision
// saw, its own events included; it is stored.
type mutationResult struct {
	seen uint64
	err  error
}

// committer is the only way a leader term changes cluster state: a
// mutation is decided on the projected state, then appended with expected
// last seq = the seq of the state decided on. Submit returns once the
// decision's events are stored and the projection holds them (or the
// decision appended nothing), or with the error that stopped it.
//
// Mutations submitted while a group is being decided and sent are decided
// and appended together, as one group, in submission order (flat
// combining: whichever submitter finds no group being decided decides and
// sends the queue, the others wait for their results). Each decision of a
// group sees the effects of those before it: the group is decided on a
// scratch state — the projection plus every event this term sent — and
// sent with one Log.AppendAsync whose expected last seq is the seq of that
// scratch state before the group. Each event is encoded once (events.Seal):
// that body is folded into the scratch state and handed to the log.
//
// Several groups may be in flight (sent, acks outstanding; see
// maxFlights): a group is chained to the group sent before it (prevID =
// the id of that group's last event), so it lands only right after it.
// The fencing is therefore the same as for one decision: nothing of a
// group lands unless every event the scratch state held before it is
// stored, with nothing else appended in between; if a group is refused,
// every later group is refused too. Groups are settled in the order they
// were sent, and a decision is answered as a success only if everything it
// saw is stored. Any failure discards the scratch state: the next group is
// decided on the projection, once every group in flight is settled.
//
// Who owns what. A committer is safe for concurrent use by any number of
// submitters; its state has three owners:
//   - The fields set by newLeaderCommitter never change, but term and
//     logger, which setTerm sets while the session starts its term (its
//     only submitter then; every other task starts after it).
//   - sem is the combiner's token. Only its holder decides and sends a
//     group, and it alone reads and writes scratch and tail (no lock).
//   - mu guards queue (submitters append, the combiner takes, a withdrawn
//     submitter removes) and the settling state: flights, flightEvents,
//     broken, lastWritten, unsure (the combiner adds flights, settlers
//     remove them and record their outcome).
//
// A flight's fields are written by the combiner before it is published in
// flights, then only by the one goroutine that settles it (the submitter
// that combined it), which closes done last; anyone reads stored and err
// after done.
type committer struct {
	ctx           context.Context // the term's: done when the term ends
	term          uint64          // set by setTerm
	writer        string
	log           events.Log
	proj          *view.Projector
	clock         clock.Clock
	fp            *failpoint.Set
	appendTimeout time.Duration
	logger        zerolog.Logger
	mayAppend     func() error                         // ErrDisconnected while the connection is down, ErrLeaseLost once the lease is too old
	fenced        func(ctx context.Context, err error) // an append was fenced: re-project, maybe lose the term
	lose          func(reason string)                  // ends the term

	sem     chan struct{}      // the combiner's token
	scratch *projections.State // with sem: the projection plus this term's sent events; nil: rebuild
	tail    *flight            // with sem: the last group with events sent since scratch was rebuilt

	mu           sync.Mutex
	queue        []*mutation // submitted, not yet decided
	flights      []*flight   // groups with events sent and not settled, in order
	flightEvents int         // their events
	broken       bool        // a group failed: scratch holds events that may not be stored
	lastWritten  uint64      // seq of this term's last stored event
	minPipelined int         // minPipelined; tests lower it
	unsure       *flight     // a group whose append's outcome is unknown: resent before deciding anew
}

// newLeaderCommitter is the committer of leader session l's term.
func newLeaderCommitter(l *leaderSession) *committer {
	cfg := &l.r.cfg
	return &committer{
		ctx: l.ctx, writer: cfg.ID, log: cfg.Log, proj: l.r.proj, clock: cfg.Clock, fp: cfg.Failpoints,
		appendTimeout: cfg.AppendTimeout, logger: l.logger,
		mayAppend: l.mayAppend, fenced: l.onFenced, lose: l.lose,
		sem: make(chan struct{}, 1), minPipelined: minPipelined,
	}
}

// setTerm sets the term the committer's events carry, and its logger. It is
// called while nothing else submits (see committer).
func (c *committer) setTerm(term uint64, logger zerolog.Logger) {
	c.term, c.logger = term, logger
}

// Submit decides and appends one mutation (see committer) and returns the
// seq of the state the decision saw, its own events included: a decision
// that appended one event finds it at that seq. If a failpoint is named it
// is hit between the decision and the append. On ErrFenced the leader
// re-projects and steps down if a higher term is there. decide must be
// short and must not keep the state; it runs once, on whichever goroutine
// combines, unless ctx ends first.
func (c *committer) Submit(ctx context.Context, fp string, decide func(v *projections.State) ([]events.Payload, error)) (uint64, error) {
	m := &mutation{ctx: ctx, fp: fp, decide: decide, done: make(chan mutationResult, 1)}
	c.mu.Lock()
	c.queue = append(c.queue, m)
	c.mu.Unlock()
	for {
		select {
		case res := <-m.done:
			return c.finish(res)
		case c.sem <- struct{}{}:
			f := c.combine()
			<-c.sem
			if f != nil {
				c.settle(f)
			}
		case <-ctx.Done():
			if c.withdraw(m) {
				return 0, ctx.Err()
			}
			// Taken into a group already: its append is bounded by
			// AppendTimeout per attempt; report its real outcome.
			return c.finish(<-m.done)
		}
	}
}

// finish returns a mutation's outcome once the projection holds it. It
// waits under the term's context: a caller whose own context ended after
// its mutation was taken into a group still gets its real outcome, not its
// context's error for an event that is stored.
func (c *committer) finish(res mutationResult) (uint64, error) {
	if res.err != nil {
		return 0, res.err
	}
	return res.seen, c.proj.AwaitSeq(c.ctx, res.seen)
}

// withdraw removes m from the queue if it is still there.
func (c *committer) withdraw(m *mutation) bool {
	c.mu.Lock()
	defer c.mu.Unlock()
	for i, q := range c.queue {
		if q == m {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			return true
		}
	}
	return false
}

// take removes up to maxGroup mutations from the head of the queue.
func (c *committer) take() []*mutation {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := min(len(c.queue), group.MaxGroup)
	group := append([]*mutation(nil), c.queue[:n]...)
	c.queue = append(c.queue[:0], c.queue[n:]...)
	return group
}

// requeue puts undecided mutations back at the head of the queue.
func (c *committer) requeue(ms []*mutation) {
	if len(ms) == 0 {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.queue = append(append([]*mutation(nil), ms...), c.queue...)
}

// decided is a mutation of a group that produced its decision.
type decided struct {
	m    *mutation
	seen uint64 // scratch seq after its events
}

// flight is a group sent (or decided without events) and not yet settled.
type flight struct {
	ok   []decided
	evs  []events.Event
	base uint64         // expected last seq: the scratch seq before the group
	pend events.Pending // nil when evs is empty
	prev *flight        // the last group with events sent before it; nil: base is the projection's
	done chan struct{}  // closed once settled; then stored and err are set
	// stored is the seq up to which everything this group's decisions saw
	// is known stored; err is nil iff that is all of it.
	stored uint64
	err    error
}

// lastID is the msg id of f's last event.
func (f *flight) lastID() string {
	last := f.evs[len(f.evs)-1]
	return events.MsgID(last, f.base+uint64(len(f.evs)))
}

// combine plans and sends one group (group.Plan decides it); the caller
// holds sem, and settles the returned flight after releasing it (nil: every
// mutation taken was answered). It works under the term's context, not the
// caller's: whichever caller happens to combine must not decide the outcome
// for the others. Each mutation's own context is checked only when it is
// taken.
func (c *committer) combine() *flight {
	ctx := c.ctx
	if err := c.room(ctx, 0); err != nil {
		return failAll(c.take(), err)
	}
	taken := c.take()
	if len(taken) == 0 {
		return nil
	}
	st, err := c.scratchState(ctx)
	if err != nil {
		return failAll(taken, err)
	}
	pending := make([]group.Mutation, len(taken))
	for i, m := range taken {
		pending[i] = group.Mutation{Decide: m.decide, Gone: m.ctx.Err(), Gated: m.fp != ""}
	}
	g := group.Plan(st, pending, group.Stamp{Term: c.term, Writer: c.writer, At: c.clock.Now()})
	c.requeue(taken[len(g.Answers):])
	taken = taken[:len(g.Answers)]
	if g.DropScratch {
		c.scratch = nil // it folded the refused events
	}
	if g.Gate >= 0 {
		if err := c.fp.Hit(taken[g.Gate].ctx, taken[g.Gate].fp); err != nil {
			// Decided on the scratch state, not sent: nothing of the
			// group is.
			c.scratch = nil
			return failAll(taken, err)
		}
	}
	f := &flight{evs: g.Batch, base: g.Base, prev: c.tail, done: make(chan struct{})}
	for i, a := range g.Answers {
		switch {
		case a.Refused != "":
			c.logger.Error().Str("result", a.Refused).Msg("the fold refuses an event this leader decided; not appending it")
			fallthrough
		case a.Err != nil:
			taken[i].done <- mutationResult{err: a.Err}
		default:
			f.ok = append(f.ok, decided{m: taken[i], seen: a.Seen})
		}
	}
	return c.send(ctx, f)
}

// send hands f's events to the log, chained to the group before it, and
// records f in flight; it returns f to settle, or nil when it was answered
// at once (nothing to append and nothing in flight before it).
func (c *committer) send(ctx context.Context, f *flight) *flight {
	switch {
	case len(f.evs) == 0 && f.prev == nil:
		// Nothing in flight: base is the projection's, all of it stored.
		for _, d := range f.ok {
			d.m.done <- mutationResult{seen: d.seen}
		}
		return nil
	case len(f.evs) == 0:
		// Settled once the group before it is: the decisions saw its events.
		return f
	}
	if err := c.room(ctx, len(f.evs)); err != nil {
		// Decided on the scratch state, not sent: it holds events that
		// will not be stored.
		c.scratch = nil
		for _, d := range f.ok {
			d.m.done <- mutationResult{err: err}
		}
		return nil
	}
	prevID := ""
	if f.prev != nil {
		prevID = f.prev.lastID()
	}
	if err := c.mayAppend(); err != nil {
		f.pend = events.Done{Last: f.base, Err: fmt.Errorf("append at seq %d %w: %w", f.base+1, group.ErrNotSent, err)}
	} else {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
		f.pend = c.log.AppendAsync(actx, f.base, prevID, f.evs...)
		cancel()
	}
	c.mu.Lock()
	c.flights = append(c.flights, f)
	c.flightEvents += len(f.evs)
	c.mu.Unlock()
	c.tail = f
	return f
}

// failAll answers every mutation of group with err; it returns no flight.
func failAll(group []*mutation, err error) *flight {
	for _, m := range group {
		m.done <- mutationResult{err: err}
	}
	return nil
}

// room waits (with sem) until a group of n events may be sent (n == 0:
// until the next group may be taken): fewer than maxFlights groups and,
// unless none is in flight, at most maxFlightEvents events in flight with
// it (n > 0) or at least minPipelined mutations queued (n == 0).
func (c *committer) room(ctx context.Context, n int) error {
	for {
		c.mu.Lock()
		var head *flight
		full := len(c.flights) >= maxFlights ||
			n > 0 && c.flightEvents+n > maxFlightEvents ||
			n == 0 && len(c.queue) < c.minPipelined
		if len(c.flights) > 0 && full {
			head = c.flights[0]
		}
		c.mu.Unlock()
		if head == nil {
			return nil
		}
		select {
		case <-head.done:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
}

// drain waits (with sem) until every group in flight is settled.
func (c *committer) drain(ctx context.Context) error {
	c.mu.Lock()
	var last *flight
	if n := len(c.flights); n > 0 {
		last = c.flights[n-1]
	}
	c.mu.Unlock()
	if last == nil {
		return nil
	}
	select {
	case <-last.done: // groups settle in order
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// settle waits for the group before f, then for f's acks, and answers f's
// mutations as group.Settling says: an append whose outcome is unknown is
// sent again with the same message ids (stored once) when the group before
// it is stored; if it stays unknown it is resent before anything new is
// decided (resendUnsure). A failure marks the scratch state broken and
// fails every later group.
func (c *committer) settle(f *flight) {
	ctx := c.ctx
	s := group.Settling{Base: f.base, Events: len(f.evs), Attempts: appendAttempts}
	if p := f.prev; p != nil {
		<-p.done // its settling is bounded by AppendTimeout per attempt
		s.Prior = group.Prior{Chained: true, Stored: p.stored, Err: p.err}
		f.prev = nil // only settle reads it: do not keep every group alive
	}
	if len(f.evs) > 0 {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
		last, err := f.pend.Wait(wctx)
		cancel()
		c.attempts(ctx, &s, f.evs, last, err)
	}
	o := s.Outcome()
	if o.Fenced {
		c.fenced(ctx, o.Err)
	}
	c.mu.Lock()
	if len(f.evs) > 0 {
		c.flights = c.flights[1:] // f is the head: groups settle in order
		c.flightEvents -= len(f.evs)
	}
	if o.Err != nil {
		c.broken = true
	}
	if o.Unsure {
		c.unsure = f
	}
	c.lastWritten = max(c.lastWritten, o.Stored)
	c.mu.Unlock()
	f.stored, f.err = o.Stored, o.Err
	close(f.done)
	for _, d := range f.ok {
		if err := o.Answer(d.seen); err != nil {
			d.m.done <- mutationResult{err: err}
		} else {
			d.m.done <- mutationResult{seen: d.seen}
		}
	}
}

// attempts feeds s the outcome (last, err) of the attempt just made and
// sends evs again, with the same ids and expected last seq, for as long as
// s says to.
func (c *committer) attempts(ctx context.Context, s *group.Settling, evs []events.Event, last uint64, err error) {
	for {
		if ctx.Err() != nil {
			s.Attempts = 0 // the term ended: no further attempt
		}
		if !s.Attempted(last, err) {
			return
		}
		c.logger.Warn().Err(err).Uint64("expected_seq", s.Base).Int("events", len(evs)).Msg("append outcome unknown; sending it again with the same message ids")
		last, err = c.appendOnce(ctx, s.Base, evs)
	}
}

// resendUnsure resends (with sem, no group in flight), with the same ids,
// the group whose append's outcome is unknown, so that nothing new is
// decided until it is known. Deciding again on the projection would reuse
// the ids (<writer>-<term>-<seq>) the group may be stored under, for other
// events: the log fences those, spuriously, a late attempt of the group
// could still land after them, and a group chained to such an id would land
// after the wrong event. The groups sent after it were sent before the
// resend on the same connection, so once it is answered they are settled
// on the server too.
func (c *committer) resendUnsure(ctx context.Context) error {
	c.mu.Lock()
	u := c.unsure
	c.mu.Unlock()
	if u == nil {
		return nil
	}
	s := group.Settling{Base: u.base, Events: len(u.evs), Attempts: appendAttempts, Resending: true}
	last, err := c.appendOnce(ctx, u.base, u.evs)
	c.attempts(ctx, &s, u.evs, last, err)
	o := s.Outcome()
	c.mu.Lock()
	c.lastWritten = max(c.lastWritten, o.Stored)
	if !o.Unsure {
		c.unsure = nil
	}
	c.mu.Unlock()
	switch {
	case o.Err == nil:
		c.logger.Info().Uint64("expected_seq", u.base).Int("events", len(u.evs)).Msg("resent a group whose outcome was unknown: it is stored")
		return nil
	case o.Fenced:
		c.fenced(ctx, o.Err)
	}
	return fmt.Errorf("resending a group whose outcome is unknown: %w", o.Err)
}

// scratchState returns the state the next group is decided on: the kept
// scratch state when it is still the projection plus the events this term
// sent, else — once every group in flight is settled — a fresh copy of the
// projection. It fails with ErrNotLeader when the projection shows a
// higher term.
func (c *committer) scratchState(ctx context.Context) (*projections.State, error) {
	c.mu.Lock()
	failed := c.broken
	if failed {
		c.scratch = nil // holds events that may not be stored
	}
	c.mu.Unlock()
	if sc := c.scratch; sc != nil {
		c.proj.Peek(func(v *projections.State) {
			switch {
			case v.Term > c.term:
			case v.Seq > sc.Seq:
				// Something this term did not append: decide on it.
				c.scratch = nil
			}
		})
	}
	if c.scratch == nil {
		if err := c.drain(ctx); err != nil {
			return nil, err
		}
		if err := c.resendUnsure(ctx); err != nil {
			return nil, err
		}
		c.mu.Lock()
		c.broken = false // every group is settled: nothing more can fail
		written := c.lastWritten
		c.mu.Unlock()
		c.tail = nil
		// A fresh copy must hold every event this term stored; after a
		// failure, whatever the log holds (an append whose outcome the
		// leader did not learn may have landed).
		if failed {
			if _, err := c.proj.CatchUp(ctx); err != nil {
				return nil, err
			}
		}
		if err := c.proj.AwaitSeq(ctx, written); err != nil {
			return nil, err
		}
	}
	var term uint64
	c.proj.Peek(func(v *projections.State) {
		term = v.Term
		if term <= c.term && c.scratch == nil {
			c.scratch = v.Clone()
		}
	})
	if term > c.term {
		c.lose(fmt.Sprintf("projection shows term %d > %d", term, c.term))
		return nil, ErrNotLeader
	}
	return c.scratch, nil
}

// appendAttempts is how many times an append whose outcome stays unknown
// is sent.
const appendAttempts = 3

// appendOnce sends evs once with expected last seq expected, bounded by
// AppendTimeout. It returns the seq of the last event known stored (at
// least expected); an error wrapping group.ErrNotSent means nothing was
// sent.
func (c *committer) appendOnce(ctx context.Context, expected uint64, evs []events.Event) (uint64, error) {
	if err := c.mayAppend(); err != nil {
		return expected, fmt.Errorf("append at seq %d %w: %w", expected+1, group.ErrNotSent, err)
	}
	actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
	defer cancel()
	last, err := c.log.Append(actx, expected, evs...)
	return max(last, expected), err
}
