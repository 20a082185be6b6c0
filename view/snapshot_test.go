package view_test

import (
	"bytes"
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/rs/zerolog"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// foldTo folds log from seq 1 to seq upTo (0: the tail).
func foldTo(t *testing.T, log events.Log, upTo uint64) *projections.State {
	t.Helper()
	st := projections.New()
	if err := log.Read(context.Background(), 1, func(r events.Record) error {
		if upTo == 0 || r.Seq <= upTo {
			st.ApplyRecord(r)
		}
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return st
}

// putState stores the state after seq as a snapshot.
func putState(t *testing.T, store events.SnapshotStore, log events.Log, seq uint64) events.SnapshotInfo {
	t.Helper()
	st := foldTo(t, log, seq)
	data, si := st.StoredSnapshot()
	si.Writer = "test"
	si, err := store.Put(context.Background(), si, data)
	if err != nil {
		t.Fatal(err)
	}
	return si
}

// catchUp runs a fresh projector with opts until it folded the tail, and
// returns its state and origin.
func catchUp(t *testing.T, log events.Log, lg zerolog.Logger, opts ...view.ProjectorOption) (*projections.State, view.Origin) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	p := view.NewProjector(log, lg, nil, opts...)
	pctx, stop := startProjector(ctx, p)
	v, err := p.CatchUp(pctx)
	stop()
	if err != nil {
		t.Fatalf("catch up: %v", err)
	}
	return v, p.Origin()
}

// From a snapshot at any cut point, the last one included, a projector
// reaches the hash of a fold from seq 1, folding only the tail.
func TestProjectorFromSnapshotSameHash(t *testing.T) {
	const n = 3000
	log := testkit.MixLog(t, n)
	want := foldTo(t, log, 0)
	if want.Seq != n || want.Counters.Applied < n*9/10 {
		t.Fatalf("mix folded to seq %d, %+v", want.Seq, want.Counters)
	}
	full, o := catchUp(t, log, zerolog.Nop())
	if full.Hash() != want.Hash() || o.Snapshot != nil || o.Folded != n {
		t.Fatalf("without snapshots: hash %s (want %s), origin %+v", full.Hash(), want.Hash(), o)
	}
	for _, cut := range []uint64{1, 213, 1500, 2999, n} {
		store := events.NewMemSnapshots(log)
		putState(t, store, log, cut)
		got, o := catchUp(t, log, zerolog.Nop(), view.WithSnapshots(store))
		if got.Hash() != want.Hash() {
			t.Fatalf("from the snapshot at %d: hash %s, want %s", cut, got.Hash(), want.Hash())
		}
		if o.Snapshot == nil || o.Snapshot.Seq != cut || o.Folded != n-cut {
			t.Fatalf("from the snapshot at %d: origin %+v, want %d events folded", cut, o, n-cut)
		}
	}
}

// Snapshots that are not the state they claim are passed over with a
// warning, and the newest good one below them is used.
func TestProjectorIgnoresBadSnapshots(t *testing.T) {
	const n = 2000
	log := testkit.MixLog(t, n)
	want := foldTo(t, log, 0).Hash()
	good := foldTo(t, log, 800)
	other := foldTo(t, log, 1200)
	otherData, otherHash := other.EncodeSnapshotHash()
	const rules = projections.RulesVersion
	// A state as another build's rules folded the same events: sound in
	// itself (it hashes to its recorded hash, its invariants hold) but not
	// the state this build's fold gives. Loaded, it would end the fold at
	// another hash than a fold from seq 1.
	drift := foldTo(t, log, 1200)
	drift.Counters.Applied++
	driftData, driftInfo := drift.StoredSnapshot()
	if driftInfo.Hash == otherHash {
		t.Fatal("the drifted state hashes like the real one")
	}
	driftOther := bytes.Replace(driftData, fmt.Appendf(nil, `"rules":%d,`, rules), fmt.Appendf(nil, `"rules":%d,`, rules+1), 1)
	if bytes.Equal(driftOther, driftData) {
		t.Fatal("no rules version in the snapshot's bytes")
	}
	for name, bad := range map[string]struct {
		info events.SnapshotInfo
		data []byte
		why  string
	}{
		"garbage":       {events.SnapshotInfo{Seq: 1500, Hash: otherHash, Rules: rules}, []byte("{not json"), "bad snapshot"},
		"truncated":     {events.SnapshotInfo{Seq: 1200, Hash: otherHash, Rules: rules}, otherData[:len(otherData)/2], "bad snapshot"},
		"hash mismatch": {events.SnapshotInfo{Seq: 1200, Hash: "0123456789abcdef0123456789abcdef", Rules: rules}, otherData, "recorded hash"},
		"flipped byte":  {events.SnapshotInfo{Seq: 1200, Hash: otherHash, Rules: rules}, bytes.Replace(otherData, []byte(`"next_worker_id":`), []byte(`"next_worker_id":9`), 1), "does not match its state"},
		"seq mismatch":  {events.SnapshotInfo{Seq: 1900, Hash: otherHash, Rules: rules}, otherData, "recorded at seq 1900"},
		// Another build's snapshot: its info and its bytes name its rules.
		"other rules": {events.SnapshotInfo{Seq: 1200, Hash: driftInfo.Hash, Rules: rules + 1}, driftOther, fmt.Sprintf("rules version %d, this reader's are version %d", rules+1, rules)},
		// No rules recorded in the info (an older build's object metadata).
		"no rules recorded": {events.SnapshotInfo{Seq: 1200, Hash: driftInfo.Hash}, driftData, fmt.Sprintf("rules version 0, this reader's are version %d", rules)},
		// Info and bytes disagree: the bytes are what was folded.
		"other rules inside": {events.SnapshotInfo{Seq: 1200, Hash: driftInfo.Hash, Rules: rules}, driftOther, fmt.Sprintf("rules version %d, this build's are version %d", rules+1, rules)},
	} {
		t.Run(name, func(t *testing.T) {
			store := events.NewMemSnapshots(log)
			data, si := good.StoredSnapshot()
			if _, err := store.Put(context.Background(), si, data); err != nil {
				t.Fatal(err)
			}
			if _, err := store.Put(context.Background(), bad.info, bad.data); err != nil {
				t.Fatal(err)
			}
			var logs bytes.Buffer
			got, o := catchUp(t, log, zerolog.New(&syncWriter{w: &logs}), view.WithSnapshots(store))
			if got.Hash() != want {
				t.Fatalf("hash %s, want %s", got.Hash(), want)
			}
			if o.Snapshot == nil || o.Snapshot.Seq != 800 || o.Folded != n-800 {
				t.Fatalf("origin %+v, want the snapshot at 800", o)
			}
			out := logs.String()
			if !strings.Contains(out, `"level":"warn"`) || !strings.Contains(out, "snapshot ignored") ||
				!strings.Contains(out, events.SnapshotName(bad.info.Seq)) || !strings.Contains(out, bad.why) {
				t.Fatalf("no warning naming %s (%s): %s", events.SnapshotName(bad.info.Seq), bad.why, out)
			}
		})
	}
	// With only bad snapshots, a full fold.
	store := events.NewMemSnapshots(log)
	if _, err := store.Put(context.Background(), events.SnapshotInfo{Seq: 1200, Hash: "bad", Rules: rules}, otherData); err != nil {
		t.Fatal(err)
	}
	got, o := catchUp(t, log, zerolog.Nop(), view.WithSnapshots(store))
	if got.Hash() != want || o.Snapshot != nil || o.Folded != n {
		t.Fatalf("only a bad snapshot: hash %s (want %s), origin %+v", got.Hash(), want, o)
	}
}

type syncWriter struct {
	mu sync.Mutex
	w  *bytes.Buffer
}

func (s *syncWriter) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w.Write(p)
}

// A projector that starts from a snapshot at the tail folds no event, and
// still releases an AwaitSeq waiter parked before Run started: the snapshot
// is the state at that seq.
func TestProjectorFromSnapshotAtTailReleasesWaiters(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		const n = 300
		log := testkit.MixLog(t, n)
		store := events.NewMemSnapshots(log)
		putState(t, store, log, n)
		p := view.NewProjector(log, zerolog.Nop(), nil, view.WithSnapshots(store))
		ctx, cancel := context.WithCancel(t.Context())
		defer cancel()
		awaited := make(chan error, 1)
		go func() { awaited <- p.AwaitSeq(ctx, n) }()
		synctest.Wait() // the waiter is parked
		select {
		case err := <-awaited:
			t.Fatalf("AwaitSeq(%d) returned before Run: %v", n, err)
		default:
		}
		ran := make(chan error, 1)
		go func() { ran <- p.Run(ctx) }()
		synctest.Wait() // Run loaded the snapshot and waits for events
		select {
		case err := <-awaited:
			if err != nil {
				t.Fatalf("AwaitSeq(%d): %v", n, err)
			}
		default:
			t.Fatalf("AwaitSeq(%d) still waiting after Run started from the snapshot at %d (origin %+v)", n, n, p.Origin())
		}
		if o := p.Origin(); o.Snapshot == nil || o.Snapshot.Seq != n || o.Folded != 0 {
			t.Fatalf("origin %+v, want the snapshot at %d and nothing folded", o, n)
		}
		cancel()
		<-ran
	})
}

// stepClock moves one second at every Now.
type stepClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *stepClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(time.Second)
	return c.now
}

func (c *stepClock) After(d time.Duration) <-chan time.Time { return time.After(d) }

// LoadFrom folds from the newest snapshot and measures the load on the
// clock it is given.
func TestLoadFromSnapshot(t *testing.T) {
	const n = 1000
	log := testkit.MixLog(t, n)
	store := events.NewMemSnapshots(log)
	putState(t, store, log, 600)
	st, o, err := view.LoadFrom(context.Background(), log, store, zerolog.Nop(), &stepClock{now: eventgen.Base()})
	if err != nil {
		t.Fatal(err)
	}
	if want := foldTo(t, log, 0).Hash(); st.Hash() != want {
		t.Fatalf("hash %s, want %s", st.Hash(), want)
	}
	if o.Snapshot == nil || o.Snapshot.Seq != 600 || o.Folded != n-600 || o.LoadTook != time.Second {
		t.Fatalf("origin %+v: want the snapshot at 600, %d folded, loaded in 1 s of the step clock", o, n-600)
	}
}
