package events

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"
)

// SnapshotInfo describes one stored snapshot: an opaque encoded state (the
// projections package encodes and decodes it) and where in which stream it
// was taken.
type SnapshotInfo struct {
	// Name is the store's key; names sort by Seq.
	Name string `json:"name"`
	// Seq is the last seq folded into the state; Term its projected term.
	Seq  uint64 `json:"seq"`
	Term uint64 `json:"term"`
	// Hash is the state's hash as its writer computed it.
	Hash string `json:"hash"`
	// Rules is the version of the fold rules the state was folded by (for
	// the projections package, its RulesVersion); 0 when its writer
	// recorded none. LoadSnapshot passes over a snapshot of other rules.
	Rules uint64 `json:"rules"`
	// Stream identifies the stream the state was folded from (for a
	// JetStream stream its creation time): a snapshot of another stream of
	// the same name (deleted and created again) is not this one's.
	Stream string `json:"stream"`
	// Writer is the replica that wrote it, LeaderTerm the term it led then.
	Writer     string    `json:"writer"`
	LeaderTerm uint64    `json:"leader_term"`
	At         time.Time `json:"at"`
	Size       int       `json:"size"`
	// Unreadable, when set, says why the store could not read this
	// snapshot's description (then Seq is 0, so it is the first pruned);
	// LoadSnapshot passes it over.
	Unreadable string `json:"unreadable,omitempty"`
}

// StreamBounds is what a snapshot is checked against: the identity of the
// stream and the seqs it still holds (FirstSeq is LastSeq+1 when it holds
// none).
type StreamBounds struct {
	ID       string
	FirstSeq uint64
	LastSeq  uint64
}

// SnapshotStore keeps snapshots of the projection of one stream. The store
// knows nothing about what a snapshot holds.
type SnapshotStore interface {
	// Put stores data as a snapshot described by info (Name, Stream, Size
	// and At are filled in by the store) and returns what it stored.
	Put(ctx context.Context, info SnapshotInfo, data []byte) (SnapshotInfo, error)
	// List returns the stored snapshots, ordered by Seq, oldest first.
	List(ctx context.Context) ([]SnapshotInfo, error)
	// Get returns the bytes of one snapshot.
	Get(ctx context.Context, name string) ([]byte, error)
	// Delete removes one snapshot.
	Delete(ctx context.Context, name string) error
	// Bounds describes the stream the snapshots belong to, as it is now.
	Bounds(ctx context.Context) (StreamBounds, error)
}

// SnapshotName is the name of a snapshot at seq: names sort by seq.
func SnapshotName(seq uint64) string { return fmt.Sprintf("snap-%020d", seq) }

// ErrSnapshotSkipped is wrapped by every reason LoadSnapshot passes over a
// snapshot.
var ErrSnapshotSkipped = errors.New("snapshot skipped")

// ErrNoSnapshot is returned by LoadSnapshot when no usable snapshot is at or
// below the wanted seq.
var ErrNoSnapshot = errors.New("no usable snapshot")

// LoadSnapshot returns the newest snapshot at or below upTo (0: the stream's
// last seq) that was folded by the reader's rules and belongs to the stream
// as it is now and decodes: its Rules is rules (checked before its bytes are
// read), its Stream is the stream's ID, its Seq is at most the stream's last
// seq, and the stream still holds every event after it (Seq+1 >= FirstSeq:
// not compacted away). decode turns the bytes into a state and must check them against
// info (hash, seq). Every snapshot passed over is reported in skipped (each
// error wraps ErrSnapshotSkipped and names it), newest first; the caller
// logs them. When none is usable the error wraps ErrNoSnapshot; when the
// store or the stream cannot be read, it is that error.
//
// The list is read before the bounds: every snapshot listed was stored at or
// below the stream's last seq, which only grows, so a snapshot stored
// between the two reads is not mistaken for one beyond the stream's end.
func LoadSnapshot[T any](ctx context.Context, store SnapshotStore, upTo, rules uint64, decode func(SnapshotInfo, []byte) (T, error)) (st T, info SnapshotInfo, skipped []error, err error) {
	var zero T
	list, err := store.List(ctx)
	if err != nil {
		return zero, SnapshotInfo{}, nil, fmt.Errorf("snapshots: list: %w", err)
	}
	bounds, err := store.Bounds(ctx)
	if err != nil {
		return zero, SnapshotInfo{}, nil, fmt.Errorf("snapshots: stream bounds: %w", err)
	}
	if upTo == 0 || upTo > bounds.LastSeq {
		upTo = bounds.LastSeq
	}
	skip := func(si SnapshotInfo, format string, a ...any) {
		skipped = append(skipped, fmt.Errorf("%w: %s (seq %d, term %d, by %s): %s", ErrSnapshotSkipped, si.Name, si.Seq, si.Term, si.Writer, fmt.Sprintf(format, a...)))
	}
	for _, si := range slices.Backward(list) {
		switch {
		case si.Unreadable != "":
			skip(si, "its description in the store is unreadable: %s", si.Unreadable)
			continue
		case si.Seq > upTo && si.Seq <= bounds.LastSeq:
			continue // newer than wanted: fine, just not this time
		case si.Rules != rules:
			skip(si, "folded by rules version %d, this reader's are version %d: its state need not be what these rules fold", si.Rules, rules)
			continue
		case si.Stream != bounds.ID:
			skip(si, "taken from another stream (%q, this one is %q): the stream was created again", si.Stream, bounds.ID)
			continue
		case si.Seq > bounds.LastSeq:
			skip(si, "beyond the stream's last seq %d: the stream lost the events it was folded from", bounds.LastSeq)
			continue
		case si.Seq+1 < bounds.FirstSeq:
			skip(si, "compacted away: the stream starts at seq %d, the events after seq %d are gone", bounds.FirstSeq, si.Seq)
			continue
		}
		b, err := store.Get(ctx, si.Name)
		if err != nil {
			if ctx.Err() != nil {
				return zero, SnapshotInfo{}, skipped, ctx.Err()
			}
			skip(si, "read: %v", err)
			continue
		}
		v, err := decode(si, b)
		if err != nil {
			skip(si, "%v", err)
			continue
		}
		return v, si, skipped, nil
	}
	return zero, SnapshotInfo{}, skipped, fmt.Errorf("%w at or below seq %d (%d stored, %d passed over)", ErrNoSnapshot, upTo, len(list), len(skipped))
}

