package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/internal/wire"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// HealthKey is the key of the health record in the health bucket.
const HealthKey = wire.HealthKey

// HealthBucket is the KV bucket where the meta leader publishes the
// cluster's health for every process with the observer role (the same name
// as wire.HealthBucket, from which the roles' permissions are built).
func HealthBucket(cluster string) string {
	return wire.HealthBucket(cluster)
}

// HealthRecord is what the meta leader publishes: the health its last
// scheduling decision saw (shards and stores), its workers and recovery,
// and the provenance of all of it (leader, term, projected seq, time).
// A reader shows its age: a record that stops moving means no leader is
// publishing.
type HealthRecord struct {
	Leader string `json:"leader"`
	// LeaderStarted is when the leader's process started its replica: a
	// record of a meta process from before a restart says so.
	LeaderStarted  time.Time `json:"leader_started,omitzero"`
	Term           uint64    `json:"term"`
	Seq            uint64    `json:"seq"` // the projected seq it reflects
	At             time.Time `json:"at"`  // when the leader wrote it (the leader's clock)
	Workers        int       `json:"workers"`
	WorkersRunning int       `json:"workers_running"`
	Recovery       Recovery  `json:"recovery"`
	sched.Health
}

// HealthKV is the health bucket.
type HealthKV struct {
	kv jetstream.KeyValue
}

// healthAttempt bounds one request to the bucket: a request left
// unanswered during a JetStream election is asked again, until the
// caller's deadline.
const healthAttempt = time.Second

