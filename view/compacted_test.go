package view_test

import (
	"bytes"
	"context"
	"strings"
	"sync"
	"testing"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/view"
)

// compactAfterCheck returns a store over log holding the state at seq snap,
// whose log is compacted below seq before right after the first bounds
// check: the snapshot passes the check, and the events after it are gone
// when the reader reads them.
func compactAfterCheck(t *testing.T, log *events.MemLog, snap, before uint64) *events.MemSnapshots {
	t.Helper()
	store := events.NewMemSnapshots(log)
	putState(t, store, log, snap)
	var once sync.Once
	store.AfterBounds = func() { once.Do(func() { log.Compact(before) }) }
	return store
}

// A projector whose snapshot's following events are compacted between the
// check and the read falls back to a full fold, with a warning, rather than
// folding the events after the gap onto the snapshot.
func TestProjectorSnapshotCompactedFallsBack(t *testing.T) {
	const n = 1000
	log := testkit.MixLog(t, n)
	store := compactAfterCheck(t, log, 400, 600)
	var logs bytes.Buffer
	got, o := catchUp(t, log, zerolog.New(&syncWriter{w: &logs}), view.WithSnapshots(store))
	if log.FirstSeq() != 600 {
		t.Fatalf("the log was not compacted: first seq %d", log.FirstSeq())
	}
	want := foldTo(t, log, 0) // a full fold of what the log holds
	if got.Hash() != want.Hash() || got.Seq != n {
		t.Fatalf("state at seq %d hash %s, want a full fold: seq %d hash %s", got.Seq, got.Hash(), want.Seq, want.Hash())
	}
	if o.Snapshot != nil || o.Folded != n-599 {
		t.Fatalf("origin %+v, want no snapshot and %d folded", o, n-599)
	}
	if out := logs.String(); !strings.Contains(out, "the events after the snapshot are gone") || !strings.Contains(out, events.ErrCompacted.Error()) {
		t.Fatalf("no warning about the compacted snapshot: %s", out)
	}
}

// LoadFrom does the same.
func TestLoadFromSnapshotCompactedFallsBack(t *testing.T) {
	const n = 1000
	log := testkit.MixLog(t, n)
	store := compactAfterCheck(t, log, 400, 600)
	var logs bytes.Buffer
	got, o, err := view.LoadFrom(context.Background(), log, store, zerolog.New(&syncWriter{w: &logs}), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := foldTo(t, log, 0)
	if got.Hash() != want.Hash() || o.Snapshot != nil || o.Folded != n-599 {
		t.Fatalf("hash %s origin %+v; want a full fold: hash %s, %d folded", got.Hash(), o, want.Hash(), n-599)
	}
	if !strings.Contains(logs.String(), "the events after the snapshot are gone") {
		t.Fatalf("no warning about the compacted snapshot: %s", logs.String())
	}
}
