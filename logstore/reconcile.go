package logstore

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// Local is what the NodeHost has: the input of Plan besides the view.
type Local struct {
	Running   []projections.ReplicaRef // loaded in the NodeHost
	Persisted []projections.ReplicaRef // with a bootstrap record (local data), running or not
	// Rebuilt is, per shard, the seq of the last shard.recovered this
	// store carried out (Host.Rebuild) for it.
	Rebuilt map[uint64]uint64
}

// ActionKind is what an Action does.
type ActionKind int

// Action kinds.
const (
	// ActStart starts a replica that the view lists as a member here.
	ActStart ActionKind = iota + 1
	// ActStop stops a running replica (not a membership change).
	ActStop
	// ActRemoveData stops a replica and removes its local data; only for
	// replicas the view lists as removed from this store.
	ActRemoveData
	// ActSkip reports a replica that is left alone: never started, data
	// kept (a persisted replica the view does not list as a member here,
	// or a member that must wait).
	ActSkip
	// ActRebuild carries out an operator's recovery (shard.recovered at
	// Seq) naming this store: the shard is rebuilt as a one-member shard
	// from the replica's own data (Host.Rebuild), which starts it.
	ActRebuild
)

func (k ActionKind) String() string {
	switch k {
	case ActStart:
		return "start"
	case ActStop:
		return "stop"
	case ActRemoveData:
		return "remove-data"
	case ActSkip:
		return "skip"
	case ActRebuild:
		return "rebuild"
	}
	return fmt.Sprintf("action(%d)", int(k))
}

// Action is one step of a reconcile plan.
type Action struct {
	Kind    ActionKind
	Shard   uint64
	Replica uint64
	// Join (ActStart): the replica was added to a running shard and starts
	// empty, waiting for the leader.
	Join bool
	// Initial (ActStart): {replica id: raft address} of the shard's initial
	// membership when this replica bootstraps it; nil otherwise.
	Initial map[uint64]string
	// Reason (ActSkip, and ActStop of a non-member) says why.
	Reason string
	// Seq (ActRebuild) is the shard.recovered event's seq.
	Seq uint64
}

func (a Action) String() string {
	s := fmt.Sprintf("%s shard=%d replica=%d", a.Kind, a.Shard, a.Replica)
	if a.Kind == ActStart {
		switch {
		case a.Join:
			s += " join"
		case len(a.Initial) > 0:
			s += fmt.Sprintf(" bootstrap=%v", a.Initial)
		default:
			s += " restart"
		}
	}
	if a.Kind == ActRebuild {
		s += fmt.Sprintf(" seq=%d", a.Seq)
	}
	if a.Reason != "" {
		s += " reason=" + a.Reason
	}
	return s
}

// Skip is a replica the reconciler refused to start, for reporting (a
// zombie candidate: local data for a (shard, replica) that the projection
// does not list as a member of this store).
type Skip struct {
	Shard   uint64 `json:"shard"`
	Replica uint64 `json:"replica"`
	Reason  string `json:"reason"`
}

// Skip reasons.
const (
	ReasonNotMember      = "not a member in the view"
	ReasonUnknownShard   = "shard unknown in the view"
	ReasonRemovalPending = "removal pending"
)

