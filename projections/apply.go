package projections

import (
	"cmp"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"time"

	"github.com/termlog/termlog/events"
)

// Outcome is what the fold did with one event.
type Outcome int

// Outcomes.
const (
	Applied   Outcome = iota // changed the state
	NoOp                     // valid, changed nothing (recorded in the counters)
	Rejected                 // broke the term rule or a projection rule; state unchanged
	Corrupt                  // could not be decoded; state unchanged
	Duplicate                // seq already folded; nothing at all changed
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case NoOp:
		return "noop"
	case Rejected:
		return "rejected"
	case Corrupt:
		return "corrupt"
	case Duplicate:
		return "duplicate"
	}
	return fmt.Sprintf("outcome(%d)", int(o))
}

// Result is the outcome of one event with a short reason.
type Result struct {
	Outcome Outcome
	Kind    string // anomaly kind for Rejected and Corrupt
	Reason  string
	// Warning is an anomaly recorded for an event the fold applied (or
	// found a no-op) all the same: "writer-mismatch: ..." ("" when none).
	Warning string
}

// String is the outcome line: "applied: worker 1 running", "rejected
// stale-term: term 1 < current term 7", "corrupt: seq 9: malformed event:
// ..." (the kind is left out when it only repeats the outcome), and a
// warning after "; warning ".
func (r Result) String() string {
	s := r.Outcome.String()
	if r.Kind != "" && r.Kind != s {
		s += " " + r.Kind
	}
	if r.Reason != "" {
		s += ": " + r.Reason
	}
	if r.Warning != "" {
		s += "; warning " + r.Warning
	}
	return s
}

func applied(format string, a ...any) Result {
	return Result{Outcome: Applied, Reason: fmt.Sprintf(format, a...)}
}

func noop(format string, a ...any) Result {
	return Result{Outcome: NoOp, Reason: fmt.Sprintf(format, a...)}
}

// reason builds the reason of an outcome without fmt, for the rules that
// every busy stream runs all the time (worker registrations, activations
// and removals, shard observations): the same text as the format it
// stands for, at a fraction of the cost.
type reason []byte

func newReason() reason            { return make(reason, 0, 64) }
func (r reason) s(v string) reason { return append(r, v...) }
func (r reason) n(v uint64) reason { return strconv.AppendUint(r, v, 10) }
func (r reason) applied() Result   { return Result{Outcome: Applied, Reason: string(r)} }

func invalid(format string, a ...any) Result {
	return Result{Outcome: Rejected, Kind: AnomalyInvalid, Reason: fmt.Sprintf(format, a...)}
}

// ApplyRecord decodes a stored record and folds it. A record that does not
// decode is counted and kept as a corrupt anomaly; it is never an error.
func (s *State) ApplyRecord(rec events.Record) Result {
	return s.DecodeApply(rec.Seq, rec.Data)
}

// DecodeApply decodes the body of the event at seq and folds it.
func (s *State) DecodeApply(seq uint64, body []byte) Result {
	if seq != 0 && seq <= s.Seq {
		return Result{Outcome: Duplicate, Reason: fmt.Sprintf("seq %d already folded (at %d)", seq, s.Seq)}
	}
	ev, err := events.Decode(seq, body)
	if err != nil {
		return s.applyCorrupt(ev, err)
	}
	return s.Apply(ev)
}

// ApplyCorrupt records an event that could not be decoded (from a JSONL file,
// say). ev carries whatever envelope fields were read.
func (s *State) ApplyCorrupt(ev events.Event, err error) Result {
	if ev.Seq != 0 && ev.Seq <= s.Seq {
		return Result{Outcome: Duplicate, Reason: fmt.Sprintf("seq %d already folded (at %d)", ev.Seq, s.Seq)}
	}
	return s.applyCorrupt(ev, err)
}