// retry runs f with a bounded context per attempt until it succeeds, fails
// for good (stop), or ctx ends.
func retry(ctx context.Context, what string, stop func(error) bool, f func(context.Context) error) error {
	backoff := 50 * time.Millisecond
	var err error
	for attempt := 1; ; attempt++ {
		actx, cancel := context.WithTimeout(ctx, healthAttempt)
		err = f(actx)
		cancel()
		if err == nil || (stop != nil && stop(err)) {
			return err
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w after %d attempts (last error: %v)", what, ctx.Err(), attempt, err)
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// OpenHealthKV creates the health bucket, or binds it if it exists (meta).
func OpenHealthKV(ctx context.Context, js jetstream.JetStream, cluster string, replicas int) (*HealthKV, error) {
	cfg := jetstream.KeyValueConfig{Bucket: HealthBucket(cluster), Storage: jetstream.FileStorage, Replicas: max(replicas, 1), History: 1,
		Description: "termlog: the meta leader's shard and store health"}
	var kv jetstream.KeyValue
	err := retry(ctx, "open health bucket "+cfg.Bucket, nil, func(ctx context.Context) error {
		var err error
		kv, err = js.CreateKeyValue(ctx, cfg)
		if errors.Is(err, jetstream.ErrBucketExists) {
			kv, err = js.KeyValue(ctx, cfg.Bucket)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &HealthKV{kv: kv}, nil
}

// ErrNoHealth means the cluster has no health bucket or record yet (no
// meta leader ever published one).
var ErrNoHealth = errors.New("no health record: no meta leader has published one")

// BindHealthKV binds an existing health bucket (observers).
func BindHealthKV(ctx context.Context, js jetstream.JetStream, cluster string) (*HealthKV, error) {
	var kv jetstream.KeyValue
	err := retry(ctx, "bind health bucket "+HealthBucket(cluster), func(err error) bool { return errors.Is(err, jetstream.ErrBucketNotFound) }, func(ctx context.Context) error {
		var err error
		kv, err = js.KeyValue(ctx, HealthBucket(cluster))
		return err
	})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return nil, fmt.Errorf("%w (bucket %s not found)", ErrNoHealth, HealthBucket(cluster))
	}
	if err != nil {
		return nil, err
	}
	return &HealthKV{kv: kv}, nil
}

// ErrStaleHealth is Put's answer to a writer whose term is older than the
// record's: its term is over, and the newer leader's record stays.
var ErrStaleHealth = errors.New("health record of a newer term in the bucket")

// Put writes the record unless the bucket holds one of a newer term, as
// a compare-and-swap on the revision it read: a deposed leader that passed
// its own lease check just before a pause cannot overwrite its
// successor's record when it wakes, and two leaders cannot interleave a
// read and a write. A lost swap reads again.
func (h *HealthKV) Put(ctx context.Context, rec HealthRecord) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	stale := func(err error) bool { return errors.Is(err, ErrStaleHealth) }
	return retry(ctx, "put health", stale, func(ctx context.Context) error {
		entry, err := h.kv.Get(ctx, HealthKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			_, err = h.kv.Create(ctx, HealthKey, b)
			return err // a lost race (key exists) is retried: read again
		}
		if err != nil {
			return err
		}
		var cur HealthRecord
		if json.Unmarshal(entry.Value(), &cur) == nil && cur.Term > rec.Term {
			return fmt.Errorf("%w: term %d by %s, ours %d", ErrStaleHealth, cur.Term, cur.Leader, rec.Term)
		}
		_, err = h.kv.Update(ctx, HealthKey, b, entry.Revision())
		return err
	})
}

// Get reads the record.
func (h *HealthKV) Get(ctx context.Context) (HealthRecord, error) {
	var rec HealthRecord
	var entry jetstream.KeyValueEntry
	err := retry(ctx, "read health", func(err error) bool { return errors.Is(err, jetstream.ErrKeyNotFound) }, func(ctx context.Context) error {
		var err error
		entry, err = h.kv.Get(ctx, HealthKey)
		return err
	})
	if errors.Is(err, jetstream.ErrKeyNotFound) {
		return rec, ErrNoHealth
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(entry.Value(), &rec); err != nil {
		return rec, fmt.Errorf("health record at revision %d: %w", entry.Revision(), err)
	}
	return rec, nil
}

// healthEvery is how often a leader rewrites an unchanged health record,
// so that its age tells a reader the leader is alive.
const healthEvery = time.Second

// healthDuty publishes the term's health record (healthLoop).
type healthDuty struct {
	cfg        *Config
	proj       *view.Projector
	started    time.Time // when the replica was made
	term       uint64
	health     func() sched.Health // the last scheduling decision's
	recovery   func() Recovery
	leaseFresh func() error // the lease keeper's check
	logger     zerolog.Logger
}

// healthLoop publishes the leader's health record whenever it changes, and
// at least every healthEvery, while the term lasts.
func (hd *healthDuty) healthLoop(ctx context.Context) {
	kv := hd.cfg.Health
	if kv == nil {
		return
	}
	var last []byte
	var lastAt time.Time
	tick := min(hd.cfg.Scheduler.Interval, healthEvery)
	for {
		select {
		case <-ctx.Done():
			return
		case <-hd.cfg.Clock.After(tick):
		}
		rec := hd.healthRecord()
		if rec.Health.Term != hd.term {
			// No scheduling decision of this term yet: a record now would
			// say nothing of this leader's shards (0 of N), so none is
			// written (the previous term's says whose it is).
			continue
		}
		// Times move every pass and every heartbeat; a change is a change
		// of anything else.
		norm := rec
		norm.At, norm.Health.At, norm.Recovery = time.Time{}, time.Time{}, Recovery{State: rec.Recovery.State}
		norm.Health.Stores = append([]sched.StoreHealth(nil), rec.Health.Stores...)
		for i := range norm.Health.Stores {
			norm.Health.Stores[i].LastHeartbeat = time.Time{}
		}
		key, _ := json.Marshal(norm)
		now := hd.cfg.Clock.Now()
		if string(key) == string(last) && now.Sub(lastAt) < healthEvery {
			continue
		}
		if err := hd.leaseFresh(); err != nil {
			return // a paused leader publishes nothing; leaseFresh ended the term
		}
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := kv.Put(pctx, rec)
		cancel()
		if errors.Is(err, ErrStaleHealth) {
			// A newer leader publishes: this term is over, and its other
			// fences (the lease, the CAS, the term rule) end it. The health
			// loop only stops; it does not end the term itself, so a record
			// left by a stream that was deleted and made again cannot make
			// every leader give up.
			hd.logger.Warn().Err(err).Msg("a newer term's health record is in the bucket; this term publishes no more health")
			return
		}
		if err != nil {
			if ctx.Err() == nil {
				hd.logger.Warn().Err(err).Msg("publish health")
			}
			continue
		}
		last, lastAt = key, now
	}
}

func (hd *healthDuty) healthRecord() HealthRecord {
	h := hd.health()
	rec := HealthRecord{Leader: hd.cfg.ID, LeaderStarted: hd.started, Term: hd.term, At: hd.cfg.Clock.Now(), Health: h, Recovery: hd.recovery()}
	hd.proj.Peek(func(v *projections.State) {
		rec.Seq = v.Seq
		rec.Workers = len(v.Workers)
		for _, w := range v.Workers {
			if w.State == projections.WorkerRunning {
				rec.WorkersRunning++
			}
		}
	})
	return rec
}
