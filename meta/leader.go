package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/projections"
)

// ErrNotLeader is returned by leader actions after leadership was lost.
var ErrNotLeader = errors.New("not the leader")

// ErrDisconnected is returned by a leader's append while the replica's NATS
// connection is down.
var ErrDisconnected = errors.New("NATS connection down")

// leaderSession is one term of leadership: plumbing between the term's
// tasks, the pure decisions (package decide, package sched) and the parts
// that hold mutable state. Everything in it lives and dies with ctx;
// Replica.lead joins every goroutine before it returns.
//
// Who owns what (each piece of mutable state has one owner):
//   - commit (the committer): the decided-but-unsent mutations and the
//     groups in flight; see committer. Everything else changes cluster
//     state only by submitting a decision to it.
//   - live (liveness): the heartbeat deadlines, behind its own mutex; RPC
//     handlers and the expiry loop change them only as the decisions say.
//   - recov (recoveryState): the barrier recovery, behind its own mutex;
//     the control loop writes it, status reads copies.
//   - sched: the stores' reports and the last health, behind its own mutex.
//
// The other fields never change after newLeaderSession.
type leaderSession struct {
	r      *Replica
	ctx    context.Context // the term's: done when the term ends
	lease  uint64          // the lease's revision when taken: the term's fencing token
	term   uint64          // chosen by startTerm (with r.mu), before any task that reads it starts
	lose   func(reason string)
	logger zerolog.Logger

	loop         *termLoop // owns commit's, live's, recov's and sched's state
	commit       *committer
	live         *liveness
	recov        recoveryState
	sched        *schedState
	renewed      atomicTime   // when the last successful renewal was sent (renewLoop writes it; the watchdog and leaseFresh read it)
	staleCounted atomic.Bool  // leaseFresh counted its refusal for this term
	queued       atomic.Int64 // RPCs waiting for a handler (serveRPC)
}

// newLeaderSession starts a session under the lease taken at revision
// lease; ctx is its context (lose must end it). startTerm chooses the term.
func (r *Replica) newLeaderSession(ctx context.Context, lease uint64, lose func(string)) *leaderSession {
	l := &leaderSession{
		r: r, ctx: ctx, lease: lease, lose: lose,
		logger: r.log.With().Uint64("lease_rev", lease).Logger(),
		sched:  newSchedState(),
		loop:   newTermLoop(),
	}
	l.live = newLiveness(decide.Config{WorkerTimeout: r.cfg.WorkerTimeout}, l.conn(), func(workers int) {
		l.logger.Info().Int("workers", workers).Dur("timeout", r.cfg.WorkerTimeout).
			Msg("NATS connection is back: every worker gets a fresh full timeout")
	})
	l.renewed.Store(r.cfg.Clock.Now()) // the lease was just taken
	l.commit = newLeaderCommitter(l)
	return l
}

// runLoop runs the term's loop (termLoop) until ctx ends.
func (l *leaderSession) runLoop(ctx context.Context) {
	l.commit.run()
	l.loop.run(ctx, l.commit)
}

// mutate submits one decision to the committer (see committer.Submit).
func (l *leaderSession) mutate(ctx context.Context, fp string, decide func(v *projections.State) ([]events.Payload, error)) error {
	_, err := l.commit.Submit(ctx, fp, decide)
	return err
}

// renewLoop renews the lease lease/3 after the last renewal that was
// stored. A renewal that goes unanswered or fails without losing the lease
// (a NATS node lost, its lease bucket electing a leader) is asked again
// until it succeeds or the watchdog's limit (lease*2/3 after the last
// stored renewal) passes: one unanswered request does not end the term,
// and nothing extends it past the limit.
func (l *leaderSession) renewLoop(ctx context.Context, last *atomicTime) {
	cfg := &l.r.cfg
	for {
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(last.Load().Add(cfg.LeaseTTL / 3).Sub(cfg.Clock.Now())):
		}
		if err := cfg.Failpoints.Hit(ctx, FPBeforeRenewal); err != nil {
			if ctx.Err() != nil {
				return
			}
			l.lose(fmt.Sprintf("renewal: %v", err))
			return
		}
		// The lease runs from when the renewal was sent, not from when
		// its answer came back; after retries, from when its first attempt
		// was sent (a retry answered as a duplicate stored that one).
		sent := cfg.Clock.Now()
		if err := l.renew(ctx, last.Load()); err != nil {
			if ctx.Err() == nil {
				l.lose(fmt.Sprintf("renewal failed: %v", err))
			}
			return
		}
		last.Store(sent)
	}
}

