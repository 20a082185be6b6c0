package replay_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/replay"
)

// snapshotAt stores the state after seq (folded from seq 1) in store.
func snapshotAt(t *testing.T, log *events.MemLog, store events.SnapshotStore, seq uint64) {
	t.Helper()
	st := projections.New()
	_ = log.Read(context.Background(), 1, func(r events.Record) error {
		if r.Seq <= seq {
			st.ApplyRecord(r)
		}
		return nil
	})
	data, si := st.StoredSnapshot()
	si.Writer = "test"
	if _, err := store.Put(context.Background(), si, data); err != nil {
		t.Fatal(err)
	}
}

func runStream(t *testing.T, log events.Log, o replay.Options) (out, diag string) {
	t.Helper()
	var o1, d bytes.Buffer
	o.Diag = &d
	if err := replay.Run(context.Background(), replay.Stream(log), o, &o1); err != nil {
		t.Fatalf("replay %+v: %v (diag %s)", o.Mode, err, d.String())
	}
	return o1.String(), d.String()
}

type stateDoc struct {
	Hash         string               `json:"hash"`
	FromSnapshot *events.SnapshotInfo `json:"from_snapshot"`
	State        json.RawMessage      `json:"state"`
}

// The state at a seq from a snapshot equals the state folded from seq 1, at
// every cut: snapshot below the wanted seq, at it, and at the last seq.
func TestReplayStateFromSnapshot(t *testing.T) {
	const n = 2500
	log := testkit.MixLog(t, n)
	store := events.NewMemSnapshots(log)
	for _, s := range []uint64{400, 1000, 2000, n} {
		snapshotAt(t, log, store, s)
	}
	for _, c := range []struct{ until, from uint64 }{{0, n}, {n, n}, {2499, 2000}, {2000, 2000}, {1999, 1000}, {700, 400}, {399, 0}} {
		o := replay.Options{Mode: replay.ModeState, UntilSeq: c.until, JSON: true}
		plainOut, _ := runStream(t, log, o)
		o.Snapshots = store
		snapOut, diag := runStream(t, log, o)
		var plain, snap stateDoc
		if err := json.Unmarshal([]byte(plainOut), &plain); err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal([]byte(snapOut), &snap); err != nil {
			t.Fatal(err)
		}
		if plain.Hash != snap.Hash || !bytes.Equal(plain.State, snap.State) {
			t.Fatalf("until %d: from snapshot hash %s, from seq 1 %s", c.until, snap.Hash, plain.Hash)
		}
		if plain.FromSnapshot != nil {
			t.Fatalf("until %d: no snapshots given, yet from %+v", c.until, plain.FromSnapshot)
		}
		switch {
		case c.from == 0 && snap.FromSnapshot != nil:
			t.Fatalf("until %d: no snapshot at or below, yet from %+v", c.until, snap.FromSnapshot)
		case c.from > 0 && (snap.FromSnapshot == nil || snap.FromSnapshot.Seq != c.from):
			t.Fatalf("until %d: from %+v, want the snapshot at %d", c.until, snap.FromSnapshot, c.from)
		case c.from > 0 && !strings.Contains(diag, "starting from snapshot "+events.SnapshotName(c.from)):
			t.Fatalf("until %d: diag %q does not say which snapshot", c.until, diag)
		}
		// The text form says it too.
		o.JSON = false
		text, _ := runStream(t, log, o)
		if c.from > 0 && !strings.Contains(text, "from snapshot "+events.SnapshotName(c.from)) {
			t.Fatalf("until %d: text output does not name the snapshot:\n%s", c.until, text)
		}
	}
}

// A diff starts from a snapshot at or below its first seq; the modes that
// need every event never use one.
func TestReplaySnapshotModes(t *testing.T) {
	const n = 1500
	log := testkit.MixLog(t, n)
	store := events.NewMemSnapshots(log)
	snapshotAt(t, log, store, 600)
	snapshotAt(t, log, store, 1400)
	o := replay.Options{Mode: replay.ModeDiff, DiffFrom: 1000, DiffTo: 1450, JSON: true}
	plain, _ := runStream(t, log, o)
	o.Snapshots = store
	snap, diag := runStream(t, log, o)
	if plain != snap || !strings.Contains(diag, "starting from snapshot "+events.SnapshotName(600)) {
		t.Fatalf("diff from a snapshot differs or used none (diag %q):\n%s\nvs\n%s", diag, snap, plain)
	}
	subject, _ := replay.ParseSubject("worker:3")
	for _, o := range []replay.Options{
		{Mode: replay.ModeTimeline}, {Mode: replay.ModeCheck}, {Mode: replay.ModeRejected},
		{Mode: replay.ModeHistory, Subject: subject}, {Mode: replay.ModeDiff, DiffFrom: 0, DiffTo: 10},
	} {
		if replay.SnapshotSound(o) {
			t.Fatalf("mode %d: snapshots must not be sound", o.Mode)
		}
		plain, _ := runStream(t, log, o)
		o.Snapshots = store
		snap, diag := runStream(t, log, o)
		if plain != snap || strings.Contains(diag, "snapshot") {
			t.Fatalf("mode %d used a snapshot (diag %q)", o.Mode, diag)
		}
	}
}

// A damaged snapshot, and one folded by other rules, are reported on Diag
// and passed over; the answer is the same.
func TestReplayIgnoresBadSnapshot(t *testing.T) {
	const n = 1200
	log := testkit.MixLog(t, n)
	store := events.NewMemSnapshots(log)
	snapshotAt(t, log, store, 500)
	if _, err := store.Put(context.Background(), events.SnapshotInfo{Seq: 1100, Hash: "feed", Rules: projections.RulesVersion},
		fmt.Appendf(nil, `{"format":1,"rules":%d,"hash":"feed","state":{}}`, projections.RulesVersion)); err != nil {
		t.Fatal(err)
	}
	st := projections.New()
	_ = log.Read(context.Background(), 1, func(r events.Record) error {
		if r.Seq <= 1150 {
			st.ApplyRecord(r)
		}
		return nil
	})
	st.Counters.Applied++ // what other rules might have folded
	data, si := st.StoredSnapshot()
	si.Rules++
	if _, err := store.Put(context.Background(), si, data); err != nil {
		t.Fatal(err)
	}
	o := replay.Options{Mode: replay.ModeState, JSON: true}
	plain, _ := runStream(t, log, o)
	o.Snapshots = store
	snap, diag := runStream(t, log, o)
	var a, b stateDoc
	_ = json.Unmarshal([]byte(plain), &a)
	_ = json.Unmarshal([]byte(snap), &b)
	if a.Hash != b.Hash || a.Hash == "" {
		t.Fatalf("hash %s, want %s", b.Hash, a.Hash)
	}
	if b.FromSnapshot == nil || b.FromSnapshot.Seq != 500 {
		t.Fatalf("from %+v, want the snapshot at 500", b.FromSnapshot)
	}
	if !strings.Contains(diag, "replay: warning: snapshot skipped: "+events.SnapshotName(1100)) || !strings.Contains(diag, "bad snapshot") {
		t.Fatalf("diag does not warn about the bad snapshot: %q", diag)
	}
	if !strings.Contains(diag, "replay: warning: snapshot skipped: "+events.SnapshotName(1150)) || !strings.Contains(diag, "folded by rules version") {
		t.Fatalf("diag does not warn about the snapshot of other rules: %q", diag)
	}
}
