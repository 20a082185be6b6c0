package natslog_test

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
)

// textRules is the rules version of the snapshots of these tests.
const textRules = 7

// decodeText is a decode for LoadSnapshot in these tests: the bytes are
// "state@<seq>", and must name the recorded seq.
func decodeText(si events.SnapshotInfo, b []byte) (string, error) {
	if want := fmt.Sprintf("state@%d", si.Seq); string(b) != want {
		return "", fmt.Errorf("bytes %q are not %q", b, want)
	}
	return string(b), nil
}

func putText(t *testing.T, s events.SnapshotStore, seq uint64) events.SnapshotInfo {
	t.Helper()
	si, err := s.Put(ctxT(t), events.SnapshotInfo{Seq: seq, Term: 1, Hash: "h", Rules: textRules, Writer: "meta-1", LeaderTerm: 1}, fmt.Appendf(nil, "state@%d", seq))
	if err != nil {
		t.Fatalf("Put seq %d: %v", seq, err)
	}
	return si
}

func appendN(t *testing.T, l *natslog.Log, n int) {
	t.Helper()
	tail, err := l.Tail(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	for i := range n {
		if _, err := l.Append(ctxT(t), tail+uint64(i), ev(1, tail+uint64(i)+1)); err != nil {
			t.Fatal(err)
		}
	}
}

// openSnapshots starts a server and opens the Log of cluster and its
// snapshot store, through the connection it returns.
func openSnapshots(t *testing.T, cluster string) (*nats.Conn, *natslog.Log, *natslog.Snapshots) {
	t.Helper()
	nc := connect(t, startServer(t, t.TempDir(), true))
	l := open(t, nc, natslog.Config{Cluster: cluster})
	store, err := natslog.OpenSnapshots(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	return nc, l, store
}

func TestSnapshotsStore(t *testing.T) {
	s := startServer(t, t.TempDir(), true)
	nc := connect(t, s)
	l := open(t, nc, natslog.Config{Cluster: "snaps"})
	if _, err := natslog.BindSnapshots(ctxT(t), l); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("BindSnapshots before the bucket exists: %v, want ErrBucketNotFound", err)
	}
	store, err := natslog.OpenSnapshots(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	if _, _, _, err := events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText); !errors.Is(err, events.ErrNoSnapshot) {
		t.Fatalf("LoadSnapshot of an empty bucket: %v, want ErrNoSnapshot", err)
	}
	appendN(t, l, 30)
	if _, err := store.Put(ctxT(t), events.SnapshotInfo{Seq: 31}, []byte("x")); err == nil {
		t.Fatal("Put of a snapshot beyond the stream's last seq succeeded")
	}
	for _, seq := range []uint64{5, 10, 20, 30} {
		putText(t, store, seq)
	}
	// A reader binds what a writer created.
	bound, err := natslog.BindSnapshots(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	list, err := bound.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	var seqs []uint64
	for _, si := range list {
		seqs = append(seqs, si.Seq)
		if si.Name != events.SnapshotName(si.Seq) || si.Writer != "meta-1" || si.Hash != "h" || si.Rules != textRules || si.Stream == "" || si.Size == 0 || si.At.IsZero() {
			t.Fatalf("listed info %+v", si)
		}
	}
	if !slices.Equal(seqs, []uint64{5, 10, 20, 30}) {
		t.Fatalf("listed seqs %v", seqs)
	}
	for _, c := range []struct {
		upTo, want uint64
	}{{0, 30}, {30, 30}, {29, 20}, {10, 10}, {7, 5}} {
		v, si, skipped, err := events.LoadSnapshot(ctxT(t), bound, c.upTo, textRules, decodeText)
		if err != nil || si.Seq != c.want || v != fmt.Sprintf("state@%d", c.want) || len(skipped) != 0 {
			t.Fatalf("LoadSnapshot up to %d: %q at %d, skipped %v, err %v; want seq %d", c.upTo, v, si.Seq, skipped, err, c.want)
		}
	}
	if _, _, _, err := events.LoadSnapshot(ctxT(t), bound, 4, textRules, decodeText); !errors.Is(err, events.ErrNoSnapshot) {
		t.Fatalf("LoadSnapshot up to 4: %v, want ErrNoSnapshot", err)
	}
	// A snapshot of several chunks, stored twice under its name: read back
	// whole (the object store checks its digest), the first copy's chunks
	// purged.
	big := bytes.Repeat([]byte("0123456789abcdef"), 20_000) // 320 KB: 3 chunks
	for range 2 {
		if _, err := store.Put(ctxT(t), events.SnapshotInfo{Seq: 25, Hash: "big"}, big); err != nil {
			t.Fatal(err)
		}
	}
	if got, err := bound.Get(ctxT(t), events.SnapshotName(25)); err != nil || !bytes.Equal(got, big) {
		t.Fatalf("Get of a 3-chunk snapshot: %d bytes, %v", len(got), err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ost, err := js.Stream(ctxT(t), "OBJ_"+natslog.SnapshotBucket("snaps"))
	if err != nil {
		t.Fatal(err)
	}
	oi, err := ost.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if want := uint64(4 + 3 + 5); oi.State.Msgs != want { // 4 small objects + 3 chunks + 5 meta messages
		t.Fatalf("object stream holds %d messages, want %d (the replaced chunks purged)", oi.State.Msgs, want)
	}
	if err := store.Delete(ctxT(t), events.SnapshotName(25)); err != nil {
		t.Fatal(err)
	}
	n, err := events.PruneSnapshots(ctxT(t), store, 2)
	if err != nil || n != 2 {
		t.Fatalf("prune to 2: deleted %d, %v", n, err)
	}
	list, _ = store.List(ctxT(t))
	if len(list) != 2 || list[0].Seq != 20 || list[1].Seq != 30 {
		t.Fatalf("after pruning: %+v", list)
	}
}

// A snapshot whose bytes do not decode is passed over with a reason, and
// the next older one is used.
func TestSnapshotsBadBytesPassedOver(t *testing.T) {
	_, l, store := openSnapshots(t, "snapbad")
	appendN(t, l, 10)
	putText(t, store, 4)
	if _, err := store.Put(ctxT(t), events.SnapshotInfo{Seq: 9, Term: 1, Hash: "h", Rules: textRules}, []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	v, si, skipped, err := events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText)
	if err != nil || si.Seq != 4 || v != "state@4" {
		t.Fatalf("got %q at %d, %v; want the snapshot at 4", v, si.Seq, err)
	}
	if len(skipped) != 1 || !errors.Is(skipped[0], events.ErrSnapshotSkipped) || !strings.Contains(skipped[0].Error(), events.SnapshotName(9)) {
		t.Fatalf("skipped %v, want the snapshot at 9", skipped)
	}
}

// A snapshot whose following events were purged from the stream cannot be
// completed by a tail: it is passed over; one at the new first seq - 1 or
// later is still good.
func TestSnapshotsCompactedAway(t *testing.T) {
	nc := connect(t, startServer(t, t.TempDir(), true))
	// The stream Open makes denies purges: compact one made without.
	l := openPurgeable(t, nc, natslog.Config{Cluster: "snapgc"})
	store, err := natslog.OpenSnapshots(ctxT(t), l)
	if err != nil {
		t.Fatal(err)
	}
	appendN(t, l, 20)
	putText(t, store, 5)
	putText(t, store, 12)
	st := streamOf(t, nc, l)
	// Purge everything below seq 14: the events after 12 (13) are gone.
	if err := st.Purge(ctxT(t), jetstream.WithPurgeSequence(14)); err != nil {
		t.Fatal(err)
	}
	b, err := store.Bounds(ctxT(t))
	if err != nil || b.FirstSeq != 14 || b.LastSeq != 20 {
		t.Fatalf("bounds after purge: %+v, %v", b, err)
	}
	_, _, skipped, err := events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText)
	if !errors.Is(err, events.ErrNoSnapshot) || len(skipped) != 2 {
		t.Fatalf("after purge: err %v, skipped %v; want both passed over", err, skipped)
	}
	for _, e := range skipped {
		if !strings.Contains(e.Error(), "compacted away") {
			t.Fatalf("reason %v, want compacted away", e)
		}
	}
	putText(t, store, 13) // the events after 13 are all there
	if _, si, _, err := events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText); err != nil || si.Seq != 13 {
		t.Fatalf("snapshot at first seq - 1: %d, %v", si.Seq, err)
	}
}

// A snapshot of a stream that was deleted and created again under the same
// name is another stream's: passed over, even at a seq the new one has.
func TestSnapshotsOfRecreatedStream(t *testing.T) {
	nc, l, store := openSnapshots(t, "snapnew")
	appendN(t, l, 10)
	putText(t, store, 8)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if err := js.DeleteStream(ctxT(t), l.Stream()); err != nil {
		t.Fatal(err)
	}
	l2 := open(t, nc, natslog.Config{Cluster: "snapnew"})
	appendN(t, l2, 10)
	store2, err := natslog.BindSnapshots(ctxT(t), l2)
	if err != nil {
		t.Fatal(err)
	}
	_, _, skipped, err := events.LoadSnapshot(ctxT(t), store2, 0, textRules, decodeText)
	if !errors.Is(err, events.ErrNoSnapshot) || len(skipped) != 1 || !strings.Contains(skipped[0].Error(), "another stream") {
		t.Fatalf("snapshot of the old stream: err %v, skipped %v", err, skipped)
	}
}

// An object whose metadata does not parse is listed as unreadable (seq 0:
// the oldest, the last tried and the first pruned) and passed over with
// that reason; one written before rules versions were recorded has none
// (0) and is passed over too; the next older good one is used.
func TestSnapshotsUnreadableMetadata(t *testing.T) {
	nc, l, store := openSnapshots(t, "snapmd")
	appendN(t, l, 10)
	for _, seq := range []uint64{5, 8, 9} {
		putText(t, store, seq)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	obs, err := js.ObjectStore(ctxT(t), natslog.SnapshotBucket("snapmd"))
	if err != nil {
		t.Fatal(err)
	}
	edit := func(seq uint64, change func(md map[string]string)) {
		t.Helper()
		oi, err := obs.GetInfo(ctxT(t), events.SnapshotName(seq))
		if err != nil {
			t.Fatal(err)
		}
		meta := oi.ObjectMeta
		change(meta.Metadata)
		if err := obs.UpdateMeta(ctxT(t), meta.Name, meta); err != nil {
			t.Fatal(err)
		}
	}
	edit(9, func(md map[string]string) { md["seq"], md["at"] = "nine", "yesterday" })
	edit(8, func(md map[string]string) { delete(md, "rules") })
	list, err := store.List(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if len(list) != 3 || list[0].Name != events.SnapshotName(9) || list[0].Seq != 0 ||
		!strings.Contains(list[0].Unreadable, "seq, at do not parse") || list[1].Seq != 5 || list[2].Seq != 8 || list[2].Rules != 0 || list[2].Unreadable != "" {
		t.Fatalf("listed %+v; want the snapshot at 9 unreadable and first, the one at 8 with no rules", list)
	}
	v, si, skipped, err := events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText)
	if err != nil || si.Seq != 5 || v != "state@5" {
		t.Fatalf("got %q at %d, %v; want the snapshot at 5", v, si.Seq, err)
	}
	if len(skipped) != 1 || !strings.Contains(skipped[0].Error(), events.SnapshotName(8)) || !strings.Contains(skipped[0].Error(), "rules version 0") {
		t.Fatalf("skipped %v; want the snapshot at 8 (no rules)", skipped)
	}
	if err := store.Delete(ctxT(t), events.SnapshotName(5)); err != nil {
		t.Fatal(err)
	}
	_, _, skipped, err = events.LoadSnapshot(ctxT(t), store, 0, textRules, decodeText)
	if !errors.Is(err, events.ErrNoSnapshot) || len(skipped) != 2 || !strings.Contains(skipped[1].Error(), events.SnapshotName(9)) ||
		!strings.Contains(skipped[1].Error(), "unreadable: object metadata seq, at do not parse") {
		t.Fatalf("without the one at 5: err %v, skipped %v; want the snapshot at 9 passed over as unreadable", err, skipped)
	}
	if n, err := events.PruneSnapshots(ctxT(t), store, 1); err != nil || n != 1 {
		t.Fatalf("prune to 1: deleted %d, %v", n, err)
	}
	if list, _ := store.List(ctxT(t)); len(list) != 1 || list[0].Seq != 8 {
		t.Fatalf("after pruning: %+v, want the unreadable one gone", list)
	}
}
