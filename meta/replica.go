package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// Failpoint names.
const (
	FPExpiryAfterCollect = "expiry-after-collect" // expired ids collected, before the append
	FPBeforeTermStarted  = "before-term-started"  // projected to the tail, before term.started
	FPBeforeRenewal      = "before-lease-renewal" // before each lease renewal
	FPOperatorBeforeAdd  = "operator-before-add"  // add intent recorded, before the config change is sent
	// FPOperatorBeforeRemove: a removal's intent recorded, before the
	// config change is sent.
	FPOperatorBeforeRemove = "operator-before-remove"
	FPOperatorAfterExec    = "operator-after-exec" // a config change's reply is in, before the scheduler sees it
)

// Config configures a meta replica. Zero durations take the defaults.
type Config struct {
	ID      string // replica name, e.g. "meta-1"
	Cluster string // default "termlog"
	Log     events.Log
	Lease   Lease
	// NC serves the worker RPCs while this replica leads. Nil disables them.
	NC *nats.Conn

	LeaseTTL       time.Duration // default 3s
	WorkerTimeout  time.Duration // heartbeat deadline, default 10s
	ExpiryInterval time.Duration // default WorkerTimeout/5
	RecoveryRetry  time.Duration // barrier recovery retry, default 250ms
	AppendTimeout  time.Duration // one append attempt, default 2s
	ControlDialer  func(ctx context.Context, endpoint string) (ControlConn, error)
	Scheduler      SchedulerConfig
	// ControlTLS, when set, makes every control stream a TLS client
	// connection over what ControlDialer returns (see client.ListenAgentTLS
	// for the worker's side). For mutual TLS it holds the leader's
	// certificate and the CA the workers' certificates are checked against;
	// an empty ServerName means the host of the worker's endpoint. Nil:
	// plaintext.
	ControlTLS *tls.Config
	// Snapshots, when set, is where the replica's projection starts from
	// (the newest usable snapshot) and where, while it leads, it stores a
	// snapshot of its projection every SnapshotEvery events and on clean
	// shutdown (see snapshot.go). Nil: no snapshots.
	Snapshots events.SnapshotStore
	// SnapshotEvery is the number of events between snapshots; default
	// DefaultSnapshotEvery; negative: only on clean shutdown.
	SnapshotEvery int
	// Health, when set, is where the leader publishes the cluster's health
	// record (health.go). Nil: not published.
	Health *HealthKV
	// SnapshotKeep is the number of newest snapshots kept; default 3.
	SnapshotKeep int
	Clock        clock.Clock
	Logger       zerolog.Logger
	Failpoints   *failpoint.Set
	// OnTerm, when set, is called at each phase of every term this replica
	// leads (open.go): how the bench and tests observe a failover without
	// reading log text. It runs on the leader's goroutines, some holding a
	// lock: it must return at once and must not call the replica.
	OnTerm func(TermEvent)

	// Read by Open only:

	// Replicas is the replica count of the stream and the buckets Open
	// creates; default 1.
	Replicas int
	// NoHealth: Open makes no health bucket, and the leader publishes no
	// health record (the bench, whose figures predate the record).
	NoHealth bool
	// Wait runs each of Open's steps (what names it): a daemon retries
	// until JetStream answers and says it is waiting. Nil: each runs once.
	Wait func(ctx context.Context, what string, open func(context.Context) error) error
}

func (c *Config) defaults() error {
	if err := c.defaultIdentity(); err != nil {
		return err
	}
	if c.Log == nil || c.Lease == nil {
		return errors.New("meta: replica needs a Log and a Lease")
	}
	if c.WorkerTimeout <= 0 {
		c.WorkerTimeout = 10 * time.Second
	}
	if c.ExpiryInterval <= 0 {
		c.ExpiryInterval = c.WorkerTimeout / 5
	}
	if c.RecoveryRetry <= 0 {
		c.RecoveryRetry = 250 * time.Millisecond
	}
	if c.AppendTimeout <= 0 {
		c.AppendTimeout = 2 * time.Second
	}
	if c.SnapshotEvery == 0 {
		c.SnapshotEvery = DefaultSnapshotEvery
	}
	if c.SnapshotKeep <= 0 {
		c.SnapshotKeep = DefaultSnapshotKeep
	}
	if c.ControlDialer == nil {
		c.ControlDialer = DialControl
	}
	if c.Clock == nil {
		c.Clock = clock.Real{}
	}
	c.Scheduler.defaults()
	return nil
}

