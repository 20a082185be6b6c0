// Package meta is a meta replica: lease election, the projection loop, and
// the leader's duties (worker RPCs, heartbeat expiry, control streams and
// barrier recovery). Leader duties read only the projected view and change
// cluster state only by fenced appends.
package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/wire"
)

// Lease errors.
var (
	ErrLeaseHeld = errors.New("lease held by another replica")
	ErrLeaseLost = errors.New("lease lost")
)

// Lease is the election primitive. Acquire returns the lease's revision: a
// number that strictly increases across holders, the fencing token of the
// term the holder then starts (terms themselves count leaders; see
// startTerm).
type Lease interface {
	Acquire(ctx context.Context, holder string) (lease uint64, err error)
	Renew(ctx context.Context) error
	Release(ctx context.Context) error
}

// LeaseKey is the key of the lease in its bucket.
const LeaseKey = wire.LeaseKey

// LeaseBucket is the KV bucket of a cluster's lease.
func LeaseBucket(cluster string) string { return wire.LeaseBucket(cluster) }

// KVLease is a Lease on a JetStream KV bucket whose TTL is the lease: Create
// takes it (its revision is the fencing token), Update(rev) renews it. It uses the
// bucket TTL, never a per-key TTL, which Update would drop.
type KVLease struct {
	kv jetstream.KeyValue
	js jetstream.JetStream
	// subject is the lease key's subject, $KV.<bucket>.leader: a renewal is
	// published there itself, to carry a Nats-Msg-Id (see Renew).
	subject string

	mu     sync.Mutex
	holder string
	term   uint64
	rev    uint64
	asked  uint64 // the revision the last renewal attempt was made from
}

// LeaseTTLError is an existing lease bucket whose TTL is not the one asked
// for. The TTL is the cluster's lease: a replica renewing by another period
// than the bucket's would lose its lease between renewals (leaders flap) or
// hold it longer than it believes, so OpenKVLease never binds it.
type LeaseTTLError struct {
	Bucket string
	Have   time.Duration // the bucket's TTL (0: none, the lease never expires)
	Want   time.Duration
}

func (e *LeaseTTLError) Error() string {
	if e.Have <= 0 {
		return fmt.Sprintf("lease bucket %s has no TTL (a lease there never expires, so a dead leader is never replaced); %s asked", e.Bucket, e.Want)
	}
	return fmt.Sprintf("lease bucket %s has TTL %s; %s asked", e.Bucket, e.Have, e.Want)
}

// LeaseOpenAttempt bounds one attempt of OpenKVLease: a clustered
// JetStream electing a leader may leave a request unanswered, however long
// one waits, and answers the next one once the election is over.
const LeaseOpenAttempt = 5 * time.Second

// OpenKVLease creates or binds the lease bucket, retrying until JetStream is
// ready or ctx is done. An existing bucket whose TTL is not ttl is refused
// with a *LeaseTTLError; ttl must be > 0. Each attempt is bounded by
// LeaseOpenAttempt (within ctx), so one unanswered request never uses the
// whole of ctx; asking again is safe, as a create that landed unanswered
// makes the next one find the bucket.
func OpenKVLease(ctx context.Context, js jetstream.JetStream, cluster string, ttl time.Duration, replicas int) (*KVLease, error) {
	if ttl <= 0 {
		return nil, fmt.Errorf("lease TTL %s: must be > 0 (a lease without a TTL never expires)", ttl)
	}
	if replicas <= 0 {
		replicas = 1
	}
	cfg := jetstream.KeyValueConfig{Bucket: LeaseBucket(cluster), TTL: ttl, Storage: jetstream.FileStorage, Replicas: replicas, History: 1}
	backoff := 50 * time.Millisecond
	for attempt := 1; ; attempt++ {
		kv, err := openLeaseBucket(ctx, js, cfg)
		var te *LeaseTTLError
		switch {
		case err == nil:
			return &KVLease{kv: kv, js: js, subject: "$KV." + cfg.Bucket + "." + LeaseKey}, nil
		case errors.As(err, &te):
			return nil, err
		}
		t := time.NewTimer(backoff)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("open lease bucket %s: %w after %d attempts (last error: %w)", cfg.Bucket, ctx.Err(), attempt, err)
		case <-t.C:
		}
		backoff = min(backoff*2, time.Second)
	}
}

// openLeaseBucket is one attempt of OpenKVLease: create or bind the bucket
// and check its TTL.
func openLeaseBucket(ctx context.Context, js jetstream.JetStream, cfg jetstream.KeyValueConfig) (jetstream.KeyValue, error) {
	ctx, cancel := context.WithTimeout(ctx, LeaseOpenAttempt)
	defer cancel()
	kv, err := js.CreateKeyValue(ctx, cfg)
	if errors.Is(err, jetstream.ErrBucketExists) {
		kv, err = js.KeyValue(ctx, cfg.Bucket)
	}
	if err != nil {
		return nil, err
	}
	st, err := kv.Status(ctx)
	if err != nil {
		return nil, err
	}
	if st.TTL() != cfg.TTL {
		return nil, &LeaseTTLError{Bucket: cfg.Bucket, Have: st.TTL(), Want: cfg.TTL}
	}
	return kv, nil
}

