package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// SchedulerConfig configures the shard scheduler. Zero values take defaults;
// Shards 0 disables bootstrapping new shards.
type SchedulerConfig struct {
	Shards       int           // shards to keep
	Replicas     int           // replicas per shard, default 3
	StoreTimeout time.Duration // a store without heartbeats this long is down, default 10s
	StepTimeout  time.Duration // bound of one operator step, default 10s
	Interval     time.Duration // planning tick, default 250ms
	Backoff      time.Duration // wait after a failed operator before re-planning the shard, default 1s
}

func (c *SchedulerConfig) defaults() {
	if c.Replicas <= 0 {
		c.Replicas = 3
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 10 * time.Second
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = 10 * time.Second
	}
	if c.Interval <= 0 {
		c.Interval = 250 * time.Millisecond
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
}

// ShardHealth is one shard's health as the leader sees it: from the
// projection and the stores' heartbeats, never from store-level state alone.
type ShardHealth struct {
	Shard     uint64            `json:"shard"`
	Expected  int               `json:"expected"`
	Members   map[uint64]string `json:"members"` // replica -> store
	Live      int               `json:"live"`    // members running on a live store
	Leader    uint64            `json:"leader"`
	Operator  string            `json:"operator,omitempty"`
	Zombies   []string          `json:"zombies,omitempty"` // persisted replicas stores refused to start
	LastError string            `json:"last_error,omitempty"`
	Healthy   bool              `json:"healthy"`
}

// storeSeen is what the leader remembers of a store between heartbeats.
type storeSeen struct {
	at          time.Time
	incarnation string
	report      client.StoreHeartbeat
}

type schedState struct {
	mu        sync.Mutex
	stores    map[string]storeSeen
	lastError map[uint64]string
	failedAt  map[uint64]time.Time
	running   map[uint64]bool // shards with an operator goroutine
}

func newSchedState() *schedState {
	return &schedState{stores: map[string]storeSeen{}, lastError: map[uint64]string{}, failedAt: map[uint64]time.Time{}, running: map[uint64]bool{}}
}

// storeRegister handles store.register.
func (l *leaderSession) storeRegister(ctx context.Context, req client.StoreRegisterRequest) client.Reply {
	err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		if st, ok := v.Stores[req.Store]; ok && st.Incarnation == req.Incarnation && st.RaftAddr == req.RaftAddr && st.State == events.StoreUp {
			return nil, nil
		}
		return []events.Payload{events.StoreRegistered{Store: req.Store, Incarnation: req.Incarnation, RaftAddr: req.RaftAddr}}, nil
	})
	if err != nil {
		return unavailable(err)
	}
	v := l.r.proj.View()
	st, ok := v.Stores[req.Store]
	if !ok || st.Incarnation != req.Incarnation {
		return client.Reply{Error: &client.RPCError{Code: client.CodeBadRequest, Message: fmt.Sprintf("store %s not registered (raft address taken or tombstone?)", req.Store)}}
	}
	l.sched.mu.Lock()
	l.sched.stores[req.Store] = storeSeen{at: l.r.cfg.Clock.Now(), incarnation: req.Incarnation}
	l.sched.mu.Unlock()
	return client.Reply{}
}

// storeHeartbeat handles store.heartbeat: memory only, except that a down
// store coming back is marked up.
func (l *leaderSession) storeHeartbeat(ctx context.Context, hb client.StoreHeartbeat) client.Reply {
	v := l.r.proj.View()
	st, ok := v.Stores[hb.Store]
	if !ok || st.Incarnation != hb.Incarnation {
		return client.Reply{Error: &client.RPCError{Code: client.CodeReregister, Message: fmt.Sprintf("store %s incarnation %s is not registered", hb.Store, hb.Incarnation)}}
	}
	l.sched.mu.Lock()
	l.sched.stores[hb.Store] = storeSeen{at: l.r.cfg.Clock.Now(), incarnation: hb.Incarnation, report: hb}
	l.sched.mu.Unlock()
	if st.State == events.StoreDown {
		err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
			if s, ok := v.Stores[hb.Store]; !ok || s.State != events.StoreDown {
				return nil, nil
			}
			return []events.Payload{events.StoreState{Store: hb.Store, State: events.StoreUp}}, nil
		})
		if err != nil {
			return unavailable(err)
		}
	}
	return client.Reply{}
}

