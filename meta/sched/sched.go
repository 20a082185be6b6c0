// Package sched holds the shard scheduler's decisions as pure functions:
// the projected state, the stores' latest reports, the outcomes of the
// config changes it asked for, the scheduler's own memory and now in; the
// events to append, the config changes to execute, the next memory and the
// health of every shard out. No clock reads, locks, I/O, goroutines or
// logging (like projections and logstore.Plan): meta's scheduler loop
// gathers the inputs, calls Decide, appends its events with the fence, and
// runs its execs.
//
// The three rules every config change obeys:
//
//  1. Quorum: a change is proposed only when the shard's current membership
//     has a quorum of replicas reported running by live stores and the
//     membership after it still has one. Otherwise nothing is proposed and
//     the shard is recorded as blocked, with the reason, once
//     (shard.blocked). A store that stops heartbeating to meta may still be
//     serving Raft: silence is not death, and a replica on a silent store
//     never counts as running.
//  2. Fencing: every change names its term, its operator and the seq of its
//     intent event; the executing store checks them against its own
//     projection (client.CheckExec). Decide emits a change only for an
//     intent of a running operator of this term.
//  3. Raft is the truth for its own membership: a membership Raft reports
//     with a newer config change id is recorded (shard.observed) before
//     anything else is planned on the shard; an inherited operator, or a
//     step that did not apply, is failed only after a fresh membership read
//     from a live member, recorded in the same append, so every intent
//     resolves to what Raft actually did. A step that sent its change is
//     failed only once Raft can no longer apply it: after its intent was
//     given up in Raft (client.ExecGiveUp: a fence at the intent's config
//     change id; see intent).
package sched