func (s *State) applyCorrupt(ev events.Event, err error) Result {
	s.init()
	if ev.Seq > s.Seq {
		s.Seq = ev.Seq
	}
	s.Counters.Corrupt++
	typ := ev.Type()
	var de *events.DecodeError
	if errors.As(err, &de) {
		typ = de.Type
	}
	r := Result{Outcome: Corrupt, Kind: AnomalyCorrupt, Reason: err.Error()}
	s.addAnomaly(Anomaly{Seq: ev.Seq, Term: ev.Term, Writer: ev.Writer, Type: typ, Kind: AnomalyCorrupt, Reason: err.Error()})
	return r
}

func (s *State) addAnomaly(a Anomaly) {
	if len(s.Anomalies) >= MaxAnomalies {
		n := copy(s.Anomalies, s.Anomalies[len(s.Anomalies)-MaxAnomalies+1:])
		s.Anomalies = s.Anomalies[:n]
	}
	s.Anomalies = append(s.Anomalies, a)
}

// Apply folds one decoded event. ev.Seq must be greater than the state's seq
// (a smaller or equal seq is a Duplicate and changes nothing); seq 0 means
// "next". Apply never panics and never returns an error: rejections are
// outcomes, counted and kept as anomalies.
func (s *State) Apply(ev events.Event) Result {
	s.init()
	if ev.Seq == 0 {
		ev.Seq = s.Seq + 1
	} else if ev.Seq <= s.Seq {
		return Result{Outcome: Duplicate, Reason: fmt.Sprintf("seq %d already folded (at %d)", ev.Seq, s.Seq)}
	}
	s.Seq = ev.Seq
	r := s.apply(ev)
	switch r.Outcome {
	case Applied:
		s.Counters.Applied++
		s.At = ev.At.UTC()
		s.checkWriter(ev, &r)
	case NoOp:
		s.Counters.NoOps++
		s.checkWriter(ev, &r)
	case Rejected:
		s.Counters.Rejected++
		if r.Kind == AnomalyStaleTerm {
			s.Counters.StaleTerm++
		}
		s.addAnomaly(Anomaly{Seq: ev.Seq, Term: ev.Term, Writer: ev.Writer, Type: ev.Type(), Kind: r.Kind, Reason: r.Reason})
	}
	return r
}

// checkWriter records a writer-mismatch anomaly for an event of the
// current term that its leader did not write: only the replica that
// started a term appends in it, so another writer is a fencing hole (a
// write that bypassed the CAS, a forged or hand-edited log). The event is
// not rejected — the term rule is the fence on read, and rejecting here
// would change what every existing log folds to — but it is reported, so a
// replay or a test sees it.
func (s *State) checkWriter(ev events.Event, r *Result) {
	if _, ok := ev.Data.(events.TermStarted); ok || s.Leader == "" || ev.Writer == s.Leader || ev.Term != s.Term {
		return
	}
	why := fmt.Sprintf("writer %s did not start term %d (its leader is %s)", orDash(ev.Writer), ev.Term, s.Leader)
	r.Warning = AnomalyWriterMismatch + ": " + why
	s.addAnomaly(Anomaly{Seq: ev.Seq, Term: ev.Term, Writer: ev.Writer, Type: ev.Type(), Kind: AnomalyWriterMismatch, Reason: why})
}

