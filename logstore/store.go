package logstore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/view"
)

// StoreConfig configures a log store process.
type StoreConfig struct {
	Host    Config     // the NodeHost
	Cluster string     // default "termlog"
	NC      *nats.Conn // store RPCs to meta and the executor subject
	Log     events.Log // the event stream, projected by the store itself
	// Snapshots, if set, is where the store's projection starts from: the
	// newest usable snapshot, then the events after it.
	Snapshots events.SnapshotStore
	// Heartbeat is the interval of heartbeats to meta; default 500ms.
	Heartbeat time.Duration
	// Resync is the reconciler's re-plan period; default 500ms.
	Resync time.Duration
	Logger zerolog.Logger
	Clock  clock.Clock
	// Failpoints, if set, are the store's test hooks (FPExecAdd).
	Failpoints *failpoint.Set
}

// FPExecAdd is hit when a store has taken an add config change from its
// executor queue, before the fence checks it (tests hold a deposed
// leader's change there).
const FPExecAdd = "store-exec-add"

// Store is one log store: a NodeHost made to match the projected membership
// of its store id, registered with meta, heartbeating its ShardInfo and
// executing the scheduler's config changes.
type Store struct {
	cfg         StoreConfig
	host        *Host
	proj        *view.Projector
	rec         *Reconciler
	incarnation string
	started     time.Time // the process's start, in every report
	logger      zerolog.Logger

	mu         sync.Mutex
	registered bool
	refused    atomic.Uint64
	outcomes   map[string]*atomic.Uint64 // config changes by outcome; keys fixed at open
}

// ConfigChanges counts the config changes this store executed, by outcome
// (client.Outcome*).
func (s *Store) ConfigChanges() map[string]uint64 {
	out := make(map[string]uint64, len(s.outcomes))
	for k, v := range s.outcomes {
		out[k] = v.Load()
	}
	return out
}

// OpenStore opens the NodeHost (it starts no replica).
func OpenStore(cfg StoreConfig) (*Store, error) {
	if cfg.NC == nil || cfg.Log == nil {
		return nil, errors.New("logstore: a store needs a NATS connection and the event log")
	}
	if err := client.ValidateStoreID(cfg.Host.StoreID); err != nil {
		return nil, err
	}
	if cfg.Cluster == "" {
		cfg.Cluster = "termlog"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = 500 * time.Millisecond
	}
	if cfg.Resync <= 0 {
		cfg.Resync = 500 * time.Millisecond
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	cfg.Host.Logger = cfg.Logger
	h, err := Open(cfg.Host)
	if err != nil {
		return nil, err
	}
	lg := cfg.Logger.With().Str("store", cfg.Host.StoreID).Logger()
	var opts []view.ProjectorOption
	if cfg.Snapshots != nil {
		opts = append(opts, view.WithSnapshots(cfg.Snapshots))
	}
	proj := view.NewProjector(cfg.Log, lg, cfg.Clock, opts...)
	b := make([]byte, 6)
	_, _ = rand.Read(b)
	s := &Store{cfg: cfg, host: h, proj: proj, incarnation: hex.EncodeToString(b), started: cfg.Clock.Now().UTC(), logger: lg, outcomes: map[string]*atomic.Uint64{}}
	for _, o := range []string{client.OutcomeApplied, client.OutcomeRejected, client.OutcomeRetry, client.OutcomeUnknown, client.OutcomeError, client.OutcomeRefused} {
		s.outcomes[o] = new(atomic.Uint64)
	}
	s.rec = NewReconciler(ReconcilerConfig{Store: cfg.Host.StoreID, Host: h, View: ViewOf(proj), Logger: lg, Clock: cfg.Clock, Resync: cfg.Resync})
	return s, nil
}

// Host is the store's NodeHost.
func (s *Store) Host() *Host { return s.host }

// Projector is the store's own projection of the stream.
func (s *Store) Projector() *view.Projector { return s.proj }

// Reconciler is the store's membership reconciler.
func (s *Store) Reconciler() *Reconciler { return s.rec }

// Incarnation identifies this process start.
func (s *Store) Incarnation() string { return s.incarnation }

// Close closes the NodeHost. Call it after Run returned.
func (s *Store) Close() { s.host.Close() }

// Run projects the stream, reconciles, serves the executor subject and
// registers and heartbeats until ctx is done; it joins every goroutine.
func (s *Store) Run(ctx context.Context) error {
	var wg sync.WaitGroup
	defer wg.Wait()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	run := func(f func(context.Context)) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	run(func(ctx context.Context) { _ = s.proj.Run(ctx) })
	run(func(ctx context.Context) { _ = s.rec.Run(ctx) })
	run(s.serveExec)
	s.heartbeatLoop(ctx)
	return nil
}

func (s *Store) request(ctx context.Context, rpc string, body any) (client.Reply, error) {
	b, err := json.Marshal(body)
	if err != nil {
		return client.Reply{}, err
	}
	rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	msg, err := s.cfg.NC.RequestWithContext(rctx, client.RPCSubject(s.cfg.Cluster, rpc), b)
	if err != nil {
		return client.Reply{}, err
	}
	var rep client.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.Reply{}, fmt.Errorf("malformed reply: %v", err)
	}
	if rep.Error != nil {
		return rep, rep.Error
	}
	return rep, nil
}