// defaultIdentity checks the replica's name and fills in the cluster's
// name and the lease: what Open needs before it opens the parts they name.
func (c *Config) defaultIdentity() error {
	if c.ID == "" {
		return errors.New("meta: replica needs an ID")
	}
	if c.Cluster == "" {
		c.Cluster = "termlog"
	}
	if c.LeaseTTL <= 0 {
		c.LeaseTTL = 3 * time.Second
	}
	return nil
}

// Replica is one meta replica. Every replica projects the stream; the one
// that holds the lease also runs the leader duties.
type Replica struct {
	started time.Time // when this process made the replica: in its health records
	cfg     Config
	log     zerolog.Logger
	proj    *view.Projector

	mu         sync.Mutex
	leader     *leaderSession // nil when following
	terms      []TermRecord
	stepDown   chan struct{}
	fenced     atomic.Uint64
	stale      atomic.Uint64 // appends not sent: the lease was last renewed too long ago
	heartbeats atomic.Uint64
	leaving    atomic.Bool  // the NATS server is in lame-duck mode (ServerLeaving)
	tail       atomicTail   // the stream's tail as sampleTail last read it
	moves      *streamMoves // the event stream's leader elections (Run subscribes)
}

// atomicTail is a stream tail and when it was read.
type atomicTail struct {
	mu  sync.Mutex
	seq uint64
	at  time.Time
}

// tailEvery is how often Run reads the stream's tail for StreamTail.
const tailEvery = time.Second

// StreamTail is the stream's last seq as this replica last read it (Run
// reads it every second) and how long ago, by the replica's clock; ok is
// false before the first answer.
// Metrics read it instead of asking NATS themselves: a scrape must answer
// at once even when NATS does not (a client reconnecting to a server it
// cannot reach holds its connection's lock for each dial, and every
// request waits behind it, whatever its context).
func (r *Replica) StreamTail() (seq uint64, age time.Duration, ok bool) {
	r.tail.mu.Lock()
	defer r.tail.mu.Unlock()
	if r.tail.at.IsZero() {
		return 0, 0, false
	}
	return r.tail.seq, r.cfg.Clock.Now().Sub(r.tail.at), true
}

// sampleTail reads the stream's tail every tailEvery until ctx ends.
func (r *Replica) sampleTail(ctx context.Context) {
	for {
		tctx, cancel := context.WithTimeout(ctx, tailEvery)
		seq, err := r.cfg.Log.Tail(tctx)
		cancel()
		if err == nil {
			r.tail.mu.Lock()
			r.tail.seq, r.tail.at = seq, r.cfg.Clock.Now()
			r.tail.mu.Unlock()
		}
		select {
		case <-ctx.Done():
			return
		case <-r.cfg.Clock.After(tailEvery):
		}
	}
}

// Fenced counts this replica's appends refused by the CAS.
func (r *Replica) Fenced() uint64 { return r.fenced.Load() }

// StaleLeaseRefusals counts this replica's appends not sent because its
// lease was last renewed longer ago than the watchdog allows.
func (r *Replica) StaleLeaseRefusals() uint64 { return r.stale.Load() }

// Heartbeats counts the worker heartbeats this replica answered as leader.
func (r *Replica) Heartbeats() uint64 { return r.heartbeats.Load() }

// TermRecord is one term this replica led, for status and tests.
type TermRecord struct {
	Term     uint64 // 0 until the term is chosen
	Lease    uint64 // the lease's revision: the term's fencing token
	Started  time.Time
	Ended    time.Time
	Reason   string // why it ended
	Recovery Recovery
}

// New validates cfg and returns a replica; Run starts it.
func New(cfg Config) (*Replica, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	lg := cfg.Logger.With().Str("replica", cfg.ID).Logger()
	return &Replica{
		cfg:      cfg,
		started:  cfg.Clock.Now().UTC(),
		log:      lg,
		proj:     view.NewProjector(cfg.Log, lg, cfg.Clock, projectorOptions(cfg)...),
		stepDown: make(chan struct{}, 1),
		moves:    newStreamMoves(),
	}, nil
}

