package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// ErrNotLeader is returned by leader actions after leadership was lost.
var ErrNotLeader = errors.New("not the leader")

// ErrDisconnected is returned by a leader's append while the replica's NATS
// connection is down.
var ErrDisconnected = errors.New("NATS connection down")

// leaderSession is one term of leadership: its lifetime (start, fence,
// end) and the parts that hold its mutable state. What the term does is
// its duties (termDuties), made once the term started. Everything in it
// lives and dies with ctx; Replica.lead joins every goroutine before it
// returns.
//
// Who owns what (each piece of mutable state has one owner):
//   - loop (termLoop, below): one goroutine owns the term's mutable state:
//     the committer's scratch state, queue and groups in flight (commit),
//     the heartbeat deadlines (live), the barrier recovery (recov), the
//     stores' reports and the last health (sched). Handlers and timers send
//     it functions to run and wait for them; none of them takes a lock.
//   - leaseKeeper: the lease's renewal and its age (leasekeeper.go); the
//     session asks it before acting (keeper.mayAppend, keeper.leaseFresh).
//
// The term's RPCs are served by an rpcServer (rpc.go) over the table of
// leaderRPCs, whose rows are the duties' methods. The other fields never
// change after newLeaderSession (duties: after startTerm).
type leaderSession struct {
	r      *Replica
	ctx    context.Context // the term's: done when the term ends
	lease  uint64          // the lease's revision when taken: the term's fencing token
	term   uint64          // chosen by startTerm (with r.mu), before any task that reads it starts
	lose   func(reason string)
	logger zerolog.Logger

	loop   *termLoop // owns commit's, live's, recov's and sched's state
	commit *committer
	live   *liveness
	recov  recoveryState
	sched  *schedState
	keeper *leaseKeeper // the lease: keeper.mayAppend and keeper.leaseFresh are its checks
	duties *termDuties  // made by startTerm once the term started
}

// termDuties are what a term does once it started, each a small type
// holding the few parts of the term it needs: the RPC table's rows and
// Replica.startDuties's tasks are their methods.
type termDuties struct {
	workers   *workerDuty   // worker RPCs and expiry (leader.go)
	stores    *storeDuty    // store RPCs and the scheduler (scheduler.go)
	recovery  *recoveryDuty // control sessions, barrier recovery (control.go)
	health    *healthDuty   // the health record (health.go)
	snapshots *snapshotDuty // snapshots (snapshot.go)
	colocate  *colocateDuty // the lease's Raft leader beside the stream's (colocate.go)
	shards    *shardDuty    // shard.recover (recover.go)
}

