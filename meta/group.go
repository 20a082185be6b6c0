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
// Mutations submitted while a group is being appended are decided and
// appended together, as one group, in submission order (flat combining:
// whichever caller finds no group in progress decides and appends the
// queue, the others wait for their results). Each decision of a group
// sees the effects of those before it: the group is decided on a scratch
// state — the projection plus every event this term appended or decided —
// and appended with one fenced append whose expected last seq is the seq
// of that scratch state before the group. The fencing is therefore the
// same as for one decision: the group lands only if nothing else was
// appended since the state its first decision saw, and a decision is
// answered as a success only if everything it saw is stored.
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
			l.combine()
			<-l.sem
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

// pendingAppend is a group's append: its events, at expected+1...
type pendingAppend struct {
	expected uint64
	evs      []events.Event
}

// errNotSent marks an append that was never handed to the log: its outcome
// is known, nothing of it is stored.
var errNotSent = errors.New("not sent")

// decided is a mutation of a group that produced its decision.
type decided struct {
	m    *mutation
	seen uint64 // scratch seq after its events
}

// combine decides and appends the queued mutations as one group (or more:
// see appendGroup). The caller holds sem.
func (l *leaderSession) combine() {
	for group := l.take(); len(group) > 0; {
		group = l.appendGroup(group)
	}
}

// errOwnEventRefused is a decision whose events the fold refuses.
var errOwnEventRefused = errors.New("the projection refuses the leader's own event")

// appendGroup decides and appends group. It works under the term's context,
// not the caller's: whichever caller happens to combine must not decide the
// outcome for the others (its own context may end mid-append, an operator
// step's timeout say, while theirs live on). Each mutation's own context is
// checked only before it is decided. A decision whose events the fold
// refuses (Rejected or Corrupt on the scratch state) fails with
// errOwnEventRefused and is not appended; the scratch state, which folded
// them, is dropped, and the mutations after it are returned undecided, to
// be decided next on a fresh state.
func (l *leaderSession) appendGroup(group []*mutation) (rest []*mutation) {
	ctx := l.ctx
	err := l.resendUnsure(ctx)
	var st *projections.State
	if err == nil {
		st, err = l.scratchState(ctx)
	}
	if err != nil {
		for _, m := range group {
			m.done <- mutationResult{err: err}
		}
		return nil
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
			rest = group[i+1:]
			break
		}
		evs = append(evs, mine...)
		ok = append(ok, decided{m: m, seen: st.Seq})
	}
	stored := base
	if len(evs) > 0 {
		stored, err = l.append(ctx, base, evs)
		if err != nil {
			l.scratch = nil // holds events that may not be stored
			switch {
			case errors.Is(err, events.ErrFenced):
				l.onFenced(ctx, err)
			case !errors.Is(err, errNotSent):
				l.unsure = &pendingAppend{expected: base, evs: evs}
			}
		}
		l.lastWritten = max(l.lastWritten, stored)
	}
	for _, d := range ok {
		if d.seen <= stored {
			d.m.done <- mutationResult{seen: d.seen}
		} else {
			d.m.done <- mutationResult{err: err}
		}
	}
	return rest
}

// resendUnsure resends, with the same ids, the group whose append's outcome
// is unknown, so that nothing new is decided until it is known. Deciding
// again on the projection would reuse the ids (<term>-<seq>) the group may
// be stored under, for other events: the log fences those, spuriously, and
// a late attempt of the group could still land after them.
func (l *leaderSession) resendUnsure(ctx context.Context) error {
	u := l.unsure
	if u == nil {
		return nil
	}
	stored, err := l.append(ctx, u.expected, u.evs)
	l.lastWritten = max(l.lastWritten, stored)
	switch {
	case err == nil:
		l.unsure = nil
		l.logger.Info().Uint64("expected_seq", u.expected).Int("events", len(u.evs)).Msg("resent a group whose outcome was unknown: it is stored")
		return nil
	case errors.Is(err, events.ErrFenced):
		l.unsure = nil
		l.onFenced(ctx, err)
	}
	return fmt.Errorf("resending a group whose outcome is unknown: %w", err)
}

// scratchState returns the state the next group is decided on: the kept
// scratch state when it is still the projection plus this term's own
// appends, else a fresh copy of the projection. It fails with ErrNotLeader
// when the projection shows a higher term.
func (l *leaderSession) scratchState(ctx context.Context) (*projections.State, error) {
	if l.scratch == nil {
		// A fresh copy must hold every event this term stored.
		if err := l.r.proj.AwaitSeq(ctx, l.lastWritten); err != nil {
			return nil, err
		}
	}
	var term uint64
	l.r.proj.Peek(func(v *projections.State) {
		term = v.Term
		if term > l.term {
			return
		}
		if sc := l.scratch; sc != nil && v.Seq > sc.Seq {
			// Something this term did not append: decide on it.
			l.scratch = nil
		}
		if l.scratch == nil {
			l.scratch = v.Clone()
		}
	})
	if term > l.term {
		l.lose(fmt.Sprintf("projection shows term %d > %d", term, l.term))
		return nil, ErrNotLeader
	}
	return l.scratch, nil
}

// append retries an append whose outcome is unknown with the same message
// ids, so it is stored once. It returns the seq of the last event known to
// be stored: the last one on success, at least expected on failure. An
// error wrapping errNotSent means nothing was sent.
func (l *leaderSession) append(ctx context.Context, expected uint64, evs []events.Event) (uint64, error) {
	var err error
	stored := expected
	for attempt := 0; attempt < 3; attempt++ {
		if cerr := l.connected(); cerr != nil {
			if attempt == 0 {
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