func (s *State) apply(ev events.Event) Result {
	// The term rule comes before anything else, even a missing payload.
	if ts, ok := ev.Data.(events.TermStarted); ok {
		return s.termStarted(ev, ts)
	}
	if ev.Term < s.Term {
		return Result{Outcome: Rejected, Kind: AnomalyStaleTerm, Reason: fmt.Sprintf("term %d < current term %d", ev.Term, s.Term)}
	}
	if ev.Term > s.Term {
		return Result{Outcome: Rejected, Kind: AnomalyFutureTerm, Reason: fmt.Sprintf("term %d > current term %d without term.started", ev.Term, s.Term)}
	}
	if ev.Data == nil {
		return invalid("no payload")
	}
	switch d := ev.Data.(type) {
	case events.WorkerRegistered:
		return s.workerRegistered(ev, d)
	case events.WorkerActivated:
		return s.workerActivated(d)
	case events.WorkerExpired:
		return s.workerRemoved(d.ID, d.Epoch)
	case events.WorkerDeregistered:
		return s.workerRemoved(d.ID, d.Epoch)
	case events.StoreRegistered:
		return s.storeRegistered(ev, d)
	case events.StoreState:
		return s.storeState(ev, d)
	case events.ShardCreated:
		return s.shardCreated(d)
	case events.ShardReplicaAdding:
		return s.replicaAdding(ev, events.ReplicaChange(d))
	case events.ShardReplicaAdded:
		return s.replicaAdded(events.ReplicaChange(d))
	case events.ShardReplicaRemoving:
		return s.replicaRemoving(ev, events.ReplicaChange(d))
	case events.ShardReplicaRemoved:
		return s.replicaRemoved(events.ReplicaChange(d))
	case events.ShardObserved:
		return s.shardObserved(d)
	case events.OperatorStarted:
		return s.operatorStarted(ev, events.Operator(d))
	case events.OperatorFinished:
		return s.operatorEnded(ev, events.Operator(d), OperatorFinished)
	case events.OperatorFailed:
		return s.operatorEnded(ev, events.Operator(d), OperatorFailed)
	case events.ShardBlocked:
		return s.shardBlocked(d)
	case events.ShardRecovered:
		return s.shardRecovered(ev, d)
	}
	return invalid("unknown payload %T", ev.Data)
}

func (s *State) termStarted(ev events.Event, d events.TermStarted) Result {
	if ev.Term < s.Term {
		return Result{Outcome: Rejected, Kind: AnomalyStaleTerm, Reason: fmt.Sprintf("term %d < current term %d", ev.Term, s.Term)}
	}
	if d.Term != ev.Term {
		return invalid("data term %d != envelope term %d", d.Term, ev.Term)
	}
	if ev.Term == s.Term {
		return invalid("term %d already started", ev.Term)
	}
	if d.Leader == "" {
		return invalid("no leader")
	}
	// The lease fence: terms count leaders, so a holder whose lease
	// lapsed can always name a term above the current one; what it cannot
	// name is a newer lease. Once a term was started under a lease, every
	// later term needs a newer one.
	if s.Lease != 0 && d.Lease <= s.Lease {
		return Result{Outcome: Rejected, Kind: AnomalyStaleLease, Reason: fmt.Sprintf("term %d lease %d <= current term %d's lease %d", d.Term, d.Lease, s.Term, s.Lease)}
	}
	s.Term = ev.Term
	s.Leader = d.Leader
	s.Lease = d.Lease
	if d.Lease == 0 {
		return applied("term %d leader %s", d.Term, d.Leader)
	}
	return applied("term %d leader %s lease %d", d.Term, d.Leader, d.Lease)
}

func (s *State) workerRegistered(ev events.Event, d events.WorkerRegistered) Result {
	if d.ID != s.NextWorkerID {
		return invalid("worker id %d != next worker id %d", d.ID, s.NextWorkerID)
	}
	if d.Endpoint == "" {
		return invalid("worker %d has no endpoint", d.ID)
	}
	r := newReason().s("worker ").n(d.ID).s(" epoch ").n(ev.Seq).s(" at ").s(d.Endpoint).applied()
	if old, ok := s.Endpoints[d.Endpoint]; ok {
		delete(s.Workers, old)
		r.Reason += fmt.Sprintf(", supersedes worker %d", old)
	}
	s.Workers[d.ID] = &Worker{
		ID: d.ID, Epoch: ev.Seq, Incarnation: d.Incarnation, Endpoint: d.Endpoint,
		Kind: d.Kind, Parallelism: d.Parallelism, State: WorkerStarting, Term: ev.Term,
	}
	s.Endpoints[d.Endpoint] = d.ID
	s.NextWorkerID++
	return r
}

