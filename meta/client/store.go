package client

import (
	"errors"
	"fmt"
	"regexp"
	"time"

	"github.com/termlog/termlog/internal/wire"
)

// Store RPCs, served by the meta leader.
const (
	RPCStoreRegister  = wire.RPCStoreRegister
	RPCStoreHeartbeat = wire.RPCStoreHeartbeat
)

// ExecSubject is where a store serves config changes and membership reads
// for the meta leader's scheduler.
func ExecSubject(cluster, store string) string { return wire.Exec(cluster, store) }

var storeIDRe = regexp.MustCompile(`^[A-Za-z0-9_-]{1,64}$`)

// ValidateStoreID accepts 1..64 letters, digits, '-' and '_' (it is part of
// NATS subjects).
func ValidateStoreID(id string) error {
	if !storeIDRe.MatchString(id) {
		return fmt.Errorf("store id %q: want 1..64 of [A-Za-z0-9_-]", id)
	}
	return nil
}

// StoreRegisterRequest registers a log store.
type StoreRegisterRequest struct {
	Store       string `json:"store"`
	Incarnation string `json:"incarnation"`
	RaftAddr    string `json:"raft_addr"`
	// Started is when the process started (its own clock): with the
	// incarnation, what tells a report of this process from one of the
	// process before a restart.
	Started time.Time `json:"started,omitzero"`
}

// ShardReport is one replica's dragonboat ShardInfo as a store reports it.
type ShardReport struct {
	Shard    uint64            `json:"shard"`
	Replica  uint64            `json:"replica"`
	Replicas map[uint64]string `json:"replicas"` // replica id -> raft address
	Leader   uint64            `json:"leader"`
	Term     uint64            `json:"term"`
	CCID     uint64            `json:"ccid"`
	Pending  bool              `json:"pending"`
}

// SkippedReplica is a persisted replica the store refused to start because
// the projection does not list it as a member (a would-be zombie).
type SkippedReplica struct {
	Shard   uint64 `json:"shard"`
	Replica uint64 `json:"replica"`
	Reason  string `json:"reason"`
}

// StoreHeartbeat is a store's periodic report.
type StoreHeartbeat struct {
	Store       string           `json:"store"`
	Incarnation string           `json:"incarnation"`
	Started     time.Time        `json:"started,omitzero"` // the process's start (its clock)
	Shards      []ShardReport    `json:"shards"`
	Skipped     []SkippedReplica `json:"skipped,omitempty"`
}

// Exec operations.
const (
	ExecAdd        = "add"
	ExecRemove     = "remove"
	ExecMembership = "membership"
	// ExecApplied asks a store for its replica of the shard and that
	// replica's applied index, read locally (no quorum needed): the input
	// of an operator's recovery.
	ExecApplied = "applied"
	// ExecGiveUp asks a member store to give up the intent (Operator,
	// Intent) in Raft, before the leader fails a step whose change may
	// still be in flight: the store proposes, at the intent's config change
	// id (CCID), a config change that changes no member (the removal of a
	// replica id no replica ever has, FenceReplica). Once it applied, no
	// proposal of the intent can apply (each names that id, and
	// OrderedConfigChange applies a change only at the id it names):
	// OutcomeGivenUp, Index its Raft index. When Raft's id has moved past
	// CCID already, nothing is proposed: OutcomeApplied with the
	// membership, which shows whether the step's own change moved it.
	// Fenced like a change: term, operator, intent (CheckExec).
	ExecGiveUp = "giveup"
)

// Exec outcomes, as classified by the executing store.
const (
	OutcomeApplied  = "applied"  // Raft applied it; CCID is the membership's after it
	OutcomeRejected = "rejected" // refused at apply time: re-read and re-plan
	OutcomeRetry    = "retry"    // shard not ready / system busy until the deadline
	OutcomeUnknown  = "unknown"  // timed out: it may still apply; re-read first
	OutcomeError    = "error"    // anything else (not a member here, bad request)
	// OutcomeRefused: the store's own projection does not hold the
	// change's intent under the exec's term as the operator's next step
	// (a deposed leader's step, an unknown operator, a stale intent).
	// Nothing was proposed.
	OutcomeRefused = "refused"
	// OutcomeGivenUp: a give-up's fence applied in Raft at Index: no
	// change of the intent can apply any more, and the step may fail.
	OutcomeGivenUp = "given-up"
)

// FenceReplica is the replica id a give-up removes to move a shard's config
// change id past ccid without changing a member: an id in a range no
// replica is ever given (termlog numbers replicas from 1 up), one per id.
func FenceReplica(ccid uint64) uint64 { return FenceReplicaBase + ccid }

