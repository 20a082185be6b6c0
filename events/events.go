// Package events is termlog's event contract: the envelope, one Go type per
// event kind, a versioned JSON codec, the JSONL export format and the Log
// interface with an in-memory implementation.
//
// It imports only the standard library so that projections stay free of NATS.
//
// # Envelope
//
// Every event is one JSON object (one JetStream message; one JSONL line with
// "seq" added):
//
//	{"v":1,"term":7,"writer":"meta-2","at":"2026-11-30T03:00:00.123Z","type":"worker.registered","data":{...}}
//
//	v       the envelope version (Version); another is corrupt
//	term    the leader term it was decided in: lower than the current term is
//	        rejected (stale-term), higher without a term.started too (future-term)
//	writer  the replica that appended it: the term's leader (another writer is
//	        the writer-mismatch anomaly: reported, applied all the same)
//	at      when the writer appended it (RFC 3339)
//	type    one of the kinds below; an unknown type is corrupt
//	data    the kind's fields, below (unknown fields are ignored by the fold
//	        and refused in projection scripts)
//
// # Event kinds and their fields
//
// The data fields of each kind, by their JSON names (the Go type of the kind
// holds the same, with the rule the fold applies):
//
//	term.started (TermStarted)
//	    term         the term it opens: the envelope's term, above the current one
//	    leader       the replica that leads it, which writes every event of the term
//	    lease        the revision of the lease it holds, the fencing token: once a
//	                 term was started under a lease, a term.started whose lease is not
//	                 newer is a deposed holder's, rejected as stale-lease (0: a log
//	                 from before leases; then every later term needs a lease too)
//	worker.registered (WorkerRegistered)
//	    id           the new worker's id: must be the projection's next_worker_id
//	    epoch        left 0 by writers: the fold sets it to the event's seq
//	    incarnation  the worker process's identity (a restart is a new one)
//	    endpoint     host:port; an active worker there is removed in the same step
//	    kind         the worker's kind ("compute", ...)
//	    parallelism  its slots
//	worker.activated (WorkerActivated)
//	    id, epoch    the worker (id and the seq of its registration) now running
//	worker.expired (WorkerExpired)
//	    id, epoch    the worker removed: exactly that id and epoch, else a no-op
//	worker.deregistered (WorkerDeregistered)
//	    id, epoch    as worker.expired, asked for by the worker itself
//	store.registered (StoreRegistered)
//	    store        the store's id
//	    incarnation  the store process's identity
//	    raft_addr    its Raft address, unique among live stores
//	store.state (StoreState)
//	    store        the store's id
//	    state        up, down, draining or tombstone
//	    until        the end of a drain (RFC 3339; absent otherwise)
//	    stopping     with draining: the store's own announcement that its
//	                 process stops for a planned restart (SIGTERM); its
//	                 replicas count as not running from this event on
//	shard.created (ShardCreated)
//	    shard        the shard's id
//	    replicas     its initial members, {replica id: store}
//	shard.replica.adding, .added, .removing, .removed (ShardReplicaAdding, ...: ReplicaChange)
//	    shard        the shard
//	    replica      the replica id added or removed
//	    store        the store it is (to be) on
//	    ccid         the config change id the change was proposed at
//	    op           the operator whose step it is (absent: none)
//	    note         an outcome's provenance, when it is not plain: e.g. its
//	                 step's give-up found the intent claimed in Raft and the
//	                 change was re-sent with its config change id
//	shard.observed (ShardObserved)
//	    shard        the shard
//	    ccid         Raft's config change id: applied only when newer than the projected one
//	    replicas     Raft's membership, {replica id: store}
//	    leader       Raft's leader replica (0: none)
//	operator.started, .finished, .failed (OperatorStarted, ...: Operator)
//	    op           the operator's id
//	    shard        its shard
//	    steps        its plan for people ("remove 3", "add on s4")
//	    reason       why it failed (or why it started)
//	    remove       the replica it removes first (0: none)
//	    add          the store it adds a new replica on ("": none)
//	shard.blocked (ShardBlocked)
//	    shard        the shard
//	    reason       why the scheduler can change nothing on it ("": no longer blocked)
//	shard.recovered (ShardRecovered)
//	    shard        the shard an operator rebuilt after it lost quorum for good
//	    replica      the surviving replica it was rebuilt from (its only member after)
//	    store        the store of that replica
//	    applied      that replica's applied index (entries after it are lost)
//	    gone         the replicas declared gone, {replica id: store}: retired,
//	                 never started again, like removed ones
//	    operator     who ran termlog shard recover
//	    reason       why (free text, absent: none)
package events