// Drain announces this store's own planned restart to meta: it drains for
// d (its replicas are not replaced meanwhile), and the drain survives its
// re-registration; it ends when the restarted store reports every replica
// assigned to it running, or after d. Call it before stopping (on
// SIGTERM); ctx bounds it.
func (s *Store) Drain(ctx context.Context, d time.Duration) error {
	req := client.SelfDrainRequest{Store: s.cfg.Host.StoreID, Incarnation: s.incarnation, ForMS: d.Milliseconds()}
	for {
		_, err := s.request(ctx, client.RPCStoreSelfDrain, req)
		if err == nil {
			s.logger.Info().Dur("for", d).Msg("drained for a planned restart: replicas are not replaced meanwhile")
			return nil
		}
		var rerr *client.RPCError
		if errors.As(err, &rerr) && rerr.Code != client.CodeUnavailable && rerr.Code != client.CodeNotLeader {
			return fmt.Errorf("drain %s: %w", s.cfg.Host.StoreID, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("drain %s: %w (last error: %v)", s.cfg.Host.StoreID, ctx.Err(), err)
		case <-s.cfg.Clock.After(100 * time.Millisecond):
		}
	}
}

// heartbeatLoop registers (again when meta says so) and heartbeats.
func (s *Store) heartbeatLoop(ctx context.Context) {
	for {
		s.mu.Lock()
		registered := s.registered
		s.mu.Unlock()
		var err error
		if !registered {
			_, err = s.request(ctx, client.RPCStoreRegister, client.StoreRegisterRequest{Store: s.cfg.Host.StoreID, Incarnation: s.incarnation, RaftAddr: s.host.RaftAddr(), Started: s.started})
			if err == nil {
				s.logger.Info().Str("raft_addr", s.host.RaftAddr()).Str("incarnation", s.incarnation).Msg("store registered")
				s.mu.Lock()
				s.registered = true
				s.mu.Unlock()
			}
		} else {
			_, err = s.request(ctx, client.RPCStoreHeartbeat, s.heartbeat())
			if errors.Is(err, client.ErrReregister) {
				s.mu.Lock()
				s.registered = false
				s.mu.Unlock()
				continue
			}
		}
		if err != nil && ctx.Err() == nil {
			s.logger.Debug().Err(err).Msg("meta not answering")
		}
		select {
		case <-ctx.Done():
			return
		case <-s.cfg.Clock.After(s.cfg.Heartbeat):
		}
	}
}

func (s *Store) heartbeat() client.StoreHeartbeat {
	hb := client.StoreHeartbeat{Store: s.cfg.Host.StoreID, Incarnation: s.incarnation, Started: s.started}
	for _, si := range s.host.ShardInfos() {
		hb.Shards = append(hb.Shards, client.ShardReport{Shard: si.Shard, Replica: si.Replica, Replicas: si.Replicas,
			Leader: si.Leader, Term: si.Term, CCID: si.CCID, Pending: si.Pending})
	}
	for _, sk := range s.rec.Skipped() {
		hb.Skipped = append(hb.Skipped, client.SkippedReplica{Shard: sk.Shard, Replica: sk.Replica, Reason: sk.Reason})
	}
	return hb
}

// serveExec runs the scheduler's config changes and membership reads, one
// at a time, each bounded by the request's timeout.
func (s *Store) serveExec(ctx context.Context) {
	ch := make(chan *nats.Msg, 64)
	sub, err := s.cfg.NC.ChanSubscribe(client.ExecSubject(s.cfg.Cluster, s.cfg.Host.StoreID), ch)
	if err != nil {
		s.logger.Error().Err(err).Msg("cannot serve config changes")
		return
	}
	defer func() { _ = sub.Unsubscribe() }()
	for {
		select {
		case <-ctx.Done():
			return
		case m := <-ch:
			rep := s.exec(ctx, m.Data)
			if req, err := client.DecodeExec(m.Data); err == nil && req.Op != client.ExecMembership && req.Op != client.ExecApplied {
				if c, ok := s.outcomes[rep.Outcome]; ok {
					c.Add(1)
				}
			}
			b, _ := json.Marshal(rep)
			if m.Reply != "" {
				_ = m.Respond(b)
			}
		}
	}
}

func (s *Store) exec(ctx context.Context, data []byte) client.ExecReply {
	req, err := client.DecodeExec(data)
	if err != nil {
		return client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}
	}
	timeout := time.Duration(req.TimeoutMS) * time.Millisecond
	if timeout <= 0 || timeout > time.Minute {
		timeout = 10 * time.Second
	}
	ectx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	lg := s.logger.With().Str("op", req.Op).Uint64("shard", req.Shard).Uint64("replica", req.Replica).Logger()
	var res Result
	switch req.Op {
	case client.ExecApplied:
		r, applied, ok := s.host.Applied(req.Shard)
		if !ok {
			return client.ExecReply{Outcome: client.OutcomeError, Error: fmt.Sprintf("no replica of shard %d runs on %s", req.Shard, s.cfg.Host.StoreID)}
		}
		return client.ExecReply{Outcome: client.OutcomeApplied, Replica: r, Applied: applied}
	case client.ExecMembership:
		m, err := s.host.Membership(ectx, req.Shard)
		if err != nil {
			return client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}
		}
		return withMembership(client.ExecReply{Outcome: client.OutcomeApplied}, m)
	case client.ExecGiveUp:
		verdict, why := s.fence(ectx, req)
		if verdict != client.ExecRun {
			lg.Warn().Uint64("term", req.Term).Str("operator", req.Operator).Uint64("intent", req.Intent).Str("reason", why).Msg("give-up refused: not a pending intent of a running operator of the current term here")
			s.refused.Add(1)
			return client.ExecReply{Outcome: client.OutcomeRefused, Error: why}
		}
		res := s.host.GiveUp(ectx, req.Shard, req.CCID)
		lg.Info().Str("operator", req.Operator).Uint64("intent", req.Intent).Uint64("ccid", req.CCID).Str("result", res.String()).Msg("give-up of a step: its config change id fenced in raft, or found moved")
		switch {
		case res.Outcome == Applied:
			rep := client.ExecReply{Outcome: client.OutcomeGivenUp, CCID: res.CCID, Index: res.CCID}
			if res.Membership != nil {
				rep = withMembership(rep, res.Membership)
				rep.Index = res.Membership.CCID
			}
			return rep
		case res.Outcome == Rejected && res.Membership != nil:
			// Raft's id moved past the intent's: the membership says by
			// what (the step's own change, or another).
			return withMembership(client.ExecReply{Outcome: client.OutcomeApplied, Error: res.Reason}, res.Membership)
		}
		rep := client.ExecReply{Outcome: client.OutcomeError, Error: res.Reason}
		switch res.Outcome {
		case Retry:
			rep.Outcome = client.OutcomeRetry
		case Unknown:
			rep.Outcome = client.OutcomeUnknown
		}
		return rep
	case client.ExecAdd, client.ExecRemove:
		if req.Op == client.ExecAdd {
			if err := s.cfg.Failpoints.Hit(ectx, FPExecAdd); err != nil {
				return client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}
			}
		}
		verdict, why := s.fence(ectx, req)
		switch verdict {
		case client.ExecRefuse, client.ExecWait:
			lg.Warn().Uint64("term", req.Term).Str("operator", req.Operator).Uint64("intent", req.Intent).Str("reason", why).Msg("config change refused: not the next step of a running operator of the current term here")
			s.refused.Add(1)
			return client.ExecReply{Outcome: client.OutcomeRefused, Error: why}
		case client.ExecDone:
			m, err := s.host.Membership(ectx, req.Shard)
			if err != nil {
				return client.ExecReply{Outcome: client.OutcomeError, Error: err.Error()}
			}
			return withMembership(client.ExecReply{Outcome: client.OutcomeApplied, Error: why}, m)
		}
		if req.Op == client.ExecAdd {
			res = s.host.AddReplicaOn(ectx, req.Shard, req.Replica, req.Addr, req.CCID)
		} else {
			res = s.host.RemoveReplicaOn(ectx, req.Shard, req.Replica, req.CCID)
		}
	}
	lg.Info().Str("result", res.String()).Msg("config change")
	rep := client.ExecReply{CCID: res.CCID, Error: res.Reason}
	switch res.Outcome {
	case Applied:
		rep.Outcome = client.OutcomeApplied
	case Rejected:
		rep.Outcome = client.OutcomeRejected
	case Retry:
		rep.Outcome = client.OutcomeRetry
	case Unknown:
		rep.Outcome = client.OutcomeUnknown
	default:
		rep.Outcome = client.OutcomeError
	}
	if res.Membership != nil {
		rep = withMembership(rep, res.Membership)
	}
	return rep
}