func (s *State) workerActivated(d events.WorkerActivated) Result {
	w, ok := s.Workers[d.ID]
	if !ok || w.Epoch != d.Epoch {
		return noop("no active worker %d epoch %d", d.ID, d.Epoch)
	}
	if w.State == WorkerRunning {
		return noop("worker %d already running", d.ID)
	}
	w.State = WorkerRunning
	return newReason().s("worker ").n(d.ID).s(" running").applied()
}

func (s *State) workerRemoved(id, epoch uint64) Result {
	w, ok := s.Workers[id]
	if !ok || w.Epoch != epoch {
		return noop("no active worker %d epoch %d", id, epoch)
	}
	delete(s.Workers, id)
	if s.Endpoints[w.Endpoint] == id {
		delete(s.Endpoints, w.Endpoint)
	}
	return newReason().s("worker ").n(id).s(" epoch ").n(epoch).s(" removed").applied()
}

func (s *State) storeRegistered(ev events.Event, d events.StoreRegistered) Result {
	if d.Store == "" || d.RaftAddr == "" {
		return invalid("store registration needs store and raft_addr")
	}
	for _, id := range sortedKeys(s.Stores) {
		if st := s.Stores[id]; id != d.Store && st.RaftAddr == d.RaftAddr && st.State != events.StoreTombstone {
			return invalid("raft address %s belongs to store %s", d.RaftAddr, id)
		}
	}
	st, ok := s.Stores[d.Store]
	if !ok {
		st = &Store{ID: d.Store}
		s.Stores[d.Store] = st
	} else if st.State == events.StoreTombstone {
		return invalid("store %s is a tombstone", d.Store)
	}
	st.Incarnation = d.Incarnation
	st.RaftAddr = d.RaftAddr
	if st.State == events.StoreDraining {
		// A planned restart's drain outlives the restart: it ends when
		// the scheduler sees the store back with its replicas running,
		// or at its deadline (store.state up).
		return applied("store %s at %s (still draining until %s)", d.Store, d.RaftAddr, st.Until.UTC().Format(time.RFC3339))
	}
	st.State = events.StoreUp
	st.Until = time.Time{}
	st.Since = ev.Seq
	return applied("store %s at %s", d.Store, d.RaftAddr)
}

func (s *State) storeState(ev events.Event, d events.StoreState) Result {
	st, ok := s.Stores[d.Store]
	if !ok {
		return invalid("unknown store %q", d.Store)
	}
	switch d.State {
	case events.StoreUp, events.StoreDown, events.StoreDraining, events.StoreTombstone:
	default:
		return invalid("unknown store state %q", d.State)
	}
	if st.State == events.StoreTombstone {
		return invalid("store %s is a tombstone", d.Store)
	}
	if d.State == events.StoreTombstone {
		// Sorted, so every replica names the same replica in the anomaly
		// (its reason is part of the state hash).
		for _, id := range sortedKeys(s.Shards) {
			sh := s.Shards[id]
			for _, r := range sortedKeys(sh.Members) {
				if on := sh.Members[r]; on == d.Store {
					return invalid("store %s still holds replica %d of shard %d", d.Store, r, sh.ID)
				}
			}
		}
	}
	// Until only bounds a draining period; it is dropped for any other state.
	var until time.Time
	if d.State == events.StoreDraining {
		until = d.Until.UTC()
		// A time that JSON cannot encode would break Hash and snapshots
		// ("9999-12-31T23:59:59-23:59" is year 10000 in UTC).
		if y := until.Year(); y < 0 || y > 9999 {
			return invalid("store %s draining until %s: year out of range", d.Store, d.Until.Format(time.RFC3339))
		}
	}
	stopping := d.Stopping && d.State == events.StoreDraining
	if st.State == d.State && st.Until.Equal(until) && (!stopping || st.Stopped == st.Incarnation) {
		return noop("store %s already %s", d.Store, d.State)
	}
	st.State = d.State
	st.Until = until
	st.Since = ev.Seq
	st.DrainedBy = ""
	if d.State != events.StoreDraining || st.Stopped != st.Incarnation {
		// A longer drain of a stopped process (store drain --for) keeps
		// it stopped: only another state, or another process, ends it.
		st.Stopped, st.StoppedAt = "", time.Time{}
	}
	if d.State == events.StoreDraining {
		st.DrainedBy = st.Incarnation
	}
	if stopping {
		st.Stopped, st.StoppedAt = st.Incarnation, ev.At.UTC()
		return applied("store %s %s: its process stops for a planned restart", d.Store, d.State)
	}
	return applied("store %s %s", d.Store, d.State)
}