// storeDrain handles store.drain: draining until now+for (never marked down
// meanwhile), or up again.
func (l *leaderSession) storeDrain(ctx context.Context, req client.DrainRequest) client.Reply {
	var missing bool
	err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		if _, ok := v.Stores[req.Store]; !ok {
			missing = true
			return nil, nil
		}
		if req.ForMS == 0 {
			return []events.Payload{events.StoreState{Store: req.Store, State: events.StoreUp}}, nil
		}
		until := l.r.cfg.Clock.Now().Add(time.Duration(req.ForMS) * time.Millisecond).UTC()
		return []events.Payload{events.StoreState{Store: req.Store, State: events.StoreDraining, Until: until}}, nil
	})
	if err != nil {
		return unavailable(err)
	}
	if missing {
		return badRequest(fmt.Errorf("unknown store %q", req.Store))
	}
	return client.Reply{}
}

// live reports whether a store heartbeats and is not down or tombstoned.
func (l *leaderSession) live(v *projections.State, store string, now time.Time) bool {
	st, ok := v.Stores[store]
	if !ok || st.State == events.StoreDown || st.State == events.StoreTombstone {
		return false
	}
	l.sched.mu.Lock()
	seen, ok := l.sched.stores[store]
	l.sched.mu.Unlock()
	return ok && seen.incarnation == st.Incarnation && now.Sub(seen.at) <= l.r.cfg.Scheduler.StoreTimeout
}

// scheduleLoop plans every tick: store liveness, observed membership, shard
// bootstrap, and replacement operators. Operators run in goroutines owned
// by this loop; it joins them before returning.
func (l *leaderSession) scheduleLoop(ctx context.Context) {
	cfg := &l.r.cfg.Scheduler
	var wg sync.WaitGroup
	defer wg.Wait()
	// Operators left running by an earlier term are failed first: nobody
	// drives them any more, and the shard is re-planned from fresh state.
	if err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		var out []events.Payload
		for _, id := range sortedOps(v) {
			op := v.Operators[id]
			out = append(out, events.OperatorFailed{Op: op.ID, Shard: op.Shard, Reason: fmt.Sprintf("abandoned by a leader change (term %d)", l.term)})
		}
		return out, nil
	}); err != nil {
		return
	}
	for {
		if err := l.scheduleOnce(ctx, &wg); err != nil && ctx.Err() == nil {
			l.logger.Warn().Err(err).Msg("schedule")
		}
		select {
		case <-ctx.Done():
			return
		case <-l.r.cfg.Clock.After(cfg.Interval):
		}
	}
}

