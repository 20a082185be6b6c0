// Package events is termlog's event contract: the envelope, one Go type per
// event kind, a versioned JSON codec, the JSONL export format and the Log
// interface with an in-memory implementation.
//
// It imports only the standard library so that projections stay free of NATS.
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
type StoreState struct {
	Store string    `json:"store"`
	State string    `json:"state"`
	Until time.Time `json:"until,omitzero"`
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
