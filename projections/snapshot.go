package projections

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"

	"github.com/termlog/termlog/events"
)

// SnapshotFormat is the version of the snapshot encoding.
const SnapshotFormat = 1

// RulesVersion is the version of the fold's rules: what Apply does with
// each event (apply.go and what it calls). A snapshot records the rules it
// was folded by, and a reader passes over a snapshot folded by other rules:
// its state need not be the state this build's fold of the same events
// gives, and a replica starting from it would end at another hash than the
// replicas that folded from seq 1.
//
// Bump it whenever Apply's rules change: when a change to the fold moves a
// hash in the replay goldens (replay/testdata, projections/testdata, the
// cmd/termlog replay goldens), the rules changed.
const RulesVersion = 4

// ErrOtherRules is wrapped (with ErrBadSnapshot) by the error of a decode of
// a snapshot folded by rules other than RulesVersion.
var ErrOtherRules = errors.New("folded by other projection rules")

type snapshot struct {
	Format int    `json:"format"`
	Rules  uint64 `json:"rules"`
	Hash   string `json:"hash"`
	State  *State `json:"state"`
}

// canonical is the deterministic encoding of a state: encoding/json sorts map
// keys, and every field of State is plain data.
func (s *State) canonical() []byte {
	s.init()
	b, err := json.Marshal(s)
	if err != nil {
		// State holds only plain data; Marshal cannot fail on it.
		return []byte(err.Error())
	}
	return b
}

// Hash is a deterministic hash of the whole state, provenance included: two
// replicas that folded the same events have the same hash.
func (s *State) Hash() string {
	sum := sha256.Sum256(s.canonical())
	return hex.EncodeToString(sum[:16])
}

// EncodeSnapshot encodes the state with its hash.
func (s *State) EncodeSnapshot() []byte {
	b, _ := s.EncodeSnapshotHash()
	return b
}

// EncodeSnapshotHash encodes the state with its hash, and returns the hash.
func (s *State) EncodeSnapshotHash() ([]byte, string) {
	h := s.Hash()
	b, _ := json.Marshal(snapshot{Format: SnapshotFormat, Rules: RulesVersion, Hash: h, State: s})
	return b, h
}

// ErrBadSnapshot is wrapped by every DecodeSnapshot error.
var ErrBadSnapshot = errors.New("bad snapshot")

// DecodeSnapshot decodes a snapshot and verifies its format, hash and invariants.
func DecodeSnapshot(b []byte) (*State, error) {
	s, _, err := decodeSnapshot(b)
	return s, err
}

// DecodeSnapshotAt is DecodeSnapshot for a snapshot recorded as the state
// after seq with hash: it also fails (wrapping ErrBadSnapshot) when the
// snapshot is another state.
func DecodeSnapshotAt(b []byte, seq uint64, hash string) (*State, error) {
	s, h, err := decodeSnapshot(b)
	switch {
	case err != nil:
		return nil, err
	case h != hash:
		return nil, fmt.Errorf("%w: recorded hash %s, the snapshot's state hashes to %s", ErrBadSnapshot, hash, h)
	case s.Seq != seq:
		return nil, fmt.Errorf("%w: recorded at seq %d, the snapshot's state is at seq %d", ErrBadSnapshot, seq, s.Seq)
	}
	return s, nil
}

// StoredSnapshot encodes the state for an events.SnapshotStore: the bytes,
// and the info Put takes with what the state says about itself filled in
// (seq, term, hash, and the rules it was folded by: RulesVersion); the
// writer adds its own name and term.
func (s *State) StoredSnapshot() ([]byte, events.SnapshotInfo) {
	b, h := s.EncodeSnapshotHash()
	return b, events.SnapshotInfo{Seq: s.Seq, Term: s.Term, Hash: h, Rules: RulesVersion}
}

// DecodeStoredSnapshot decodes a snapshot read from an events.SnapshotStore
// and checks that it is the state its info records (seq and hash), folded
// by this build's rules (RulesVersion, in the info and in the bytes): the
// decode every reader of stored snapshots passes to events.LoadSnapshot
// (with RulesVersion, so a snapshot of other rules is passed over before
// its bytes are read).
func DecodeStoredSnapshot(si events.SnapshotInfo, b []byte) (*State, error) {
	if si.Rules != RulesVersion {
		return nil, otherRules(si.Rules)
	}
	return DecodeSnapshotAt(b, si.Seq, si.Hash)
}

func otherRules(v uint64) error {
	return fmt.Errorf("%w: %w: rules version %d, this build's are version %d", ErrBadSnapshot, ErrOtherRules, v, RulesVersion)
}

func decodeSnapshot(b []byte) (*State, string, error) {
	var snap snapshot
	if err := json.Unmarshal(b, &snap); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	if snap.Format != SnapshotFormat {
		return nil, "", fmt.Errorf("%w: format %d, this build reads %d", ErrBadSnapshot, snap.Format, SnapshotFormat)
	}
	if snap.Rules != RulesVersion {
		return nil, "", otherRules(snap.Rules)
	}
	if snap.State == nil {
		return nil, "", fmt.Errorf("%w: no state", ErrBadSnapshot)
	}
	s := snap.State
	s.init()
	for id, w := range s.Workers {
		if w == nil {
			return nil, "", fmt.Errorf("%w: worker %d is null", ErrBadSnapshot, id)
		}
	}
	for id, st := range s.Stores {
		if st == nil {
			return nil, "", fmt.Errorf("%w: store %s is null", ErrBadSnapshot, id)
		}
	}
	for id, sh := range s.Shards {
		if sh == nil {
			return nil, "", fmt.Errorf("%w: shard %d is null", ErrBadSnapshot, id)
		}
		if sh.Members == nil {
			sh.Members = map[uint64]string{}
		}
	}
	for id, op := range s.Operators {
		if op == nil {
			return nil, "", fmt.Errorf("%w: operator %s is null", ErrBadSnapshot, id)
		}
	}
	h := s.Hash()
	if h != snap.Hash {
		return nil, "", fmt.Errorf("%w: hash %s does not match its state (%s)", ErrBadSnapshot, snap.Hash, h)
	}
	if err := s.CheckInvariants(); err != nil {
		return nil, "", fmt.Errorf("%w: %v", ErrBadSnapshot, err)
	}
	return s, h, nil
}