func (s *State) registeredStore(id string) bool {
	st, ok := s.Stores[id]
	return ok && st.State != events.StoreTombstone
}

// checkReplicaSet validates a {replica: store} set: non-zero ids, registered
// stores, one replica per store.
func (s *State) checkReplicaSet(replicas map[uint64]string) (Result, bool) {
	seen := map[string]bool{}
	for _, r := range sortedKeys(replicas) {
		st := replicas[r]
		if r == 0 {
			return invalid("replica id 0"), true
		}
		if !s.registeredStore(st) {
			return invalid("replica %d on unregistered store %q", r, st), true
		}
		if seen[st] {
			return invalid("two replicas on store %s", st), true
		}
		seen[st] = true
	}
	return Result{}, false
}

func (s *State) shardCreated(d events.ShardCreated) Result {
	if _, ok := s.Shards[d.Shard]; ok {
		return invalid("shard %d exists", d.Shard)
	}
	if d.Shard == 0 || len(d.Replicas) == 0 {
		return invalid("shard %d needs an id and replicas", d.Shard)
	}
	if r, bad := s.checkReplicaSet(d.Replicas); bad {
		return r
	}
	s.Shards[d.Shard] = &Shard{ID: d.Shard, Members: cloneMap(d.Replicas), Initial: cloneMap(d.Replicas), MaxReplica: maxKey(d.Replicas)}
	return applied("shard %d with %d replicas", d.Shard, len(d.Replicas))
}

// changeTarget returns the shard a replica change applies to, or the
// rejection when the shard is unknown or the replica id is 0.
func (s *State) changeTarget(d events.ReplicaChange) (*Shard, Result, bool) {
	sh, ok := s.Shards[d.Shard]
	if !ok {
		return nil, invalid("unknown shard %d", d.Shard), false
	}
	if d.Replica == 0 {
		return nil, invalid("replica id 0"), false
	}
	return sh, Result{}, true
}

func (s *State) replicaAdding(ev events.Event, d events.ReplicaChange) Result {
	sh, rejected, ok := s.changeTarget(d)
	if !ok {
		return rejected
	}
	if _, gone := sh.Removed[d.Replica]; gone {
		return invalid("replica %d of shard %d was removed; ids are never reused", d.Replica, d.Shard)
	}
	if sh.IsMember(d.Replica) {
		return noop("replica %d already a member of shard %d", d.Replica, d.Shard)
	}
	if !s.registeredStore(d.Store) {
		return invalid("unregistered store %q", d.Store)
	}
	if sh.Pending == nil {
		sh.Pending = map[uint64]Pending{}
	}
	sh.Pending[d.Replica] = Pending{Kind: PendingAdding, Store: d.Store, CCID: d.CCID, Op: d.Op, Seq: ev.Seq}
	sh.MaxReplica = max(sh.MaxReplica, d.Replica)
	return applied("shard %d adding replica %d on %s", d.Shard, d.Replica, d.Store)
}