// Plan is the pure core of the reconcile loop: the actions that make the
// NodeHost match the view's membership for store. Rules:
//   - a replica the view lists as a member of this store and that is not
//     running is started: restarted from its data when persisted, else
//     bootstrapped when it belongs to the shard's initial membership, else
//     joined (it was added to a running shard);
//   - a replica the view lists as removed from this store is stopped and
//     its data removed;
//   - a (shard, replica) that is not a member of this store in the view is
//     never started; its data is kept and it is reported (ActSkip), and it
//     is stopped if it runs;
//   - a member whose removal is pending is not started (it would only
//     campaign until the removal lands).
//
// Stops come first, then data removals, then skips, then starts; each group
// is ordered by shard then replica. A nil view plans nothing.
func Plan(store string, view *projections.State, local Local) []Action {
	if view == nil {
		return nil
	}
	var stops, removes, skips, starts []Action
	running := refSet(local.Running)
	persisted := refSet(local.Persisted)
	handled := map[projections.ReplicaRef]bool{}

	// What runs or has data here.
	for _, ref := range sortedRefs(running, persisted) {
		handled[ref] = true
		isRunning, isPersisted := running[ref], persisted[ref]
		sh := view.Shards[ref.Shard]
		switch {
		case sh == nil:
			if isRunning {
				stops = append(stops, Action{Kind: ActStop, Shard: ref.Shard, Replica: ref.Replica, Reason: ReasonUnknownShard})
			}
			skips = append(skips, Action{Kind: ActSkip, Shard: ref.Shard, Replica: ref.Replica, Reason: ReasonUnknownShard})
		case sh.Members[ref.Replica] == store:
			if isRunning {
				continue
			}
			if p, ok := sh.Pending[ref.Replica]; ok && p.Kind == projections.PendingRemoving {
				skips = append(skips, Action{Kind: ActSkip, Shard: ref.Shard, Replica: ref.Replica, Reason: ReasonRemovalPending})
				continue
			}
			// Persisted: restart from local data.
			starts = append(starts, Action{Kind: ActStart, Shard: ref.Shard, Replica: ref.Replica})
		case removedFrom(sh, ref.Replica, store):
			if isRunning {
				stops = append(stops, Action{Kind: ActStop, Shard: ref.Shard, Replica: ref.Replica, Reason: "removed"})
			}
			if isPersisted || isRunning {
				removes = append(removes, Action{Kind: ActRemoveData, Shard: ref.Shard, Replica: ref.Replica, Reason: "removed"})
			}
		default:
			reason := ReasonNotMember
			if st, ok := sh.Members[ref.Replica]; ok {
				reason = fmt.Sprintf("a member of store %s, not %s", st, store)
			} else if st, ok := sh.Removed[ref.Replica]; ok {
				reason = fmt.Sprintf("removed from store %s, not %s", st, store)
			}
			if isRunning {
				stops = append(stops, Action{Kind: ActStop, Shard: ref.Shard, Replica: ref.Replica, Reason: reason})
			}
			skips = append(skips, Action{Kind: ActSkip, Shard: ref.Shard, Replica: ref.Replica, Reason: reason})
		}
	}

	// Members of this store without local data.
	members, _ := view.ReplicasOn(store)
	for _, ref := range members {
		if handled[ref] {
			continue
		}
		sh := view.Shards[ref.Shard]
		if p, ok := sh.Pending[ref.Replica]; ok && p.Kind == projections.PendingRemoving {
			skips = append(skips, Action{Kind: ActSkip, Shard: ref.Shard, Replica: ref.Replica, Reason: ReasonRemovalPending})
			continue
		}
		initial, known := shardInitial(sh)
		if _, isInitial := initial[ref.Replica]; !known || !isInitial {
			starts = append(starts, Action{Kind: ActStart, Shard: ref.Shard, Replica: ref.Replica, Join: true})
			continue
		}
		addrs, err := raftAddrs(view, initial)
		if err != nil {
			skips = append(skips, Action{Kind: ActSkip, Shard: ref.Shard, Replica: ref.Replica, Reason: "cannot bootstrap: " + err.Error()})
			continue
		}
		starts = append(starts, Action{Kind: ActStart, Shard: ref.Shard, Replica: ref.Replica, Initial: addrs})
	}
	// An operator's recovery naming this store's member replica, not
	// carried out here yet: the rebuild starts it (from its own data, as a
	// one-member shard) instead of a plain start.
	var rebuilds []Action
	for _, id := range slices.Sorted(maps.Keys(view.Shards)) {
		sh := view.Shards[id]
		rc := sh.Recovered
		if rc == nil || rc.Store != store || sh.Members[rc.Replica] != store || local.Rebuilt[id] >= rc.Seq {
			continue
		}
		starts = slices.DeleteFunc(starts, func(a Action) bool { return a.Shard == id })
		if !persisted[projections.ReplicaRef{Shard: id, Replica: rc.Replica}] {
			skips = append(skips, Action{Kind: ActSkip, Shard: id, Replica: rc.Replica, Reason: "cannot rebuild: no local data of the replica recovered from"})
			continue
		}
		rebuilds = append(rebuilds, Action{Kind: ActRebuild, Shard: id, Replica: rc.Replica, Seq: rc.Seq})
	}
	slices.SortStableFunc(starts, func(a, b Action) int {
		return compareRefs(projections.ReplicaRef{Shard: a.Shard, Replica: a.Replica}, projections.ReplicaRef{Shard: b.Shard, Replica: b.Replica})
	})
	n := len(stops) + len(removes) + len(skips) + len(rebuilds) + len(starts)
	if n == 0 {
		return nil
	}
	out := make([]Action, 0, n)
	out = append(out, stops...)
	out = append(out, removes...)
	out = append(out, skips...)
	out = append(out, rebuilds...)
	return append(out, starts...)
}