// fenceWait bounds the wait for the store's projection to fold an exec's
// intent (the leader appended it a moment ago).
const fenceWait = 3 * time.Second

// fence is the store's check of a config change against its own
// projection (client.CheckExec), after waiting, bounded, for the
// projection to reach the change's intent.
//
// The projection is first brought to the stream's tail: a store whose
// projection lags (a slow reader, a paused process) must not pass a
// deposed leader's change because it has not folded the new term yet.
func (s *Store) fence(ctx context.Context, req client.ExecRequest) (client.ExecVerdict, string) {
	wctx, cancel := context.WithTimeout(ctx, fenceWait)
	defer cancel()
	v, err := s.proj.CatchUp(wctx)
	if err != nil {
		return client.ExecRefuse, fmt.Sprintf("cannot bring the projection to the stream's tail within %s to check the change's term: %v", fenceWait, err)
	}
	return client.CheckExec(v, req)
}

// Refused counts config changes this store refused by the fence.
func (s *Store) Refused() uint64 { return s.refused.Load() }

func withMembership(rep client.ExecReply, m *Membership) client.ExecReply {
	rep.CCID = m.CCID
	rep.Replicas = m.Replicas
	for r := range m.Removed {
		rep.Removed = append(rep.Removed, r)
	}
	sort.Slice(rep.Removed, func(i, j int) bool { return rep.Removed[i] < rep.Removed[j] })
	return rep
}