func (s *State) replicaAdded(d events.ReplicaChange) Result {
	sh, rejected, ok := s.changeTarget(d)
	if !ok {
		return rejected
	}
	if _, gone := sh.Removed[d.Replica]; gone {
		return invalid("replica %d of shard %d was removed; ids are never reused", d.Replica, d.Shard)
	}
	if !s.registeredStore(d.Store) {
		return invalid("unregistered store %q", d.Store)
	}
	if cur, ok := sh.Members[d.Replica]; ok {
		// A replica id lives on one store for its whole life; "added" on
		// another store would silently move it and orphan the old one.
		if cur != d.Store {
			return invalid("replica %d of shard %d is on store %s, not %s", d.Replica, d.Shard, cur, d.Store)
		}
		// A late outcome settles an adding intent and may advance the
		// ccid; it leaves a removing intent alone.
		p, pending := sh.Pending[d.Replica]
		adding := pending && p.Kind == PendingAdding
		if !adding && d.CCID <= sh.CCID {
			return noop("replica %d already a member of shard %d", d.Replica, d.Shard)
		}
		if adding {
			delete(sh.Pending, d.Replica)
		}
		sh.CCID = max(sh.CCID, d.CCID)
		return applied("shard %d replica %d already a member on %s; outcome recorded", d.Shard, d.Replica, d.Store)
	}
	for r, st := range sh.Members {
		if st == d.Store {
			return invalid("store %s already holds replica %d of shard %d", d.Store, r, d.Shard)
		}
	}
	sh.Members[d.Replica] = d.Store
	delete(sh.Pending, d.Replica)
	sh.CCID = max(sh.CCID, d.CCID)
	sh.MaxReplica = max(sh.MaxReplica, d.Replica)
	return applied("shard %d replica %d added on %s", d.Shard, d.Replica, d.Store)
}

func (s *State) replicaRemoving(ev events.Event, d events.ReplicaChange) Result {
	sh, rejected, ok := s.changeTarget(d)
	if !ok {
		return rejected
	}
	st, ok := sh.Members[d.Replica]
	if !ok {
		return noop("replica %d is not a member of shard %d", d.Replica, d.Shard)
	}
	if sh.Pending == nil {
		sh.Pending = map[uint64]Pending{}
	}
	sh.Pending[d.Replica] = Pending{Kind: PendingRemoving, Store: st, CCID: d.CCID, Op: d.Op, Seq: ev.Seq}
	return applied("shard %d removing replica %d from %s", d.Shard, d.Replica, st)
}

func (s *State) replicaRemoved(d events.ReplicaChange) Result {
	sh, rejected, ok := s.changeTarget(d)
	if !ok {
		return rejected
	}
	st, member := sh.Members[d.Replica]
	if !member {
		if _, gone := sh.Removed[d.Replica]; gone {
			delete(sh.Pending, d.Replica)
			return noop("replica %d of shard %d already removed", d.Replica, d.Shard)
		}
		st = d.Store
	}
	delete(sh.Members, d.Replica)
	delete(sh.Pending, d.Replica)
	if sh.Removed == nil {
		sh.Removed = map[uint64]string{}
	}
	sh.Removed[d.Replica] = st
	sh.CCID = max(sh.CCID, d.CCID)
	sh.MaxReplica = max(sh.MaxReplica, d.Replica)
	if sh.Leader == d.Replica {
		sh.Leader = 0
	}
	return applied("shard %d replica %d removed from %s", d.Shard, d.Replica, st)
}

