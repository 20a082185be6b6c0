package events_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
)

const testRules = 3

// decodeSeq is a decode for LoadSnapshot: the bytes are "state@<seq>".
func decodeSeq(si events.SnapshotInfo, b []byte) (string, error) {
	if want := fmt.Sprintf("state@%d", si.Seq); string(b) != want {
		return "", fmt.Errorf("bytes %q are not %q", b, want)
	}
	return string(b), nil
}

func put(t *testing.T, s events.SnapshotStore, seq uint64) {
	t.Helper()
	if _, err := s.Put(context.Background(), events.SnapshotInfo{Seq: seq, Rules: testRules, Writer: "test"}, fmt.Appendf(nil, "state@%d", seq)); err != nil {
		t.Fatalf("Put at %d: %v", seq, err)
	}
}

// memLogN is a MemLog of n recorded no-ops.
func memLogN(t *testing.T, n int) *events.MemLog {
	t.Helper()
	l := events.NewMemLog()
	appendN(t, l, n)
	return l
}

func appendN(t *testing.T, l *events.MemLog, n int) {
	t.Helper()
	tail, err := l.Tail(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	evs := make([]events.Event, n)
	for i := range evs {
		evs[i] = events.Event{Term: 1, Writer: "test", At: time.Unix(int64(tail)+int64(i), 0).UTC(), Data: events.WorkerDeregistered{ID: 1, Epoch: tail + uint64(i) + 1}}
	}
	if _, err := l.Append(context.Background(), tail, evs...); err != nil {
		t.Fatal(err)
	}
}

// boundsStore is a store whose Bounds goes through a hook.
type boundsStore struct {
	*events.MemSnapshots
	bounds func(ctx context.Context) (events.StreamBounds, error)
}

func (b boundsStore) Bounds(ctx context.Context) (events.StreamBounds, error) { return b.bounds(ctx) }

// MemSnapshots, like a store next to a real stream, refuses a snapshot
// beyond the log's tail; it stamps a snapshot put without a time with its
// Now.
func TestMemSnapshotsRefusesBeyondTail(t *testing.T) {
	store := events.NewMemSnapshots(memLogN(t, 40))
	if _, err := store.Put(context.Background(), events.SnapshotInfo{Seq: 41}, []byte("x")); err == nil || !strings.Contains(err.Error(), "ends at seq 40") {
		t.Fatalf("Put at 41 on a 40-event log: %v, want refused", err)
	}
	put(t, store, 40)
	at := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	store.Now = func() time.Time { return at }
	si, err := store.Put(context.Background(), events.SnapshotInfo{Seq: 20}, []byte("x"))
	if err != nil || !si.At.Equal(at) {
		t.Fatalf("Put without a time: at %v, %v; want the store's Now %v", si.At, err, at)
	}
}

// A snapshot beyond the stream's last seq (a stream that lost its tail: put
// back from an older backup under the same identity) is passed over with
// that reason; the older one is used.
func TestLoadSnapshotBeyondLastSeq(t *testing.T) {
	mem := events.NewMemSnapshots(memLogN(t, 50))
	put(t, mem, 30)
	put(t, mem, 50)
	store := boundsStore{mem, func(context.Context) (events.StreamBounds, error) {
		return events.StreamBounds{ID: "mem", FirstSeq: 1, LastSeq: 40}, nil
	}}
	v, si, skipped, err := events.LoadSnapshot(context.Background(), store, 0, testRules, decodeSeq)
	if err != nil || si.Seq != 30 || v != "state@30" {
		t.Fatalf("got %q at %d, %v; want the snapshot at 30", v, si.Seq, err)
	}
	if len(skipped) != 1 || !errors.Is(skipped[0], events.ErrSnapshotSkipped) ||
		!strings.Contains(skipped[0].Error(), events.SnapshotName(50)) || !strings.Contains(skipped[0].Error(), "beyond the stream's last seq 40") {
		t.Fatalf("skipped %v, want the snapshot at 50 beyond the last seq", skipped)
	}
}

// A snapshot stored while LoadSnapshot reads the store (a leader appending
// and snapshotting on a busy cluster) is not mistaken for one beyond the
// stream's end: the list is read before the bounds.
func TestLoadSnapshotStoredMeanwhile(t *testing.T) {
	log := memLogN(t, 50)
	mem := events.NewMemSnapshots(log)
	put(t, mem, 30)
	store := boundsStore{mem, func(ctx context.Context) (events.StreamBounds, error) {
		b, err := mem.Bounds(ctx)
		// Right after the bounds were read, the leader appends 10 events
		// and stores a snapshot at its new tail.
		appendN(t, log, 10)
		put(t, mem, 60)
		return b, err
	}}
	v, si, skipped, err := events.LoadSnapshot(context.Background(), store, 0, testRules, decodeSeq)
	if err != nil || si.Seq != 30 || v != "state@30" || len(skipped) != 0 {
		t.Fatalf("got %q at %d, skipped %v, %v; want the snapshot at 30 and nothing passed over", v, si.Seq, skipped, err)
	}
	// The next load sees the new one.
	store.bounds = mem.Bounds
	if _, si, skipped, err := events.LoadSnapshot(context.Background(), store, 0, testRules, decodeSeq); err != nil || si.Seq != 60 || len(skipped) != 0 {
		t.Fatalf("second load: at %d, skipped %v, %v; want the snapshot at 60", si.Seq, skipped, err)
	}
}

// A snapshot of other rules is passed over without decoding it.
func TestLoadSnapshotOtherRules(t *testing.T) {
	mem := events.NewMemSnapshots(memLogN(t, 20))
	put(t, mem, 10)
	if _, err := mem.Put(context.Background(), events.SnapshotInfo{Seq: 15, Rules: testRules + 1}, []byte("state@15")); err != nil {
		t.Fatal(err)
	}
	read := 0
	_, si, skipped, err := events.LoadSnapshot(context.Background(), mem, 0, testRules, func(si events.SnapshotInfo, b []byte) (string, error) {
		read++
		return decodeSeq(si, b)
	})
	if err != nil || si.Seq != 10 || read != 1 {
		t.Fatalf("at %d, %d decoded, %v; want the snapshot at 10, decoded alone", si.Seq, read, err)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0].Error(), fmt.Sprintf("folded by rules version %d, this reader's are version %d", testRules+1, testRules)) {
		t.Fatalf("skipped %v, want the snapshot at 15 of other rules", skipped)
	}
}
