package projections_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// benchWorkload is a realistic stream: a handful of stores and shards, then
// mostly worker registrations, activations and expiries over 10k endpoints
// (re-registrations at a busy endpoint supersede), some shard observations
// and replica replacements, and a new term now and then. Every event applies.
type benchWorkload struct {
	events []events.Event
	bodies [][]byte
}

var benchOnce = sync.OnceValue(func() *benchWorkload { return makeWorkload(100_000, 10_000) })

func makeWorkload(n, endpoints int) *benchWorkload {
	rng := rand.New(rand.NewPCG(1, 2))
	w := &benchWorkload{}
	var (
		term   uint64 = 1
		nextID uint64 = 1
	)
	type active struct{ id, epoch uint64 }
	var starting, running []active
	byEndpoint := map[int]active{}
	drop := func(list []active, id uint64) []active {
		for i, a := range list {
			if a.id == id {
				list[i] = list[len(list)-1]
				return list[:len(list)-1]
			}
		}
		return list
	}
	const stores, shards = 12, 200
	ccid := make([]uint64, shards+1)
	members := make([]map[uint64]string, shards+1)
	nextReplica := make([]uint64, shards+1)
	add := func(d events.Payload) uint64 {
		seq := uint64(len(w.events) + 1)
		ev := events.Event{Seq: seq, Term: term, Writer: fmt.Sprintf("meta-%d", term), At: base.Add(time.Duration(seq) * time.Millisecond), Data: d}
		body, err := events.Encode(ev)
		if err != nil {
			panic(err)
		}
		w.events = append(w.events, ev)
		w.bodies = append(w.bodies, body)
		return seq
	}
	add(events.TermStarted{Term: term, Leader: "meta-1"})
	for i := range stores {
		add(events.StoreRegistered{Store: fmt.Sprintf("s%d", i), Incarnation: "i", RaftAddr: fmt.Sprintf("10.0.1.%d:63000", i)})
	}
	for sh := 1; sh <= shards; sh++ {
		members[sh] = map[uint64]string{}
		for r := range 3 {
			members[sh][uint64(r+1)] = fmt.Sprintf("s%d", (sh+r)%stores)
		}
		nextReplica[sh] = 4
		add(events.ShardCreated{Shard: uint64(sh), Replicas: members[sh]})
	}
	for len(w.events) < n {
		switch x := rng.IntN(100); {
		case x < 40 || len(starting)+len(running) == 0:
			ep := rng.IntN(endpoints)
			d := events.WorkerRegistered{ID: nextID, Incarnation: fmt.Sprintf("inc-%d", nextID), Endpoint: fmt.Sprintf("10.0.%d.%d:5688", ep/250, ep%250), Kind: "compute", Parallelism: 4}
			if old, ok := byEndpoint[ep]; ok {
				starting, running = drop(starting, old.id), drop(running, old.id)
			}
			seq := add(d)
			a := active{nextID, seq}
			starting = append(starting, a)
			byEndpoint[ep] = a
			nextID++
		case x < 65 && len(starting) > 0:
			i := rng.IntN(len(starting))
			a := starting[i]
			add(events.WorkerActivated{ID: a.id, Epoch: a.epoch})
			starting = drop(starting, a.id)
			running = append(running, a)
		case x < 90 && len(running) > 0:
			i := rng.IntN(len(running))
			a := running[i]
			if rng.IntN(10) == 0 {
				add(events.WorkerDeregistered{ID: a.id, Epoch: a.epoch})
			} else {
				add(events.WorkerExpired{ID: a.id, Epoch: a.epoch})
			}
			running = drop(running, a.id)
		case x < 97:
			sh := 1 + rng.IntN(shards)
			ccid[sh]++
			var leader uint64
			for r := range members[sh] {
				leader = max(leader, r)
			}
			add(events.ShardObserved{Shard: uint64(sh), CCID: ccid[sh], Replicas: members[sh], Leader: leader})
		case x < 98:
			term++
			add(events.TermStarted{Term: term, Leader: fmt.Sprintf("meta-%d", term)})
		default:
			// replace the lowest replica of a shard: four events
			sh := 1 + rng.IntN(shards)
			var old uint64 = 1 << 63
			for r := range members[sh] {
				old = min(old, r)
			}
			oldStore := members[sh][old]
			used := map[string]bool{}
			for _, st := range members[sh] {
				used[st] = true
			}
			var target string
			for i := range stores {
				if st := fmt.Sprintf("s%d", i); !used[st] {
					target = st
					break
				}
			}
			op := fmt.Sprintf("op-%d", len(w.events))
			add(events.ShardReplicaRemoving{Shard: uint64(sh), Replica: old, Store: oldStore, CCID: ccid[sh], Op: op})
			ccid[sh]++
			add(events.ShardReplicaRemoved{Shard: uint64(sh), Replica: old, Store: oldStore, CCID: ccid[sh], Op: op})
			members[sh] = cloneReplicas(members[sh]) // earlier events keep theirs
			delete(members[sh], old)
			r := nextReplica[sh]
			nextReplica[sh]++
			add(events.ShardReplicaAdding{Shard: uint64(sh), Replica: r, Store: target, CCID: ccid[sh], Op: op})
			ccid[sh]++
			add(events.ShardReplicaAdded{Shard: uint64(sh), Replica: r, Store: target, CCID: ccid[sh], Op: op})
			members[sh][r] = target
		}
	}
	w.events, w.bodies = w.events[:n], w.bodies[:n]
	return w
}