func sortedOps(v *projections.State) []string {
	ids := make([]string, 0, len(v.Operators))
	for id := range v.Operators {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	return ids
}

func (l *leaderSession) scheduleOnce(ctx context.Context, wg *sync.WaitGroup) error {
	cfg := &l.r.cfg.Scheduler
	now := l.r.cfg.Clock.Now()

	// 1. Store liveness. A store the leader has not heard of yet gets a full
	// timeout from now; draining until a deadline is never marked down.
	err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		var out []events.Payload
		l.sched.mu.Lock()
		defer l.sched.mu.Unlock()
		for _, st := range v.ListStores() {
			seen, ok := l.sched.stores[st.ID]
			if !ok {
				l.sched.stores[st.ID] = storeSeen{at: now, incarnation: st.Incarnation}
				continue
			}
			if st.State != events.StoreUp && st.State != events.StoreDraining {
				continue
			}
			if st.State == events.StoreDraining && now.Before(st.Until) {
				continue
			}
			if now.Sub(seen.at) > cfg.StoreTimeout {
				out = append(out, events.StoreState{Store: st.ID, State: events.StoreDown})
			}
		}
		return out, nil
	})
	if err != nil {
		return err
	}

	// 2. Membership observed by Raft that is newer than the projection.
	if err := l.mutate(ctx, "", l.observed); err != nil {
		return err
	}

	// 3. Bootstrap shards while there are fewer than wanted.
	if err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		if len(v.Shards) >= cfg.Shards {
			return nil, nil
		}
		var live []string
		for _, st := range v.ListStores() {
			if l.live(v, st.ID, now) && st.State == events.StoreUp {
				live = append(live, st.ID)
			}
		}
		if len(live) < cfg.Replicas {
			return nil, nil
		}
		load := storeLoad(v)
		sort.SliceStable(live, func(i, j int) bool { return load[live[i]] < load[live[j]] })
		var next uint64
		for id := range v.Shards {
			next = max(next, id)
		}
		reps := map[uint64]string{}
		for i := 0; i < cfg.Replicas; i++ {
			reps[uint64(i+1)] = live[i]
		}
		return []events.Payload{events.ShardCreated{Shard: next + 1, Replicas: reps}}, nil
	}); err != nil {
		return err
	}

	// 4. Repair: one operator per shard that has a member on a store that is
	// not live, or fewer members than wanted.
	v := l.r.proj.View()
	for _, sh := range v.ListShards() {
		if sh.Operator != "" {
			continue
		}
		l.sched.mu.Lock()
		busy := l.sched.running[sh.ID] || now.Sub(l.sched.failedAt[sh.ID]) < cfg.Backoff
		l.sched.mu.Unlock()
		if busy {
			continue
		}
		var stale uint64
		for _, r := range sortedReplicaIDs(sh.Members) {
			st := v.Stores[sh.Members[r]]
			if st == nil || st.State == events.StoreDown || st.State == events.StoreTombstone {
				stale = r
				break
			}
		}
		if stale == 0 && len(sh.Members) >= cfg.Replicas {
			continue
		}
		l.sched.mu.Lock()
		l.sched.running[sh.ID] = true
		l.sched.mu.Unlock()
		shard := sh.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			err := l.runOperator(ctx, shard, stale)
			l.sched.mu.Lock()
			delete(l.sched.running, shard)
			if err != nil {
				l.sched.lastError[shard] = err.Error()
				l.sched.failedAt[shard] = l.r.cfg.Clock.Now()
			} else {
				delete(l.sched.lastError, shard)
			}
			l.sched.mu.Unlock()
		}()
	}
	return nil
}

func storeLoad(v *projections.State) map[string]int {
	load := map[string]int{}
	for _, sh := range v.Shards {
		for _, st := range sh.Members {
			load[st]++
		}
	}
	return load
}

func sortedReplicaIDs(m map[uint64]string) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// observed turns heartbeat reports with a newer config change id than the
// projection into shard.observed events (one per shard, the newest report).
func (l *leaderSession) observed(v *projections.State) ([]events.Payload, error) {
	byAddr := map[string]string{}
	for _, st := range v.ListStores() {
		if st.State != events.StoreTombstone {
			byAddr[st.RaftAddr] = st.ID
		}
	}
	best := map[uint64]client.ShardReport{}
	l.sched.mu.Lock()
	for _, seen := range l.sched.stores {
		for _, rep := range seen.report.Shards {
			sh, ok := v.Shards[rep.Shard]
			if !ok || rep.CCID <= sh.CCID || rep.Pending || len(rep.Replicas) == 0 {
				continue
			}
			if b, ok := best[rep.Shard]; !ok || rep.CCID > b.CCID {
				best[rep.Shard] = rep
			}
		}
	}
	l.sched.mu.Unlock()
	var out []events.Payload
	for _, shard := range sortedKeys(best) {
		rep := best[shard]
		reps := map[uint64]string{}
		ok := true
		for r, addr := range rep.Replicas {
			st, found := byAddr[addr]
			if !found {
				ok = false
				break
			}
			reps[r] = st
		}
		if ok {
			out = append(out, events.ShardObserved{Shard: shard, CCID: rep.CCID, Replicas: reps, Leader: rep.Leader})
		}
	}
	return out, nil
}

func sortedKeys[V any](m map[uint64]V) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// errStep is an operator step that did not complete.
var errStep = errors.New("operator step failed")

