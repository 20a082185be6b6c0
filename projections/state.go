// Package projections folds events into cluster state. It is the pure core of
// termlog: no I/O, no clocks, no goroutines, no logging. The same events in
// the same order give the same state and the same hash on every replica.
package projections

import (
	"cmp"
	"time"

	"github.com/termlog/termlog/events"
)

// Worker states.
const (
	WorkerStarting = "starting"
	WorkerRunning  = "running"
)

// Worker is an active worker. Epoch is the seq of its registration.
type Worker struct {
	ID          uint64 `json:"id"`
	Epoch       uint64 `json:"epoch"`
	Incarnation string `json:"incarnation"`
	Endpoint    string `json:"endpoint"`
	Kind        string `json:"kind"`
	Parallelism int    `json:"parallelism"`
	State       string `json:"state"`
	Term        uint64 `json:"term"` // term it registered in
}

// Store is a registered log store.
type Store struct {
	ID          string    `json:"id"`
	Incarnation string    `json:"incarnation"`
	RaftAddr    string    `json:"raft_addr"`
	State       string    `json:"state"`
	Until       time.Time `json:"until,omitzero"`
	Since       uint64    `json:"since"` // seq of the last state change
	// DrainedBy is the incarnation the store had when its drain began: the
	// drain can end early only once another incarnation (the restarted
	// process) runs its replicas.
	DrainedBy string `json:"drained_by,omitempty"`
	// Stopped is the incarnation that announced its own planned stop
	// (store.state draining with stopping), at StoppedAt (the event's
	// time): that process is stopping or gone, and nothing it reported
	// counts any more. A registration of another incarnation is the
	// restarted process.
	Stopped   string    `json:"stopped,omitempty"`
	StoppedAt time.Time `json:"stopped_at,omitzero"`
}

// PlannedStop reports whether the store's registered process announced its
// own stop (SIGTERM) and no other process has registered since.
func (st Store) PlannedStop() bool {
	return st.Stopped != "" && st.Stopped == st.Incarnation && st.State == events.StoreDraining
}

// Pending is a replica change whose intent is recorded and whose outcome is not.
type Pending struct {
	Kind  string `json:"kind"` // "adding" or "removing"
	Store string `json:"store"`
	CCID  uint64 `json:"ccid"`
	Op    string `json:"op,omitempty"`
	Seq   uint64 `json:"seq"`
}

// Pending kinds.
const (
	PendingAdding   = "adding"
	PendingRemoving = "removing"
)

// Shard is one Raft shard's projected membership.
type Shard struct {
	ID       uint64             `json:"id"`
	Members  map[uint64]string  `json:"members"`           // replica id -> store
	Initial  map[uint64]string  `json:"initial"`           // the shard.created replicas: they bootstrap, later ones join
	Removed  map[uint64]string  `json:"removed,omitempty"` // replica ids that must never start again
	Pending  map[uint64]Pending `json:"pending,omitempty"`
	CCID     uint64             `json:"ccid"`
	Leader   uint64             `json:"leader"`
	Operator string             `json:"operator,omitempty"` // the active operator, if any
	// Blocked is why the scheduler can change nothing on the shard
	// (shard.blocked); "" when it is not blocked. An operator's start
	// clears it.
	Blocked string `json:"blocked,omitempty"`
	// MaxReplica is the highest replica id ever named for the shard (created,
	// intended, added, observed): a new replica gets MaxReplica+1, so an id
	// is never used twice, not even one whose add was abandoned and may
	// still apply in Raft.
	MaxReplica uint64 `json:"max_replica"`
	// Retired are the replicas an operator's recovery declared gone
	// (shard.recovered): like removed ones they never start again, and
	// no later shard.observed makes them members again (a report naming
	// one is Raft's membership from before the recovery).
	Retired map[uint64]string `json:"retired,omitempty"`
	// Recovered is the shard's last recovery, if any.
	Recovered *Recovery `json:"recovered,omitempty"`
}

// Recovery is an operator's recovery of a shard (shard.recovered): it was
// rebuilt as a one-member shard from Replica on Store at Raft index
// Applied, by the event at Seq.
type Recovery struct {
	Seq      uint64 `json:"seq"`
	Replica  uint64 `json:"replica"`
	Store    string `json:"store"`
	Applied  uint64 `json:"applied"`
	Operator string `json:"operator,omitempty"`
}

