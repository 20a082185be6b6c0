package meta

import (
	"context"
	"fmt"
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
// leader CPU (one hand-off each) than they save in stream idle time. The
// events bound is checked before a group is decided, counting one event a
// mutation: a soft bound.
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
// Its state is owned by the term's loop (termLoop): Submit sends the
// mutation to the loop, which queues it and, whenever there is room, plans
// the next group (group.Plan: up to group.MaxGroup queued mutations, in
// submission order, each decision seeing the effects of those before it) on
// a scratch state — the projection plus every event this term sent — and
// hands its events to the sender goroutine: one Log.AppendAsync whose
// expected last seq is the seq of that scratch state before the group. The
// settler goroutine waits for each group's acks in the order they were
// sent, sends again (same ids) an append whose outcome is unknown
// (group.Settling), reports the outcome to the loop and answers the
// group's submitters. Each event is encoded once (events.Seal): that body
// is folded into the scratch state and handed to the log.
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
// decided on the projection, once every group in flight is settled (the
// rebuild — resending a group whose outcome stayed unknown, catching up,
// copying the projection — runs on a goroutine of the loop's too).
//
// The fields up to loop never change after newLeaderCommitter; the rest
// belong to the loop's goroutine, but a flight's stored and err, which the
// settler writes before it reports the flight to the loop.
type committer struct {
	ctx           context.Context // the term's: done when the term ends
	writer        string
	log           events.Log
	proj          *view.Projector
	clock         clock.Clock
	fp            *failpoint.Set
	appendTimeout time.Duration                        // an attempt's bound: min(AppendTimeout, resendAfter)
	maxAttempts   int                                  // attempts of an append whose outcome stays unknown
	mayAppend     func() error                         // ErrDisconnected while the connection is down, ErrLeaseLost once the lease is too old
	fenced        func(ctx context.Context, err error) // an append was fenced: re-project, maybe lose the term
	lose          func(reason string)                  // ends the term
	loop          *termLoop
	moves         *streamMoves // the stream's leader elections end attempts (nil: none)
	sends         chan *flight // the loop hands groups to the sender, in order
	settles       chan *flight // the sender hands them to the settler, in order

	term         uint64 // set by setTerm
	logger       zerolog.Logger
	scratch      *projections.State // the projection plus this term's sent events; nil: rebuild
	rebuilding   bool               // a rebuild of scratch runs
	tail         *flight            // the last group with events sent since scratch was rebuilt
	queue        []*mutation        // submitted, not yet decided
	flights      []*flight          // groups handed to the sender and not settled, in order
	unsent       int                // of them, not yet handed to the log by the sender
	flightEvents int                // their events
	broken       bool               // a group failed: scratch holds events that may not be stored
	lastWritten  uint64             // seq of this term's last stored event
	minPipelined int                // minPipelined; tests lower it
	unsure       *flight            // a group whose append's outcome is unknown: resent before deciding anew
	held         bool               // tests: no group is planned
	ended        bool               // the term ended: every mutation fails
}

// newLeaderCommitter is the committer of leader session l's term, owned by
// its loop.
func newLeaderCommitter(l *leaderSession) *committer {
	cfg := &l.r.cfg
	return &committer{
		ctx: l.ctx, writer: cfg.ID, log: cfg.Log, proj: l.r.proj, clock: cfg.Clock, fp: cfg.Failpoints,
		appendTimeout: min(cfg.AppendTimeout, resendAfter), maxAttempts: appendAttemptsFor(cfg.AppendTimeout),
		logger:    l.logger,
		mayAppend: l.keeper.mayAppend, fenced: l.onFenced, lose: l.lose, loop: l.loop, moves: l.r.moves,
		sends: make(chan *flight, maxFlights+1), settles: make(chan *flight, maxFlights+1),
		minPipelined: minPipelined,
	}
}

// run starts the committer's sender and settler; called on the loop when
// it starts.
func (c *committer) run() {
	c.loop.goIO(c.sender)
	c.loop.goIO(c.settler)
}

// closing is called on the loop once the term ended: every queued mutation
// fails, nothing more is planned, and the sender ends once it has sent what
// it was handed (the groups in flight still settle).
func (c *committer) closing() {
	c.ended = true
	c.failQueue(len(c.queue), c.ctx.Err())
	close(c.sends)
}

// setTerm sets the term the committer's events carry, and its logger.
func (c *committer) setTerm(term uint64, logger zerolog.Logger) {
	c.loop.do(context.Background(), func() { c.term, c.logger = term, logger })
}

// Submit decides and appends one mutation (see committer) and returns the
// seq of the state the decision saw, its own events included: a decision
// that appended one event finds it at that seq. If a failpoint is named it
// is hit between the decision and the append. On ErrFenced the leader
// re-projects and steps down if a higher term is there. decide must be
// short and must not keep the state; it runs once, on the term's loop,
// unless ctx ends first.
func (c *committer) Submit(ctx context.Context, fp string, decide func(v *projections.State) ([]events.Payload, error)) (uint64, error) {
	m := &mutation{ctx: ctx, fp: fp, decide: decide, done: make(chan mutationResult, 1)}
	if !c.loop.do(ctx, func() { c.queue = append(c.queue, m); c.pump() }) {
		if err := ctx.Err(); err != nil {
			return 0, err
		}
		return 0, fmt.Errorf("%w: the term ended", ErrNotLeader)
	}
	select {
	case res := <-m.done:
		return c.finish(res)
	case <-ctx.Done():
		withdrawn := false
		c.loop.do(context.Background(), func() { withdrawn = c.withdraw(m) })
		if withdrawn {
			return 0, ctx.Err()
		}
		// Taken into a group already: its append is bounded by
		// AppendTimeout per attempt; report its real outcome.
		return c.finish(<-m.done)
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
	return res.seen, c.proj.AwaitStored(c.ctx, res.seen)
}

// withdraw removes m from the queue if it is still there. On the loop.
func (c *committer) withdraw(m *mutation) bool {
	for i, q := range c.queue {
		if q == m {
			c.queue = append(c.queue[:i], c.queue[i+1:]...)
			return true
		}
	}
	return false
}

// failQueue answers the first n queued mutations with err. On the loop.
func (c *committer) failQueue(n int, err error) {
	for _, m := range c.queue[:n] {
		m.done <- mutationResult{err: err}
	}
	c.queue = append(c.queue[:0], c.queue[n:]...)
}

// pump plans and sends groups for as long as there is room. On the loop,
// after every message that may have made room.
func (c *committer) pump() {
	for len(c.queue) > 0 && !c.held {
		if c.ended {
			c.failQueue(len(c.queue), c.ctx.Err())
			return
		}
		if c.rebuilding || !c.room() || !c.scratchReady() {
			return
		}
		c.plan()
	}
}

// room: nothing in flight; or the sender idle, fewer than maxFlights
// groups in flight, at least minPipelined mutations queued and room for
// them under maxFlightEvents (counted as one event each).
func (c *committer) room() bool {
	switch {
	case len(c.flights) == 0:
		return true
	case c.unsent > 0:
		// The sender is still handing a group to the log (an atomic batch
		// is sent whole before AppendAsync returns): the queue grows
		// meanwhile, so the next group is large, as one decided after it.
		return false
	}
	n := min(len(c.queue), group.MaxGroup)
	return len(c.flights) < maxFlights && n >= c.minPipelined && c.flightEvents+n <= maxFlightEvents
}

// scratchReady reports whether the scratch state may be decided on now. It
// drops a scratch state that holds events that may not be stored (a group
// failed) or misses events this term did not append, and starts a rebuild
// once no group is in flight. A projection showing a higher term ends the
// term.
func (c *committer) scratchReady() bool {
	if c.broken {
		c.scratch = nil // holds events that may not be stored
	}
	var term uint64
	if sc := c.scratch; sc != nil {
		c.proj.Peek(func(v *projections.State) {
			term = v.Term
			if v.Seq > sc.Seq && v.Term <= c.term {
				c.scratch = nil // something this term did not append: decide on it
			}
		})
	}
	switch {
	case term > c.term:
		c.lose(fmt.Sprintf("projection shows term %d > %d", term, c.term))
		c.failQueue(min(len(c.queue), group.MaxGroup), ErrNotLeader)
		return false
	case c.scratch != nil:
		return true
	case len(c.flights) == 0:
		c.rebuild()
	}
	return false
}

// rebuild makes a fresh scratch state on a goroutine of the loop's (no
// group in flight): it resends the group whose outcome is unknown, catches
// up after a failure and copies the projection once it holds every event
// this term stored. On the loop.
func (c *committer) rebuild() {
	c.rebuilding = true
	failed, written, unsure, term := c.broken, c.lastWritten, c.unsure, c.term
	c.loop.goIO(func() {
		var res rebuilt
		res.stored, res.known, res.err = c.resendUnsure(c.ctx, unsure)
		if res.err == nil {
			res.st, res.term, res.err = c.fresh(failed, max(written, res.stored), term)
		}
		c.loop.post(func() { c.rebuilt(res) })
	})
}

// rebuilt is what a rebuild reports to the loop.
type rebuilt struct {
	st     *projections.State // nil on failure
	term   uint64             // the projection's term
	stored uint64             // the resent group is stored up to it
	known  bool               // the resent group's outcome is known (or there was none)
	err    error
}

// fresh copies the projection once it holds every event up to written;
// after a failure, whatever the log holds (an append whose outcome the
// leader did not learn may have landed).
func (c *committer) fresh(failed bool, written, term uint64) (*projections.State, uint64, error) {
	ctx := c.ctx
	if failed {
		if _, err := c.proj.CatchUp(ctx); err != nil {
			return nil, 0, err
		}
	}
	if err := c.proj.AwaitStored(ctx, written); err != nil {
		return nil, 0, err
	}
	var st *projections.State
	var vt uint64
	c.proj.Peek(func(v *projections.State) {
		if vt = v.Term; vt <= term {
			st = v.Clone()
		}
	})
	return st, vt, nil
}

// rebuilt takes a rebuild's result. On the loop.
func (c *committer) rebuilt(r rebuilt) {
	c.rebuilding = false
	c.lastWritten = max(c.lastWritten, r.stored)
	if r.known {
		c.unsure = nil
	}
	switch {
	case r.err != nil:
		c.failQueue(min(len(c.queue), group.MaxGroup), r.err)
	case r.term > c.term:
		c.lose(fmt.Sprintf("projection shows term %d > %d", r.term, c.term))
		c.failQueue(min(len(c.queue), group.MaxGroup), ErrNotLeader)
	default:
		c.scratch, c.broken, c.tail = r.st, false, nil // every group is settled: nothing more can fail
	}
	c.pump()
}

// plan decides the next group (group.Plan) and hands it to the sender. On
// the loop.
func (c *committer) plan() {
	n := min(len(c.queue), group.MaxGroup)
	pending := make([]group.Mutation, n)
	for i, m := range c.queue[:n] {
		pending[i] = group.Mutation{Decide: m.decide, Gone: m.ctx.Err(), Gated: m.fp != ""}
	}
	g := group.Plan(c.scratch, pending, group.Stamp{Term: c.term, Writer: c.writer, At: c.clock.Now()})
	taken := append([]*mutation(nil), c.queue[:len(g.Answers)]...)
	c.queue = append(c.queue[:0], c.queue[len(g.Answers):]...)
	if g.DropScratch {
		c.scratch = nil // it folded the refused events
	}
	f := &flight{evs: g.Batch, base: g.Base, prev: c.tail}
	if g.Gate >= 0 {
		f.gate = taken[g.Gate]
	}
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
	c.send(f)
}

// send hands f to the sender, chained to the group before it, unless it
// can be answered at once (nothing to append and nothing in flight). On
// the loop.
func (c *committer) send(f *flight) {
	if len(f.evs) == 0 && len(c.flights) == 0 {
		// Base is the projection's (or a stored group's), all of it stored.
		for _, d := range f.ok {
			d.m.done <- mutationResult{seen: d.seen}
		}
		return
	}
	if f.prev != nil && len(f.evs) > 0 {
		f.prevID = f.prev.lastID()
	}
	if len(f.evs) > 0 {
		c.tail = f
	}
	c.flights = append(c.flights, f)
	c.flightEvents += len(f.evs)
	c.unsent++
	c.sends <- f // never blocks: at most maxFlights groups are in flight
}

// sender hands each group's events to the log, in the order the loop
// planned them, and passes the group on to the settler.
func (c *committer) sender() {
	defer close(c.settles)
	for f := range c.sends {
		switch {
		case len(f.evs) == 0:
			// Settled once the group before it is: the decisions saw its events.
		case f.gate != nil && c.fp.Hit(f.gate.ctx, f.gate.fp) != nil:
			f.pend = events.Done{Last: f.base, Err: fmt.Errorf("append at seq %d %w: failpoint %s", f.base+1, group.ErrNotSent, f.gate.fp)}
		default:
			if err := c.mayAppend(); err != nil {
				f.pend = events.Done{Last: f.base, Err: fmt.Errorf("append at seq %d %w: %w", f.base+1, group.ErrNotSent, err)}
				break
			}
			f.sent, f.moved = time.Now(), c.moves.current()
			actx, cancel := attemptCtx(context.WithoutCancel(c.ctx), c.appendTimeout, f.moved)
			f.pend = c.log.AppendAsync(actx, f.base, f.prevID, f.evs...)
			cancel()
		}
		c.loop.post(func() { c.unsent--; c.pump() })
		c.settles <- f
	}
}

// settler settles the groups in the order they were sent (settle).
func (c *committer) settler() {
	for f := range c.settles {
		c.settle(f)
	}
}

// decided is a mutation of a group that produced its decision.
type decided struct {
	m    *mutation
	seen uint64 // scratch seq after its events
}

// flight is a group handed to the sender and not yet settled. The loop
// writes its fields before it hands it over; the settler writes stored and
// err, which only the settler reads (of the group before the one it
// settles).
type flight struct {
	ok     []decided
	evs    []events.Event
	base   uint64          // expected last seq: the scratch seq before the group
	prev   *flight         // the last group with events sent before it; nil: base is the projection's
	prevID string          // the msg id of prev's last event
	gate   *mutation       // its failpoint is hit before the append
	pend   events.Pending  // set by the sender; nil when evs is empty
	sent   time.Time       // when the sender handed it to the log
	moved  <-chan struct{} // closed at the stream's first leader election since then
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

// settle waits for f's acks (the group before it is settled: groups settle
// in order) and answers f's mutations as group.Settling says: an append
// whose outcome is unknown is sent again with the same message ids (stored
// once) when the group before it is stored; if it stays unknown it is
// resent before anything new is decided (resendUnsure). It reports the
// outcome to the loop before it answers.
func (c *committer) settle(f *flight) {
	ctx := c.ctx
	s := group.Settling{Base: f.base, Events: len(f.evs), Attempts: c.maxAttempts}
	if p := f.prev; p != nil {
		s.Prior = group.Prior{Chained: true, Stored: p.stored, Err: p.err}
		f.prev = nil // do not keep every group alive
	}
	if len(f.evs) > 0 {
		// Tied to the elections since the group was sent: one between the
		// send and this wait ends the wait at once.
		wctx, cancel := attemptCtx(context.WithoutCancel(ctx), c.appendTimeout, f.moved)
		last, err := f.pend.Wait(wctx)
		cancel()
		c.attempts(ctx, &s, f.evs, last, err, f.sent, f.moved)
	}
	o := s.Outcome()
	if o.Fenced {
		c.fenced(ctx, o.Err)
	}
	f.stored, f.err = o.Stored, o.Err
	c.loop.post(func() { c.settled(f, o) })
	for _, d := range f.ok {
		if err := o.Answer(d.seen); err != nil {
			d.m.done <- mutationResult{err: err}
		} else {
			d.m.done <- mutationResult{seen: d.seen}
		}
	}
}

// settled takes the outcome of the group at the head of the flights. A
// failure marks the scratch state broken: every later group fails too. On
// the loop.
func (c *committer) settled(f *flight, o group.Outcome) {
	c.flights = c.flights[1:]
	c.flightEvents -= len(f.evs)
	if o.Err != nil {
		c.broken = true
	}
	if o.Unsure {
		c.unsure = f
	}
	c.lastWritten = max(c.lastWritten, o.Stored)
	c.pump()
}

// attempts feeds s the outcome (last, err) of the attempt just made and
// sends evs again, with the same ids and expected last seq, for as long as
// s says to.
func (c *committer) attempts(ctx context.Context, s *group.Settling, evs []events.Event, last uint64, err error, sent time.Time, moved <-chan struct{}) {
	for {
		if ctx.Err() != nil {
			s.Attempts = 0 // the term ended: no further attempt
		}
		if !s.Attempted(last, err) {
			return
		}
		c.logger.Warn().Err(err).Uint64("expected_seq", s.Base).Int("events", len(evs)).Msg("append outcome unknown; sending it again with the same message ids")
		// An attempt that failed at once (no responders while the stream
		// elects a leader) is paced: one attempt per appendTimeout, or
		// the next as soon as the stream has elected a leader since it.
		select {
		case <-time.After(time.Until(sent.Add(c.appendTimeout))):
		case <-moved:
		case <-ctx.Done():
		}
		sent, moved = time.Now(), c.moves.current()
		last, err = c.appendOnce(ctx, s.Base, evs, moved)
	}
}

// resendUnsure resends u (nil: none), the group whose append's outcome is
// unknown, with the same ids, so that nothing new is decided until it is
// known: it returns the seq up to which it is stored and whether its
// outcome is known. Deciding again on the projection would reuse the ids
// (<writer>-<term>-<seq>) the group may be stored under, for other events:
// the log fences those, spuriously, a late attempt of the group could still
// land after them, and a group chained to such an id would land after the
// wrong event. The groups sent after it were sent before the resend on the
// same connection, so once it is answered they are settled on the server
// too.
func (c *committer) resendUnsure(ctx context.Context, u *flight) (stored uint64, known bool, err error) {
	if u == nil {
		return 0, true, nil
	}
	s := group.Settling{Base: u.base, Events: len(u.evs), Attempts: c.maxAttempts, Resending: true}
	sent, moved := time.Now(), c.moves.current()
	last, err := c.appendOnce(ctx, u.base, u.evs, moved)
	c.attempts(ctx, &s, u.evs, last, err, sent, moved)
	o := s.Outcome()
	switch {
	case o.Err == nil:
		c.logger.Info().Uint64("expected_seq", u.base).Int("events", len(u.evs)).Msg("resent a group whose outcome was unknown: it is stored")
		return o.Stored, true, nil
	case o.Fenced:
		c.fenced(ctx, o.Err)
	}
	return o.Stored, !o.Unsure, fmt.Errorf("resending a group whose outcome is unknown: %w", o.Err)
}

// appendAttempts × AppendTimeout is how long an append whose outcome stays
// unknown is sent again and again, in attempts of resendAfter (or
// AppendTimeout when it is shorter): an attempt lost with a NATS node (its
// stream leader gone, the request unanswered) is sent again within
// resendAfter of the stream answering again, not after a whole
// AppendTimeout. Every attempt carries the same ids and expected last seq,
// so the log stores the group once, whole or not at all; an attempt that a
// slow stream has not answered yet is answered as a duplicate.
const (
	appendAttempts = 3
	resendAfter    = 500 * time.Millisecond
)

// appendAttemptsFor is how many attempts of min(timeout, resendAfter) fit
// in appendAttempts × timeout.
func appendAttemptsFor(timeout time.Duration) int {
	return max(appendAttempts, int(appendAttempts*timeout/min(timeout, resendAfter)))
}

// appendOnce sends evs once with expected last seq expected, bounded by
// min(AppendTimeout, resendAfter) and by the stream's next leader election
// (moved: streamMoves.current before the send). It returns the seq of the last event
// known stored (at least expected); an error wrapping group.ErrNotSent
// means nothing was sent.
func (c *committer) appendOnce(ctx context.Context, expected uint64, evs []events.Event, moved <-chan struct{}) (uint64, error) {
	if err := c.mayAppend(); err != nil {
		return expected, fmt.Errorf("append at seq %d %w: %w", expected+1, group.ErrNotSent, err)
	}
	actx, cancel := attemptCtx(context.WithoutCancel(ctx), c.appendTimeout, moved)
	defer cancel()
	last, err := c.log.Append(actx, expected, evs...)
	return max(last, expected), err
}