func removedFrom(sh *projections.Shard, replica uint64, store string) bool {
	st, ok := sh.Removed[replica]
	return ok && st == store
}

// shardInitial returns the shard's initial membership {replica id: store}
// and whether it is known.
//
// ASSUMPTION: projections.Shard does not record the membership of
// shard.created (proposed field: `Initial map[uint64]string`, set once by
// shard.created and never changed; with it this function is
// `return sh.Initial, sh.Initial != nil`). Until then the initial membership
// is inferred from Raft's config change ids: dragonboat bootstraps n initial
// members as the config changes at log indexes 1..n, so a shard still at its
// initial membership has ccid 0 (nothing observed yet) or n; every later
// change sits at an index past the leader's first no-op entry, so after k
// changes ccid >= n+1+k > n+k >= the number of members. Hence: nothing
// removed and ccid <= len(Members) means Members is the initial membership.
// Otherwise it is unknown and every replica without local data joins, which
// is safe for an initial member too once the shard has applied a change (it
// had a leader, which replicates the whole log to the joiner);
// bootstrapping a replica that was added later would start a second Raft
// group, so the inference never guesses that way.
// shardInitial returns the shard's bootstrap membership while the shard is
// still as created: no replica removed and no config change past the n
// bootstrap entries (dragonboat numbers them 1..n). A replica of a shard
// that moved on joins instead: it never bootstraps a second time.
func shardInitial(sh *projections.Shard) (map[uint64]string, bool) {
	if sh.Initial == nil || len(sh.Removed) != 0 || sh.CCID > uint64(len(sh.Initial)) {
		return nil, false
	}
	return sh.Initial, true
}

// raftAddrs maps {replica id: store} to {replica id: raft address}.
func raftAddrs(view *projections.State, replicas map[uint64]string) (map[uint64]string, error) {
	out := make(map[uint64]string, len(replicas))
	for _, r := range slices.Sorted(maps.Keys(replicas)) {
		st := view.Stores[replicas[r]]
		if st == nil || st.RaftAddr == "" {
			return nil, fmt.Errorf("store %q of replica %d has no raft address in the view", replicas[r], r)
		}
		out[r] = st.RaftAddr
	}
	return out, nil
}

func refSet(refs []projections.ReplicaRef) map[projections.ReplicaRef]bool {
	m := make(map[projections.ReplicaRef]bool, len(refs))
	for _, r := range refs {
		m[r] = true
	}
	return m
}

func sortedRefs(sets ...map[projections.ReplicaRef]bool) []projections.ReplicaRef {
	all := map[projections.ReplicaRef]bool{}
	for _, s := range sets {
		maps.Copy(all, s)
	}
	out := slices.Collect(maps.Keys(all))
	sortRefs(out)
	return out
}

// apply carries out one planned action on the NodeHost. It is unexported on
// purpose: replicas start only through a plan.
func (h *Host) apply(ctx context.Context, a Action) error {
	switch a.Kind {
	case ActStart:
		return h.startMember(a.Shard, a.Replica, a.Initial, a.Join)
	case ActStop:
		return h.stopMember(a.Shard, a.Replica)
	case ActRemoveData:
		return h.removeData(ctx, a.Shard, a.Replica)
	case ActSkip:
		return nil
	case ActRebuild:
		_, err := h.rebuildFor(ctx, a.Shard, a.Replica, a.Seq)
		return err
	}
	return fmt.Errorf("logstore: unknown action %v", a)
}