import (
	"time"
)

// Version is the envelope version this codec writes and the only one it reads.
const Version = 1

// Event kinds. The names are the contract: never rename or remove one.
const (
	TypeTermStarted         = "term.started"
	TypeWorkerRegistered    = "worker.registered"
	TypeWorkerActivated     = "worker.activated"
	TypeWorkerExpired       = "worker.expired"
	TypeWorkerDeregistered  = "worker.deregistered"
	TypeStoreRegistered     = "store.registered"
	TypeStoreState          = "store.state"
	TypeShardCreated        = "shard.created"
	TypeShardReplicaAdding  = "shard.replica.adding"
	TypeShardReplicaAdded   = "shard.replica.added"
	TypeShardReplicaRemove  = "shard.replica.removing"
	TypeShardReplicaRemoved = "shard.replica.removed"
	TypeShardObserved       = "shard.observed"
	TypeOperatorStarted     = "operator.started"
	TypeOperatorFinished    = "operator.finished"
	TypeOperatorFailed      = "operator.failed"
	TypeShardBlocked        = "shard.blocked"
	TypeShardRecovered      = "shard.recovered"
)

// Event is one entry of the stream: the envelope plus its typed payload.
//
// Seq is the stream sequence; it comes from the log (message metadata) and is
// never stored in the body. Zero means "not yet appended".
type Event struct {
	Seq    uint64
	Term   uint64
	Writer string
	At     time.Time
	Data   Payload

	// body is the encoding Seal made; Encode returns it as it is.
	body []byte
}

// Type is the kind of the event's payload ("" when it has none).
func (e Event) Type() string {
	if e.Data == nil {
		return ""
	}
	return e.Data.Type()
}

// Payload is the data of one event kind.
type Payload interface {
	Type() string
}

// TermStarted opens a leader term. Term must equal the envelope term.
//
// Terms count leaders: a leader starts the term after the last one it
// projected (1, 2, 3, ...). Lease is the revision of the lease it holds (the
// lease KV's revision when it took the lease), the fencing token: a
// term.started whose lease is not newer than the current term's is a
// deposed holder's and is rejected. Logs written before terms counted
// leaders have no lease (0) and terms equal to lease revisions.
type TermStarted struct {
	Term   uint64 `json:"term"`
	Leader string `json:"leader"`
	Lease  uint64 `json:"lease,omitempty"`
}

// WorkerRegistered adds a worker. Epoch is filled by the projection with the
// event's seq; writers leave it 0.
type WorkerRegistered struct {
	ID          uint64 `json:"id"`
	Epoch       uint64 `json:"epoch"`
	Incarnation string `json:"incarnation"`
	Endpoint    string `json:"endpoint"`
	Kind        string `json:"kind"`
	Parallelism int    `json:"parallelism"`
}

// WorkerActivated moves a worker from Starting to Running.
type WorkerActivated struct {
	ID    uint64 `json:"id"`
	Epoch uint64 `json:"epoch"`
}

// WorkerExpired removes exactly the worker with this id and epoch.
type WorkerExpired struct {
	ID    uint64 `json:"id"`
	Epoch uint64 `json:"epoch"`
}

// WorkerDeregistered removes exactly the worker with this id and epoch.
type WorkerDeregistered struct {
	ID    uint64 `json:"id"`
	Epoch uint64 `json:"epoch"`
}

// StoreRegistered adds or re-registers a log store.
type StoreRegistered struct {
	Store       string `json:"store"`
	Incarnation string `json:"incarnation"`
	RaftAddr    string `json:"raft_addr"`
}

// Store states.
const (
	StoreUp        = "up"
	StoreDown      = "down"
	StoreDraining  = "draining"
	StoreTombstone = "tombstone"
)

// StoreState changes a store's state; Until bounds a draining period.
// Stopping (with draining) is the store's own announcement that its
// process is stopping for a planned restart (its SIGTERM): from this event
// on, that incarnation counts as gone, whatever it last reported.
type StoreState struct {
	Store    string    `json:"store"`
	State    string    `json:"state"`
	Until    time.Time `json:"until,omitzero"`
	Stopping bool      `json:"stopping,omitempty"`
}

// ShardCreated creates a shard with its initial replicas {replica id: store}.
type ShardCreated struct {
	Shard    uint64            `json:"shard"`
	Replicas map[uint64]string `json:"replicas"`
}