func (s *State) shardObserved(d events.ShardObserved) Result {
	sh, ok := s.Shards[d.Shard]
	if !ok {
		return invalid("unknown shard %d", d.Shard)
	}
	if d.CCID < sh.CCID {
		return noop("shard %d observed ccid %d older than %d", d.Shard, d.CCID, sh.CCID)
	}
	if d.CCID == sh.CCID {
		if d.Leader == sh.Leader || (d.Leader != 0 && !sh.IsMember(d.Leader)) {
			return noop("shard %d observed ccid %d is not newer", d.Shard, d.CCID)
		}
		sh.Leader = d.Leader
		return applied("shard %d leader %d", d.Shard, d.Leader)
	}
	if len(d.Replicas) == 0 {
		return invalid("shard %d observed with no replicas", d.Shard)
	}
	if r, bad := s.checkReplicaSet(d.Replicas); bad {
		return r
	}
	for _, r := range sortedKeys(d.Replicas) {
		if _, retired := sh.Retired[r]; retired {
			return noop("shard %d observed ccid %d names replica %d, retired by the recovery at seq %d: Raft's membership from before it", d.Shard, d.CCID, r, recoverySeq(sh))
		}
	}
	for r, st := range sh.Members {
		if _, still := d.Replicas[r]; !still {
			if sh.Removed == nil {
				sh.Removed = map[uint64]string{}
			}
			sh.Removed[r] = st
		}
	}
	// Raft is the truth for its own membership.
	for r := range d.Replicas {
		delete(sh.Removed, r)
	}
	sh.Members = cloneMap(d.Replicas)
	sh.MaxReplica = max(sh.MaxReplica, maxKey(d.Replicas))
	for r, p := range sh.Pending {
		if (p.Kind == PendingAdding && sh.IsMember(r)) || (p.Kind == PendingRemoving && !sh.IsMember(r)) {
			delete(sh.Pending, r)
		}
	}
	sh.CCID = d.CCID
	sh.Leader = 0
	if sh.IsMember(d.Leader) {
		sh.Leader = d.Leader
	}
	return newReason().s("shard ").n(d.Shard).s(" observed ccid ").n(d.CCID).s(" with ").n(uint64(len(d.Replicas))).s(" replicas").applied()
}

func (s *State) operatorStarted(ev events.Event, d events.Operator) Result {
	sh, ok := s.Shards[d.Shard]
	if !ok {
		return invalid("unknown shard %d", d.Shard)
	}
	if d.Op == "" {
		return invalid("operator without id")
	}
	if _, ok := s.Operators[d.Op]; ok {
		return invalid("operator %s already running", d.Op)
	}
	if sh.Operator != "" {
		return invalid("shard %d already has operator %s", d.Shard, sh.Operator)
	}
	if d.Remove != 0 && !sh.IsMember(d.Remove) {
		return invalid("operator %s removes replica %d, not a member of shard %d", d.Op, d.Remove, d.Shard)
	}
	if d.Add != "" && !s.registeredStore(d.Add) {
		return invalid("operator %s adds a replica on unregistered store %q", d.Op, d.Add)
	}
	s.Operators[d.Op] = &Operator{ID: d.Op, Shard: d.Shard, Steps: append([]string(nil), d.Steps...), Remove: d.Remove, Add: d.Add, Term: ev.Term, State: OperatorRunning, Started: ev.Seq}
	sh.Operator = d.Op
	sh.Blocked = ""
	return applied("operator %s on shard %d", d.Op, d.Shard)
}

func (s *State) operatorEnded(ev events.Event, d events.Operator, state string) Result {
	op, ok := s.Operators[d.Op]
	if !ok {
		return noop("operator %s is not running", d.Op)
	}
	delete(s.Operators, d.Op)
	if sh, ok := s.Shards[op.Shard]; ok {
		if sh.Operator == d.Op {
			sh.Operator = ""
		}
		// An intent without an outcome ends with its operator: whatever Raft
		// did with it reaches the stream as shard.observed.
		for _, r := range sortedKeys(sh.Pending) {
			if sh.Pending[r].Op == d.Op {
				delete(sh.Pending, r)
			}
		}
	}
	ended := *op
	ended.State = state
	ended.Reason = d.Reason
	ended.Finished = ev.Seq
	if len(s.History) >= MaxHistory {
		n := copy(s.History, s.History[len(s.History)-MaxHistory+1:])
		s.History = s.History[:n]
	}
	s.History = append(s.History, ended)
	return applied("operator %s %s", d.Op, state)
}

func recoverySeq(sh *Shard) uint64 {
	if sh.Recovered == nil {
		return 0
	}
	return sh.Recovered.Seq
}

