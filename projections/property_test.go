package projections_test

import (
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"pgregory.net/rapid"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// step is one stored message: the seq the log gave it and its body.
type step struct {
	Seq  uint64
	Body []byte
}

func (st step) String() string { return fmt.Sprintf("seq %d %s", st.Seq, st.Body) }

// gen draws random but plausible event sequences. It folds what it generates
// into its own state so that most ids, epochs, stores and ccids are the right
// ones, and a minority are stale, wrong or colliding.
type gen struct {
	t *rapid.T
	s *projections.State
	// stale forces every generated event below the current term.
	stale bool
}

var (
	genEndpoints = []string{"10.0.0.1:5688", "10.0.0.2:5688", "10.0.0.3:5688", "10.0.0.4:5688"}
	genStores    = []string{"s1", "s2", "s3", "s4", "s5"}
	genRaftAddrs = []string{"r1:63000", "r2:63000", "r3:63000", "r4:63000", "r5:63000", "r6:63000"}
	genOps       = []string{"op-1", "op-2", "op-3", "op-4"}
	genWriters   = []string{"meta-1", "meta-2", "meta-3"}
)

// uniform draws a uint64 that is close to uniform. rapid's own ranges favour
// small values and edges (good for finding edge cases, bad for weights: a
// 3% branch would be taken a third of the time); mixing the draw with
// splitmix64 spreads them. Shrinking still shortens sequences.
func uniform(t *rapid.T, label string) uint64 {
	z := rapid.Uint64().Draw(t, label) + 0x9e3779b97f4a7c15
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// intn draws from [0, n) about uniformly.
func intn(t *rapid.T, label string, n int) int {
	return int(uniform(t, label) % uint64(n))
}

// between draws from [lo, hi] about uniformly.
func between(t *rapid.T, label string, lo, hi uint64) uint64 {
	return lo + uniform(t, label)%(hi-lo+1)
}

func pick[E any](t *rapid.T, label string, list []E) E {
	return list[intn(t, label, len(list))]
}

// weighted returns i with probability weights[i]/sum(weights).
func weighted(t *rapid.T, label string, weights ...int) int {
	total := 0
	for _, w := range weights {
		total += w
	}
	n := intn(t, label, total)
	for i, w := range weights {
		if n < w {
			return i
		}
		n -= w
	}
	return len(weights) - 1
}

func chance(t *rapid.T, label string, percent int) bool {
	return intn(t, label, 100) < percent
}

// genSteps draws a sequence of up to max steps.
func genSteps(t *rapid.T, max int) []step {
	g := &gen{t: t, s: projections.New()}
	n := int(between(t, "events", 0, uint64(max)))
	steps := make([]step, 0, n)
	for range n {
		st := g.next()
		g.s.DecodeApply(st.Seq, st.Body)
		steps = append(steps, st)
	}
	return steps
}

// next draws the next step (without folding it).
func (g *gen) next() step {
	t := g.t
	var seq uint64
	switch weighted(t, "seq", 92, 4, 2, 2) {
	case 0:
		seq = g.s.Seq + 1
	case 1: // a gap
		seq = g.s.Seq + between(t, "gap", 2, 4)
	case 2: // a redelivery
		seq = g.s.Seq
	case 3: // "next", as Apply reads seq 0
		seq = 0
	}
	at := base.Add(time.Duration(g.s.Seq+1) * time.Second)
	if weighted(t, "kind", 97, 3) == 1 {
		return step{Seq: seq, Body: g.corrupt(at)}
	}
	ev := events.Event{Term: g.term(), Writer: pick(t, "writer", genWriters), At: at, Data: g.payload()}
	if ts, ok := ev.Data.(events.TermStarted); ok {
		// A term.started mostly opens a newer term; its data term mostly
		// equals the envelope's.
		if !g.stale && weighted(t, "ts-term", 80, 20) == 0 {
			ev.Term = g.s.Term + between(t, "ts-jump", 1, 3)
		}
		ts.Term = ev.Term
		if chance(t, "ts-mismatch", 8) {
			ts.Term = ev.Term + 1
		}
		ev.Data = ts
	}
	body, err := events.Encode(ev)
	if err != nil {
		t.Fatalf("encode %+v: %v", ev, err)
	}
	return step{Seq: seq, Body: body}
}

func (g *gen) term() uint64 {
	cur := g.s.Term
	if g.stale {
		return between(g.t, "stale-term", 0, cur-1)
	}
	switch weighted(g.t, "term", 85, 10, 5) {
	case 1: // stale: an old leader finishing late
		if cur > 0 {
			return between(g.t, "stale-term", 0, cur-1)
		}
	case 2: // future, without term.started
		return cur + between(g.t, "future-term", 1, 2)
	}
	return cur
}

func (g *gen) corrupt(at time.Time) []byte {
	t := g.t
	stamp := at.UTC().Format(time.RFC3339Nano)
	switch int(between(t, "corrupt", 0, 5)) {
	case 0:
		return []byte("not json at all")
	case 1:
		return fmt.Appendf(nil, `{"v":1,"term":%d,"writer":"meta-1","at":%q,"type":"worker.promoted","data":{"id":1}}`, g.s.Term, stamp)
	case 2:
		return fmt.Appendf(nil, `{"v":2,"term":%d,"writer":"meta-1","at":%q,"type":"worker.registered","data":{"id":%d,"endpoint":"x:1"}}`, g.s.Term, stamp, g.s.NextWorkerID)
	case 3:
		return fmt.Appendf(nil, `{"v":1,"term":%d,"writer":"meta-1","at":%q,"type":"worker.expired","data":[1,2]}`, g.s.Term, stamp)
	case 4: // a valid body cut short
		body, _ := events.Encode(events.Event{Term: g.s.Term, Writer: "meta-1", At: at, Data: events.WorkerRegistered{ID: g.s.NextWorkerID, Endpoint: genEndpoints[0]}})
		return body[:intn(t, "cut", len(body))]
	default:
		return rapid.SliceOfN(rapid.Byte(), 0, 32).Draw(t, "bytes")
	}
}

func (g *gen) payload() events.Payload {
	t := g.t
	s := g.s
	kind := weighted(t, "type",
		6,  // term.started
		20, // worker.registered
		12, // worker.activated
		10, // worker.expired
		4,  // worker.deregistered
		6,  // store.registered
		5,  // store.state
		5,  // shard.created
		5,  // shard.replica.adding
		5,  // shard.replica.added
		4,  // shard.replica.removing
		4,  // shard.replica.removed
		6,  // shard.observed
		4,  // operator.started
		3,  // operator.finished
		2,  // operator.failed
	)
	if kind >= 8 && len(s.Shards) == 0 && chance(t, "create-first", 60) {
		kind = 7 // most shard events need a shard
	}
	switch kind {
	case 0:
		leader := pick(t, "leader", genWriters)
		if chance(t, "no-leader", 3) {
			leader = ""
		}
		return events.TermStarted{Term: s.Term, Leader: leader}
	case 1:
		id := s.NextWorkerID
		if chance(t, "wrong-id", 10) {
			id = between(t, "id", 0, s.NextWorkerID+2)
		}
		ep := pick(t, "endpoint", genEndpoints)
		if chance(t, "no-endpoint", 2) {
			ep = ""
		}
		return events.WorkerRegistered{
			ID: id, Incarnation: fmt.Sprintf("inc-%d", int(between(t, "inc", 0, 20))), Endpoint: ep,
			Kind: pick(t, "wkind", []string{"compute", "frontend"}), Parallelism: int(between(t, "par", 1, 8)),
		}
	case 2, 3, 4:
		id, epoch := g.workerRef()
		switch weighted(t, "wtype", 12, 10, 4) {
		case 0:
			return events.WorkerActivated{ID: id, Epoch: epoch}
		case 1:
			return events.WorkerExpired{ID: id, Epoch: epoch}
		default:
			return events.WorkerDeregistered{ID: id, Epoch: epoch}
		}
	case 5:
		addr := pick(t, "raft", genRaftAddrs)
		if chance(t, "no-raft", 3) {
			addr = ""
		}
		return events.StoreRegistered{Store: pick(t, "store", genStores), Incarnation: fmt.Sprintf("st-%d", int(between(t, "sinc", 0, 9))), RaftAddr: addr}
	case 6:
		d := events.StoreState{
			Store: pick(t, "store", append([]string{"s9"}, genStores...)),
			State: pick(t, "state", []string{events.StoreUp, events.StoreDown, events.StoreDown, events.StoreDraining, events.StoreTombstone, "bogus"}),
		}
		if d.State == events.StoreDraining || chance(t, "until", 10) {
			d.Until = base.Add(time.Duration(int(between(t, "hours", 1, 4))) * time.Hour)
		}
		return d
	case 7:
		shard := between(t, "shard", 1, 4)
		if chance(t, "shard0", 3) {
			shard = 0
		}
		n := int(between(t, "nreplicas", 1, 3))
		if chance(t, "no-replicas", 3) {
			n = 0
		}
		reps := map[uint64]string{}
		live := g.liveStores()
		distinct := len(live) >= n && chance(t, "distinct", 80)
		for i := range n {
			if distinct {
				j := i + intn(t, "rstore-i", len(live)-i)
				live[i], live[j] = live[j], live[i]
				reps[uint64(i+1)] = live[i]
			} else {
				reps[uint64(i+1)] = g.store("rstore")
			}
		}
		if chance(t, "replica0", 3) {
			reps[0] = g.store("rstore0")
		}
		return events.ShardCreated{Shard: shard, Replicas: reps}
	case 8, 9, 10, 11:
		shard, sh := g.shard()
		c := events.ReplicaChange{Shard: shard, CCID: g.ccid(sh), Op: pick(t, "op", genOps)}
		switch weighted(t, "rtype", 5, 5, 4, 4) {
		case 0:
			c.Replica, c.Store = g.newReplica(sh)
			return events.ShardReplicaAdding(c)
		case 1:
			if p := pendingOf(sh, projections.PendingAdding); p != 0 && chance(t, "settle", 70) {
				c.Replica, c.Store = p, sh.Pending[p].Store
			} else if chance(t, "repeat-outcome", 20) {
				c.Replica, c.Store = g.member(sh)
			} else {
				c.Replica, c.Store = g.newReplica(sh)
			}
			return events.ShardReplicaAdded(c)
		case 2:
			c.Replica, c.Store = g.member(sh)
			return events.ShardReplicaRemoving(c)
		default:
			if p := pendingOf(sh, projections.PendingRemoving); p != 0 && chance(t, "settle", 70) {
				c.Replica, c.Store = p, sh.Pending[p].Store
			} else {
				c.Replica, c.Store = g.member(sh)
			}
			return events.ShardReplicaRemoved(c)
		}
	case 12:
		shard, sh := g.shard()
		d := events.ShardObserved{Shard: shard, CCID: g.ccid(sh), Replicas: map[uint64]string{}}
		if sh != nil {
			for r, st := range sh.Members {
				d.Replicas[r] = st
			}
			if len(sh.Members) > 0 && chance(t, "drop", 40) {
				r, _ := g.member(sh)
				delete(d.Replicas, r)
			}
			if chance(t, "grow", 40) {
				r, st := g.newReplica(sh)
				d.Replicas[r] = st
			}
			d.Leader, _ = g.member(sh)
		}
		if chance(t, "leader-any", 20) {
			d.Leader = between(t, "leader", 0, 8)
		}
		return d
	default:
		op := events.Operator{Op: pick(t, "op", genOps), Reason: "r"}
		op.Shard, _ = g.shard()
		if kind > 13 && len(s.Operators) > 0 && chance(t, "running-op", 70) {
			running := slices.Sorted(maps.Keys(s.Operators))
			op.Op = pick(t, "running", running)
			op.Shard = s.Operators[op.Op].Shard
		}
		if chance(t, "steps", 50) {
			op.Steps = []string{"remove", "add"}
		}
		switch kind {
		case 13:
			return events.OperatorStarted(op)
		case 14:
			return events.OperatorFinished(op)
		default:
			return events.OperatorFailed(op)
		}
	}
}

// workerRef is mostly an active worker's id and epoch, sometimes a wrong
// epoch or an unknown id.
func (g *gen) workerRef() (id, epoch uint64) {
	t := g.t
	ws := g.s.ListWorkers()
	if len(ws) > 0 && chance(t, "known-worker", 80) {
		w := pick(t, "worker", ws)
		if chance(t, "right-epoch", 80) {
			return w.ID, w.Epoch
		}
		return w.ID, between(t, "epoch", 0, g.s.Seq+1)
	}
	return between(t, "id", 0, g.s.NextWorkerID+1), between(t, "epoch", 0, g.s.Seq+1)
}

func (g *gen) liveStores() []string {
	var live []string
	for _, st := range g.s.ListStores() {
		if st.State != events.StoreTombstone {
			live = append(live, st.ID)
		}
	}
	return live
}

// store is mostly a registered, live store.
func (g *gen) store(label string) string {
	live := g.liveStores()
	if len(live) > 0 && chance(g.t, label+"-live", 85) {
		return pick(g.t, label, live)
	}
	return pick(g.t, label, append([]string{"s9"}, genStores...))
}

// shard is mostly an existing shard.
func (g *gen) shard() (uint64, *projections.Shard) {
	shards := g.s.ListShards()
	if len(shards) > 0 && chance(g.t, "known-shard", 85) {
		sh := pick(g.t, "shard", shards)
		return sh.ID, &sh
	}
	id := between(g.t, "shard-id", 0, 5)
	if sh, ok := g.s.Shards[id]; ok {
		return id, sh
	}
	return id, nil
}

func (g *gen) ccid(sh *projections.Shard) uint64 {
	var cur uint64
	if sh != nil {
		cur = sh.CCID
	}
	switch weighted(g.t, "ccid", 20, 25, 55) {
	case 0:
		if cur > 0 {
			return cur - 1
		}
		return 0
	case 1:
		return cur
	default:
		return cur + between(g.t, "ccid-step", 1, 3)
	}
}

// member is mostly a member of sh with its store.
func (g *gen) member(sh *projections.Shard) (uint64, string) {
	if sh != nil && len(sh.Members) > 0 && chance(g.t, "is-member", 85) {
		r := pick(g.t, "member", sortedIDs(sh.Members))
		return r, sh.Members[r]
	}
	if sh != nil && len(sh.Removed) > 0 && chance(g.t, "was-member", 50) {
		r := pick(g.t, "removed", sortedIDs(sh.Removed))
		return r, sh.Removed[r]
	}
	return between(g.t, "replica", 0, 8), g.store("mstore")
}

// newReplica is mostly a fresh replica id on a store that holds none of sh's.
func (g *gen) newReplica(sh *projections.Shard) (uint64, string) {
	t := g.t
	if sh == nil || chance(t, "any-replica", 15) {
		return between(t, "replica", 0, 8), g.store("nstore")
	}
	var top uint64
	for r := range sh.Members {
		top = max(top, r)
	}
	for r := range sh.Removed {
		top = max(top, r)
	}
	for r := range sh.Pending {
		top = max(top, r)
	}
	used := map[string]bool{}
	for _, st := range sh.Members {
		used[st] = true
	}
	var free []string
	for _, st := range g.s.ListStores() {
		if st.State != events.StoreTombstone && !used[st.ID] {
			free = append(free, st.ID)
		}
	}
	if len(free) == 0 {
		return top + 1, g.store("nstore")
	}
	return top + 1, pick(t, "free-store", free)
}

func pendingOf(sh *projections.Shard, kind string) uint64 {
	if sh == nil {
		return 0
	}
	for _, r := range sortedIDs(sh.Pending) {
		if sh.Pending[r].Kind == kind {
			return r
		}
	}
	return 0
}

func sortedIDs[V any](m map[uint64]V) []uint64 {
	return slices.Sorted(maps.Keys(m))
}

func fold(s *projections.State, steps []step) *projections.State {
	for _, st := range steps {
		s.DecodeApply(st.Seq, st.Body)
	}
	return s
}

// bookkeepingOnly reports whether after differs from before only in seq,
// counters and anomalies, with a readable diff when it does not.
func bookkeepingOnly(before, after *projections.State) (string, bool) {
	a := after.Clone()
	a.Seq = before.Seq
	a.Counters = before.Counters
	a.Anomalies = before.Anomalies
	if a.Hash() == before.Hash() {
		return "", true
	}
	return fmt.Sprintf("before:\n%safter:\n%s", entities(before), entities(after)), false
}

// entities is the part of Render that describes the cluster: the header
// without seq, workers, stores, shards and operators.
func entities(s *projections.State) string {
	var b strings.Builder
	for i, line := range strings.SplitAfter(s.Render(), "\n") {
		if i == 0 {
			_, line, _ = strings.Cut(line, " ")
		}
		if strings.HasPrefix(line, "counters ") || strings.HasPrefix(line, "anomaly ") {
			continue
		}
		b.WriteString(line)
	}
	return b.String()
}

// TestPropFold folds random sequences and checks, after every step, the
// invariants, the step rules, the counters, and that whatever is rejected,
// corrupt, a no-op, a duplicate or below the current term changes nothing
// but the bookkeeping.
func TestPropFold(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		steps := genSteps(t, 200)
		s := projections.New()
		var seen, stale uint64
		for i, st := range steps {
			before := s.Clone()
			ev, decErr := events.Decode(st.Seq, st.Body)
			r := s.DecodeApply(st.Seq, st.Body)
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("step %d (%s) -> %s: %v\n%s", i, st, r, err, s.Render())
			}
			if err := projections.CheckStep(before.Provenance, s); err != nil {
				t.Fatalf("step %d (%s) -> %s: %v", i, st, r, err)
			}
			if len(s.Anomalies) > projections.MaxAnomalies || len(s.History) > projections.MaxHistory {
				t.Fatalf("step %d: %d anomalies, %d history entries", i, len(s.Anomalies), len(s.History))
			}
			if r.Outcome == projections.Duplicate {
				if s.Hash() != before.Hash() {
					t.Fatalf("step %d (%s): a duplicate changed the state", i, st)
				}
				continue
			}
			seen++
			if st.Seq != 0 && s.Seq != st.Seq {
				t.Fatalf("step %d (%s): seq is %d", i, st, s.Seq)
			}
			if decErr == nil && ev.Term < before.Term {
				stale++
				if r.Outcome != projections.Rejected || r.Kind != projections.AnomalyStaleTerm {
					t.Fatalf("step %d (%s): term %d < %d but %s", i, st, ev.Term, before.Term, r)
				}
			}
			if r.Outcome != projections.Applied {
				if diff, ok := bookkeepingOnly(before, s); !ok {
					t.Fatalf("step %d (%s) -> %s changed the state:\n%s", i, st, r, diff)
				}
			}
			if r.Outcome == projections.Rejected || r.Outcome == projections.Corrupt {
				a := s.Anomalies[len(s.Anomalies)-1]
				wantSeq := s.Seq
				if r.Outcome == projections.Corrupt && st.Seq == 0 {
					wantSeq = 0 // a corrupt body at an unknown seq does not take one
				}
				if a.Seq != wantSeq || a.Kind != r.Kind || (decErr == nil && (a.Term != ev.Term || a.Writer != ev.Writer)) {
					t.Fatalf("step %d (%s) -> %s: anomaly %+v", i, st, r, a)
				}
			}
			c := s.Counters
			if c.Applied+c.NoOps+c.Rejected+c.Corrupt != seen || c.StaleTerm != stale {
				t.Fatalf("step %d: counters %+v after %d events, %d stale", i, c, seen, stale)
			}
		}
	})
}

