package meta

import (
	"context"
	"errors"
	"fmt"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// maxGroup bounds the mutations decided and appended together.
const maxGroup = 2048

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

// mutate is the only way a leader changes cluster state: decide on the
// projected state, then append with expected last seq = the seq of the state
// decided on. It returns once the decision's events are stored and the
// projection holds them (or the decision appended nothing), or with the
// error that stopped it. If a failpoint is named it is hit between the
// decision and the append. On ErrFenced the leader re-projects and steps
// down if a higher term is there. decide must be short and must not keep
// the state.
//
// Mutations submitted while a group is being decided and sent are decided
// and appended together, as one group, in submission order (flat
// combining: whichever caller finds no group being decided decides and
// sends the queue, the others wait for their results). Each decision of a
// group sees the effects of those before it: the group is decided on a
// scratch state — the projection plus every event this term sent — and
// sent with one Log.AppendAsync whose expected last seq is the seq of that
// scratch state before the group.
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
func (l *leaderSession) mutate(ctx context.Context, fp string, decide func(v *projections.State) ([]events.Payload, error)) error {
	_, err := l.mutateSeen(ctx, fp, decide)
	return err
}

// mutateSeen is mutate that also returns the seq of the state the decision
// saw, its own events included: a decision that appended one event finds
// it at that seq.
func (l *leaderSession) mutateSeen(ctx context.Context, fp string, decide func(v *projections.State) ([]events.Payload, error)) (uint64, error) {
	m := &mutation{ctx: ctx, fp: fp, decide: decide, done: make(chan mutationResult, 1)}
	l.qmu.Lock()
	l.queue = append(l.queue, m)
	l.qmu.Unlock()
	for {
		select {
		case res := <-m.done:
			return l.finish(res)
		case l.sem <- struct{}{}:
			f := l.combine()
			<-l.sem
			if f != nil {
				l.settle(f)
			}
		case <-ctx.Done():
			if l.withdraw(m) {
				return 0, ctx.Err()
			}
			// Taken into a group already: its append is bounded by
			// AppendTimeout per attempt; report its real outcome.
			return l.finish(<-m.done)
		}
	}
}

// finish returns a mutation's outcome once the projection holds it. It
// waits under the term's context: a caller whose own context ended after
// its mutation was taken into a group still gets its real outcome, not its
// context's error for an event that is stored.
func (l *leaderSession) finish(res mutationResult) (uint64, error) {
	if res.err != nil {
		return 0, res.err
	}
	return res.seen, l.r.proj.AwaitSeq(l.ctx, res.seen)
}

// withdraw removes m from the queue if it is still there.
func (l *leaderSession) withdraw(m *mutation) bool {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	for i, q := range l.queue {
		if q == m {
			l.queue = append(l.queue[:i], l.queue[i+1:]...)
			return true
		}
	}
	return false
}

// take removes up to maxGroup mutations from the head of the queue.
func (l *leaderSession) take() []*mutation {
	l.qmu.Lock()
	defer l.qmu.Unlock()
	n := min(len(l.queue), maxGroup)
	group := append([]*mutation(nil), l.queue[:n]...)
	l.queue = append(l.queue[:0], l.queue[n:]...)
	return group
}

// requeue puts undecided mutations back at the head of the queue.
func (l *leaderSession) requeue(ms []*mutation) {
	if len(ms) == 0 {
		return
	}
	l.qmu.Lock()
	defer l.qmu.Unlock()
	l.queue = append(append([]*mutation(nil), ms...), l.queue...)
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
func (l *leaderSession) combine() *flight {
	ctx := l.ctx
	if err := l.room(ctx, 0); err != nil {
		if group := l.take(); len(group) > 0 {
			return failAll(group, err)
		}
		return nil
	}
	group := l.take()
	if len(group) == 0 {
		return nil
	}
	st, err := l.scratchState(ctx)
	if err != nil {
		return failAll(group, err)
	}
	base := st.Seq
	now := l.r.cfg.Clock.Now()
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
			err = l.r.cfg.Failpoints.Hit(m.ctx, m.fp)
		}
		var mine []events.Event
		var bodies [][]byte
		for _, p := range payloads {
			if err != nil {
				break
			}
			ev := events.Event{Term: l.term, Writer: l.r.cfg.ID, At: now, Data: p}
			var b []byte
			if b, err = events.Encode(ev); err == nil {
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
			l.logger.Error().Str("result", refused.String()).Msg("the fold refuses an event this leader decided; not appending it")
			m.done <- mutationResult{err: fmt.Errorf("%w: %s", errOwnEventRefused, refused)}
			l.scratch = nil // it folded the refused events
			l.requeue(group[i+1:])
			break
		}
		evs = append(evs, mine...)
		ok = append(ok, decided{m: m, seen: st.Seq})
	}
	f := &flight{ok: ok, evs: evs, base: base, prev: l.tail, done: make(chan struct{})}
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
	if err := l.room(ctx, len(evs)); err != nil {
		// Decided on the scratch state, not sent: it holds events that
		// will not be stored.
		l.scratch = nil
		for _, d := range ok {
			d.m.done <- mutationResult{err: err}
		}
		return nil
	}
	prevID := ""
	if f.prev != nil {
		prevID = f.prev.lastID()
	}
	if err := l.connected(); err != nil {
		f.pend = events.Done{Last: base, Err: fmt.Errorf("append at seq %d %w: %w", base+1, errNotSent, err)}
	} else {
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.r.cfg.AppendTimeout)
		f.pend = l.r.cfg.Log.AppendAsync(actx, base, prevID, evs...)
		cancel()
	}
	l.fmu.Lock()
	l.flights = append(l.flights, f)
	l.flightEvents += len(evs)
	l.fmu.Unlock()
	l.tail = f
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
func (l *leaderSession) room(ctx context.Context, n int) error {
	for {
		queued := 0
		if n == 0 {
			l.qmu.Lock()
			queued = len(l.queue)
			l.qmu.Unlock()
		}
		l.fmu.Lock()
		var head *flight
		full := len(l.flights) >= maxFlights ||
			n > 0 && l.flightEvents+n > maxFlightEvents ||
			n == 0 && queued < l.minPipelined
		if len(l.flights) > 0 && full {
			head = l.flights[0]
		}
		l.fmu.Unlock()
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
func (l *leaderSession) drain(ctx context.Context) error {
	l.fmu.Lock()
	var last *flight
	if n := len(l.flights); n > 0 {
		last = l.flights[n-1]
	}
	l.fmu.Unlock()
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
func (l *leaderSession) settle(f *flight) {
	ctx := l.ctx
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
		wctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.r.cfg.AppendTimeout)
		last, werr := f.pend.Wait(wctx)
		cancel()
		if werr != nil && !errors.Is(werr, events.ErrFenced) && !errors.Is(werr, errNotSent) && prevErr == nil {
			// Everything before base is stored, so the expected last seq
			// alone fences the retry.
			l.logger.Warn().Err(werr).Uint64("expected_seq", f.base).Int("events", len(f.evs)).Msg("append failed; retrying with the same message ids")
			rlast, rerr := l.append(ctx, f.base, f.evs, appendAttempts-1)
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
			l.onFenced(ctx, werr)
		}
	}
	l.fmu.Lock()
	if len(f.evs) > 0 {
		l.flights = l.flights[1:] // f is the head: groups settle in order
		l.flightEvents -= len(f.evs)
	}
	if err != nil {
		l.broken = true
	}
	if unsure {
		l.unsure = f
	}
	l.lastWritten = max(l.lastWritten, stored)
	l.fmu.Unlock()
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
func (l *leaderSession) resendUnsure(ctx context.Context) error {
	l.fmu.Lock()
	u := l.unsure
	l.fmu.Unlock()
	if u == nil {
		return nil
	}
	stored, err := l.append(ctx, u.base, u.evs, appendAttempts)
	l.fmu.Lock()
	l.lastWritten = max(l.lastWritten, stored)
	if err == nil || errors.Is(err, events.ErrFenced) {
		l.unsure = nil
	}
	l.fmu.Unlock()
	switch {
	case err == nil:
		l.logger.Info().Uint64("expected_seq", u.base).Int("events", len(u.evs)).Msg("resent a group whose outcome was unknown: it is stored")
		return nil
	case errors.Is(err, events.ErrFenced):
		l.onFenced(ctx, err)
	}
	return fmt.Errorf("resending a group whose outcome is unknown: %w", err)
}

// scratchState returns the state the next group is decided on: the kept
// scratch state when it is still the projection plus the events this term
// sent, else — once every group in flight is settled — a fresh copy of the
// projection. It fails with ErrNotLeader when the projection shows a
// higher term.
func (l *leaderSession) scratchState(ctx context.Context) (*projections.State, error) {
	l.fmu.Lock()
	failed := l.broken
	if failed {
		l.scratch = nil // holds events that may not be stored
	}
	l.fmu.Unlock()
	if sc := l.scratch; sc != nil {
		l.r.proj.Peek(func(v *projections.State) {
			switch {
			case v.Term > l.term:
			case v.Seq > sc.Seq:
				// Something this term did not append: decide on it.
				l.scratch = nil
			}
		})
	}
	if l.scratch == nil {
		if err := l.drain(ctx); err != nil {
			return nil, err
		}
		if err := l.resendUnsure(ctx); err != nil {
			return nil, err
		}
		l.fmu.Lock()
		l.broken = false // every group is settled: nothing more can fail
		written := l.lastWritten
		l.fmu.Unlock()
		l.tail = nil
		// A fresh copy must hold every event this term stored; after a
		// failure, whatever the log holds (an append whose outcome the
		// leader did not learn may have landed).
		if failed {
			if _, err := l.r.proj.CatchUp(ctx); err != nil {
				return nil, err
			}
		}
		if err := l.r.proj.AwaitSeq(ctx, written); err != nil {
			return nil, err
		}
	}
	var term uint64
	l.r.proj.Peek(func(v *projections.State) {
		term = v.Term
		if term <= l.term && l.scratch == nil {
			l.scratch = v.Clone()
		}
	})
	if term > l.term {
		l.lose(fmt.Sprintf("projection shows term %d > %d", term, l.term))
		return nil, ErrNotLeader
	}
	return l.scratch, nil
}

// appendAttempts is how many times an append whose outcome stays unknown
// is sent.
const appendAttempts = 3

// append retries an append whose outcome is unknown with the same message
// ids, so it is stored once, sending it up to attempts times. It returns
// the seq of the last event known to be stored: the last one on success,
// at least expected on failure. An error wrapping errNotSent means nothing
// was sent.
func (l *leaderSession) append(ctx context.Context, expected uint64, evs []events.Event, attempts int) (uint64, error) {
	var err error
	stored := expected
	for attempt := 0; attempt < attempts; attempt++ {
		if cerr := l.connected(); cerr != nil {
			if attempt == 0 && err == nil {
				return stored, fmt.Errorf("append at seq %d %w: %w", expected+1, errNotSent, cerr)
			}
			return stored, fmt.Errorf("append at seq %d, outcome unknown: %w (retry not sent: %w)", expected+1, err, cerr)
		}
		actx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.r.cfg.AppendTimeout)
		var last uint64
		last, err = l.r.cfg.Log.Append(actx, expected, evs...)
		cancel()
		stored = max(stored, last)
		if err == nil {
			return last, nil
		}
		if errors.Is(err, events.ErrFenced) {
			return stored, err
		}
		l.logger.Warn().Err(err).Uint64("expected_seq", expected).Int("events", len(evs)).Int("attempt", attempt+1).Msg("append failed; retrying with the same message ids")
		if ctx.Err() != nil {
			break
		}
	}
	return stored, err
}
