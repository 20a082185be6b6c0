package replay

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// Step is what folding one entry did.
type Step struct {
	Item
	// Result is the fold's outcome with its reason.
	Result projections.Result
	// Before is the provenance of the state the entry was folded into.
	Before projections.Provenance
	// Touch lists the ids the entry names or changes, read against the
	// state before it.
	Touch Touch
}

// Touch lists the ids one entry names or changes: a registration touches the
// worker it supersedes, an expiry the endpoint of its worker, a shard change
// the stores of the replicas involved.
type Touch struct {
	Workers   []uint64
	Endpoints []string
	Stores    []string
	Shards    []uint64
}

// Has reports whether the entry touches the subject.
func (t Touch) Has(s Subject) bool {
	switch s.Kind {
	case KindWorker:
		return slices.Contains(t.Workers, s.Num)
	case KindShard:
		return slices.Contains(t.Shards, s.Num)
	case KindStore:
		return slices.Contains(t.Stores, s.Name)
	case KindEndpoint:
		return slices.Contains(t.Endpoints, s.Name)
	}
	return false
}

// Subject kinds.
const (
	KindWorker   = "worker"
	KindStore    = "store"
	KindShard    = "shard"
	KindEndpoint = "endpoint"
)

// Subject names one id whose history can be told: worker:<id>,
// store:<id>, shard:<id> or endpoint:<host:port>.
type Subject struct {
	Kind string
	Name string // the id as written
	Num  uint64 // the id of a worker or a shard
}

func (s Subject) String() string { return s.Kind + ":" + s.Name }

// ParseSubject parses "worker:1", "store:s1", "shard:3" or
// "endpoint:10.0.0.5:5688".
func ParseSubject(v string) (Subject, error) {
	kind, name, ok := strings.Cut(v, ":")
	if !ok || name == "" {
		return Subject{}, fmt.Errorf("subject %q: want worker:<id>, store:<id>, shard:<id> or endpoint:<host:port>", v)
	}
	s := Subject{Kind: kind, Name: name}
	switch kind {
	case KindWorker, KindShard:
		n, err := strconv.ParseUint(name, 10, 64)
		if err != nil || n == 0 {
			return Subject{}, fmt.Errorf("subject %q: %s id must be a positive integer", v, kind)
		}
		s.Num = n
	case KindStore, KindEndpoint:
	default:
		return Subject{}, fmt.Errorf("subject %q: unknown kind %q (want worker, store, shard or endpoint)", v, kind)
	}
	return s, nil
}

// Folder folds entries one at a time into a projections.State and reports
// what each did. Use NewFolder.
type Folder struct {
	state *projections.State
	// endpoints remembers the endpoint of every worker id ever registered
	// (ids are never reused), so an event about a worker that is gone still
	// touches its endpoint.
	endpoints map[uint64]string
	n         uint64
}

// NewFolder returns a folder at the state before the first event.
func NewFolder() *Folder {
	return &Folder{state: projections.New(), endpoints: map[uint64]string{}}
}

// State is the state after the entries folded so far. It is the folder's
// own: Clone it to keep it.
func (f *Folder) State() *projections.State { return f.state }

// Count is the number of entries folded so far.
func (f *Folder) Count() uint64 { return f.n }

// Fold folds one entry. A corrupt entry is folded as a corrupt anomaly.
func (f *Folder) Fold(it Item) Step {
	st := Step{Item: it, Before: f.state.Provenance}
	if it.Err != nil {
		st.Result = f.state.ApplyCorrupt(it.Event, it.Err)
	} else {
		st.Touch = f.touches(it.Event)
		st.Result = f.state.Apply(it.Event)
		if w, ok := it.Event.Data.(events.WorkerRegistered); ok && st.Result.Outcome == projections.Applied {
			f.endpoints[w.ID] = w.Endpoint
		}
	}
	f.n++
	return st
}

// touches lists the ids ev names, read against the state before it.
func (f *Folder) touches(ev events.Event) Touch {
	s := f.state
	var t Touch
	worker := func(id uint64) {
		t.Workers = appendNew(t.Workers, id)
		if ep, ok := f.endpoints[id]; ok {
			t.Endpoints = appendNew(t.Endpoints, ep)
		}
	}
	store := func(id string) {
		if id != "" {
			t.Stores = appendNew(t.Stores, id)
		}
	}
	replicas := func(m map[uint64]string) {
		for _, r := range sortedKeys(m) {
			store(m[r])
		}
	}
	shard := func(id uint64) (members map[uint64]string) {
		t.Shards = appendNew(t.Shards, id)
		if sh, ok := s.Shards[id]; ok && sh != nil {
			return sh.Members
		}
		return nil
	}
	switch d := ev.Data.(type) {
	case events.WorkerRegistered:
		worker(d.ID)
		if d.Endpoint != "" {
			t.Endpoints = appendNew(t.Endpoints, d.Endpoint)
			if old, ok := s.Endpoints[d.Endpoint]; ok {
				worker(old)
			}
		}
	case events.WorkerActivated:
		worker(d.ID)
	case events.WorkerExpired:
		worker(d.ID)
	case events.WorkerDeregistered:
		worker(d.ID)
	case events.StoreRegistered:
		store(d.Store)
	case events.StoreState:
		store(d.Store)
	case events.ShardCreated:
		shard(d.Shard)
		replicas(d.Replicas)
	case events.ShardReplicaAdding:
		f.replicaChange(&t, shard(d.Shard), events.ReplicaChange(d))
	case events.ShardReplicaAdded:
		f.replicaChange(&t, shard(d.Shard), events.ReplicaChange(d))
	case events.ShardReplicaRemoving:
		f.replicaChange(&t, shard(d.Shard), events.ReplicaChange(d))
	case events.ShardReplicaRemoved:
		f.replicaChange(&t, shard(d.Shard), events.ReplicaChange(d))
	case events.ShardObserved:
		replicas(shard(d.Shard))
		replicas(d.Replicas)
	case events.OperatorStarted:
		shard(d.Shard)
	case events.OperatorFinished:
		shard(d.Shard)
	case events.OperatorFailed:
		shard(d.Shard)
	case events.ShardRecovered:
		replicas(shard(d.Shard))
		store(d.Store)
		for _, st := range d.Gone {
			store(st)
		}
	}
	return t
}

func (f *Folder) replicaChange(t *Touch, members map[uint64]string, d events.ReplicaChange) {
	if d.Store != "" {
		t.Stores = appendNew(t.Stores, d.Store)
	}
	if on, ok := members[d.Replica]; ok && on != "" {
		t.Stores = appendNew(t.Stores, on)
	}
}

func appendNew[T comparable](s []T, v T) []T {
	if slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}

func sortedKeys[K interface{ ~uint64 | ~string }, V any](m map[K]V) []K {
	keys := make([]K, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