// shardRecovered applies an operator's recovery: the shard becomes the
// one-member shard {Replica: Store}; every other member (and replica with a
// pending change) must be declared gone, and each gone replica is retired:
// removed, never started again, never a member again. The running operator
// ends (failed), pending intents and the block with it; the projected config
// change id becomes the recovered replica's applied index, so that only
// Raft's membership after the rebuild is observed.
func (s *State) shardRecovered(ev events.Event, d events.ShardRecovered) Result {
	sh, ok := s.Shards[d.Shard]
	if !ok {
		return invalid("unknown shard %d", d.Shard)
	}
	if d.Operator == "" {
		return invalid("shard %d recovered by nobody: the operator who ran it is required", d.Shard)
	}
	if st, ok := sh.Members[d.Replica]; !ok || st != d.Store {
		return invalid("shard %d recovered from replica %d on %q, not a member there (members %s)", d.Shard, d.Replica, d.Store, renderReplicas(sh.Members))
	}
	if _, ok := d.Gone[d.Replica]; ok {
		return invalid("shard %d: the replica recovered from, %d, is declared gone", d.Shard, d.Replica)
	}
	for _, r := range sortedKeys(sh.Members) {
		if _, gone := d.Gone[r]; r != d.Replica && !gone {
			return invalid("shard %d: member %d@%s is neither the replica recovered from nor declared gone", d.Shard, r, sh.Members[r])
		}
	}
	for _, r := range sortedKeys(d.Gone) {
		st := d.Gone[r]
		if m, ok := sh.Members[r]; ok && m == st {
			continue
		}
		if p, ok := sh.Pending[r]; ok && p.Store == st {
			continue
		}
		return invalid("shard %d: gone replica %d@%s is not a member or a pending change there", d.Shard, r, st)
	}
	if sh.Operator != "" {
		if op, ok := s.Operators[sh.Operator]; ok {
			ended := *op
			ended.State = OperatorFailed
			ended.Reason = fmt.Sprintf("shard recovered by %s at seq %d", d.Operator, ev.Seq)
			ended.Finished = ev.Seq
			delete(s.Operators, sh.Operator)
			if len(s.History) >= MaxHistory {
				n := copy(s.History, s.History[len(s.History)-MaxHistory+1:])
				s.History = s.History[:n]
			}
			s.History = append(s.History, ended)
		}
		sh.Operator = ""
	}
	if sh.Removed == nil {
		sh.Removed = map[uint64]string{}
	}
	if sh.Retired == nil {
		sh.Retired = map[uint64]string{}
	}
	for r, st := range d.Gone {
		sh.Removed[r] = st
		sh.Retired[r] = st
		sh.MaxReplica = max(sh.MaxReplica, r)
	}
	sh.Members = map[uint64]string{d.Replica: d.Store}
	sh.Pending = map[uint64]Pending{}
	sh.Blocked = ""
	sh.Leader = 0
	sh.CCID = d.Applied
	sh.Recovered = &Recovery{Seq: ev.Seq, Replica: d.Replica, Store: d.Store, Applied: d.Applied, Operator: d.Operator}
	return applied("shard %d recovered from replica %d@%s at index %d by %s; retired %s", d.Shard, d.Replica, d.Store, d.Applied, d.Operator, renderReplicas(d.Gone))
}

func (s *State) shardBlocked(d events.ShardBlocked) Result {
	sh, ok := s.Shards[d.Shard]
	if !ok {
		return invalid("unknown shard %d", d.Shard)
	}
	if sh.Blocked == d.Reason {
		return noop("shard %d already blocked: %q", d.Shard, d.Reason)
	}
	sh.Blocked = d.Reason
	if d.Reason == "" {
		return applied("shard %d no longer blocked", d.Shard)
	}
	return applied("shard %d blocked: %s", d.Shard, d.Reason)
}

// maxKey is the largest key of m (0 when m is empty), without the slice
// and sort of sortedKeys: shard observations run it on every new ccid.
func maxKey[V any](m map[uint64]V) uint64 {
	var top uint64
	for k := range m {
		top = max(top, k)
	}
	return top
}

func sortedKeys[K cmp.Ordered, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