// runOperator replaces replica stale of shard (0: only add one): remove it
// first, then add a new replica id on a live store, each step a config
// change run by a live member with a fresh config change id, bounded by the
// step timeout; intent and outcome are events.
func (l *leaderSession) runOperator(ctx context.Context, shard, stale uint64) (err error) {
	cfg := &l.r.cfg.Scheduler
	var opID string
	err = l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		sh, ok := v.Shards[shard]
		if !ok || sh.Operator != "" {
			return nil, fmt.Errorf("shard %d: nothing to do", shard)
		}
		opID = fmt.Sprintf("op-%d-%d", shard, v.Seq+1)
		var steps []string
		if stale != 0 {
			steps = append(steps, fmt.Sprintf("remove replica %d from %s", stale, sh.Members[stale]))
		}
		steps = append(steps, "add a new replica on a live store")
		return []events.Payload{events.OperatorStarted{Op: opID, Shard: shard, Steps: steps}}, nil
	})
	if err != nil {
		return err
	}
	lg := l.logger.With().Str("op", opID).Uint64("shard", shard).Logger()
	lg.Info().Uint64("stale_replica", stale).Msg("operator started")
	defer func() {
		var end events.Payload = events.OperatorFinished{Op: opID, Shard: shard}
		if err != nil {
			end = events.OperatorFailed{Op: opID, Shard: shard, Reason: err.Error()}
			lg.Warn().Err(err).Msg("operator failed")
		} else {
			lg.Info().Msg("operator finished")
		}
		if merr := l.mutate(ctx, "", func(*projections.State) ([]events.Payload, error) { return []events.Payload{end}, nil }); merr != nil && err == nil {
			err = merr
		}
	}()

	if stale != 0 {
		if err := l.removeStep(ctx, opID, shard, stale); err != nil {
			return err
		}
	}
	// Add: wait (bounded) for a live store that holds no replica of the shard.
	sctx, cancel := context.WithTimeout(ctx, cfg.StepTimeout)
	defer cancel()
	for {
		v := l.r.proj.View()
		if sh := v.Shards[shard]; sh != nil && len(sh.Members) >= cfg.Replicas {
			return nil
		}
		target := l.pickTarget(v, shard)
		if target != "" {
			return l.addStep(sctx, opID, shard, target)
		}
		select {
		case <-sctx.Done():
			return fmt.Errorf("%w: no live store to add a replica of shard %d on within %s", errStep, shard, cfg.StepTimeout)
		case <-l.r.cfg.Clock.After(cfg.Interval):
		}
	}
}

func (l *leaderSession) pickTarget(v *projections.State, shard uint64) string {
	sh := v.Shards[shard]
	if sh == nil {
		return ""
	}
	holds := map[string]bool{}
	for _, st := range sh.Members {
		holds[st] = true
	}
	for _, p := range sh.Pending {
		holds[p.Store] = true
	}
	load := storeLoad(v)
	now := l.r.cfg.Clock.Now()
	best := ""
	for _, st := range v.ListStores() {
		if holds[st.ID] || st.State != events.StoreUp || !l.live(v, st.ID, now) {
			continue
		}
		if best == "" || load[st.ID] < load[best] {
			best = st.ID
		}
	}
	return best
}

// executor picks a live member store to run a config change, other than avoid.
func (l *leaderSession) executor(v *projections.State, shard, avoid uint64) (string, error) {
	sh := v.Shards[shard]
	if sh == nil {
		return "", fmt.Errorf("unknown shard %d", shard)
	}
	now := l.r.cfg.Clock.Now()
	for _, r := range sortedReplicaIDs(sh.Members) {
		if r == avoid {
			continue
		}
		if st := sh.Members[r]; l.live(v, st, now) {
			return st, nil
		}
	}
	return "", fmt.Errorf("%w: no live member of shard %d to run the change", errStep, shard)
}