// TestPropDeterministic: independent folds of the same sequence agree, and so
// does a fold of the pre-decoded events through Apply and ApplyCorrupt.
func TestPropDeterministic(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		steps := genSteps(t, 200)
		a := fold(projections.New(), steps)
		b := fold(&projections.State{}, steps)
		if a.Hash() != b.Hash() || a.Render() != b.Render() {
			t.Fatalf("two folds differ:\n%s\n%s", a.Render(), b.Render())
		}
		c := projections.New()
		for _, st := range steps {
			ev, err := events.Decode(st.Seq, st.Body)
			if err != nil {
				c.ApplyCorrupt(ev, err)
			} else {
				c.Apply(ev)
			}
		}
		if a.Hash() != c.Hash() {
			t.Fatalf("DecodeApply and Decode+Apply differ:\n%s\n%s", a.Render(), c.Render())
		}
	})
}

// TestPropSnapshot: fold a prefix, snapshot, decode, fold the rest: the same
// state as folding everything.
func TestPropSnapshot(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		steps := genSteps(t, 200)
		k := intn(t, "split", len(steps)+1)
		whole := fold(projections.New(), steps)
		prefix := fold(projections.New(), steps[:k])
		snap, hash := prefix.EncodeSnapshotHash()
		if hash != prefix.Hash() {
			t.Fatalf("EncodeSnapshotHash returned %s, the state hashes to %s", hash, prefix.Hash())
		}
		restored, err := projections.DecodeSnapshotAt(snap, prefix.Seq, hash)
		if err != nil {
			t.Fatalf("decode snapshot at %d: %v", k, err)
		}
		// Recorded as another seq or another hash, it is not this snapshot.
		if _, err := projections.DecodeSnapshotAt(snap, prefix.Seq+1, hash); !errors.Is(err, projections.ErrBadSnapshot) {
			t.Fatalf("snapshot of seq %d accepted as seq %d: %v", prefix.Seq, prefix.Seq+1, err)
		}
		if _, err := projections.DecodeSnapshotAt(snap, prefix.Seq, whole.Hash()+"x"); !errors.Is(err, projections.ErrBadSnapshot) {
			t.Fatalf("snapshot accepted under another hash: %v", err)
		}
		if restored.Hash() != prefix.Hash() {
			t.Fatalf("restored snapshot differs:\n%s\n%s", prefix.Render(), restored.Render())
		}
		fold(restored, steps[k:])
		if restored.Hash() != whole.Hash() {
			t.Fatalf("split at %d differs:\n%s\n%s", k, whole.Render(), restored.Render())
		}
		// The snapshot is a copy: folding on does not touch the prefix state.
		if p2 := fold(projections.New(), steps[:k]); p2.Hash() != prefix.Hash() {
			t.Fatalf("prefix state changed by folding its restored copy")
		}
	})
}

