package meta

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/testkit"
)

// TestKVLeaseTTLIsTheClusters: OpenKVLease binds an existing lease bucket
// only with the TTL it has; another TTL, or none, is a *LeaseTTLError (a
// replica renewing by another period than the bucket's flaps or holds the
// lease too long), and a TTL <= 0 is refused before anything is created.
func TestKVLeaseTTLIsTheClusters(t *testing.T) {
	_, nc := testkit.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	for _, ttl := range []time.Duration{0, -time.Second} {
		if _, err := OpenKVLease(ctx, js, "zero", ttl, 1); err == nil {
			t.Fatalf("OpenKVLease with TTL %s succeeded", ttl)
		}
	}
	if _, err := js.KeyValue(ctx, LeaseBucket("zero")); !errors.Is(err, jetstream.ErrBucketNotFound) {
		t.Fatalf("a refused TTL made a bucket: %v", err)
	}

	if _, err := OpenKVLease(ctx, js, "c", 3*time.Second, 1); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKVLease(ctx, js, "c", 3*time.Second, 1); err != nil {
		t.Fatalf("the same TTL again: %v", err)
	}
	_, err = OpenKVLease(ctx, js, "c", 10*time.Second, 1)
	var te *LeaseTTLError
	if !errors.As(err, &te) || te.Have != 3*time.Second || te.Want != 10*time.Second || te.Bucket != LeaseBucket("c") {
		t.Fatalf("another TTL: %v, want a LeaseTTLError 3s -> 10s", err)
	}

	// A bucket without a TTL (an older termlog's --lease 0) is refused too.
	if _, err := js.CreateKeyValue(ctx, jetstream.KeyValueConfig{Bucket: LeaseBucket("none"), History: 1}); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenKVLease(ctx, js, "none", 3*time.Second, 1); !errors.As(err, &te) || te.Have != 0 {
		t.Fatalf("a bucket without TTL: %v, want a LeaseTTLError with Have 0", err)
	}
}

// TestKVLeaseRenewalAskedAgain: a renewal whose answer was lost (it was
// stored) and is asked again from the same revision is answered with the
// stored revision (a duplicate of its Nats-Msg-Id), not refused for a stale
// revision; a renewal from a revision another holder replaced is refused
// with ErrLeaseLost.
func TestKVLeaseRenewalAskedAgain(t *testing.T) {
	_, nc := testkit.NATS(t)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := OpenKVLease(ctx, js, "again", 3*time.Second, 1)
	if err != nil {
		t.Fatal(err)
	}
	rev, err := l.Acquire(ctx, "meta-1")
	if err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	stored := l.rev
	l.rev = rev // the answer was lost: the holder still has the old revision
	if err := l.Renew(ctx); err != nil {
		t.Fatalf("renewal asked again after a lost answer: %v (want the stored renewal's revision)", err)
	}
	if l.rev != stored {
		t.Fatalf("revision after asking again %d, want the stored one %d", l.rev, stored)
	}
	e, err := l.kv.Get(ctx, LeaseKey)
	if err != nil || e.Revision() != stored || string(e.Value()) != "meta-1" {
		t.Fatalf("lease key %v (rev %d), want meta-1 at %d: asking again stored a second renewal", err, e.Revision(), stored)
	}
	// Another holder's revision: a stale renewal loses the lease.
	if _, err := l.kv.Put(ctx, LeaseKey, []byte("meta-2")); err != nil {
		t.Fatal(err)
	}
	if err := l.Renew(ctx); !errors.Is(err, ErrLeaseLost) {
		t.Fatalf("renewal after another holder wrote: %v, want ErrLeaseLost", err)
	}
}