// exec sends one request to a store's executor, bounded by ctx.
func (l *leaderSession) exec(ctx context.Context, store string, req client.ExecRequest) (client.ExecReply, error) {
	if l.r.cfg.NC == nil {
		return client.ExecReply{}, errors.New("no NATS connection for store RPCs")
	}
	if dl, ok := ctx.Deadline(); ok {
		req.TimeoutMS = max(time.Until(dl).Milliseconds()-100, 100)
	}
	b, _ := json.Marshal(req)
	msg, err := l.r.cfg.NC.RequestWithContext(ctx, client.ExecSubject(l.r.cfg.Cluster, store), b)
	if err != nil {
		return client.ExecReply{Outcome: client.OutcomeUnknown, Error: err.Error()}, nil
	}
	var rep client.ExecReply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		return client.ExecReply{}, fmt.Errorf("store %s: malformed exec reply: %v", store, err)
	}
	return rep, nil
}

// membership re-reads a shard's membership from a live member.
func (l *leaderSession) membership(ctx context.Context, shard, avoid uint64) (client.ExecReply, error) {
	st, err := l.executor(l.r.proj.View(), shard, avoid)
	if err != nil {
		return client.ExecReply{}, err
	}
	rep, err := l.exec(ctx, st, client.ExecRequest{Op: client.ExecMembership, Shard: shard})
	if err == nil && rep.Outcome != client.OutcomeApplied {
		err = fmt.Errorf("membership read on %s: %s %s", st, rep.Outcome, rep.Error)
	}
	return rep, err
}

func (l *leaderSession) removeStep(ctx context.Context, opID string, shard, replica uint64) error {
	cfg := &l.r.cfg.Scheduler
	sctx, cancel := context.WithTimeout(ctx, cfg.StepTimeout)
	defer cancel()
	var store string
	if err := l.mutate(sctx, "", func(v *projections.State) ([]events.Payload, error) {
		sh := v.Shards[shard]
		store = sh.Members[replica]
		return []events.Payload{events.ShardReplicaRemoving{Shard: shard, Replica: replica, Store: store, CCID: sh.CCID, Op: opID}}, nil
	}); err != nil {
		return err
	}
	for {
		st, err := l.executor(l.r.proj.View(), shard, replica)
		if err != nil {
			return err
		}
		rep, err := l.exec(sctx, st, client.ExecRequest{Op: client.ExecRemove, Shard: shard, Replica: replica})
		if err != nil {
			return err
		}
		l.logger.Info().Str("op", opID).Uint64("shard", shard).Uint64("replica", replica).Str("executor", st).Str("outcome", rep.Outcome).Uint64("ccid", rep.CCID).Msg("remove replica")
		switch rep.Outcome {
		case client.OutcomeApplied:
			return l.recordRemoved(sctx, opID, shard, replica, store, rep.CCID)
		case client.OutcomeRejected, client.OutcomeUnknown:
			// Re-read: the change may have applied (or been applied before).
			m, err := l.membership(sctx, shard, replica)
			if err == nil {
				if _, still := m.Replicas[replica]; !still {
					return l.recordRemoved(sctx, opID, shard, replica, store, m.CCID)
				}
			}
			if rep.Outcome == client.OutcomeRejected {
				return fmt.Errorf("%w: remove replica %d of shard %d rejected: %s", errStep, replica, shard, rep.Error)
			}
		}
		select {
		case <-sctx.Done():
			return fmt.Errorf("%w: remove replica %d of shard %d: %s within %s (%s)", errStep, replica, shard, rep.Outcome, cfg.StepTimeout, rep.Error)
		case <-l.r.cfg.Clock.After(cfg.Interval):
		}
	}
}

func (l *leaderSession) recordRemoved(ctx context.Context, opID string, shard, replica uint64, store string, ccid uint64) error {
	err := l.mutate(ctx, "", func(*projections.State) ([]events.Payload, error) {
		return []events.Payload{events.ShardReplicaRemoved{Shard: shard, Replica: replica, Store: store, CCID: ccid, Op: opID}}, nil
	})
	return err
}