// Actuator is what the Reconciler drives; *Host is the implementation (the
// unexported method keeps every replica start behind Plan).
type Actuator interface {
	Local() Local
	apply(ctx context.Context, a Action) error
}

// View is where the Reconciler reads the projected membership.
type View struct {
	// Current returns the current view (shared, read-only); required.
	Current func() *projections.State
	// Changed returns a channel closed at the next change; required.
	Changed func() <-chan struct{}
	// CatchUp, if set, must succeed before the first plan: it returns once
	// the view has folded everything the stream held when it was called, so
	// that a restarted store never acts on a prefix of the stream (where a
	// since-removed replica is still a member).
	CatchUp func(ctx context.Context) error
	// Healthy, if set, gates every plan: while the stream is unreadable the
	// reconciler does nothing.
	Healthy func() (bool, error)
}

// ViewOf reads the view of a Projector.
func ViewOf(p *view.Projector) View {
	return View{
		Current: p.View,
		Changed: p.Changed,
		CatchUp: func(ctx context.Context) error { _, err := p.CatchUp(ctx); return err },
		Healthy: p.Healthy,
	}
}

// ReconcilerConfig configures a Reconciler.
type ReconcilerConfig struct {
	Store  string
	Host   Actuator
	View   View
	Logger zerolog.Logger
	Clock  clock.Clock
	// Resync is the period of a full re-plan without a view change (the
	// NodeHost can change by itself); default 1s.
	Resync time.Duration
	// ActionTimeout bounds one action; default 30s.
	ActionTimeout time.Duration
	// CatchUpTimeout bounds one CatchUp attempt; default 10s.
	CatchUpTimeout time.Duration
}

// Status is what the reconciler last did, for reporting.
type Status struct {
	Ready   bool      // caught up with the stream at least once
	Seq     uint64    // seq of the view last planned from (0: none yet)
	Term    uint64    // its term
	Skipped []Skip    // replicas refused in the last plan
	Err     string    // last error (stream or actions), empty when none
	At      time.Time // time of the last plan
}

// Reconciler makes a Host match the projected membership of its store.
type Reconciler struct {
	cfg ReconcilerConfig

	mu     sync.Mutex
	status Status
	warned string // last "waiting" message logged, to log each once
}

// NewReconciler returns a reconciler; Run drives it.
func NewReconciler(cfg ReconcilerConfig) *Reconciler {
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if cfg.Resync <= 0 {
		cfg.Resync = time.Second
	}
	if cfg.ActionTimeout <= 0 {
		cfg.ActionTimeout = 30 * time.Second
	}
	if cfg.CatchUpTimeout <= 0 {
		cfg.CatchUpTimeout = 10 * time.Second
	}
	cfg.Logger = cfg.Logger.With().Str("component", "reconciler").Logger()
	return &Reconciler{cfg: cfg}
}

// Skipped returns the replicas refused in the last plan.
func (r *Reconciler) Skipped() []Skip {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.status.Skipped)
}

// Status returns what the reconciler last did.
func (r *Reconciler) Status() Status {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.status
	s.Skipped = slices.Clone(s.Skipped)
	return s
}

// errNoView means there is nothing safe to plan from yet.
var errNoView = errors.New("no view of the event stream")

// Run reconciles until ctx ends and returns ctx.Err(). It starts no
// goroutine. Until the view has caught up with the stream it starts
// nothing; while the stream is unreadable it does nothing and retries.
func (r *Reconciler) Run(ctx context.Context) error {
	backoff := 50 * time.Millisecond
	if r.cfg.View.CatchUp != nil {
		for {
			cctx, cancel := context.WithTimeout(ctx, r.cfg.CatchUpTimeout)
			err := r.cfg.View.CatchUp(cctx)
			cancel()
			if err == nil {
				break
			}
			if ctx.Err() != nil {
				return ctx.Err()
			}
			r.waiting(fmt.Errorf("catching up with the event stream: %w", err))
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-r.cfg.Clock.After(backoff):
			}
			backoff = min(backoff*2, 2*time.Second)
		}
	}
	r.mu.Lock()
	r.status.Ready = true
	r.mu.Unlock()
	backoff = 50 * time.Millisecond
	for {
		changed := r.cfg.View.Changed()
		next := r.cfg.Resync
		if err := r.ReconcileOnce(ctx); err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			next = min(backoff, r.cfg.Resync)
			backoff = min(backoff*2, 2*time.Second)
		} else {
			backoff = 50 * time.Millisecond
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-changed:
		case <-r.cfg.Clock.After(next):
		}
	}
}