// IsMember reports whether replica is a member of the shard.
func (s *Shard) IsMember(replica uint64) bool {
	_, ok := s.Members[replica]
	return ok
}

// Operator states.
const (
	OperatorRunning  = "running"
	OperatorFinished = "finished"
	OperatorFailed   = "failed"
)

// Operator is a multi-step change of one shard.
type Operator struct {
	ID       string   `json:"id"`
	Shard    uint64   `json:"shard"`
	Steps    []string `json:"steps,omitempty"`
	Remove   uint64   `json:"remove,omitempty"` // replica to remove first (0: none)
	Add      string   `json:"add,omitempty"`    // store to add a new replica on ("": none)
	Term     uint64   `json:"term"`             // term of its operator.started: a later term inherits it
	State    string   `json:"state"`
	Reason   string   `json:"reason,omitempty"`
	Started  uint64   `json:"started"`
	Finished uint64   `json:"finished,omitempty"`
}

// Anomaly kinds.
const (
	AnomalyStaleTerm  = "stale-term"  // term lower than the current term
	AnomalyFutureTerm = "future-term" // higher term without term.started
	AnomalyStaleLease = "stale-lease" // term.started with a lease not newer than the current term's
	AnomalyInvalid    = "invalid"     // breaks a projection rule
	AnomalyCorrupt    = "corrupt"     // could not be decoded
	// AnomalyWriterMismatch is an event of the current term whose writer
	// is not the term's leader. It is reported, not rejected: the event is
	// applied (or a no-op) as it would be from the leader.
	AnomalyWriterMismatch = "writer-mismatch"
)

// Anomaly is one rejected or corrupt event, or one applied despite a
// writer-mismatch.
type Anomaly struct {
	Seq    uint64 `json:"seq"`
	Term   uint64 `json:"term"`
	Writer string `json:"writer"`
	Type   string `json:"type"`
	Kind   string `json:"kind"`
	Reason string `json:"reason"`
}

// Counters count what the fold did with every event it saw.
type Counters struct {
	Applied   uint64 `json:"applied"`
	NoOps     uint64 `json:"noops"`
	Rejected  uint64 `json:"rejected"`   // all rejections, stale terms included
	StaleTerm uint64 `json:"stale_term"` // rejections by the term rule
	Corrupt   uint64 `json:"corrupt"`
}

// Provenance says which point of the stream a state reflects.
type Provenance struct {
	Seq  uint64    `json:"seq"`  // last event seen (applied, rejected or corrupt)
	Term uint64    `json:"term"` // current term
	At   time.Time `json:"at"`   // time of the last applied event
}

// Bounds of the kept lists; the counters keep the totals.
const (
	MaxAnomalies = 128
	MaxHistory   = 64
)

// State is the projected cluster state. Use New; the zero value is also
// usable and equal to New().
type State struct {
	Provenance
	Leader       string               `json:"leader"`
	Lease        uint64               `json:"lease,omitempty"` // fencing token of the current term (its term.started's lease)
	NextWorkerID uint64               `json:"next_worker_id"`
	Workers      map[uint64]*Worker   `json:"workers"`
	Endpoints    map[string]uint64    `json:"endpoints"` // endpoint -> active worker id
	Stores       map[string]*Store    `json:"stores"`
	Shards       map[uint64]*Shard    `json:"shards"`
	Operators    map[string]*Operator `json:"operators"` // running ones
	History      []Operator           `json:"history"`   // ended ones, newest last, bounded
	Anomalies    []Anomaly            `json:"anomalies"` // newest last, bounded
	Counters     Counters             `json:"counters"`
}

// New returns the state before the first event.
func New() *State {
	s := &State{}
	s.init()
	return s
}

func (s *State) init() {
	if s.NextWorkerID == 0 {
		s.NextWorkerID = 1
	}
	if s.Workers == nil {
		s.Workers = map[uint64]*Worker{}
	}
	if s.Endpoints == nil {
		s.Endpoints = map[string]uint64{}
	}
	if s.Stores == nil {
		s.Stores = map[string]*Store{}
	}
	if s.Shards == nil {
		s.Shards = map[uint64]*Shard{}
	}
	if s.Operators == nil {
		s.Operators = map[string]*Operator{}
	}
}