// TestPropStaleTermChangesNothing: on any reachable state, an event of any
// kind below the current term changes only seq, counters and anomalies.
func TestPropStaleTermChangesNothing(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		g := &gen{t: t, s: fold(projections.New(), genSteps(t, 150))}
		if g.s.Term == 0 {
			// Make sure there is a term to be stale against.
			body, _ := events.Encode(events.Event{Term: 3, Writer: "meta-3", At: base, Data: events.TermStarted{Term: 3, Leader: "meta-3"}})
			g.s.DecodeApply(g.s.Seq+1, body)
		}
		for i := range int(between(t, "stale-events", 1, 20)) {
			g.stale = true
			st := g.next()
			g.stale = false
			if st.Seq <= g.s.Seq {
				st.Seq = g.s.Seq + 1
			}
			ev, err := events.Decode(st.Seq, st.Body)
			before := g.s.Clone()
			r := g.s.DecodeApply(st.Seq, st.Body)
			if err == nil && (ev.Term >= before.Term || r.Outcome != projections.Rejected || r.Kind != projections.AnomalyStaleTerm) {
				t.Fatalf("stale event %d (%s) at term %d: %s", i, st, before.Term, r)
			}
			if diff, ok := bookkeepingOnly(before, g.s); !ok {
				t.Fatalf("stale event %d (%s) -> %s changed the state:\n%s", i, st, r, diff)
			}
			if entities(before) != entities(g.s) {
				t.Fatalf("stale event %d (%s) changed the rendering:\n%s\n%s", i, st, entities(before), entities(g.s))
			}
		}
	})
}

