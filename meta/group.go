package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// maxGroup bounds the mutations decided and appended together: about one
// JetStream atomic batch (at most 1000 messages, the server's default
// max_batch_size) when each mutation appends one event, so one append
// attempt (AppendTimeout) carries one batch, not several in a row. Measured
// on a loaded 2-core machine with sync always: groups of 2048 (three
// batches an attempt) ran out of the 2 s attempt ("append batch ... (1000
// events), outcome unknown: context deadline exceeded") and the leader lost
// its lease in the same seconds.
const maxGroup = 1000

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
	n := min(len(c.queue), maxGroup)
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

// errNotSent marks an append that was never handed to the log: its outcome
// is known, nothing of it is stored.
var errNotSent = errors.New("not sent")

// errOwnEventRefused is a decision whose events the fold refuses.
var errOwnEventRefused = errors.New("the projection refuses the leader's own event")

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

// combine decides and sends one group; the caller holds sem, and settles
// the returned flight after releasing it (nil: every mutation taken was
// answered). It works under the term's context, not the caller's:
// whichever caller happens to combine must not decide the outcome for the
// others. Each mutation's own context is checked only before it is
// decided. A decision whose events the fold refuses (Rejected or Corrupt on
// the scratch state) fails with errOwnEventRefused and is not appended; the
// scratch state, which folded them, is dropped, and the mutations after it
// go back to the head of the queue, to be decided on a fresh state.
func (c *committer) combine() *flight {
	ctx := c.ctx
	if err := c.room(ctx, 0); err != nil {
		if group := c.take(); len(group) > 0 {
			return failAll(group, err)
		}
		return nil
	}
	group := c.take()
	if len(group) == 0 {
		return nil
	}
	st, err := c.scratchState(ctx)
	if err != nil {
		return failAll(group, err)
	}
	base := st.Seq
	now := c.clock.Now()
	var (
		evs []events.Event
		ok  []decided
	)
	for i, m := range group {
		if err := m.ctx.Err(); err != nil {
			m.done <- mutationResult{err: err}
			continue
		}
		payloads, err := m.decide(st)
		if err == nil && len(payloads) > 0 && m.fp != "" {
			err = c.fp.Hit(m.ctx, m.fp)
		}
		var mine []events.Event
		var bodies [][]byte
		for _, p := range payloads {
			if err != nil {
				break
			}
			// Encoded once: the body folded below is the one the log
			// stores.
			var ev events.Event
			var b []byte
			if ev, b, err = events.Seal(events.Event{Term: c.term, Writer: c.writer, At: now, Data: p}); err == nil {
				mine, bodies = append(mine, ev), append(bodies, b)
			}
		}
		if err != nil {
			m.done <- mutationResult{err: err}
			continue
		}
		// Later decisions of the group see these events: fold them into
		// the scratch state exactly as the projection will fold them.
		var refused *projections.Result
		for _, b := range bodies {
			if r := st.DecodeApply(st.Seq+1, b); r.Outcome == projections.Rejected || r.Outcome == projections.Corrupt {
				refused = &r
				break
			}
		}
		if refused != nil {
			c.logger.Error().Str("result", refused.String()).Msg("the fold refuses an event this leader decided; not appending it")
			m.done <- mutationResult{err: fmt.Errorf("%w: %s", errOwnEventRefused, refused)}
			c.scratch = nil // it folded the refused events
			c.requeue(group[i+1:])
			break
		}
		evs = append(evs, mine...)
		ok = append(ok, decided{m: m, seen: st.Seq})
	}
	f := &flight{ok: ok, evs: evs, base: base, prev: c.tail, done: make(chan struct{})}
	switch {
	case len(evs) == 0 && f.prev == nil:
		// Nothing in flight: base is the projection's, all of it stored.
		for _, d := range ok {
			d.m.done <- mutationResult{seen: d.seen}
		}
		return nil
	case len(evs) == 0:
		// Settled once the group before it is: the decisions saw its events.
		return f
	}
	if err := c.room(ctx, len(evs)); err != nil {
		// Decided on the scratch state, not sent: it holds events that
		// will not be stored.
		c.scratch = nil
		for _, d := range ok {
			d.m.done <- mutationResult{err: err}
		}
		return nil
	}
	prevID := ""
	if f.prev != nil {
		prevID = f.prev.lastID()
	}
	if err := c.mayAppend(); err != nil {
		f.pend = events.Done{Last: base, Err: fmt.Errorf("append at seq %d %w: %w", base+1, errNotSent, err)}
	} else {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
		f.pend = c.log.AppendAsync(actx, base, prevID, evs...)
		cancel()
	}
	c.mu.Lock()
	c.flights = append(c.flights, f)
	c.flightEvents += len(evs)
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
// mutations. An append whose outcome is unknown is retried with the same
// message ids (stored once) when the group before it is stored; if it stays
// unknown it is resent before anything new is decided (resendUnsure). A
// failure marks the scratch state broken and fails every later group.
func (c *committer) settle(f *flight) {
	ctx := c.ctx
	floor := f.base
	var prevErr error
	if p := f.prev; p != nil {
		<-p.done // its settling is bounded by AppendTimeout per attempt
		if p.err != nil {
			floor, prevErr = min(floor, p.stored), p.err
		}
		f.prev = nil // only settle reads it: do not keep every group alive
	}
	stored, err := floor, prevErr
	unsure := false
	if len(f.evs) > 0 {
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
		last, werr := f.pend.Wait(wctx)
		cancel()
		if werr != nil && !errors.Is(werr, events.ErrFenced) && !errors.Is(werr, errNotSent) && prevErr == nil {
			// Everything before base is stored, so the expected last seq
			// alone fences the retry.
			c.logger.Warn().Err(werr).Uint64("expected_seq", f.base).Int("events", len(f.evs)).Msg("append failed; retrying with the same message ids")
			rlast, rerr := c.append(ctx, f.base, f.evs, appendAttempts-1)
			if errors.Is(rerr, errNotSent) {
				// The first attempt was sent: its outcome is what is unknown.
				rerr = fmt.Errorf("append at seq %d, outcome unknown: %w (retry not sent: %v)", f.base+1, werr, rerr)
			}
			last, werr = max(last, rlast), rerr
			unsure = werr != nil && !errors.Is(werr, events.ErrFenced)
		}
		switch {
		case prevErr != nil:
			// Chained to a group that failed: whatever its acks say, what
			// its decisions saw is not known stored (the failed group's
			// ids may be held by other events of this term: an earlier
			// attempt whose outcome the leader did not learn).
			if werr == nil {
				werr = fmt.Errorf("%w: stored after a group that failed", events.ErrFenced)
			}
			err = fmt.Errorf("%w (after the group before it failed: %v)", werr, prevErr)
		case last > f.base:
			stored, err = last, werr
		default:
			err = werr
		}
		if errors.Is(werr, events.ErrFenced) && !errors.Is(prevErr, events.ErrFenced) {
			c.fenced(ctx, werr)
		}
	}
	c.mu.Lock()
	if len(f.evs) > 0 {
		c.flights = c.flights[1:] // f is the head: groups settle in order
		c.flightEvents -= len(f.evs)
	}
	if err != nil {
		c.broken = true
	}
	if unsure {
		c.unsure = f
	}
	c.lastWritten = max(c.lastWritten, stored)
	c.mu.Unlock()
	f.stored, f.err = stored, err
	close(f.done)
	for _, d := range f.ok {
		if d.seen <= stored {
			d.m.done <- mutationResult{seen: d.seen}
		} else {
			d.m.done <- mutationResult{err: err}
		}
	}
}

// resendUnsure resends (with sem, no group in flight), with the same ids,
// the group whose append's outcome is unknown, so that nothing new is
// decided until it is known. Deciding again on the projection would reuse
// the ids (<term>-<seq>) the group may be stored under, for other events:
// the log fences those, spuriously, a late attempt of the group could still
// land after them, and a group chained to such an id would land after the
// wrong event. The groups sent after it were sent before the resend on the
// same connection, so once it is answered they are settled on the server
// too.
func (c *committer) resendUnsure(ctx context.Context) error {
	c.mu.Lock()
	u := c.unsure
	c.mu.Unlock()
	if u == nil {
		return nil
	}
	stored, err := c.append(ctx, u.base, u.evs, appendAttempts)
	c.mu.Lock()
	c.lastWritten = max(c.lastWritten, stored)
	if err == nil || errors.Is(err, events.ErrFenced) {
		c.unsure = nil
	}
	c.mu.Unlock()
	switch {
	case err == nil:
		c.logger.Info().Uint64("expected_seq", u.base).Int("events", len(u.evs)).Msg("resent a group whose outcome was unknown: it is stored")
		return nil
	case errors.Is(err, events.ErrFenced):
		c.fenced(ctx, err)
	}
	return fmt.Errorf("resending a group whose outcome is unknown: %w", err)
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

// append retries an append whose outcome is unknown with the same message
// ids, so it is stored once, sending it up to attempts times. It returns
// the seq of the last event known to be stored: the last one on success,
// at least expected on failure. An error wrapping errNotSent means nothing
// was sent.
func (c *committer) append(ctx context.Context, expected uint64, evs []events.Event, attempts int) (uint64, error) {
	var err error
	stored := expected
	for attempt := 0; attempt < attempts; attempt++ {
		if cerr := c.mayAppend(); cerr != nil {
			if attempt == 0 && err == nil {
				return stored, fmt.Errorf("append at seq %d %w: %w", expected+1, errNotSent, cerr)
			}
			return stored, fmt.Errorf("append at seq %d, outcome unknown: %w (retry not sent: %w)", expected+1, err, cerr)
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), c.appendTimeout)
		var last uint64
		last, err = c.log.Append(actx, expected, evs...)
		cancel()
		stored = max(stored, last)
		if err == nil {
			return last, nil
		}
		if errors.Is(err, events.ErrFenced) {
			return stored, err
		}
		c.logger.Warn().Err(err).Uint64("expected_seq", expected).Int("events", len(evs)).Int("attempt", attempt+1).Msg("append failed; retrying with the same message ids")
		if ctx.Err() != nil {
			break
		}
	}
	return stored, err
}