// ReplicaChange is the data of the four shard.replica.* kinds: intent
// (adding, removing) first, outcome (added, removed) after Raft applied it.
type ReplicaChange struct {
	Shard   uint64 `json:"shard"`
	Replica uint64 `json:"replica"`
	Store   string `json:"store"`
	CCID    uint64 `json:"ccid"`
	Op      string `json:"op,omitempty"`
	// Note says how an outcome was resolved when it is not plain (the
	// step's give-up found the intent claimed in Raft: the change was
	// re-sent with the same config change id and read back).
	Note string `json:"note,omitempty"`
}

// ShardReplicaAdding is the intent to add a replica.
type ShardReplicaAdding ReplicaChange

// ShardReplicaAdded records that Raft applied the addition.
type ShardReplicaAdded ReplicaChange

// ShardReplicaRemoving is the intent to remove a replica.
type ShardReplicaRemoving ReplicaChange

// ShardReplicaRemoved records that Raft applied the removal.
type ShardReplicaRemoved ReplicaChange

// ShardObserved is membership as reported by Raft itself. It is applied only
// when CCID is newer than the projected one.
type ShardObserved struct {
	Shard    uint64            `json:"shard"`
	CCID     uint64            `json:"ccid"`
	Replicas map[uint64]string `json:"replicas"`
	Leader   uint64            `json:"leader"`
}

// Operator is the data of the three operator.* kinds. An operator.started
// names its plan: Remove (a replica id, 0 for none) first, then one new
// replica on the store Add ("" for none); Steps says the same for people.
type Operator struct {
	Op     string   `json:"op"`
	Shard  uint64   `json:"shard"`
	Steps  []string `json:"steps,omitempty"`
	Reason string   `json:"reason,omitempty"`
	Remove uint64   `json:"remove,omitempty"`
	Add    string   `json:"add,omitempty"`
}

// OperatorStarted opens an operator on a shard.
type OperatorStarted Operator

// OperatorFinished closes an operator successfully.
type OperatorFinished Operator

// OperatorFailed closes an operator with a reason.
type OperatorFailed Operator

// ShardRecovered records an operator's recovery of a shard that lost its
// quorum for good (termlog shard recover): the shard is rebuilt as a
// one-member shard from the surviving Replica on Store, whose applied index
// was Applied when the plan was made; the replicas in Gone are declared
// lost: retired, never started again (like removed ones), and whatever they
// had committed after Applied is lost. Operator is who ran it.
type ShardRecovered struct {
	Shard    uint64            `json:"shard"`
	Replica  uint64            `json:"replica"`
	Store    string            `json:"store"`
	Applied  uint64            `json:"applied"`
	Gone     map[uint64]string `json:"gone"`
	Operator string            `json:"operator"`
	Reason   string            `json:"reason,omitempty"`
}

// ShardBlocked records why the scheduler can change nothing on a shard
// (no quorum of running replicas, no store to add a replica on, its
// membership unreadable), once per change of reason; "" ends it. It is
// recorded once, not on every planning tick, so a shard that stays blocked
// costs one event.
type ShardBlocked struct {
	Shard  uint64 `json:"shard"`
	Reason string `json:"reason"`
}

func (TermStarted) Type() string          { return TypeTermStarted }
func (WorkerRegistered) Type() string     { return TypeWorkerRegistered }
func (WorkerActivated) Type() string      { return TypeWorkerActivated }
func (WorkerExpired) Type() string        { return TypeWorkerExpired }
func (WorkerDeregistered) Type() string   { return TypeWorkerDeregistered }
func (StoreRegistered) Type() string      { return TypeStoreRegistered }
func (StoreState) Type() string           { return TypeStoreState }
func (ShardCreated) Type() string         { return TypeShardCreated }
func (ShardReplicaAdding) Type() string   { return TypeShardReplicaAdding }
func (ShardReplicaAdded) Type() string    { return TypeShardReplicaAdded }
func (ShardReplicaRemoving) Type() string { return TypeShardReplicaRemove }
func (ShardReplicaRemoved) Type() string  { return TypeShardReplicaRemoved }
func (ShardObserved) Type() string        { return TypeShardObserved }
func (OperatorStarted) Type() string      { return TypeOperatorStarted }
func (OperatorFinished) Type() string     { return TypeOperatorFinished }
func (OperatorFailed) Type() string       { return TypeOperatorFailed }
func (ShardBlocked) Type() string         { return TypeShardBlocked }
func (ShardRecovered) Type() string       { return TypeShardRecovered }

// Types lists every known kind, in contract order.
func Types() []string {
	out := make([]string, 0, len(decoders))
	for _, d := range decoderList {
		out = append(out, d.typ)
	}
	return out
}
