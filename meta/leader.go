package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// ErrNotLeader is returned by leader actions after leadership was lost.
var ErrNotLeader = errors.New("not the leader")

// ErrDisconnected is returned by a leader's append while the replica's NATS
// connection is down.
var ErrDisconnected = errors.New("NATS connection down")

// leaderSession is one term of leadership. Everything in it lives and dies
// with ctx; Replica.lead joins every goroutine before it returns.
type leaderSession struct {
	r      *Replica
	ctx    context.Context // the term's: done when the term ends
	lease  uint64          // the lease's revision when taken: the term's fencing token
	term   uint64          // chosen by startTerm (with r.mu), before any task that reads it starts
	lose   func(reason string)
	logger zerolog.Logger

	// Mutations are decided and appended in groups (see group.go).
	sem     chan struct{}      // held by the goroutine deciding and sending a group
	qmu     sync.Mutex         // guards queue
	queue   []*mutation        // submitted, not yet decided
	scratch *projections.State // with sem: the projection plus this term's sent events; nil: rebuild
	tail    *flight            // with sem: the last group with events sent since scratch was rebuilt

	fmu          sync.Mutex // guards the fields below
	flights      []*flight  // groups with events sent and not settled, in order
	flightEvents int        // their events
	broken       bool       // a group failed: scratch holds events that may not be stored
	lastWritten  uint64     // seq of this term's last stored event
	minPipelined int        // minPipelined; tests lower it
	unsure       *flight    // a group whose append's outcome is unknown: resent before deciding anew

	dmu        sync.Mutex
	deadlines  map[uint64]deadline // heartbeat deadlines by worker id (memory only)
	reconnects uint64              // NC's reconnect count when the deadlines were last valid

	rmu     sync.Mutex
	rec     Recovery            // Waiting is kept in waiting instead
	waiting map[uint64]struct{} // active workers without an acked control session

	sched *schedState
}

// newLeaderSession starts a session under the lease taken at revision
// lease; ctx is its context (lose must end it). startTerm chooses the term.
func (r *Replica) newLeaderSession(ctx context.Context, lease uint64, lose func(string)) *leaderSession {
	l := &leaderSession{
		r: r, ctx: ctx, lease: lease, lose: lose,
		logger:       r.log.With().Uint64("lease_rev", lease).Logger(),
		sem:          make(chan struct{}, 1),
		minPipelined: minPipelined,
		deadlines:    map[uint64]deadline{},
		sched:        newSchedState(),
	}
	if r.cfg.NC != nil {
		l.reconnects = r.cfg.NC.Stats().Reconnects
	}
	return l
}

type deadline struct {
	epoch uint64
	at    time.Time
}

func (l *leaderSession) renewLoop(ctx context.Context, last *atomicTime) {
	cfg := &l.r.cfg
	for {
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(cfg.LeaseTTL / 3):
		}
		if err := cfg.Failpoints.Hit(ctx, FPBeforeRenewal); err != nil {
			if ctx.Err() != nil {
				return
			}
			l.lose(fmt.Sprintf("renewal: %v", err))
			return
		}
		rctx, cancel := context.WithTimeout(ctx, cfg.LeaseTTL/3)
		err := cfg.Lease.Renew(rctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.lose(fmt.Sprintf("renewal failed: %v", err))
			}
			return
		}
		last.Store(cfg.Clock.Now())
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
// deposed leader's are rejected from the new term.started on. The leader
// then checks that the term it projected carries its own lease: only then
// is it the term's one writer.
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
			var term, lease uint64
			l.r.proj.Peek(func(v *projections.State) { term, lease = v.Term, v.Lease })
			if term != l.term || lease != l.lease {
				return fmt.Errorf("%w: projection at term %d lease %d after starting term %d lease %d", ErrNotLeader, term, lease, l.term, l.lease)
			}
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

// connected fails with ErrDisconnected while the RPC connection (which the
// log shares) is not connected. nats.go does not refuse a publish made while
// it reconnects: it buffers it and sends it once the server is back,
// possibly long after the decision, on a view the outage made stale (a
// worker expired because its heartbeats could not arrive). So the leader
// never hands the client an append then.
func (l *leaderSession) connected() error {
	nc := l.r.cfg.NC
	if nc == nil || nc.IsConnected() {
		return nil
	}
	return fmt.Errorf("%w (%s)", ErrDisconnected, nc.Status())
}

// hearingLocked reports whether heartbeats can reach this leader, so that
// its deadlines mean something. While the connection is down they cannot:
// nothing may be expired. Once it is back (its reconnect count moved), every
// deadline is first pushed to at least now + WorkerTimeout, as a new leader
// would grant: a worker is expired only after a full timeout in which its
// heartbeats could have arrived. A longer outage also ends the term (the
// lease cannot be renewed), and the next term starts from fresh timeouts.
// Called with dmu held.
func (l *leaderSession) hearingLocked(now time.Time) bool {
	nc := l.r.cfg.NC
	if nc == nil {
		return true
	}
	if !nc.IsConnected() {
		return false
	}
	if n := nc.Stats().Reconnects; n != l.reconnects {
		l.reconnects = n
		fresh := now.Add(l.r.cfg.WorkerTimeout)
		for id, d := range l.deadlines {
			if d.at.Before(fresh) {
				d.at = fresh
				l.deadlines[id] = d
			}
		}
		l.logger.Info().Int("workers", len(l.deadlines)).Dur("timeout", l.r.cfg.WorkerTimeout).
			Msg("NATS connection is back: every worker gets a fresh full timeout")
	}
	return true
}