import (
	"fmt"
	"maps"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// Config is the scheduler's configuration. Defaults fills the zero fields.
type Config struct {
	Shards       int           // shards to keep (0: bootstrap none)
	Replicas     int           // replicas per shard, default 3
	StoreTimeout time.Duration // a store silent this long is down, default 10s
	StepTimeout  time.Duration // bound of one operator step, default 10s
	Backoff      time.Duration // wait after a failed operator, doubled per failure, default 1s
	BackoffMax   time.Duration // cap of that wait, default 2m
	LeaderEvery  time.Duration // at most one leader-only shard.observed per shard this often, default 1s
	Retry        time.Duration // pause before a step is retried or re-read after a failure, default 250ms
	// Fresh is how recent a store's report must be for its replicas to
	// count as running in the quorum rule, default StoreTimeout/2. A
	// store is marked down only after StoreTimeout, so without it a store
	// that died a moment before another was marked down would still count
	// for the membership after removing the other one.
	Fresh time.Duration
	// LostQuorumAfter is how long a shard may have fewer members running
	// on live stores than a quorum before its health says lost-quorum
	// (and names the runbook's recovery), default 3*StoreTimeout. A new
	// leader counts from its first decision.
	LostQuorumAfter time.Duration
}

// Defaults returns c with every zero field set to its default.
func (c Config) Defaults() Config {
	if c.Replicas <= 0 {
		c.Replicas = 3
	}
	if c.StoreTimeout <= 0 {
		c.StoreTimeout = 10 * time.Second
	}
	if c.StepTimeout <= 0 {
		c.StepTimeout = 10 * time.Second
	}
	if c.Backoff <= 0 {
		c.Backoff = time.Second
	}
	if c.BackoffMax <= 0 {
		c.BackoffMax = 2 * time.Minute
	}
	if c.BackoffMax < c.Backoff {
		c.BackoffMax = c.Backoff
	}
	if c.LeaderEvery <= 0 {
		c.LeaderEvery = time.Second
	}
	if c.Retry <= 0 {
		c.Retry = 250 * time.Millisecond
	}
	if c.Fresh <= 0 || c.Fresh > c.StoreTimeout {
		c.Fresh = c.StoreTimeout / 2
	}
	if c.LostQuorumAfter <= 0 {
		c.LostQuorumAfter = 3 * c.StoreTimeout
	}
	return c
}

// Report is what the leader last heard from one store: its registration or
// its latest heartbeat.
type Report struct {
	Incarnation string
	Started     time.Time // the process's start, as it says (its clock)
	At          time.Time // when it arrived (the leader's clock)
	Shards      []client.ShardReport
	Skipped     []client.SkippedReplica
}

// Exec is one request to a store's executor.
type Exec struct {
	Store    string
	Req      client.ExecRequest
	Deadline time.Time // the request's bound: the end of its step
}

func (e Exec) String() string {
	s := fmt.Sprintf("%s shard=%d", e.Req.Op, e.Req.Shard)
	if e.Req.Replica != 0 {
		s += fmt.Sprintf(" replica=%d", e.Req.Replica)
	}
	if e.Req.Addr != "" {
		s += " addr=" + e.Req.Addr
	}
	if e.Req.Operator != "" {
		s += fmt.Sprintf(" op=%s term=%d intent=%d", e.Req.Operator, e.Req.Term, e.Req.Intent)
	}
	return s + " on " + e.Store
}

// Result is an Exec's outcome. A request that got no reply (transport
// error, timeout) is OutcomeUnknown with the error.
type Result struct {
	Exec  Exec
	Reply client.ExecReply
	At    time.Time
}

// shardMem is the scheduler's memory of one shard within a term.
type shardMem struct {
	inFlight  bool      // an exec was emitted and its result is not in
	result    *Result   // the last change's result for the current step
	read      *Result   // the last membership read, not yet used
	step      string    // what stepSince times: an intent seq or a wait
	stepSince time.Time // when Decide first saw the step
	failures  int       // operators failed in a row
	notBefore time.Time // no new operator before (backoff)
	leaderAt  time.Time // last leader-only shard.observed
	sent      bool      // the current step's change was sent since the last read
	waitUntil time.Time // the current step sends nothing before (paces retries)
	lastErr   string
	// The current step's fence in Raft (see intent): touched, a change
	// was sent in it; failWhy, the failure waiting for its give-up's
	// answer; giveUp, that answer, not yet used.
	touched bool
	failWhy string
	giveUp  *Result
	// shortSince is when the health first saw fewer members running on
	// live stores than a quorum, without a break since (zero: not short).
	shortSince time.Time
}

// Memory is the scheduler's memory within one term: what is in flight, the
// results not yet acted on, step clocks, backoff. It is a value: Decide and
// WithResult return a new one and never change theirs. A new leader starts
// from the zero Memory.
type Memory struct {
	shards    map[uint64]shardMem
	firstSeen map[string]time.Time // stores this leader has no report of yet
}

func (m Memory) clone() Memory {
	return Memory{shards: maps.Clone(m.shards), firstSeen: maps.Clone(m.firstSeen)}
}

func (m *Memory) shard(id uint64) shardMem { return m.shards[id] }

func (m *Memory) set(id uint64, s shardMem) {
	if m.shards == nil {
		m.shards = map[uint64]shardMem{}
	}
	m.shards[id] = s
}

// WithResult records an exec's result for the next Decide.
func (m Memory) WithResult(r Result) Memory {
	n := m.clone()
	s := n.shard(r.Exec.Req.Shard)
	s.inFlight = false
	rr := r
	switch r.Exec.Req.Op {
	case client.ExecMembership:
		s.read = &rr
	case client.ExecGiveUp:
		s.giveUp = &rr
	default:
		s.result = &rr
	}
	n.set(r.Exec.Req.Shard, s)
	return n
}

// Input is everything a decision depends on.
type Input struct {
	View    *projections.State // the projected state (read only)
	Reports map[string]Report  // by store id
	Memory  Memory
	Now     time.Time
	Term    uint64 // the deciding leader's term
	Config  Config // with Defaults applied
}

// Output is a decision.
type Output struct {
	Events []events.Payload // one fenced append, in order
	Execs  []Exec           // to send once Events are stored
	Memory Memory           // the next memory, once Events are stored
	Health Health
}

// Decide makes one scheduling pass. Run it again right after its events are
// stored (a pass plans one step per shard), and whenever a result comes in
// or time passes.
func Decide(in Input) Output {
	in.Config = in.Config.Defaults()
	d := &decider{in: in, mem: in.Memory.clone(), v: in.View}
	if d.v == nil {
		d.v = projections.New()
	}
	d.live = map[string]bool{}
	for _, st := range d.v.ListStores() {
		d.live[st.ID] = d.isLive(st)
	}
	if evs := d.storeStates(); len(evs) > 0 {
		return d.output(evs, nil)
	}
	if evs := d.bootstrap(); len(evs) > 0 {
		return d.output(evs, nil)
	}
	var evs []events.Payload
	var execs []Exec
	for _, id := range sortedIDs(d.v.Shards) {
		sh := d.v.Shards[id]
		e, x := d.shard(sh)
		if sh.Blocked != "" && progress(e, x) {
			e = append(e, events.ShardBlocked{Shard: id, Reason: ""})
		}
		evs = append(evs, e...)
		execs = append(execs, x...)
	}
	return d.output(evs, execs)
}

// progress: the shard's decision moves it on (events other than a block,
// or a config change sent), so a recorded block is over.
func progress(evs []events.Payload, execs []Exec) bool {
	for _, e := range evs {
		switch e.(type) {
		case events.ShardBlocked, events.OperatorStarted, events.OperatorFailed:
			return false // a new block, the fold clears it, or a re-plan follows
		case events.ShardObserved:
			// Raft moved (a leader change, a membership): the next pass
			// decides again, and clears the block only if it is over (a
			// leader change on a blocked shard costs one event, not three).
			return false
		}
	}
	if len(evs) > 0 {
		return true
	}
	for _, x := range execs {
		if x.Req.Op != client.ExecMembership && x.Req.Op != client.ExecGiveUp {
			return true
		}
	}
	return false
}

type decider struct {
	in   Input
	v    *projections.State
	mem  Memory
	live map[string]bool
}

func (d *decider) output(evs []events.Payload, execs []Exec) Output {
	for _, x := range execs {
		s := d.mem.shard(x.Req.Shard)
		s.inFlight = true
		switch x.Req.Op {
		case client.ExecMembership:
			s.read = nil
		case client.ExecGiveUp:
			s.giveUp = nil
		default:
			s.result = nil
		}
		d.mem.set(x.Req.Shard, s)
	}
	h := d.health() // it keeps the shards' quorum clocks in d.mem
	return Output{Events: evs, Execs: execs, Memory: d.mem, Health: h}
}

// isLive: the store heartbeats (this incarnation, within the store
// timeout) and is not down or a tombstone.
func (d *decider) isLive(st projections.Store) bool {
	if st.State == events.StoreDown || st.State == events.StoreTombstone {
		return false
	}
	return d.reporting(st)
}

// reporting: the store's registered process reports (its incarnation,
// within the store timeout) and has not announced its own stop: the
// reports of a process that said it stops count for nothing, however
// recent.
func (d *decider) reporting(st projections.Store) bool {
	rep, ok := d.in.Reports[st.ID]
	return ok && rep.Incarnation == st.Incarnation && !st.PlannedStop() && d.in.Now.Sub(rep.At) <= d.in.Config.StoreTimeout
}

// unheard: a store this leader has no report of, first seen less than a
// store timeout ago (a new leader gives every store a full timeout).
func (d *decider) unheard(store string) bool {
	if _, ok := d.in.Reports[store]; ok {
		return false
	}
	at, ok := d.mem.firstSeen[store]
	return !ok || d.in.Now.Sub(at) <= d.in.Config.StoreTimeout
}

// storeStates marks silent stores down (not while draining until a
// deadline) and heartbeating down stores up.
func (d *decider) storeStates() []events.Payload {
	var out []events.Payload
	for _, st := range d.v.ListStores() {
		if st.State == events.StoreTombstone {
			continue
		}
		if _, ok := d.in.Reports[st.ID]; !ok {
			if _, seen := d.mem.firstSeen[st.ID]; !seen {
				if d.mem.firstSeen == nil {
					d.mem.firstSeen = map[string]time.Time{}
				}
				d.mem.firstSeen[st.ID] = d.in.Now
			}
		}
		switch {
		case st.State == events.StoreDown:
			if d.reporting(st) {
				out = append(out, events.StoreState{Store: st.ID, State: events.StoreUp})
			}
		case st.State == events.StoreDraining && d.reporting(st) && (!d.in.Now.Before(st.Until) || (st.Incarnation != st.DrainedBy && d.runsAll(st.ID))):
			// A drain ends when the store is back (another incarnation
			// than the one that drained) with every replica assigned to
			// it running, or at its deadline.
			out = append(out, events.StoreState{Store: st.ID, State: events.StoreUp})
		case st.State == events.StoreDraining && d.in.Now.Before(st.Until):
		case d.unheard(st.ID) || d.reporting(st):
		default:
			out = append(out, events.StoreState{Store: st.ID, State: events.StoreDown})
		}
	}
	return out
}

// runsAll reports whether store reports every replica the projection
// assigns to it running.
func (d *decider) runsAll(store string) bool {
	running := map[projections.ReplicaRef]bool{}
	for _, r := range d.in.Reports[store].Shards {
		running[projections.ReplicaRef{Shard: r.Shard, Replica: r.Replica}] = true
	}
	members, _ := d.v.ReplicasOn(store)
	for _, ref := range members {
		if !running[ref] {
			return false
		}
	}
	return true
}

// bootstrap creates the next shard while there are fewer than wanted and
// enough live up stores.
func (d *decider) bootstrap() []events.Payload {
	cfg := d.in.Config
	if len(d.v.Shards) >= cfg.Shards {
		return nil
	}
	var live []string
	for _, st := range d.v.ListStores() {
		if d.live[st.ID] && st.State == events.StoreUp {
			live = append(live, st.ID)
		}
	}
	if len(live) < cfg.Replicas {
		return nil
	}
	load := storeLoad(d.v)
	sort.SliceStable(live, func(i, j int) bool { return load[live[i]] < load[live[j]] })
	var next uint64
	for id := range d.v.Shards {
		next = max(next, id)
	}
	reps := map[uint64]string{}
	for i := range cfg.Replicas {
		reps[uint64(i+1)] = live[i]
	}
	return []events.Payload{events.ShardCreated{Shard: next + 1, Replicas: reps}}
}

// shardView is what the stores report of one shard.
type shardView struct {
	running map[uint64]bool     // members running on live stores
	raft    *client.ShardReport // newest membership reported by a live member store (highest ccid)
	leader  *client.ShardReport // report with the highest Raft term
	zombies []string            // replica@store the stores refused to start
	unheard []string            // member stores not heard of yet this term
	addrs   map[string]string   // raft address -> store
}

func (d *decider) see(sh *projections.Shard) shardView {
	sv := shardView{running: map[uint64]bool{}, addrs: map[string]string{}}
	for _, st := range d.v.ListStores() {
		if st.State != events.StoreTombstone {
			sv.addrs[st.RaftAddr] = st.ID
		}
	}
	for _, store := range slices.Sorted(maps.Keys(d.in.Reports)) {
		rep := d.in.Reports[store]
		for _, z := range rep.Skipped {
			if z.Shard == sh.ID {
				sv.zombies = append(sv.zombies, fmt.Sprintf("%d@%s", z.Replica, store))
			}
		}
		if !d.live[store] || d.in.Now.Sub(rep.At) > d.in.Config.Fresh {
			continue
		}
		for i := range rep.Shards {
			r := rep.Shards[i]
			if r.Shard != sh.ID || sh.Members[r.Replica] != store {
				continue
			}
			sv.running[r.Replica] = true
			if len(r.Replicas) > 0 && (sv.raft == nil || r.CCID > sv.raft.CCID) {
				sv.raft = &r
			}
			if r.Leader != 0 && (sv.leader == nil || r.Term > sv.leader.Term) {
				sv.leader = &r
			}
		}
	}
	for _, r := range sortedIDs(sh.Members) {
		st := d.v.Stores[sh.Members[r]]
		if st != nil && st.State != events.StoreDown && st.State != events.StoreTombstone && d.unheard(st.ID) {
			sv.unheard = append(sv.unheard, st.ID)
		}
	}
	return sv
}

// observed builds shard.observed from a membership {replica: raft address}
// Raft reported, when it is newer than the projection's.
func (d *decider) observed(sh *projections.Shard, sv shardView, ccid uint64, replicas map[uint64]string, leader uint64) (events.Payload, string) {
	if ccid <= sh.CCID || len(replicas) == 0 {
		return nil, ""
	}
	if _, ok := replicas[leader]; !ok {
		leader = 0
		if sv.leader != nil {
			if _, ok := replicas[sv.leader.Leader]; ok {
				leader = sv.leader.Leader
			}
		}
	}
	reps := map[uint64]string{}
	for _, r := range sortedIDs(replicas) {
		st, ok := sv.addrs[replicas[r]]
		if !ok {
			return nil, fmt.Sprintf("raft membership names replica %d at %s, an address no store is registered at", r, replicas[r])
		}
		reps[r] = st
	}
	return events.ShardObserved{Shard: sh.ID, CCID: ccid, Replicas: reps, Leader: leader}, ""
}

func quorum(n int) int { return n/2 + 1 }

// quorumRule checks rule 1 for a change from the projected membership to
// after (replica ids); it returns the refusal, or "".
func quorumRule(sh *projections.Shard, sv shardView, change string, after []uint64) string {
	before := 0
	for r := range sh.Members {
		if sv.running[r] {
			before++
		}
	}
	if need := quorum(len(sh.Members)); before < need {
		return fmt.Sprintf("no quorum: %d of %d replicas running on live stores, a change needs %d", before, len(sh.Members), need)
	}
	if len(sh.Members) == 1 && len(after) == 2 {
		// A one-member shard (after an operator's recovery) grows only
		// through two members: the one member commits the add alone, and
		// the joining replica catches up from it.
		return ""
	}
	n := 0
	for _, r := range after {
		if sv.running[r] {
			n++
		}
	}
	if need := quorum(len(after)); n < need {
		return fmt.Sprintf("no quorum after %s: %d of %d replicas would run on live stores, quorum is %d", change, n, len(after), need)
	}
	return ""
}

func without(m map[uint64]string, r uint64) []uint64 {
	var out []uint64
	for _, id := range sortedIDs(m) {
		if id != r {
			out = append(out, id)
		}
	}
	return out
}

func with(m map[uint64]string, r uint64) []uint64 {
	return append(sortedIDs(m), r)
}

// executor picks a live member store to run a change or a read: the Raft
// leader's store when it runs there, else the lowest running replica's;
// never the store of replica avoid.
func (d *decider) executor(sh *projections.Shard, sv shardView, avoid uint64) string {
	if sv.leader != nil && sv.leader.Leader != avoid {
		if sv.running[sv.leader.Leader] {
			return sh.Members[sv.leader.Leader]
		}
	}
	for _, r := range sortedIDs(sh.Members) {
		if r != avoid && sv.running[r] {
			return sh.Members[r]
		}
	}
	return ""
}

// step starts or continues the clock of the shard's current step and
// reports whether its deadline passed.
func (d *decider) step(id uint64, s *shardMem, key string) (deadline time.Time, expired bool) {
	if s.step != key {
		s.step, s.stepSince, s.result, s.read, s.sent, s.waitUntil = key, d.in.Now, nil, nil, false, time.Time{}
		s.touched, s.failWhy, s.giveUp = false, "", nil
	}
	deadline = s.stepSince.Add(d.in.Config.StepTimeout)
	return deadline, !d.in.Now.Before(deadline)
}

// execDeadline is the deadline of a request sent now in a step ending at
// deadline: at least a second, so a late retry still has time to run.
func (d *decider) execDeadline(deadline time.Time) time.Time {
	if floor := d.in.Now.Add(time.Second); deadline.Before(floor) {
		return floor
	}
	return deadline
}

// block records the shard as blocked for reason (once per reason).
func block(sh *projections.Shard, reason string) []events.Payload {
	if sh.Blocked == reason {
		return nil
	}
	return []events.Payload{events.ShardBlocked{Shard: sh.ID, Reason: reason}}
}

// freshRead returns the successful membership read in s, if any; a failed
// one is dropped and the next read paced. ok is false while there is none.
func (d *decider) freshRead(sh *projections.Shard, sv shardView, s *shardMem, deadline time.Time) (*Result, []events.Payload, []Exec) {
	if r := s.read; r != nil {
		s.read = nil
		if r.Reply.Outcome == client.OutcomeApplied {
			return r, nil, nil
		}
		s.lastErr = "membership unreadable: " + r.Reply.Error
		s.waitUntil = d.in.Now.Add(d.in.Config.Retry)
	}
	if d.in.Now.Before(s.waitUntil) {
		d.mem.set(sh.ID, *s)
		return nil, nil, nil
	}
	evs, execs := d.read(sh, sv, *s, deadline)
	return nil, evs, execs
}

func (d *decider) read(sh *projections.Shard, sv shardView, s shardMem, deadline time.Time) ([]events.Payload, []Exec) {
	st := d.executor(sh, sv, 0)
	if st == "" {
		return block(sh, "membership unreadable: no member runs on a live store"), nil
	}
	d.mem.set(sh.ID, s)
	return nil, []Exec{{Store: st, Req: client.ExecRequest{Op: client.ExecMembership, Shard: sh.ID}, Deadline: d.execDeadline(deadline)}}
}

// shard decides one step for one shard.
func (d *decider) shard(sh *projections.Shard) ([]events.Payload, []Exec) {
	s := d.mem.shard(sh.ID)
	if s.inFlight {
		return nil, nil
	}
	sv := d.see(sh)
	// Rule 3: Raft moved on; the stream catches up first.
	if sv.raft != nil && sv.raft.CCID > sh.CCID {
		ev, bad := d.observed(sh, sv, sv.raft.CCID, sv.raft.Replicas, sv.raft.Leader)
		if ev != nil {
			return []events.Payload{ev}, nil
		}
		return block(sh, bad), nil
	}
	if len(sv.unheard) > 0 {
		return nil, nil // a new leader waits for its member stores' first word
	}
	if sh.Operator != "" {
		if op := d.v.Operators[sh.Operator]; op != nil {
			return d.operator(sh, op, sv, s)
		}
	}
	if len(sh.Pending) > 0 {
		// Intents no running operator owns: resolve them against Raft.
		return d.orphans(sh, sv, s)
	}
	if evs := d.leader(sh, sv, &s); len(evs) > 0 {
		d.mem.set(sh.ID, s)
		return evs, nil
	}
	return d.repair(sh, sv, s)
}

// leader records a Raft leader change at an unchanged membership, at most
// once per LeaderEvery per shard.
func (d *decider) leader(sh *projections.Shard, sv shardView, s *shardMem) []events.Payload {
	if sv.leader == nil || sv.leader.CCID != sh.CCID || sv.leader.Leader == sh.Leader || !sh.IsMember(sv.leader.Leader) {
		return nil
	}
	if !s.leaderAt.IsZero() && d.in.Now.Sub(s.leaderAt) < d.in.Config.LeaderEvery {
		return nil
	}
	s.leaderAt = d.in.Now
	return []events.Payload{events.ShardObserved{Shard: sh.ID, CCID: sh.CCID, Replicas: maps.Clone(sh.Members), Leader: sv.leader.Leader}}
}

func (d *decider) orphans(sh *projections.Shard, sv shardView, s shardMem) ([]events.Payload, []Exec) {
	deadline, _ := d.step(sh.ID, &s, "orphans")
	r, evs, execs := d.freshRead(sh, sv, &s, deadline)
	if r == nil {
		return evs, execs
	}
	d.mem.set(sh.ID, s)
	ev, bad := d.observed(sh, sv, r.Reply.CCID, r.Reply.Replicas, 0)
	if ev != nil {
		return []events.Payload{ev}, nil
	}
	if bad != "" {
		return block(sh, bad), nil
	}
	return block(sh, fmt.Sprintf("intents without an operator: %s", pendingList(sh))), nil
}

// fail ends op as failed, after the fresh read r (recorded first when it is
// newer), and backs the shard off.
func (d *decider) fail(sh *projections.Shard, op *projections.Operator, sv shardView, s shardMem, r *Result, reason string, backoff bool) []events.Payload {
	var out []events.Payload
	if r != nil {
		if ev, _ := d.observed(sh, sv, r.Reply.CCID, r.Reply.Replicas, 0); ev != nil {
			out = append(out, ev)
		}
	}
	out = append(out, events.OperatorFailed{Op: op.ID, Shard: sh.ID, Reason: reason})
	s.result, s.read, s.step, s.sent = nil, nil, "", false
	s.touched, s.failWhy, s.giveUp = false, "", nil
	s.lastErr = reason
	if backoff {
		s.failures++
		wait := d.in.Config.Backoff
		for i := 1; i < s.failures && wait < d.in.Config.BackoffMax; i++ {
			wait *= 2
		}
		s.notBefore = d.in.Now.Add(min(wait, d.in.Config.BackoffMax))
	}
	d.mem.set(sh.ID, s)
	return out
}

func (d *decider) operator(sh *projections.Shard, op *projections.Operator, sv shardView, s shardMem) ([]events.Payload, []Exec) {
	if op.Term != d.in.Term {
		// Inherited: nobody drives it any more. Fail it only after
		// reading what Raft did with its intents.
		deadline, _ := d.step(sh.ID, &s, "inherited "+op.ID)
		reason := fmt.Sprintf("abandoned by a leader change (term %d -> %d)", op.Term, d.in.Term)
		if seq, r, p, ok := intentOf(sh, op.ID); ok && p.CCID != 0 {
			// The old leader's change may still be on its way to Raft:
			// give the intent up there first.
			return d.giveUpInherited(sh, op, sv, s, seq, r, p, deadline, reason)
		}
		read, evs, execs := d.freshRead(sh, sv, &s, deadline)
		if read == nil {
			return evs, execs
		}
		return d.fail(sh, op, sv, s, read, reason, false), nil
	}
	if seq, r, p, ok := intentOf(sh, op.ID); ok {
		return d.intent(sh, op, sv, s, seq, r, p)
	}
	// The next step of the plan.
	if op.Remove != 0 && sh.IsMember(op.Remove) {
		st := sh.Members[op.Remove]
		return []events.Payload{events.ShardReplicaRemoving{Shard: sh.ID, Replica: op.Remove, Store: st, CCID: sh.CCID, Op: op.ID}}, nil
	}
	if op.Add != "" && !holds(sh, op.Add) {
		_, expired := d.step(sh.ID, &s, "add on "+op.Add)
		store := d.v.Stores[op.Add]
		if store == nil || !d.live[op.Add] || store.State != events.StoreUp {
			if expired {
				return d.fail(sh, op, sv, s, nil, fmt.Sprintf("store %s not live within the step timeout (%s)", op.Add, d.in.Config.StepTimeout), true), nil
			}
			d.mem.set(sh.ID, s)
			return nil, nil
		}
		id := sh.MaxReplica + 1
		if why := quorumRule(sh, sv, fmt.Sprintf("adding replica %d", id), with(sh.Members, id)); why != "" {
			if expired {
				return d.fail(sh, op, sv, s, nil, why, true), nil
			}
			d.mem.set(sh.ID, s)
			return block(sh, why), nil
		}
		d.mem.set(sh.ID, s)
		return []events.Payload{events.ShardReplicaAdding{Shard: sh.ID, Replica: id, Store: op.Add, CCID: sh.CCID, Op: op.ID}}, nil
	}
	s.failures, s.notBefore, s.result, s.read, s.step, s.lastErr = 0, time.Time{}, nil, nil, "", ""
	d.mem.set(sh.ID, s)
	return []events.Payload{events.OperatorFinished{Op: op.ID, Shard: sh.ID}}, nil
}

// intentOf returns op's first pending intent.
func intentOf(sh *projections.Shard, op string) (uint64, uint64, projections.Pending, bool) {
	var (
		best uint64
		rep  uint64
		pend projections.Pending
	)
	for _, r := range sortedIDs(sh.Pending) {
		p := sh.Pending[r]
		if p.Op == op && (best == 0 || p.Seq < best) {
			best, rep, pend = p.Seq, r, p
		}
	}
	return best, rep, pend, best != 0
}

func holds(sh *projections.Shard, store string) bool {
	for _, st := range sh.Members {
		if st == store {
			return true
		}
	}
	return false
}

// visible reports whether membership replicas shows intent p of replica r
// applied.
func visible(d *decider, p projections.Pending, r uint64, replicas map[uint64]string) bool {
	addr, member := replicas[r]
	if p.Kind == projections.PendingRemoving {
		return !member
	}
	st := d.v.Stores[p.Store]
	return member && st != nil && st.RaftAddr == addr
}

func outcome(sh *projections.Shard, op string, r uint64, p projections.Pending, ccid uint64, note string) events.Payload {
	c := events.ReplicaChange{Shard: sh.ID, Replica: r, Store: p.Store, CCID: ccid, Op: op, Note: note}
	if p.Kind == projections.PendingRemoving {
		return events.ShardReplicaRemoved(c)
	}
	return events.ShardReplicaAdded(c)
}

// intent carries out a recorded intent: send it, read its result, record
// its outcome, or fail the operator. An operator whose step sent anything
// is failed only after a membership read taken after the last send (rule
// 3): until one succeeds the intent stays pending and the shard waits.
//
// A read is not enough once a change was sent: a proposal in flight, or an
// exec a store still holds, may commit after any read (bugLateExec). Every
// proposal of the intent names the intent's config change id (the store's
// executor proposes on it or not at all, and OrderedConfigChange applies a
// change only at the id it names), so the step's change can never apply
// once Raft's config change id has moved past it. Before failing a step
// that sent its change, the leader has a member store give the intent up
// in Raft (client.ExecGiveUp): the store proposes a config change that
// changes no member at that id, the fence. Fence applied: nothing of the
// step can apply any more, and the step fails naming the fence's index.
// Raft's id had moved already: the membership read with the answer says
// whether by the step's own change (its outcome is recorded) or not (the
// step fails). No answer: the give-up is sent again, nothing else is.
func (d *decider) intent(sh *projections.Shard, op *projections.Operator, sv shardView, s shardMem, seq, r uint64, p projections.Pending) ([]events.Payload, []Exec) {
	deadline, expired := d.step(sh.ID, &s, fmt.Sprintf("intent %d", seq))
	if g := s.giveUp; g != nil {
		s.giveUp = nil
		switch {
		case g.Reply.Outcome == client.OutcomeGivenUp:
			return d.fail(sh, op, sv, s, g, fmt.Sprintf("%s; given up in Raft: config change id %d fenced at index %d", s.failWhy, p.CCID, g.Reply.Index), true), nil
		case g.Reply.Outcome == client.OutcomeApplied && len(g.Reply.Replicas) > 0 && visible(d, p, r, g.Reply.Replicas):
			s.failWhy, s.result, s.sent = "", nil, false
			d.mem.set(sh.ID, s)
			note := fmt.Sprintf("applied before its step's give-up (config change id %d moved to %d)", p.CCID, g.Reply.CCID)
			return []events.Payload{outcome(sh, op.ID, r, p, max(g.Reply.CCID, sh.CCID), note)}, nil
		case g.Reply.Outcome == client.OutcomeApplied && len(g.Reply.Replicas) > 0 && g.Reply.CCID != p.CCID:
			return d.fail(sh, op, sv, s, g, fmt.Sprintf("%s; given up: Raft's config change id moved past %d (now %d) without it, so it can never apply", s.failWhy, p.CCID, g.Reply.CCID), true), nil
		default:
			s.lastErr = "give-up: " + lastError(g)
			s.waitUntil = d.in.Now.Add(d.in.Config.Retry)
		}
	}
	if s.failWhy != "" {
		// Giving up: nothing is sent, read or failed until Raft says
		// that nothing of the step can apply any more.
		if d.in.Now.Before(s.waitUntil) {
			d.mem.set(sh.ID, s)
			return nil, nil
		}
		return d.giveUpExec(sh, sv, s, op, seq, r, p, deadline)
	}
	if read := s.read; read != nil {
		s.read = nil
		if read.Reply.Outcome != client.OutcomeApplied {
			// Unreadable (no leader, no quorum): nothing can be failed
			// safely; read again, paced.
			s.lastErr = "membership unreadable: " + read.Reply.Error
			s.waitUntil = d.in.Now.Add(d.in.Config.Retry)
			d.mem.set(sh.ID, s)
			if expired {
				return block(sh, "membership unreadable from the live members"), nil
			}
			return nil, nil
		}
		if visible(d, p, r, read.Reply.Replicas) {
			s.result, s.sent = nil, false
			d.mem.set(sh.ID, s)
			return []events.Payload{outcome(sh, op.ID, r, p, max(read.Reply.CCID, sh.CCID), "")}, nil
		}
		if s.result != nil && s.result.Reply.Outcome == client.OutcomeRejected {
			return d.failStep(sh, op, sv, s, read, seq, r, p, deadline, fmt.Sprintf("%s replica %d rejected by raft: %s", p.Kind, r, s.result.Reply.Error))
		}
		if expired {
			return d.failStep(sh, op, sv, s, read, seq, r, p, deadline, fmt.Sprintf("%s replica %d: no outcome within the step timeout (%s): %s", p.Kind, r, d.in.Config.StepTimeout, lastError(s.result)))
		}
		// Not applied, not rejected: it may be sent again, paced.
		s.result, s.sent = nil, false
		s.waitUntil = d.in.Now.Add(d.in.Config.Retry)
		d.mem.set(sh.ID, s)
		return nil, nil
	}
	if d.in.Now.Before(s.waitUntil) {
		d.mem.set(sh.ID, s)
		return nil, nil
	}
	if res := s.result; res != nil {
		if res.Reply.Outcome == client.OutcomeApplied {
			s.result, s.sent = nil, false
			d.mem.set(sh.ID, s)
			return []events.Payload{outcome(sh, op.ID, r, p, max(res.Reply.CCID, sh.CCID), "")}, nil
		}
		// Rejected, unknown, retry, refused, error: what did Raft do?
		s.lastErr = lastError(res)
		return d.read(sh, sv, s, deadline)
	}
	if s.sent {
		// Sent, no result kept (a leader's memory is fresh): read first.
		return d.read(sh, sv, s, deadline)
	}
	// Send it, if the quorum rule allows.
	var why string
	req := client.ExecRequest{Shard: sh.ID, Replica: r, Term: d.in.Term, Operator: op.ID, Intent: seq, CCID: p.CCID}
	if p.Kind == projections.PendingRemoving {
		req.Op = client.ExecRemove
		why = quorumRule(sh, sv, fmt.Sprintf("removing replica %d", r), without(sh.Members, r))
	} else {
		req.Op = client.ExecAdd
		if st := d.v.Stores[p.Store]; st != nil {
			req.Addr = st.RaftAddr
		}
		why = quorumRule(sh, sv, fmt.Sprintf("adding replica %d", r), with(sh.Members, r))
	}
	st := d.executor(sh, sv, r)
	if why == "" && st == "" {
		why = "no member runs on a live store to execute the change"
	}
	if expired {
		if why == "" {
			why = fmt.Sprintf("%s replica %d: no outcome within the step timeout (%s): %s", p.Kind, r, d.in.Config.StepTimeout, s.lastErr)
		}
		// Nothing sent since the last read showed it not applied; a
		// change sent before it may still be in flight (failStep).
		return d.failStep(sh, op, sv, s, nil, seq, r, p, deadline, why)
	}
	if why != "" {
		d.mem.set(sh.ID, s)
		return block(sh, why), nil
	}
	s.sent, s.touched = true, true
	d.mem.set(sh.ID, s)
	return nil, []Exec{{Store: st, Req: req, Deadline: d.execDeadline(deadline)}}
}

// giveUpInherited fails an inherited operator with a pending intent once
// the intent was given up in Raft: the fence applied, or Raft's config
// change id had moved past the intent's (by its change or another); the
// membership of the answer is recorded first, so the intent resolves to
// what Raft did.
func (d *decider) giveUpInherited(sh *projections.Shard, op *projections.Operator, sv shardView, s shardMem, seq, r uint64, p projections.Pending, deadline time.Time, reason string) ([]events.Payload, []Exec) {
	if g := s.giveUp; g != nil {
		s.giveUp = nil
		switch {
		case g.Reply.Outcome == client.OutcomeGivenUp:
			return d.fail(sh, op, sv, s, g, fmt.Sprintf("%s; given up in Raft: config change id %d fenced at index %d", reason, p.CCID, g.Reply.Index), false), nil
		case g.Reply.Outcome == client.OutcomeApplied && len(g.Reply.Replicas) > 0 && g.Reply.CCID != p.CCID:
			return d.fail(sh, op, sv, s, g, fmt.Sprintf("%s; given up: Raft's config change id had moved past %d (now %d)", reason, p.CCID, g.Reply.CCID), false), nil
		}
		s.lastErr = "give-up: " + lastError(g)
		s.waitUntil = d.in.Now.Add(d.in.Config.Retry)
	}
	if d.in.Now.Before(s.waitUntil) {
		d.mem.set(sh.ID, s)
		return nil, nil
	}
	s.failWhy = reason
	return d.giveUpExec(sh, sv, s, op, seq, r, p, deadline)
}

// failStep fails op's step for reason, after the read r. A step that never
// sent its change fails at once; one that did may have a proposal in
// flight, so its intent is first given up in Raft (giveUpExec): the step
// fails once Raft's config change id has moved past the intent's.
func (d *decider) failStep(sh *projections.Shard, op *projections.Operator, sv shardView, s shardMem, r *Result, seq, replica uint64, p projections.Pending, deadline time.Time, reason string) ([]events.Payload, []Exec) {
	if !s.touched {
		return d.fail(sh, op, sv, s, r, reason, true), nil
	}
	s.failWhy, s.waitUntil = reason, time.Time{}
	return d.giveUpExec(sh, sv, s, op, seq, replica, p, deadline)
}

// giveUpExec sends the give-up of op's intent seq (replica, decided at
// config change id p.CCID) to a live member store, or records that none
// can take it.
func (d *decider) giveUpExec(sh *projections.Shard, sv shardView, s shardMem, op *projections.Operator, seq, replica uint64, p projections.Pending, deadline time.Time) ([]events.Payload, []Exec) {
	st := d.executor(sh, sv, 0)
	d.mem.set(sh.ID, s)
	if st == "" {
		return block(sh, fmt.Sprintf("cannot give up intent %d of %s in Raft: no member runs on a live store (%s)", seq, op.ID, s.failWhy)), nil
	}
	req := client.ExecRequest{Op: client.ExecGiveUp, Shard: sh.ID, Replica: replica, Term: d.in.Term, Operator: op.ID, Intent: seq, CCID: p.CCID}
	// Its own bound (the step's is over): a proposal and its commit, as
	// long as a step may take.
	return nil, []Exec{{Store: st, Req: req, Deadline: d.in.Now.Add(d.in.Config.StepTimeout)}}
}

func lastError(r *Result) string {
	if r == nil {
		return "nothing sent"
	}
	return strings.TrimSpace(r.Reply.Outcome + " " + r.Reply.Error)
}

// repair starts an operator on a shard with a member on a down store, or
// fewer members than wanted, when the rules allow; otherwise it records
// why it cannot (once).
func (d *decider) repair(sh *projections.Shard, sv shardView, s shardMem) ([]events.Payload, []Exec) {
	cfg := d.in.Config
	var stale uint64
	for _, r := range sortedIDs(sh.Members) {
		st := d.v.Stores[sh.Members[r]]
		if st == nil || st.State == events.StoreDown || st.State == events.StoreTombstone {
			stale = r
			break
		}
	}
	size := len(sh.Members)
	if stale == 0 && size > cfg.Replicas {
		// More members than wanted (an add whose outcome was never
		// recorded committed after all): remove one, a member that does
		// not run first.
		ids := sortedIDs(sh.Members)
		stale = ids[len(ids)-1]
		for _, r := range ids {
			if !sv.running[r] {
				stale = r
				break
			}
		}
	}
	if stale != 0 {
		size--
	}
	if stale == 0 && size >= cfg.Replicas {
		if sh.Blocked != "" {
			return block(sh, ""), nil
		}
		return nil, nil
	}
	if d.in.Now.Before(s.notBefore) {
		return nil, nil
	}
	target := ""
	if size < cfg.Replicas {
		target = d.pickTarget(sh)
	}
	var why string
	switch {
	case stale != 0:
		why = quorumRule(sh, sv, fmt.Sprintf("removing replica %d", stale), without(sh.Members, stale))
	case target == "":
		why = fmt.Sprintf("waiting for a live store without a replica of shard %d to add one on", sh.ID)
	default:
		why = quorumRule(sh, sv, "adding a replica", with(sh.Members, sh.MaxReplica+1))
	}
	if why != "" {
		return block(sh, why), nil
	}
	var steps []string
	if stale != 0 {
		steps = append(steps, fmt.Sprintf("remove replica %d from %s", stale, sh.Members[stale]))
	}
	if target != "" {
		steps = append(steps, "add a new replica on "+target)
	}
	opID := fmt.Sprintf("op-%d-%d", sh.ID, d.v.Seq+1)
	return []events.Payload{events.OperatorStarted{Op: opID, Shard: sh.ID, Steps: steps, Remove: stale, Add: target}}, nil
}

// pickTarget returns the least loaded live up store holding no replica of
// the shard (nor a pending one).
func (d *decider) pickTarget(sh *projections.Shard) string {
	held := map[string]bool{}
	for _, st := range sh.Members {
		held[st] = true
	}
	for _, p := range sh.Pending {
		held[p.Store] = true
	}
	load := storeLoad(d.v)
	best := ""
	for _, st := range d.v.ListStores() {
		if held[st.ID] || st.State != events.StoreUp || !d.live[st.ID] {
			continue
		}
		if best == "" || load[st.ID] < load[best] {
			best = st.ID
		}
	}
	return best
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

func pendingList(sh *projections.Shard) string {
	var parts []string
	for _, r := range sortedIDs(sh.Pending) {
		p := sh.Pending[r]
		parts = append(parts, fmt.Sprintf("%s %d@%s", p.Kind, r, p.Store))
	}
	return strings.Join(parts, ", ")
}

func sortedIDs[V any](m map[uint64]V) []uint64 {
	return slices.Sorted(maps.Keys(m))
}