// ID is the replica's name.
func (r *Replica) ID() string { return r.cfg.ID }

// Log is the event stream the replica projects and appends to.
func (r *Replica) Log() events.Log { return r.cfg.Log }

// Projector is the replica's projection of the stream.
func (r *Replica) Projector() *view.Projector { return r.proj }

// View is the replica's projected state (read-only).
func (r *Replica) View() *projections.State { return r.proj.View() }

// Leading reports whether the replica currently runs leader duties, and its term.
// A term stops leading the moment something ends it (the watchdog, a failed
// renewal, a fence), not when its last task has been joined: a task still
// finishing an append whose outcome is unknown (up to the append timeout,
// while NATS is unreachable) must not keep the replica saying it leads for
// that long after its lease may have lapsed.
func (r *Replica) Leading() (bool, uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.leader == nil || r.leader.term == 0 || r.leader.ctx.Err() != nil {
		return false, 0 // no lease, no term chosen yet, or the term is ending
	}
	return true, r.leader.term
}

// Terms returns the terms this replica led, the current one last.
func (r *Replica) Terms() []TermRecord {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := append([]TermRecord(nil), r.terms...)
	if r.leader != nil && len(out) > 0 {
		out[len(out)-1].Recovery = r.leader.recovery()
	}
	return out
}

// StepDown makes a leading replica give up its lease and follow. It returns
// at once; the replica campaigns again after one lease period.
func (r *Replica) StepDown() {
	select {
	case r.stepDown <- struct{}{}:
	default:
	}
}

// Run projects the stream and campaigns for the lease until ctx is done. It
// returns only after every goroutine it started has ended.
func (r *Replica) Run(ctx context.Context) error {
	if r.cfg.NC != nil {
		stop, err := r.moves.watch(r.cfg.NC, r.cfg.Cluster, r.log)
		if err != nil {
			// Appends still resend, after their attempt: say so, go on.
			r.log.Warn().Err(err).Msg("no subscription to the event stream's leader elections: an unanswered append is sent again after its attempt only")
		}
		defer stop()
	}
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		_ = r.proj.Run(ctx)
	}()
	go func() {
		defer wg.Done()
		r.sampleTail(ctx)
	}()
	defer wg.Wait()
	r.campaign(ctx)
	return nil
}

// leadThenFollow leads one term under lease and says why it ended; after a
// step-down it waits a lease, so that another replica wins the next round.
func (r *Replica) leadThenFollow(ctx context.Context, lease uint64) {
	term, reason := r.lead(ctx, lease)
	ev := r.log.Warn()
	if reason == reasonShutdown || reason == reasonStepDown {
		ev = r.log.Info() // asked for: a clean stop logs no warning
	}
	ev.Uint64("term", term).Uint64("lease_rev", lease).Str("reason", reason).Msg("stopped leading; following")
	if reason == reasonStepDown {
		r.sleep(ctx, r.cfg.LeaseTTL)
	}
}

// sleep waits d on the replica's clock, or until ctx is done.
func (r *Replica) sleep(ctx context.Context, d time.Duration) {
	select {
	case <-ctx.Done():
	case <-r.cfg.Clock.After(d):
	}
}

const (
	reasonStepDown = "stepped down"
	reasonShutdown = "shutdown" // Run's ctx ended while the term was held
)

// lead runs one term under the lease taken at revision lease. It returns the
// term (0 if none was chosen) and why it ended, after every leader task has
// been cancelled and joined.
func (r *Replica) lead(ctx context.Context, lease uint64) (uint64, string) {
	lctx, cancel := context.WithCancel(ctx)
	end := &termEnd{cancel: cancel, log: r.log.With().Uint64("lease_rev", lease).Logger()}
	l := r.newLeaderSession(lctx, lease, end.lose)
	r.beginTerm(l)

	tasks := &termTasks{ctx: lctx}
	tasks.start(l.runLoop)     // first: every other task sends the term's loop messages
	tasks.start(l.keeper.keep) // renewal and watchdog, from the lease's Acquire on
	tasks.start(func(ctx context.Context) {
		select {
		case <-ctx.Done():
		case <-r.stepDown:
			l.lose(reasonStepDown)
		}
	})
	started, snapLast := r.startDuties(l, tasks)

	<-lctx.Done()
	l.lose(reasonShutdown)
	tasks.wait()
	r.endTerm(ctx, l, end.reason, started, *snapLast)
	return l.term, end.reason
}