// TestPropApplyArbitrary: Apply on events with arbitrary (not plausible)
// fields never panics and keeps the invariants.
func TestPropApplyArbitrary(t *testing.T) {
	small := rapid.Uint64Range(0, 4)
	name := rapid.SampledFrom([]string{"", "a", "b", "s1", "s2", "x:1", "y:1"})
	reps := rapid.MapOfN(small, name, 0, 3)
	payload := rapid.OneOf(
		rapid.Just[events.Payload](nil),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.TermStarted{Term: small.Draw(t, "t"), Leader: name.Draw(t, "l")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.WorkerRegistered{ID: small.Draw(t, "id"), Epoch: small.Draw(t, "e"), Endpoint: name.Draw(t, "ep"), Parallelism: rapid.Int().Draw(t, "p")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.WorkerActivated{ID: small.Draw(t, "id"), Epoch: rapid.Uint64Range(0, 30).Draw(t, "e")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.WorkerExpired{ID: small.Draw(t, "id"), Epoch: rapid.Uint64Range(0, 30).Draw(t, "e")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.WorkerDeregistered{ID: small.Draw(t, "id"), Epoch: rapid.Uint64Range(0, 30).Draw(t, "e")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.StoreRegistered{Store: name.Draw(t, "s"), RaftAddr: name.Draw(t, "r")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.StoreState{Store: name.Draw(t, "s"), State: rapid.SampledFrom([]string{"", "up", "down", "draining", "tombstone"}).Draw(t, "st"),
				Until: time.Unix(rapid.Int64Range(-5, 5).Draw(t, "u"), 0)}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.ShardCreated{Shard: small.Draw(t, "sh"), Replicas: reps.Draw(t, "reps")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			c := events.ReplicaChange{Shard: small.Draw(t, "sh"), Replica: small.Draw(t, "r"), Store: name.Draw(t, "s"), CCID: small.Draw(t, "c"), Op: name.Draw(t, "op")}
			switch rapid.IntRange(0, 3).Draw(t, "rc") {
			case 0:
				return events.ShardReplicaAdding(c)
			case 1:
				return events.ShardReplicaAdded(c)
			case 2:
				return events.ShardReplicaRemoving(c)
			}
			return events.ShardReplicaRemoved(c)
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			return events.ShardObserved{Shard: small.Draw(t, "sh"), CCID: small.Draw(t, "c"), Replicas: reps.Draw(t, "reps"), Leader: small.Draw(t, "l")}
		}),
		rapid.Custom(func(t *rapid.T) events.Payload {
			op := events.Operator{Op: name.Draw(t, "op"), Shard: small.Draw(t, "sh")}
			switch rapid.IntRange(0, 2).Draw(t, "oc") {
			case 0:
				return events.OperatorStarted(op)
			case 1:
				return events.OperatorFinished(op)
			}
			return events.OperatorFailed(op)
		}),
	)
	rapid.Check(t, func(t *rapid.T) {
		s := projections.New()
		for i := range int(between(t, "n", 0, 300)) {
			ev := events.Event{
				Seq:    rapid.Uint64Range(0, uint64(i)+2).Draw(t, "seq"),
				Term:   rapid.Uint64Range(0, 4).Draw(t, "term"),
				Writer: name.Draw(t, "writer"),
				Data:   payload.Draw(t, "data"),
			}
			before := s.Provenance
			r := s.Apply(ev)
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("event %d %+v -> %s: %v\n%s", i, ev, r, err, s.Render())
			}
			if err := projections.CheckStep(before, s); err != nil {
				t.Fatalf("event %d %+v -> %s: %v", i, ev, r, err)
			}
		}
		if _, err := projections.DecodeSnapshot(s.EncodeSnapshot()); err != nil {
			t.Fatalf("snapshot: %v", err)
		}
	})
}