// newDuties makes l's duties once its term is chosen (they log with it).
func newDuties(l *leaderSession) *termDuties {
	r, cfg := l.r, &l.r.cfg
	stores := &storeDuty{cfg: cfg, proj: r.proj, commit: l.commit, loop: l.loop, sched: l.sched, term: l.term,
		leaseFresh: l.keeper.leaseFresh, logger: l.logger}
	term, lease := l.term, l.lease
	return &termDuties{
		workers: &workerDuty{cfg: cfg, proj: r.proj, commit: l.commit, loop: l.loop, live: l.live, beats: &r.heartbeats, logger: l.logger},
		stores:  stores,
		recovery: &recoveryDuty{cfg: cfg, proj: r.proj, loop: l.loop, recov: &l.recov, term: term, logger: l.logger,
			recovered: func() { r.onTerm(term, lease, TermRecovered, "") }},
		health: &healthDuty{cfg: cfg, proj: r.proj, started: r.started, term: term, health: l.health, recovery: l.recovery,
			leaseFresh: l.keeper.leaseFresh, logger: l.logger},
		snapshots: &snapshotDuty{cfg: cfg, proj: r.proj, term: term, logger: l.logger},
		colocate:  &colocateDuty{cfg: cfg, logger: l.logger},
		shards:    &shardDuty{proj: r.proj, commit: l.commit, exec: stores.exec, health: r.HealthReport, logger: l.logger},
	}
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
	l.live = newLiveness(decide.Config{WorkerTimeout: r.cfg.WorkerTimeout}, connState(r.cfg.NC), func(workers int) {
		l.logger.Info().Int("workers", workers).Dur("timeout", r.cfg.WorkerTimeout).
			Msg("NATS connection is back: every worker gets a fresh full timeout")
	})
	l.keeper = newLeaseKeeper(r, l.logger, lose) // the lease was just taken
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
			l.duties = newDuties(l)
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

// connState is the leader's NATS connection nc as it is now, for the
// decisions.
func connState(nc *nats.Conn) decide.Conn {
	if nc == nil {
		return decide.Conn{None: true}
	}
	return decide.Conn{Connected: nc.IsConnected(), Reconnects: nc.Stats().Reconnects}
}

// workerDuty is the term's worker registrations and liveness: the worker
// RPCs (register, activate, deregister, heartbeat) and the expiry.
type workerDuty struct {
	cfg    *Config
	proj   *view.Projector
	commit *committer
	loop   *termLoop // owns live
	live   *liveness
	beats  *atomic.Uint64 // the replica's heartbeat count
	logger zerolog.Logger
}

// decideRequest submits a request's pure decision and answers as it says:
// the decision's reply once its events are stored (a new registration's
// epoch is the seq its event is stored at; the worker renewed when the
// decision asks for that), or unavailable when they could not be.
func (wd *workerDuty) decideRequest(ctx context.Context, f func(v *projections.State) decide.Decision) client.Reply {
	var d decide.Decision
	seen, err := wd.commit.Submit(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		d = f(v)
		return d.Events, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if d.EpochAtSeq {
		d.Reply.Epoch = seen
		wd.logger.Info().Uint64("worker_id", d.Reply.ID).Uint64("epoch", d.Reply.Epoch).Msg("worker registered")
	}
	if d.Renew {
		wd.grantTimeout(d.Reply.ID, d.Reply.Epoch)
	}
	return d.Reply
}

func (wd *workerDuty) register(ctx context.Context, req client.RegisterRequest) client.Reply {
	return wd.decideRequest(ctx, func(v *projections.State) decide.Decision {
		return decide.Register(v, req)
	})
}

// grantTimeout grants registration (id, epoch) a fresh full timeout from
// now, on the term's loop.
func (wd *workerDuty) grantTimeout(id, epoch uint64) {
	now := wd.cfg.Clock.Now()
	wd.loop.do(context.Background(), func() { wd.live.renew(id, epoch, now) })
}

func (wd *workerDuty) activate(ctx context.Context, ref client.WorkerRef) client.Reply {
	return wd.decideRequest(ctx, func(v *projections.State) decide.Decision { return decide.Activate(v, ref) })
}

// deregister is idempotent: a registration already gone is a success, but
// one registered by another incarnation is refused.
func (wd *workerDuty) deregister(ctx context.Context, ref client.WorkerRef) client.Reply {
	return wd.decideRequest(ctx, func(v *projections.State) decide.Decision { return decide.Deregister(v, ref) })
}

// heartbeats answers heartbeats waiting together, in order: one look at
// the projection and one visit to the term's loop for all of them (at
// 10,000 workers, 10,000 visits a second were the heartbeat's cost).
func (wd *workerDuty) heartbeats(refs []client.WorkerRef) []client.Reply {
	wd.beats.Add(uint64(len(refs)))
	type seen struct {
		w     projections.Worker
		found bool
	}
	ws := make([]seen, len(refs))
	// Peek, not View: a view is a copy of every worker, made again after
	// every change, and heartbeats arrive while registrations change it.
	wd.proj.Peek(func(v *projections.State) {
		for i, ref := range refs {
			ws[i].w, ws[i].found = v.Worker(ref.ID)
		}
	})
	c, now := connState(wd.cfg.NC), wd.cfg.Clock.Now()
	reps := make([]client.Reply, len(refs))
	if !wd.loop.do(context.Background(), func() {
		for i, ref := range refs {
			reps[i] = wd.live.beat(ws[i].w, ws[i].found, ref, c, now)
		}
	}) {
		for i := range reps {
			reps[i] = unavailable(fmt.Errorf("%w: the term ended", ErrNotLeader))
		}
	}
	return reps
}

// expiryLoop expires workers whose heartbeat deadline passed: one fenced
// append per tick, by id and epoch.
func (wd *workerDuty) expiryLoop(ctx context.Context) {
	cfg := wd.cfg
	for {
		select {
		case <-ctx.Done():
			return
		case <-cfg.Clock.After(cfg.ExpiryInterval):
		}
		if err := wd.expireOnce(ctx); err != nil && ctx.Err() == nil {
			wd.logger.Warn().Err(err).Msg("expiry")
		}
	}
}

func (wd *workerDuty) expireOnce(ctx context.Context) error {
	// The tick's inputs, gathered here: the decision itself reads only
	// them, the view and the deadlines it owns on the term's loop.
	c, now := connState(wd.cfg.NC), wd.cfg.Clock.Now()
	var expired []events.Payload
	_, err := wd.commit.Submit(ctx, FPExpiryAfterCollect, func(v *projections.State) ([]events.Payload, error) {
		expired = wd.collectExpired(v, c, now)
		return expired, nil
	})
	if err != nil {
		return err
	}
	for _, p := range expired {
		e := p.(events.WorkerExpired)
		wd.logger.Info().Uint64("worker_id", e.ID).Uint64("epoch", e.Epoch).Msg("worker expired")
	}
	return nil
}

// collectExpired decides an expiry tick on v: the view, the deadlines, the
// connection c and now in, the worker.expired events to append out. It runs
// in a decision, so on the term's loop, which owns the deadlines.
func (wd *workerDuty) collectExpired(v *projections.State, c decide.Conn, now time.Time) []events.Payload {
	return wd.live.expire(v, c, now)
}

// termLoop is the one goroutine that owns a leader term's mutable state,
// as hashicorp/raft's leaderState is owned by its leader loop: the
// committer's scratch state, queue and groups in flight (committer), the
// worker heartbeat deadlines (liveness), the barrier recovery
// (recoveryState) and the stores' reports (schedState). RPC handlers and
// timers send it messages — functions run on its goroutine, one at a time,
// in the order they arrive — and wait for them to have run; they never take
// a lock. I/O (appends, catching up, waiting for acks) runs on goroutines
// the loop starts and joins, which report back as messages, so the loop
// never blocks on NATS.
//
// Once run returns, done is closed and the state no longer changes: read
// runs its function directly then (status reads the last recovery after
// the term ended), while do refuses.
type termLoop struct {
	inbox chan func()
	done  chan struct{}
	wg    sync.WaitGroup // the I/O goroutines it started
}

func newTermLoop() *termLoop {
	return &termLoop{inbox: make(chan func(), 1024), done: make(chan struct{})}
}

// run handles messages until ctx ends, then lets c finish (it fails what
// is queued, and the groups in flight settle), joins every goroutine it
// started and closes done.
func (t *termLoop) run(ctx context.Context, c *committer) {
	defer close(t.done)
	for {
		select {
		case f := <-t.inbox:
			f()
		case <-ctx.Done():
			c.closing()
			t.drain(c)
			return
		}
	}
}

// drain handles messages until every goroutine the loop started has
// returned (they report back as messages), then whatever was sent last.
func (t *termLoop) drain(c *committer) {
	joined := make(chan struct{})
	go func() { t.wg.Wait(); close(joined) }()
	for {
		select {
		case f := <-t.inbox:
			f()
		case <-joined:
			for {
				select {
				case f := <-t.inbox:
					f()
				default:
					return
				}
			}
		}
	}
}

// goIO runs f on a goroutine the loop owns (joined before run returns).
// Called on the loop.
func (t *termLoop) goIO(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// do runs f on the loop and returns once it ran. It returns false, f not
// run, when the loop has ended or ctx ended before the loop took f.
func (t *termLoop) do(ctx context.Context, f func()) bool {
	ran := make(chan struct{})
	msg := func() { f(); close(ran) }
	select {
	case t.inbox <- msg:
	case <-t.done:
		return false
	case <-ctx.Done():
		return false
	}
	select {
	case <-ran:
		return true
	case <-t.done:
		// Ended: f ran before the loop did, or never will (it stays in the
		// inbox's buffer).
		select {
		case <-ran:
			return true
		default:
			return false
		}
	}
}

// post sends f to the loop without waiting for it to run; an I/O goroutine
// reports back so. The loop drains its inbox before it ends, so f runs
// unless the loop has ended already.
func (t *termLoop) post(f func()) {
	select {
	case t.inbox <- f:
	case <-t.done:
	}
}

// read runs f, which must not change the state, on the loop, or directly
// once the loop has ended. The loop must be running or about to run
// (Replica.lead starts it first of the term's tasks).
func (t *termLoop) read(f func()) {
	if !t.do(context.Background(), f) {
		f()
	}
}

// atomicTime is a time written and read by several goroutines (the lease's
// last renewal), with its monotonic reading kept.
type atomicTime struct{ p atomic.Pointer[time.Time] }

func (a *atomicTime) Store(t time.Time) { a.p.Store(&t) }

func (a *atomicTime) Load() time.Time {
	if t := a.p.Load(); t != nil {
		return *t
	}
	return time.Time{}
}