// ReconcileOnce plans from the current view and applies the plan. It does
// nothing (and returns an error) when there is no usable view.
func (r *Reconciler) ReconcileOnce(ctx context.Context) error {
	v := r.cfg.View.Current()
	if v == nil || v.Seq == 0 {
		r.waiting(errNoView)
		return errNoView
	}
	if r.cfg.View.Healthy != nil {
		if ok, err := r.cfg.View.Healthy(); !ok {
			if err == nil {
				err = errNoView
			}
			err = fmt.Errorf("event stream unreadable; starting nothing: %w", err)
			r.waiting(err)
			return err
		}
	}
	actions := Plan(r.cfg.Store, v, r.cfg.Host.Local())
	if hasStart(actions) && r.cfg.View.CatchUp != nil {
		// Starting a replica on a view that lags the stream (a slow
		// reader, the first events after a NATS outage) could start one
		// the stream has removed since: every start is planned on a view
		// caught up with the stream's tail.
		cctx, cancel := context.WithTimeout(ctx, r.cfg.CatchUpTimeout)
		err := r.cfg.View.CatchUp(cctx)
		cancel()
		if err != nil {
			err = fmt.Errorf("catching up with the event stream before starting a replica: %w", err)
			r.waiting(err)
			return err
		}
		v = r.cfg.View.Current()
		actions = Plan(r.cfg.Store, v, r.cfg.Host.Local())
	}
	var (
		skipped []Skip
		errs    []error
	)
	for _, a := range actions {
		lg := r.cfg.Logger.With().Uint64("seq", v.Seq).Uint64("term", v.Term).Stringer("action", a).Logger()
		if a.Kind == ActSkip {
			skipped = append(skipped, Skip{Shard: a.Shard, Replica: a.Replica, Reason: a.Reason})
			if !r.wasSkipped(a) {
				lg.Warn().Msg("replica left alone: never started, data kept")
			}
			continue
		}
		actx, cancel := context.WithTimeout(ctx, r.cfg.ActionTimeout)
		err := r.cfg.Host.apply(actx, a)
		cancel()
		if err != nil {
			lg.Warn().Err(err).Msg("reconcile action failed; will retry")
			errs = append(errs, fmt.Errorf("%v: %w", a, err))
			continue
		}
		lg.Info().Msg("reconcile action done")
	}
	err := errors.Join(errs...)
	r.mu.Lock()
	r.status.Seq, r.status.Term, r.status.At = v.Seq, v.Term, r.cfg.Clock.Now()
	r.status.Skipped = skipped
	r.status.Err = errString(err)
	r.warned = ""
	r.mu.Unlock()
	return err
}

func hasStart(actions []Action) bool {
	for _, a := range actions {
		if a.Kind == ActStart || a.Kind == ActRebuild {
			return true
		}
	}
	return false
}

func (r *Reconciler) wasSkipped(a Action) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.status.Skipped {
		if s.Shard == a.Shard && s.Replica == a.Replica && s.Reason == a.Reason {
			return true
		}
	}
	return false
}

func (r *Reconciler) waiting(err error) {
	r.mu.Lock()
	r.status.Err = err.Error()
	first := r.warned != err.Error()
	r.warned = err.Error()
	r.mu.Unlock()
	if first {
		ev := r.cfg.Logger.Warn()
		if errors.Is(err, errNoView) {
			ev = r.cfg.Logger.Info() // every start waits for its first view
		}
		ev.Err(err).Msg("reconcile waiting")
	}
}