// renewRetryMax caps the pause between a renewal's attempts.
const renewRetryMax = 250 * time.Millisecond

// renew is one renewal: attempts until one succeeds, the lease is lost,
// or lease*2/3 has passed since last (the last stored renewal); each
// attempt is bounded by lease/3 and by that limit.
func (l *leaderSession) renew(ctx context.Context, last time.Time) error {
	cfg := &l.r.cfg
	deadline := last.Add(cfg.LeaseTTL * 2 / 3)
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		left := deadline.Sub(cfg.Clock.Now())
		if left <= 0 {
			return fmt.Errorf("no renewal within %s of the last one (%d attempts)", cfg.LeaseTTL*2/3, attempt-1)
		}
		rctx, cancel := context.WithTimeout(ctx, min(cfg.LeaseTTL/3, left))
		err := cfg.Lease.Renew(rctx)
		cancel()
		if err == nil {
			if attempt > 1 {
				l.logger.Info().Int("attempts", attempt).Msg("lease renewed after asking again")
			}
			return nil
		}
		if errors.Is(err, ErrLeaseLost) || ctx.Err() != nil {
			return err
		}
		if attempt == 1 {
			l.logger.Warn().Err(err).Dur("left", left.Round(time.Millisecond)).Msg("lease renewal unanswered; asking again within the lease")
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-cfg.Clock.After(min(backoff, max(deadline.Sub(cfg.Clock.Now()), 0))):
		}
		backoff = min(2*backoff, renewRetryMax)
	}
}

// watchdog ends the term when lease*2/3 passes without a renewal, whatever
// the renewal call is doing.
func (l *leaderSession) watchdog(ctx context.Context, last *atomicTime) {
	cfg := &l.r.cfg
	limit := cfg.LeaseTTL * 2 / 3
	for {
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(cfg.LeaseTTL / 12):
		}
		if since := cfg.Clock.Now().Sub(last.Load()); since > limit {
			l.lose(fmt.Sprintf("no lease renewal for %s (limit %s)", since.Round(time.Millisecond), limit))
			return
		}
	}
}

// startTerm projects to the tail, chooses the term after the projected one
// and appends its term.started, with the lease as fencing token, under the
// CAS on that tail.
//
// Why this is safe (terms count leaders, so any holder can name the next
// one): the CAS makes the term.started land only right after the state it
// was decided on, so two candidates cannot both start the term after it;
// the projection rejects a term.started whose lease is not newer than the
// current term's, so a holder whose lease lapsed (its revision is older
// than the new holder's) cannot start any term after a newer holder
// started one; and events are accepted only under the current term, so a
// deposed leader's are rejected from the new term.started on. Like every
// event the leader appends, its term.started must be applied by its own
// fold (the committer fails the append otherwise), and a duplicate ack
// counts only for our own bytes: so a started term is ours, lease included.
func (l *leaderSession) startTerm(ctx context.Context) error {
	for attempt := 1; ; attempt++ {
		v, err := l.r.proj.CatchUp(ctx)
		if err != nil {
			return fmt.Errorf("catch up: %w", err)
		}
		if v.Lease >= l.lease {
			return fmt.Errorf("%w: term %d was started under lease %d >= ours %d", ErrNotLeader, v.Term, v.Lease, l.lease)
		}
		l.chooseTerm(v.Term + 1)
		if err := l.r.cfg.Failpoints.Hit(ctx, FPBeforeTermStarted); err != nil {
			return err
		}
		err = l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
			if v.Term+1 != l.term {
				// The log moved on after the catch-up: choose again.
				return nil, fmt.Errorf("%w: projection at term %d, not %d", events.ErrFenced, v.Term, l.term-1)
			}
			return []events.Payload{events.TermStarted{Term: l.term, Leader: l.r.cfg.ID, Lease: l.lease}}, nil
		})
		if err == nil {
			l.logger.Info().Uint64("seq", l.r.proj.Seq()).Msg("term started")
			return nil
		}
		if !errors.Is(err, events.ErrFenced) || attempt >= 5 {
			return err
		}
	}
}

