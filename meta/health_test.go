package meta

import (
	"errors"
	"testing"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/testkit"
)

// The health record is fenced by term: a deposed leader's write (it
// passed its lease check just before a pause, and wakes after its
// successor published) is refused and the newer record stays; the
// current leader rewrites its own record, and the next term replaces it.
func TestHealthPutFencedByTerm(t *testing.T) {
	_, nc := testkit.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	kv, err := OpenHealthKV(t.Context(), js, "hfence", 1)
	if err != nil {
		t.Fatal(err)
	}
	put := func(leader string, term uint64) error {
		return kv.Put(t.Context(), HealthRecord{Leader: leader, Term: term, Seq: term * 10})
	}
	want := func(leader string, term uint64) {
		t.Helper()
		rec, err := kv.Get(t.Context())
		if err != nil {
			t.Fatal(err)
		}
		if rec.Leader != leader || rec.Term != term {
			t.Fatalf("record by %s of term %d, want %s of term %d", rec.Leader, rec.Term, leader, term)
		}
	}
	if err := put("meta-2", 5); err != nil { // the first record: created
		t.Fatal(err)
	}
	want("meta-2", 5)
	err = put("meta-1", 4) // the deposed leader of term 4 wakes up
	if !errors.Is(err, ErrStaleHealth) {
		t.Fatalf("a term-4 write over a term-5 record: %v, want ErrStaleHealth", err)
	}
	t.Logf("refused: %v", err)
	want("meta-2", 5)
	if err := put("meta-2", 5); err != nil { // the leader rewrites its own
		t.Fatal(err)
	}
	if err := put("meta-3", 6); err != nil { // the next term replaces it
		t.Fatal(err)
	}
	want("meta-3", 6)
}