// PruneSnapshots deletes all but the keep newest snapshots (by seq) and
// returns how many it deleted.
func PruneSnapshots(ctx context.Context, store SnapshotStore, keep int) (int, error) {
	list, err := store.List(ctx)
	if err != nil {
		return 0, err
	}
	n := 0
	for i := 0; i < len(list)-max(keep, 1); i++ {
		if err := store.Delete(ctx, list[i].Name); err != nil {
			return n, fmt.Errorf("snapshots: delete %s: %w", list[i].Name, err)
		}
		n++
	}
	return n, nil
}

// MemSnapshots is an in-memory SnapshotStore over a MemLog, for unit tests.
// Its stream ID is "mem"; its bounds are the MemLog's (its first seq is
// above 1 once compacted, see MemLog.Compact). Like a store
// next to a real stream, it refuses a snapshot beyond the log's tail.
type MemSnapshots struct {
	Log *MemLog
	// Now stamps the snapshots put without a time (nil: time.Now; this
	// package takes no clock).
	Now func() time.Time

	mu    sync.Mutex
	snaps map[string]memSnap

	// AfterBounds, when set, runs after each Bounds call has read the
	// log's bounds: tests change the log there (compact it: then its
	// first seq is above 1), between a reader's check of a snapshot and
	// its read after it.
	AfterBounds func()
}

type memSnap struct {
	info SnapshotInfo
	data []byte
}

// NewMemSnapshots returns an empty store over log.
func NewMemSnapshots(log *MemLog) *MemSnapshots { return &MemSnapshots{Log: log} }

// Put implements SnapshotStore.
func (m *MemSnapshots) Put(ctx context.Context, info SnapshotInfo, data []byte) (SnapshotInfo, error) {
	if err := ctx.Err(); err != nil {
		return SnapshotInfo{}, err
	}
	tail, err := m.Log.Tail(ctx)
	if err != nil {
		return SnapshotInfo{}, err
	}
	if info.Seq > tail {
		return SnapshotInfo{}, fmt.Errorf("put snapshot at seq %d: the log ends at seq %d: not the log it was folded from", info.Seq, tail)
	}
	info.Name, info.Stream, info.Size = SnapshotName(info.Seq), "mem", len(data)
	if info.At.IsZero() {
		now := m.Now
		if now == nil {
			now = time.Now
		}
		info.At = now().UTC()
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.snaps == nil {
		m.snaps = map[string]memSnap{}
	}
	m.snaps[info.Name] = memSnap{info, append([]byte(nil), data...)}
	return info, nil
}

// List implements SnapshotStore.
func (m *MemSnapshots) List(ctx context.Context) ([]SnapshotInfo, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := make([]SnapshotInfo, 0, len(m.snaps))
	for _, s := range m.snaps {
		out = append(out, s.info)
	}
	SortSnapshots(out)
	return out, ctx.Err()
}

// Get implements SnapshotStore.
func (m *MemSnapshots) Get(ctx context.Context, name string) ([]byte, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	s, ok := m.snaps[name]
	if !ok {
		return nil, fmt.Errorf("snapshot %s: not found", name)
	}
	return append([]byte(nil), s.data...), ctx.Err()
}

// Delete implements SnapshotStore.
func (m *MemSnapshots) Delete(ctx context.Context, name string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.snaps, name)
	return ctx.Err()
}

// Bounds implements SnapshotStore: the MemLog's first seq (above 1 once
// compacted, see MemLog.Compact) and tail.
func (m *MemSnapshots) Bounds(ctx context.Context) (StreamBounds, error) {
	tail, err := m.Log.Tail(ctx)
	b := StreamBounds{ID: "mem", FirstSeq: m.Log.FirstSeq(), LastSeq: tail}
	if m.AfterBounds != nil {
		m.AfterBounds()
	}
	return b, err
}

// SortSnapshots orders snapshots by seq, then name.
func SortSnapshots(list []SnapshotInfo) {
	slices.SortFunc(list, func(a, b SnapshotInfo) int {
		return cmp.Or(cmp.Compare(a.Seq, b.Seq), strings.Compare(a.Name, b.Name))
	})
}