// chooseTerm sets the term the session is to start. Leading and Terms read
// it under r.mu; the session's own tasks that read it start after startTerm.
func (l *leaderSession) chooseTerm(term uint64) {
	l.r.mu.Lock()
	l.term = term
	if n := len(l.r.terms); n > 0 {
		l.r.terms[n-1].Term = term
	}
	l.r.mu.Unlock()
	l.logger = l.r.log.With().Uint64("term", term).Uint64("lease_rev", l.lease).Logger()
	l.commit.setTerm(term, l.logger)
}

func (l *leaderSession) onFenced(ctx context.Context, err error) {
	l.r.fenced.Add(1)
	l.logger.Warn().Err(err).Msg("append fenced; re-projecting")
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.r.cfg.AppendTimeout)
	defer cancel()
	v, cerr := l.r.proj.CatchUp(cctx)
	if cerr != nil {
		l.lose(fmt.Sprintf("fenced and cannot re-project: %v", cerr))
		return
	}
	if v.Term > l.term {
		l.lose(fmt.Sprintf("fenced by term %d > %d", v.Term, l.term))
	}
}

// mayAppend is checked before every append is sent. It fails with
// ErrDisconnected while the RPC connection (which the log shares) is not
// connected, and as leaseFresh says once the lease is too old. nats.go does not refuse a publish made while
// it reconnects: it buffers it and sends it once the server is back,
// possibly long after the decision, on a view the outage made stale (a
// worker expired because its heartbeats could not arrive). So the leader
// never hands the client an append then.
func (l *leaderSession) mayAppend() error {
	nc := l.r.cfg.NC
	if nc != nil && !nc.IsConnected() {
		return fmt.Errorf("%w (%s)", ErrDisconnected, nc.Status())
	}
	if l.r.leaving.Load() {
		return fmt.Errorf("%w (its NATS server is stopping: lame duck)", ErrDisconnected)
	}
	return l.leaseFresh()
}

// leaseFresh fails with ErrLeaseLost, and ends the term, once the lease
// was last renewed longer ago than the watchdog allows. The watchdog checks
// every lease/12; a leader paused past its lease (SIGSTOP, a long GC, a
// frozen VM: the first report) runs its goroutines again before the
// watchdog's next tick, and without this check its first appends are
// stopped only by the CAS. Checked before every append is sent.
func (l *leaderSession) leaseFresh() error {
	limit := l.r.cfg.LeaseTTL * 2 / 3
	if since := l.r.cfg.Clock.Now().Sub(l.renewed.Load()); since > limit {
		why := fmt.Sprintf("no lease renewal for %s (limit %s)", since.Round(time.Millisecond), limit)
		if l.staleCounted.CompareAndSwap(false, true) {
			l.r.stale.Add(1) // once a term: later retries and queued groups are the same refusal
		}
		l.lose(why)
		return fmt.Errorf("%w: %s", ErrLeaseLost, why)
	}
	return nil
}

// conn is the leader's NATS connection as it is now, for the decisions.
func (l *leaderSession) conn() decide.Conn {
	nc := l.r.cfg.NC
	if nc == nil {
		return decide.Conn{None: true}
	}
	return decide.Conn{Connected: nc.IsConnected(), Reconnects: nc.Stats().Reconnects}
}

// rpcHandlers is how many requests that may append are handled at once:
// their mutations are decided and appended in groups (see committer), so a
// registration burst costs one append per group, not one per worker.
const rpcHandlers = 2048

// rpcQueue is how many requests that may append wait for a handler.
const rpcQueue = 16384