// rpcHandlers is how many requests that may append are handled at once:
// their mutations are decided and appended in groups (see mutate), so a
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
	var wg sync.WaitGroup
	defer wg.Wait()
	sub, err := nc.Subscribe(prefix+">", func(m *nats.Msg) {
		dst := reqs
		if m.Subject == prefix+client.RPCHeartbeat {
			dst = beats
		}
		select {
		case dst <- m:
		default:
			l.respond(m, unavailable(errors.New("leader busy: request queue full")))
		}
	})
	if err != nil {
		l.lose(fmt.Sprintf("subscribe %s>: %v", prefix, err))
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
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
		select {
		case <-ctx.Done():
			return
		case m := <-q:
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

func badRequest(err error) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeBadRequest, Message: err.Error()}}
}

func unavailable(err error) client.Reply {
	code := client.CodeUnavailable
	if errors.Is(err, ErrNotLeader) || errors.Is(err, events.ErrFenced) || errors.Is(err, context.Canceled) {
		code = client.CodeNotLeader
	}
	return client.Reply{Error: &client.RPCError{Code: code, Message: err.Error()}}
}

func reregister(ref client.WorkerRef) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeReregister, Message: fmt.Sprintf("no active worker %d epoch %d; register again", ref.ID, ref.Epoch)}}
}

func forbidden(ref client.WorkerRef) client.Reply {
	return client.Reply{Error: &client.RPCError{Code: client.CodeForbidden, Message: fmt.Sprintf("worker %d epoch %d was registered by another incarnation", ref.ID, ref.Epoch)}}
}

// owned checks a request's registration against a view: nil when an active
// worker has the id and epoch and was registered by the incarnation, else
// the reply refusing it (reregister when there is no such worker, forbidden
// when another incarnation registered it).
func (l *leaderSession) owned(v *projections.State, rpc string, ref client.WorkerRef) *client.Reply {
	w, ok := v.Worker(ref.ID)
	if !ok || w.Epoch != ref.Epoch {
		rep := reregister(ref)
		return &rep
	}
	if w.Incarnation != ref.Incarnation {
		l.logger.Warn().Str("rpc", rpc).Uint64("worker_id", ref.ID).Uint64("epoch", ref.Epoch).
			Str("claimed_incarnation", ref.Incarnation).Msg("refused: the registration belongs to another incarnation")
		rep := forbidden(ref)
		return &rep
	}
	return nil
}

// handle answers one RPC. It never panics on input: every request is decoded
// and validated first.
func (l *leaderSession) handle(ctx context.Context, rpc string, data []byte) client.Reply {
	switch rpc {
	case client.RPCRegister:
		req, err := client.DecodeRegister(data)
		if err != nil {
			return badRequest(err)
		}
		return l.register(ctx, req)
	case client.RPCActivate, client.RPCHeartbeat, client.RPCDeregister:
		ref, err := client.DecodeWorkerRef(data)
		if err != nil {
			return badRequest(err)
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
			return badRequest(err)
		}
		return l.storeDrain(ctx, req)
	case client.RPCStoreSelfDrain:
		req, err := client.DecodeSelfDrain(data)
		if err != nil {
			return badRequest(err)
		}
		return l.storeSelfDrain(ctx, req)
	case client.RPCStepDown:
		if err := client.DecodeStepDown(data); err != nil {
			return badRequest(err)
		}
		l.logger.Warn().Msg("step-down requested")
		l.lose(reasonStepDown)
		return client.Reply{}
	case client.RPCStoreRegister:
		req, err := client.DecodeStoreRegister(data)
		if err != nil {
			return badRequest(err)
		}
		return l.storeRegister(ctx, req)
	case client.RPCStoreHeartbeat:
		hb, err := client.DecodeStoreHeartbeat(data)
		if err != nil {
			return badRequest(err)
		}
		return l.storeHeartbeat(ctx, hb)
	}
	return badRequest(fmt.Errorf("unknown rpc %q", rpc))
}