// FenceReplicaBase is where the give-ups' replica ids begin (see
// FenceReplica); a replica id at or above it names no replica.
const FenceReplicaBase = 1 << 62

// ExecRequest asks a member store to change or read a shard's membership.
//
// A change (add, remove) is fenced: it names the meta term it was decided
// in, the operator and the seq of the intent event it carries out, and the
// store runs it only when its own projection holds that intent, under that
// term, as the operator's next step (CheckExec). A membership read is not
// fenced (it changes nothing).
type ExecRequest struct {
	Op        string `json:"op"`
	Shard     uint64 `json:"shard"`
	Replica   uint64 `json:"replica,omitempty"`
	Addr      string `json:"addr,omitempty"`
	TimeoutMS int64  `json:"timeout_ms,omitempty"`
	Term      uint64 `json:"term,omitempty"`
	Operator  string `json:"operator,omitempty"`
	Intent    uint64 `json:"intent,omitempty"` // seq of the shard.replica.adding/removing event
	// CCID is the config change id the change was decided on (the
	// intent's): a store whose Raft membership moved past it rejects the
	// change without proposing it.
	CCID uint64 `json:"ccid,omitempty"`
}

// ExecReply is the classified result, with the membership read after it.
type ExecReply struct {
	Outcome  string            `json:"outcome"`
	CCID     uint64            `json:"ccid"`
	Replicas map[uint64]string `json:"replicas,omitempty"` // replica id -> raft address
	Removed  []uint64          `json:"removed,omitempty"`
	Error    string            `json:"error,omitempty"`
	// ExecApplied: the store's replica of the shard and its applied index.
	Replica uint64 `json:"replica,omitempty"`
	Applied uint64 `json:"applied,omitempty"`
	// OutcomeGivenUp: the Raft index of the give-up's fence (Raft's
	// config change id after it).
	Index uint64 `json:"index,omitempty"`
}

// validStore checks a store id and the incarnation it claims.
func validStore(store, incarnation string) error {
	if err := ValidateStoreID(store); err != nil {
		return err
	}
	if incarnation == "" || len(incarnation) > MaxFieldBytes {
		return errors.New("incarnation must be 1..256 bytes")
	}
	return nil
}

// maxDrainMS bounds a drain: 7 days.
const maxDrainMS = int64(7 * 24 * time.Hour / time.Millisecond)

// DecodeStoreRegister decodes and validates a store registration.
func DecodeStoreRegister(b []byte) (StoreRegisterRequest, error) {
	var r StoreRegisterRequest
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if err := validStore(r.Store, r.Incarnation); err != nil {
		return r, err
	}
	if err := ValidateEndpoint(r.RaftAddr); err != nil {
		return r, fmt.Errorf("raft_addr: %w", err)
	}
	return r, nil
}

// MaxHeartbeatBytes bounds a store heartbeat.
const MaxHeartbeatBytes = 1 << 20

// DecodeStoreHeartbeat decodes and validates a store heartbeat.
func DecodeStoreHeartbeat(b []byte) (StoreHeartbeat, error) {
	var h StoreHeartbeat
	if len(b) > MaxHeartbeatBytes {
		return h, fmt.Errorf("heartbeat of %d bytes exceeds %d", len(b), MaxHeartbeatBytes)
	}
	if err := decodeStrictN(b, &h, MaxHeartbeatBytes); err != nil {
		return h, err
	}
	if err := ValidateStoreID(h.Store); err != nil {
		return h, err
	}
	for _, s := range h.Shards {
		if s.Shard == 0 || s.Replica == 0 {
			return h, errors.New("shard report without shard or replica id")
		}
	}
	return h, nil
}

// DecodeExec decodes and validates an exec request.
func DecodeExec(b []byte) (ExecRequest, error) {
	var r ExecRequest
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if r.Shard == 0 {
		return r, errors.New("shard is required")
	}
	switch r.Op {
	case ExecMembership, ExecApplied:
	case ExecGiveUp:
		if r.Replica == 0 {
			return r, errors.New("replica is required")
		}
		if r.CCID == 0 {
			return r, errors.New("a give-up needs the intent's config change id")
		}
		if err := fenced(r); err != nil {
			return r, err
		}
	case ExecRemove:
		if r.Replica == 0 || r.Replica >= FenceReplicaBase {
			return r, errors.New("replica is required (below the give-ups' fence ids)")
		}
		if err := fenced(r); err != nil {
			return r, err
		}
	case ExecAdd:
		if r.Replica == 0 || r.Replica >= FenceReplicaBase {
			return r, errors.New("replica is required (below the give-ups' fence ids)")
		}
		if err := fenced(r); err != nil {
			return r, err
		}
		if err := ValidateEndpoint(r.Addr); err != nil {
			return r, fmt.Errorf("addr: %w", err)
		}
	default:
		return r, fmt.Errorf("unknown op %q", r.Op)
	}
	return r, nil
}