// serveRPC answers RPCs while the term lasts: every subject under
// <cluster>.rpc., so an unknown RPC gets a bad_request reply rather than no
// responders. Requests that may append are handled by rpcHandlers
// goroutines; heartbeats, which only touch memory, have their own goroutine
// so they never wait behind an append (the expiry must not decide on
// deadlines whose renewals are queued). No handler outlives the term.
func (l *leaderSession) serveRPC(ctx context.Context) {
	nc := l.r.cfg.NC
	if nc == nil {
		return
	}
	prefix := client.RPCSubject(l.r.cfg.Cluster, "")
	// A registration burst of 10,000 workers fits in the request queue: a
	// refused request costs its worker a 50 ms..1 s backoff, which made the
	// burst's tail. Heartbeats keep a short queue: a renewal must not wait
	// long behind others while the expiry decides.
	reqs := make(chan *nats.Msg, rpcQueue)
	beats := make(chan *nats.Msg, 1024)
	ended := unavailable(fmt.Errorf("%w: the term ended", ErrNotLeader))
	var wg sync.WaitGroup
	sub, err := nc.Subscribe(prefix+">", func(m *nats.Msg) {
		if ctx.Err() != nil {
			l.respond(m, ended) // the next leader answers it: ask there now
			return
		}
		dst := reqs
		if m.Subject == prefix+client.RPCHeartbeat {
			dst = beats
		}
		select {
		case dst <- m:
			l.queued.Add(1)
		default:
			l.respond(m, unavailable(errors.New("leader busy: request queue full")))
		}
	})
	if err != nil {
		l.lose(fmt.Sprintf("subscribe %s>: %v", prefix, err))
		return
	}
	defer func() {
		// The handlers are joined; what is still queued is answered "not
		// the leader", so each client asks the next leader at once instead
		// of waiting out its request timeout.
		wg.Wait()
		_ = sub.Unsubscribe()
		for _, q := range []chan *nats.Msg{reqs, beats} {
			for drained := false; !drained; {
				select {
				case m := <-q:
					l.queued.Add(-1)
					l.respond(m, ended)
				default:
					drained = true
				}
			}
		}
	}()
	wg.Add(1)
	go func() {
		defer wg.Done()
		l.serveQueue(ctx, prefix, beats)
	}()
	for range rpcHandlers - 1 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			l.serveQueue(ctx, prefix, reqs)
		}()
	}
	l.serveQueue(ctx, prefix, reqs)
}

// serveQueue handles the requests of one queue in order until ctx is done.
func (l *leaderSession) serveQueue(ctx context.Context, prefix string, q <-chan *nats.Msg) {
	for {
		if ctx.Err() != nil {
			return // the term ended: serveRPC answers what is still queued
		}
		select {
		case <-ctx.Done():
			return
		case m := <-q:
			l.queued.Add(-1)
			l.respond(m, l.handle(ctx, strings.TrimPrefix(m.Subject, prefix), m.Data))
		}
	}
}

func (l *leaderSession) respond(m *nats.Msg, rep client.Reply) {
	if m.Reply == "" {
		return
	}
	rep.Term, rep.Leader = l.term, l.r.cfg.ID
	b, _ := json.Marshal(rep)
	_ = m.Respond(b)
}

func unavailable(err error) client.Reply {
	code := client.CodeUnavailable
	if errors.Is(err, ErrNotLeader) || errors.Is(err, events.ErrFenced) || errors.Is(err, context.Canceled) {
		code = client.CodeNotLeader
	}
	return client.Reply{Error: &client.RPCError{Code: code, Message: err.Error()}}
}

// logForbidden logs a request refused because another incarnation
// registered the worker.
func (l *leaderSession) logForbidden(rpc string, ref client.WorkerRef) {
	l.logger.Warn().Str("rpc", rpc).Uint64("worker_id", ref.ID).Uint64("epoch", ref.Epoch).
		Str("claimed_incarnation", ref.Incarnation).Msg("refused: the registration belongs to another incarnation")
}

// decideRequest submits a request's pure decision and answers as it says:
// the decision's reply once its events are stored (a new registration's
// epoch is the seq its event is stored at; the worker renewed when the
// decision asks for that), or unavailable when they could not be.
func (l *leaderSession) decideRequest(ctx context.Context, rpc string, ref client.WorkerRef, f func(v *projections.State) decide.Decision) client.Reply {
	var d decide.Decision
	seen, err := l.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		d = f(v)
		return d.Events, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if d.Forbidden {
		l.logForbidden(rpc, ref)
	}
	if d.EpochAtSeq {
		d.Reply.Epoch = seen
		l.logger.Info().Uint64("worker_id", d.Reply.ID).Uint64("epoch", d.Reply.Epoch).Msg("worker registered")
	}
	if d.Renew {
		l.grantTimeout(d.Reply.ID, d.Reply.Epoch)
	}
	return d.Reply
}

