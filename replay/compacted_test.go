package replay_test

import (
	"encoding/json"
	"strings"
	"sync"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/replay"
)

// A replay whose snapshot's following events are compacted between the
// check and the read folds from seq 1 instead, and says so.
func TestReplaySnapshotCompactedFallsBack(t *testing.T) {
	const n = 1000
	log := testkit.MixLog(t, n)
	store := events.NewMemSnapshots(log)
	snapshotAt(t, log, store, 400)
	var once sync.Once
	store.AfterBounds = func() { once.Do(func() { log.Compact(600) }) }
	o := replay.Options{Mode: replay.ModeState, JSON: true, Snapshots: store}
	out, diag := runStream(t, log, o)
	if log.FirstSeq() != 600 {
		t.Fatalf("the log was not compacted: first seq %d", log.FirstSeq())
	}
	o.Snapshots = nil
	plainOut, _ := runStream(t, log, o) // a full fold of what the log holds
	var got, want stateDoc
	if err := json.Unmarshal([]byte(out), &got); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(plainOut), &want); err != nil {
		t.Fatal(err)
	}
	if got.Hash != want.Hash || got.FromSnapshot != nil {
		t.Fatalf("hash %s from %+v; want a full fold's %s", got.Hash, got.FromSnapshot, want.Hash)
	}
	if !strings.Contains(diag, events.ErrCompacted.Error()) || !strings.Contains(diag, "folding from seq 1") {
		t.Fatalf("diag does not say it fell back: %s", diag)
	}
}