func (l *leaderSession) addStep(ctx context.Context, opID string, shard uint64, target string) error {
	cfg := &l.r.cfg.Scheduler
	var replica uint64
	var addr string
	if err := l.mutate(ctx, "", func(v *projections.State) ([]events.Payload, error) {
		sh := v.Shards[shard]
		for r := range sh.Members {
			replica = max(replica, r)
		}
		for r := range sh.Removed {
			replica = max(replica, r)
		}
		for r := range sh.Pending {
			replica = max(replica, r)
		}
		replica++
		addr = v.Stores[target].RaftAddr
		return []events.Payload{events.ShardReplicaAdding{Shard: shard, Replica: replica, Store: target, CCID: sh.CCID, Op: opID}}, nil
	}); err != nil {
		return err
	}
	if err := l.r.cfg.Failpoints.Hit(ctx, FPOperatorBeforeAdd); err != nil {
		return err
	}
	for {
		st, err := l.executor(l.r.proj.View(), shard, 0)
		if err != nil {
			return err
		}
		rep, err := l.exec(ctx, st, client.ExecRequest{Op: client.ExecAdd, Shard: shard, Replica: replica, Addr: addr})
		if err != nil {
			return err
		}
		l.logger.Info().Str("op", opID).Uint64("shard", shard).Uint64("replica", replica).Str("store", target).Str("executor", st).Str("outcome", rep.Outcome).Uint64("ccid", rep.CCID).Msg("add replica")
		switch rep.Outcome {
		case client.OutcomeApplied:
			return l.recordAdded(ctx, opID, shard, replica, target, rep.CCID)
		case client.OutcomeRejected, client.OutcomeUnknown:
			m, err := l.membership(ctx, shard, 0)
			if err == nil {
				if a, ok := m.Replicas[replica]; ok && a == addr {
					return l.recordAdded(ctx, opID, shard, replica, target, m.CCID)
				}
			}
			if rep.Outcome == client.OutcomeRejected {
				return fmt.Errorf("%w: add replica %d of shard %d on %s rejected: %s", errStep, replica, shard, target, rep.Error)
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w: add replica %d of shard %d: %s within %s (%s)", errStep, replica, shard, rep.Outcome, cfg.StepTimeout, rep.Error)
		case <-l.r.cfg.Clock.After(cfg.Interval):
		}
	}
}

func (l *leaderSession) recordAdded(ctx context.Context, opID string, shard, replica uint64, store string, ccid uint64) error {
	err := l.mutate(ctx, "", func(*projections.State) ([]events.Payload, error) {
		return []events.Payload{events.ShardReplicaAdded{Shard: shard, Replica: replica, Store: store, CCID: ccid, Op: opID}}, nil
	})
	return err
}

// Health reports every shard's health (leader only; nil when following).
func (r *Replica) Health() []ShardHealth {
	r.mu.Lock()
	l := r.leader
	r.mu.Unlock()
	if l == nil {
		return nil
	}
	return l.health()
}

func (l *leaderSession) health() []ShardHealth {
	v := l.r.proj.View()
	now := l.r.cfg.Clock.Now()
	l.sched.mu.Lock()
	defer l.sched.mu.Unlock()
	running := map[string]map[uint64]uint64{} // store -> shard -> replica running
	zombies := map[uint64][]string{}
	for st, seen := range l.sched.stores {
		if now.Sub(seen.at) > l.r.cfg.Scheduler.StoreTimeout {
			continue
		}
		running[st] = map[uint64]uint64{}
		for _, rep := range seen.report.Shards {
			running[st][rep.Shard] = rep.Replica
		}
		for _, z := range seen.report.Skipped {
			zombies[z.Shard] = append(zombies[z.Shard], fmt.Sprintf("%d@%s", z.Replica, st))
		}
	}
	var out []ShardHealth
	for _, sh := range v.ListShards() {
		h := ShardHealth{Shard: sh.ID, Expected: l.r.cfg.Scheduler.Replicas, Members: sh.Members, Leader: sh.Leader, Operator: sh.Operator, Zombies: zombies[sh.ID], LastError: l.sched.lastError[sh.ID]}
		for r, st := range sh.Members {
			if running[st][sh.ID] == r {
				h.Live++
			}
		}
		h.Healthy = h.Live >= h.Expected && len(sh.Members) >= h.Expected && h.Operator == ""
		out = append(out, h)
	}
	return out
}