// termEnd is how a term ends: the first reason given ends it (cancels its
// context) and is the one recorded.
type termEnd struct {
	once   sync.Once
	cancel context.CancelFunc
	log    zerolog.Logger
	reason string // set once, by the first lose; read after the term's tasks are joined
}

func (e *termEnd) lose(why string) {
	e.once.Do(func() {
		e.reason = why
		e.cancel()
		if why != reasonShutdown {
			// Now, not when the last task is joined (see Leading).
			e.log.Info().Str("reason", why).Msg("term ending; leader tasks stopping")
		}
	})
}

// termTasks are a term's tasks: each runs with the term's context, and
// wait joins them all.
type termTasks struct {
	ctx context.Context
	wg  sync.WaitGroup
}

func (t *termTasks) start(f func(context.Context)) { t.wg.Go(func() { f(t.ctx) }) }
func (t *termTasks) wait()                         { t.wg.Wait() }

// beginTerm makes l the replica's leader session and records its term.
func (r *Replica) beginTerm(l *leaderSession) {
	l.logger.Info().Msg("lease acquired")
	r.onTerm(0, l.lease, TermAcquired, "")
	r.mu.Lock()
	r.leader = l
	r.terms = append(r.terms, TermRecord{Lease: l.lease, Started: r.cfg.Clock.Now()})
	r.mu.Unlock()
}

// startDuties starts l's term (its term.started) and, once it has started,
// the leader's duties as tasks. It says whether the term started, and
// where the snapshot task leaves the seq of the newest snapshot it stored
// (to read once the tasks are joined).
func (r *Replica) startDuties(l *leaderSession, tasks *termTasks) (bool, *uint64) {
	var snapLast uint64
	if err := l.startTerm(tasks.ctx); err != nil {
		l.lose(fmt.Sprintf("start term: %v", err))
		return false, &snapLast
	}
	r.onTerm(l.term, l.lease, TermStarted, "")
	d := l.duties
	tasks.start(newRPCServer(l).serve)
	tasks.start(d.workers.expiryLoop)
	tasks.start(d.recovery.controlLoop)
	tasks.start(d.stores.scheduleLoop)
	tasks.start(d.health.healthLoop)
	tasks.start(func(ctx context.Context) { snapLast = d.snapshots.snapshotLoop(ctx) })
	tasks.start(d.colocate.colocateLoop)
	return true, &snapLast
}

// endTerm closes l's term, whose tasks are joined, ended for reason: a
// last snapshot on a clean shutdown, the lease released when asked for,
// and the term recorded as ended.
func (r *Replica) endTerm(ctx context.Context, l *leaderSession, reason string, started bool, snapLast uint64) {
	lg := r.log.With().Uint64("lease_rev", l.lease).Logger()
	if started && reason == reasonShutdown {
		// Clean shutdown with the term still held (nothing lost it first):
		// one more snapshot, of the view this replica projected, written
		// while it still leads (a leader task like the others, so before
		// the release) and bounded by what is left of the lease.
		l.duties.snapshots.finalSnapshot(ctx, snapLast, l.keeper.lastRenewal())
	}
	if reason == reasonStepDown || ctx.Err() != nil {
		rctx, rcancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.AppendTimeout)
		if err := r.cfg.Lease.Release(rctx); err != nil {
			lg.Warn().Err(err).Msg("release lease")
		}
		rcancel()
	}
	r.mu.Lock()
	r.leader = nil
	if n := len(r.terms); n > 0 {
		r.terms[n-1].Ended = r.cfg.Clock.Now()
		r.terms[n-1].Reason = reason
		r.terms[n-1].Recovery = l.recovery()
	}
	r.mu.Unlock()
	r.onTerm(l.term, l.lease, TermEnded, reason)
}