// handle answers one RPC. It never panics on input: every request is decoded
// and validated first.
func (l *leaderSession) handle(ctx context.Context, rpc string, data []byte) client.Reply {
	switch rpc {
	case client.RPCRegister:
		req, err := client.DecodeRegister(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.register(ctx, req)
	case client.RPCActivate, client.RPCHeartbeat, client.RPCDeregister:
		ref, err := client.DecodeWorkerRef(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		switch rpc {
		case client.RPCActivate:
			return l.activate(ctx, ref)
		case client.RPCHeartbeat:
			return l.heartbeat(ref)
		default:
			return l.deregister(ctx, ref)
		}
	case client.RPCStoreDrain:
		req, err := client.DecodeDrain(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.storeDrain(ctx, req)
	case client.RPCShardRecover:
		req, err := client.DecodeRecover(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.shardRecover(ctx, req)
	case client.RPCStoreSelfDrain:
		req, err := client.DecodeSelfDrain(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.storeSelfDrain(ctx, req)
	case client.RPCStepDown:
		if err := client.DecodeStepDown(data); err != nil {
			return decide.BadRequest(err)
		}
		l.logger.Info().Msg("step-down requested")
		l.lose(reasonStepDown)
		return client.Reply{}
	case client.RPCStoreRegister:
		req, err := client.DecodeStoreRegister(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.storeRegister(ctx, req)
	case client.RPCStoreHeartbeat:
		hb, err := client.DecodeStoreHeartbeat(data)
		if err != nil {
			return decide.BadRequest(err)
		}
		return l.storeHeartbeat(ctx, hb)
	}
	return decide.BadRequest(fmt.Errorf("unknown rpc %q", rpc))
}

func (l *leaderSession) register(ctx context.Context, req client.RegisterRequest) client.Reply {
	return l.decideRequest(ctx, client.RPCRegister, client.WorkerRef{Incarnation: req.Incarnation}, func(v *projections.State) decide.Decision {
		return decide.Register(v, req)
	})
}

// grantTimeout grants registration (id, epoch) a fresh full timeout from
// now, on the term's loop.
func (l *leaderSession) grantTimeout(id, epoch uint64) {
	now := l.r.cfg.Clock.Now()
	l.loop.do(context.Background(), func() { l.live.renew(id, epoch, now) })
}

func (l *leaderSession) activate(ctx context.Context, ref client.WorkerRef) client.Reply {
	return l.decideRequest(ctx, client.RPCActivate, ref, func(v *projections.State) decide.Decision { return decide.Activate(v, ref) })
}

// deregister is idempotent: a registration already gone is a success, but
// one registered by another incarnation is refused.
func (l *leaderSession) deregister(ctx context.Context, ref client.WorkerRef) client.Reply {
	return l.decideRequest(ctx, client.RPCDeregister, ref, func(v *projections.State) decide.Decision { return decide.Deregister(v, ref) })
}

func (l *leaderSession) heartbeat(ref client.WorkerRef) client.Reply {
	l.r.heartbeats.Add(1)
	var (
		w     projections.Worker
		found bool
	)
	// Peek, not View: a view is a copy of every worker, made again after
	// every change, and heartbeats arrive while registrations change it.
	l.r.proj.Peek(func(v *projections.State) { w, found = v.Worker(ref.ID) })
	c, now := l.conn(), l.r.cfg.Clock.Now()
	var (
		rep       client.Reply
		forbidden bool
	)
	if !l.loop.do(context.Background(), func() { rep, forbidden = l.live.beat(w, found, ref, c, now) }) {
		return unavailable(fmt.Errorf("%w: the term ended", ErrNotLeader))
	}
	if forbidden {
		l.logForbidden(client.RPCHeartbeat, ref)
	}
	return rep
}

// expiryLoop expires workers whose heartbeat deadline passed: one fenced
// append per tick, by id and epoch.
func (l *leaderSession) expiryLoop(ctx context.Context) {
	cfg := &l.r.cfg
	for {
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(cfg.ExpiryInterval):
		}
		if err := l.expireOnce(ctx); err != nil && ctx.Err() == nil {
			l.logger.Warn().Err(err).Msg("expiry")
		}
	}
}

func (l *leaderSession) expireOnce(ctx context.Context) error {
	var expired []events.Payload
	err := l.mutate(ctx, FPExpiryAfterCollect, func(v *projections.State) ([]events.Payload, error) {
		expired = l.collectExpired(v)
		return expired, nil
	})
	if err != nil {
		return err
	}
	for _, p := range expired {
		e := p.(events.WorkerExpired)
		l.logger.Info().Uint64("worker_id", e.ID).Uint64("epoch", e.Epoch).Msg("worker expired")
	}
	return nil
}

// collectExpired decides an expiry tick on v: the view, the deadlines, the
// connection and now in, the worker.expired events to append out. It runs
// in a decision, so on the term's loop, which owns the deadlines.
func (l *leaderSession) collectExpired(v *projections.State) []events.Payload {
	return l.live.expire(v, l.conn(), l.r.cfg.Clock.Now())
}