func fenced(r ExecRequest) error {
	if r.Term == 0 || r.Operator == "" || r.Intent == 0 {
		return errors.New("a config change needs its term, operator and intent seq")
	}
	if len(r.Operator) > MaxFieldBytes {
		return errors.New("operator id too long")
	}
	return nil
}

// RPCStoreDrain marks a store draining until a deadline (a planned restart:
// it is not marked down meanwhile) or, with a zero duration, up again.
const RPCStoreDrain = wire.RPCStoreDrain

// DrainRequest asks for a store to drain for a while (0: undrain).
type DrainRequest struct {
	Store string `json:"store"`
	ForMS int64  `json:"for_ms"`
}

// RPCStoreSelfDrain is a store announcing its own planned restart (on
// SIGTERM): it drains until the deadline, and the drain survives its
// re-registration. The leader accepts it only from the store's registered
// incarnation.
const RPCStoreSelfDrain = wire.RPCStoreSelfDrain

// SelfDrainRequest is a store's own drain.
type SelfDrainRequest struct {
	Store       string `json:"store"`
	Incarnation string `json:"incarnation"`
	ForMS       int64  `json:"for_ms"`
}

// DecodeSelfDrain decodes and validates a self-drain request.
func DecodeSelfDrain(b []byte) (SelfDrainRequest, error) {
	var r SelfDrainRequest
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if err := validStore(r.Store, r.Incarnation); err != nil {
		return r, err
	}
	if r.ForMS <= 0 || r.ForMS > maxDrainMS {
		return r, errors.New("for_ms must be 1 ms..7 days")
	}
	return r, nil
}

// DecodeDrain decodes and validates a drain request.
func DecodeDrain(b []byte) (DrainRequest, error) {
	var r DrainRequest
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if err := ValidateStoreID(r.Store); err != nil {
		return r, err
	}
	if r.ForMS < 0 || r.ForMS > maxDrainMS {
		return r, errors.New("for_ms must be 0..7 days")
	}
	return r, nil
}

// RPCShardRecover is an operator's recovery of a shard that lost its quorum
// for good (termlog shard recover, admin only): the leader plans it (the
// surviving replica with the highest applied index, asked of every
// surviving store) and, with Yes and not DryRun, records shard.recovered;
// the store recovered from then rebuilds the shard as a one-member shard.
const RPCShardRecover = wire.RPCShardRecover

// RecoverRequest asks for a recovery of Shard from its replica on From.
type RecoverRequest struct {
	Shard    uint64 `json:"shard"`
	From     string `json:"from"`
	DryRun   bool   `json:"dry_run,omitempty"`
	Yes      bool   `json:"yes,omitempty"`
	Force    bool   `json:"force,omitempty"`
	Operator string `json:"operator"` // who runs it (recorded)
}

// DecodeRecover decodes and validates a recovery request.
func DecodeRecover(b []byte) (RecoverRequest, error) {
	var r RecoverRequest
	if err := decodeStrict(b, &r); err != nil {
		return r, err
	}
	if r.Shard == 0 {
		return r, errors.New("shard is required")
	}
	if err := ValidateStoreID(r.From); err != nil {
		return r, fmt.Errorf("from: %w", err)
	}
	if r.Operator == "" || len(r.Operator) > MaxFieldBytes {
		return r, errors.New("operator must be 1..256 bytes")
	}
	return r, nil
}

// ReplicaApplied is what one store said of its replica of a shard.
type ReplicaApplied struct {
	Store   string `json:"store"`
	Replica uint64 `json:"replica,omitempty"`
	Applied uint64 `json:"applied,omitempty"`
	Error   string `json:"error,omitempty"` // it did not answer, or holds no replica
}

// RecoveryPlan is a recovery as planned (and done, when Seq is set).
type RecoveryPlan struct {
	Shard   uint64            `json:"shard"`
	Replica uint64            `json:"replica"` // the replica recovered from
	Store   string            `json:"store"`
	Applied uint64            `json:"applied"`
	Members map[uint64]string `json:"members"` // before
	Gone    map[uint64]string `json:"gone"`    // declared gone: retired
	// Asked is every member store's answer; Lost counts the entries another
	// replica applied beyond Applied (lost by the recovery; 0 when none).
	Asked []ReplicaApplied `json:"asked"`
	Lost  uint64           `json:"lost"`
	// After is the membership right after the recovery: one member; the
	// scheduler then adds replicas up to the replication factor.
	After map[uint64]string `json:"after"`
	Seq   uint64            `json:"seq,omitempty"` // shard.recovered's seq, once recorded
}