func (l *leaderSession) register(ctx context.Context, req client.RegisterRequest) client.Reply {
	var (
		existing *projections.Worker
		id       uint64
	)
	seen, err := l.mutateSeen(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		// The same incarnation at the same endpoint: its existing id. (A
		// lookup by endpoint: one active worker per endpoint, found in
		// O(1), where a search by incarnation scans every worker.)
		if w, ok := v.WorkerAt(req.Endpoint); ok && w.Incarnation == req.Incarnation {
			existing = &w
			return nil, nil
		}
		id = v.NextWorkerID
		return []events.Payload{events.WorkerRegistered{
			ID: id, Incarnation: req.Incarnation, Endpoint: req.Endpoint, Kind: req.Kind, Parallelism: req.Parallelism,
		}}, nil
	})
	if err != nil {
		return unavailable(err)
	}
	w := existing
	if w == nil {
		// Its only event is at seen: that is its epoch. The projection
		// folded it; a later event of the same group may already have
		// replaced it (another incarnation at its endpoint), which the
		// worker learns at its next heartbeat, as if it came later.
		var got projections.Worker
		var applied, ok bool
		l.r.proj.Peek(func(v *projections.State) {
			applied = v.NextWorkerID > id
			got, ok = v.Worker(id)
		})
		if !applied || ok && (got.Epoch != seen || got.Incarnation != req.Incarnation) {
			return unavailable(errors.New("registration not visible in the projection"))
		}
		w = &projections.Worker{ID: id, Epoch: seen}
		l.logger.Info().Uint64("worker_id", id).Uint64("epoch", seen).Str("endpoint", req.Endpoint).Msg("worker registered")
	}
	l.touch(w.ID, w.Epoch)
	return client.Reply{ID: w.ID, Epoch: w.Epoch}
}

func (l *leaderSession) activate(ctx context.Context, ref client.WorkerRef) client.Reply {
	var refused *client.Reply
	err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		if refused = l.owned(v, client.RPCActivate, ref); refused != nil {
			return nil, nil
		}
		if w, _ := v.Worker(ref.ID); w.State == projections.WorkerRunning {
			return nil, nil
		}
		return []events.Payload{events.WorkerActivated{ID: ref.ID, Epoch: ref.Epoch}}, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if refused != nil {
		return *refused
	}
	l.touch(ref.ID, ref.Epoch)
	return client.Reply{ID: ref.ID, Epoch: ref.Epoch}
}

func (l *leaderSession) heartbeat(ref client.WorkerRef) client.Reply {
	l.r.heartbeats.Add(1)
	var refused *client.Reply
	// Peek, not View: a view is a copy of every worker, made again after
	// every change, and heartbeats arrive while registrations change it.
	l.r.proj.Peek(func(v *projections.State) { refused = l.owned(v, client.RPCHeartbeat, ref) })
	if refused != nil {
		return *refused
	}
	now := l.r.cfg.Clock.Now()
	l.dmu.Lock()
	l.hearingLocked(now) // a deadline that passed during an outage is fresh again
	d, has := l.deadlines[ref.ID]
	expired := has && d.epoch == ref.Epoch && now.After(d.at)
	if !expired {
		l.deadlines[ref.ID] = deadline{epoch: ref.Epoch, at: now.Add(l.r.cfg.WorkerTimeout)}
	}
	l.dmu.Unlock()
	if expired {
		return reregister(ref)
	}
	return client.Reply{ID: ref.ID, Epoch: ref.Epoch}
}

// deregister is idempotent: a registration already gone is a success, but
// one registered by another incarnation is refused.
func (l *leaderSession) deregister(ctx context.Context, ref client.WorkerRef) client.Reply {
	var refused *client.Reply
	err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		refused = l.owned(v, client.RPCDeregister, ref)
		if refused != nil {
			if refused.Error.Code == client.CodeReregister {
				refused = nil // gone already
			}
			return nil, nil
		}
		return []events.Payload{events.WorkerDeregistered{ID: ref.ID, Epoch: ref.Epoch}}, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if refused != nil {
		return *refused
	}
	return client.Reply{ID: ref.ID, Epoch: ref.Epoch}
}

func (l *leaderSession) touch(id, epoch uint64) {
	l.dmu.Lock()
	l.deadlines[id] = deadline{epoch: epoch, at: l.r.cfg.Clock.Now().Add(l.r.cfg.WorkerTimeout)}
	l.dmu.Unlock()
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

// collectExpired returns worker.expired for every worker in v whose deadline
// passed. A worker without a deadline (a new leader's first look) gets a
// fresh full timeout. Nothing expires while heartbeats cannot arrive (see
// hearingLocked).
func (l *leaderSession) collectExpired(v *projections.State) []events.Payload {
	now := l.r.cfg.Clock.Now()
	l.dmu.Lock()
	defer l.dmu.Unlock()
	if !l.hearingLocked(now) {
		return nil
	}
	var out []events.Payload
	for _, w := range v.ListWorkers() {
		d, ok := l.deadlines[w.ID]
		if !ok || d.epoch != w.Epoch {
			l.deadlines[w.ID] = deadline{epoch: w.Epoch, at: now.Add(l.r.cfg.WorkerTimeout)}
			continue
		}
		if now.After(d.at) {
			out = append(out, events.WorkerExpired{ID: w.ID, Epoch: w.Epoch})
		}
	}
	for id := range l.deadlines {
		if _, ok := v.Workers[id]; !ok {
			delete(l.deadlines, id)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i].(events.WorkerExpired).ID < out[j].(events.WorkerExpired).ID })
	return out
}