// Acquire implements Lease.
func (l *KVLease) Acquire(ctx context.Context, holder string) (uint64, error) {
	rev, err := l.kv.Create(ctx, LeaseKey, []byte(holder))
	if errors.Is(err, jetstream.ErrKeyExists) {
		return 0, l.held(ctx)
	}
	if err != nil {
		return 0, fmt.Errorf("acquire lease: %w", err)
	}
	l.mu.Lock()
	l.holder, l.term, l.rev = holder, rev, rev
	l.mu.Unlock()
	return rev, nil
}

// LeaseHeldError is ErrLeaseHeld with what the bucket says of the lease
// that is held: its holder and when the server stored its last renewal (on
// the server's clock). A campaign uses Renewed only to time its next try
// (CampaignWait): the server decides when the lease is free.
type LeaseHeldError struct {
	Holder  string
	Renewed time.Time // zero: unknown
}

func (e *LeaseHeldError) Error() string {
	if e.Renewed.IsZero() {
		return ErrLeaseHeld.Error()
	}
	return fmt.Sprintf("%v (%s, renewed at %s)", ErrLeaseHeld, e.Holder, e.Renewed.UTC().Format("15:04:05.000"))
}

func (e *LeaseHeldError) Unwrap() error { return ErrLeaseHeld }

// held is the error of a Create refused because the key exists: the
// holder's last renewal read from the bucket, or a bare ErrLeaseHeld when
// it cannot be read (it is only a hint).
func (l *KVLease) held(ctx context.Context) error {
	e, err := l.kv.Get(ctx, LeaseKey)
	if err != nil {
		return &LeaseHeldError{}
	}
	return &LeaseHeldError{Holder: string(e.Value()), Renewed: e.Created()}
}

// Renew implements Lease. It is KV Update(rev), published with the
// Nats-Msg-Id <holder>-renew-<rev>, so that asking again after an
// unanswered renewal is safe: if the first one was stored, the server
// answers the retry as a duplicate with the first one's revision instead
// of refusing it for its stale expected revision (which would lose a lease
// that was renewed). The caller must date a renewal that succeeded after a
// retry from its first attempt (see leaseKeeper.renew): a duplicate's
// stored message is the first attempt's.
func (l *KVLease) Renew(ctx context.Context) error {
	l.mu.Lock()
	holder, rev := l.holder, l.rev
	l.mu.Unlock()
	if rev == 0 {
		return ErrLeaseLost
	}
	l.mu.Lock()
	again := l.asked == rev
	l.asked = rev
	l.mu.Unlock()
	id := fmt.Sprintf("%s-renew-%d", holder, rev)
	m := &nats.Msg{Subject: l.subject, Data: []byte(holder), Header: nats.Header{}}
	ack, err := l.js.PublishMsg(ctx, m, jetstream.WithExpectLastSequencePerSubject(rev), jetstream.WithMsgID(id))
	var nrev uint64
	switch {
	case err == nil:
		nrev = ack.Sequence
	case again && isWrongRev(err):
		// A single server checks the revision before the msg id: an
		// earlier attempt that was stored makes this one "wrong last
		// sequence". The key's last message says whether it is ours.
		if seq, ok := l.storedRenewal(ctx, id); ok {
			nrev = seq
			break
		}
		fallthrough
	case errors.Is(err, jetstream.ErrKeyNotFound) || isWrongRev(err):
		l.mu.Lock()
		l.rev = 0
		l.mu.Unlock()
		return fmt.Errorf("%w: %v", ErrLeaseLost, err)
	default:
		return fmt.Errorf("renew lease: %w", err)
	}
	l.mu.Lock()
	l.rev = nrev
	l.mu.Unlock()
	return nil
}

// storedRenewal reads the lease key's last message: the revision of the
// renewal with msg id id if it is the one stored there.
func (l *KVLease) storedRenewal(ctx context.Context, id string) (uint64, bool) {
	st, err := l.js.Stream(ctx, "KV_"+l.kv.Bucket())
	if err != nil {
		return 0, false
	}
	m, err := st.GetLastMsgForSubject(ctx, l.subject)
	if err != nil || m.Header.Get(jetstream.MsgIDHeader) != id {
		return 0, false
	}
	return m.Sequence, true
}

func isWrongRev(err error) bool {
	if errors.Is(err, jetstream.ErrKeyExists) {
		return true
	}
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == jetstream.JSErrCodeStreamWrongLastSequence || apiErr.ErrorCode == 10164)
}

// Release implements Lease: it deletes the key if this holder still has it,
// so the next candidate need not wait for the TTL.
func (l *KVLease) Release(ctx context.Context) error {
	l.mu.Lock()
	rev := l.rev
	l.rev = 0
	l.mu.Unlock()
	if rev == 0 {
		return nil
	}
	return l.kv.Purge(ctx, LeaseKey, jetstream.LastRevision(rev))
}
