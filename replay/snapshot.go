package replay

import (
	"context"
	"errors"
	"fmt"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// Seeker is a Source that can start after a given seq: the live stream.
// Run starts it after a snapshot when Options.Snapshots is set.
type Seeker interface {
	Source
	// ReadFrom is Read starting at seq from.
	ReadFrom(ctx context.Context, from uint64, fn func(Item) error) error
}

// SnapshotSound reports whether a mode's answer can start from a snapshot:
// only the state at a seq (ModeState without UntilTime) and a diff (the
// snapshot at or below its first seq). The others need every event: the
// timeline, a history and the rejected list print events a snapshot folded
// away, and a check must check every step. UntilTime needs every event too:
// a snapshot does not say when its events happened.
func SnapshotSound(o Options) bool {
	switch o.Mode {
	case ModeState:
		return o.UntilTime.IsZero()
	case ModeDiff:
		return o.DiffFrom > 0
	}
	return false
}

// snapshotBound is the highest seq a snapshot may be at for o (0: the tail).
func snapshotBound(o Options) uint64 {
	if o.Mode == ModeDiff {
		return o.DiffFrom
	}
	return o.UntilSeq
}

// startFromSnapshot loads the newest usable snapshot for o, and returns a
// folder at its state and the seq to read from; with none usable (each one
// passed over is reported on Diag), a fresh folder and seq 1.
func startFromSnapshot(ctx context.Context, o Options) (*Folder, uint64, *events.SnapshotInfo) {
	st, si, skipped, err := events.LoadSnapshot(ctx, o.Snapshots, snapshotBound(o), projections.RulesVersion, projections.DecodeStoredSnapshot)
	for _, s := range skipped {
		fmt.Fprintf(o.Diag, "replay: warning: %v\n", s)
	}
	switch {
	case err == nil:
		fmt.Fprintf(o.Diag, "replay: starting from snapshot %s (seq %d, term %d, hash %s, written by %s in term %d); folding the events after it\n",
			si.Name, si.Seq, si.Term, si.Hash, si.Writer, si.LeaderTerm)
		return NewFolderFrom(st), si.Seq + 1, &si
	case errors.Is(err, events.ErrNoSnapshot):
		if len(skipped) > 0 {
			fmt.Fprintf(o.Diag, "replay: %v; folding from seq 1\n", err)
		}
	default:
		fmt.Fprintf(o.Diag, "replay: warning: snapshots unreadable (%v); folding from seq 1\n", err)
	}
	return NewFolder(), 1, nil
}

// NewFolderFrom returns a folder at st (a snapshot's state); it takes st.
// Touch lists of events about workers registered before st name no
// endpoint for them.
func NewFolderFrom(st *projections.State) *Folder {
	return &Folder{state: st, endpoints: map[uint64]string{}}
}