func cloneReplicas(m map[uint64]string) map[uint64]string {
	c := make(map[uint64]string, len(m)+1)
	for k, v := range m {
		c[k] = v
	}
	return c
}

// TestBenchWorkload keeps the benchmark honest: every event of its stream
// applies and the invariants hold.
func TestBenchWorkload(t *testing.T) {
	w := makeWorkload(20_000, 10_000)
	s := projections.New()
	for _, ev := range w.events {
		s.Apply(ev)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	c := s.Counters
	if c.Applied != uint64(len(w.events)) {
		t.Fatalf("workload does not apply cleanly: %+v\n%v", c, s.Anomalies)
	}
	if len(s.Workers) < 1000 || len(s.Shards) != 200 {
		t.Fatalf("workload too small: %d workers, %d shards", len(s.Workers), len(s.Shards))
	}
}

func reportEventsPerSecond(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkApply folds pre-decoded events; a fresh state every 100k events.
func BenchmarkApply(b *testing.B) {
	w := benchOnce()
	b.ReportAllocs()
	b.ResetTimer()
	s := projections.New()
	for i := range b.N {
		j := i % len(w.events)
		if j == 0 && i > 0 {
			s = projections.New()
		}
		s.Apply(w.events[j])
	}
	reportEventsPerSecond(b)
}

// BenchmarkDecodeApply folds the same events from their stored bodies.
func BenchmarkDecodeApply(b *testing.B) {
	w := benchOnce()
	b.ReportAllocs()
	b.ResetTimer()
	s := projections.New()
	for i := range b.N {
		j := i % len(w.bodies)
		if j == 0 && i > 0 {
			s = projections.New()
		}
		s.DecodeApply(uint64(j+1), w.bodies[j])
	}
	reportEventsPerSecond(b)
}

// BenchmarkDecode is events.Decode alone on the same bodies.
func BenchmarkDecode(b *testing.B) {
	w := benchOnce()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		j := i % len(w.bodies)
		if _, err := events.Decode(uint64(j+1), w.bodies[j]); err != nil {
			b.Fatal(err)
		}
	}
	reportEventsPerSecond(b)
}

// BenchmarkJSONUnmarshal is the floor: encoding/json into a generic envelope
// that leaves the data undecoded.
func BenchmarkJSONUnmarshal(b *testing.B) {
	type envelope struct {
		V      int             `json:"v"`
		Term   uint64          `json:"term"`
		Writer string          `json:"writer"`
		At     time.Time       `json:"at"`
		Type   string          `json:"type"`
		Data   json.RawMessage `json:"data"`
	}
	w := benchOnce()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		var env envelope
		if err := json.Unmarshal(w.bodies[i%len(w.bodies)], &env); err != nil {
			b.Fatal(err)
		}
	}
	reportEventsPerSecond(b)
}