// Clone returns a deep copy that shares nothing with s.
func (s *State) Clone() *State {
	c := *s
	c.Workers = make(map[uint64]*Worker, len(s.Workers))
	for k, w := range s.Workers {
		w2 := *w
		c.Workers[k] = &w2
	}
	c.Endpoints = make(map[string]uint64, len(s.Endpoints))
	for k, v := range s.Endpoints {
		c.Endpoints[k] = v
	}
	c.Stores = make(map[string]*Store, len(s.Stores))
	for k, st := range s.Stores {
		st2 := *st
		c.Stores[k] = &st2
	}
	c.Shards = make(map[uint64]*Shard, len(s.Shards))
	for k, sh := range s.Shards {
		c.Shards[k] = sh.clone()
	}
	c.Operators = make(map[string]*Operator, len(s.Operators))
	for k, op := range s.Operators {
		op2 := *op
		op2.Steps = append([]string(nil), op.Steps...)
		c.Operators[k] = &op2
	}
	c.History = append([]Operator(nil), s.History...)
	c.Anomalies = append([]Anomaly(nil), s.Anomalies...)
	c.init()
	return &c
}

func (sh *Shard) clone() *Shard {
	c := *sh
	c.Members = cloneMap(sh.Members)
	c.Initial = cloneMap(sh.Initial)
	c.Removed = cloneMap(sh.Removed)
	c.Pending = cloneMap(sh.Pending)
	c.Retired = cloneMap(sh.Retired)
	if sh.Recovered != nil {
		r := *sh.Recovered
		c.Recovered = &r
	}
	return &c
}

func cloneMap[K comparable, V any](m map[K]V) map[K]V {
	if m == nil {
		return nil
	}
	c := make(map[K]V, len(m))
	for k, v := range m {
		c[k] = v
	}
	return c
}

// Worker returns the active worker with this id.
func (s *State) Worker(id uint64) (Worker, bool) {
	w, ok := s.Workers[id]
	if !ok || w == nil {
		return Worker{}, false
	}
	return *w, true
}

// WorkerAt returns the active worker at an endpoint.
func (s *State) WorkerAt(endpoint string) (Worker, bool) {
	id, ok := s.Endpoints[endpoint]
	if !ok {
		return Worker{}, false
	}
	return s.Worker(id)
}

// WorkerByIncarnation returns the active worker registered with this incarnation.
func (s *State) WorkerByIncarnation(inc string) (Worker, bool) {
	for _, w := range s.Workers {
		if w != nil && w.Incarnation == inc {
			return *w, true
		}
	}
	return Worker{}, false
}

// ListWorkers returns copies of the active workers ordered by id. It reads
// only the projection and cannot fail.
func (s *State) ListWorkers() []Worker {
	return sortedCopies(s.Workers, func(w *Worker) Worker { return *w })
}

// ListStores returns copies of the stores ordered by id.
func (s *State) ListStores() []Store {
	return sortedCopies(s.Stores, func(st *Store) Store { return *st })
}

// ListShards returns deep copies of the shards ordered by id.
func (s *State) ListShards() []Shard {
	return sortedCopies(s.Shards, func(sh *Shard) Shard { return *sh.clone() })
}

// sortedCopies returns cp of each value of m that is not nil, ordered by
// key.
func sortedCopies[K cmp.Ordered, V any](m map[K]*V, cp func(*V) V) []V {
	out := make([]V, 0, len(m))
	for _, k := range sortedKeys(m) {
		if v := m[k]; v != nil {
			out = append(out, cp(v))
		}
	}
	return out
}

// ReplicaRef names one replica of one shard.
type ReplicaRef struct {
	Shard   uint64 `json:"shard"`
	Replica uint64 `json:"replica"`
}

// ReplicasOn returns the replicas projected as members on one store and those
// projected as removed from it, each ordered by shard then replica.
func (s *State) ReplicasOn(store string) (members, removed []ReplicaRef) {
	for _, id := range sortedKeys(s.Shards) {
		sh := s.Shards[id]
		for _, r := range sortedKeys(sh.Members) {
			if sh.Members[r] == store {
				members = append(members, ReplicaRef{id, r})
			}
		}
		for _, r := range sortedKeys(sh.Removed) {
			if sh.Removed[r] == store {
				removed = append(removed, ReplicaRef{id, r})
			}
		}
	}
	return members, removed
}
