// Package eventgen generates a realistic stream of events that folds
// cleanly, for tests and benchmarks (termlog bench uses it too).
package eventgen

import (
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/termlog/termlog/events"
)

// Stream is a generated stream: event i has seq i+1.
type Stream struct {
	Events []events.Event
	Bodies [][]byte // Events encoded
	Bytes  int      // total body bytes
}

// Base is the time of the first event; event seq s happens s ms later.
func Base() time.Time { return time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC) }

// Mix returns n events (the same ones for the same arguments): a term, a
// dozen stores and 200 shards, then mostly worker registrations over
// endpoints distinct endpoints (a re-registration at a busy endpoint
// supersedes the old worker), activations, expiries and deregistrations,
// shard observations, replica replacements (four events each) and now and
// then a new term. Every event is applied (none rejected).
func Mix(n, endpoints int) (*Stream, error) {
	if n < 0 || endpoints < 1 {
		return nil, fmt.Errorf("eventgen: %d events over %d endpoints: want n >= 0 and endpoints >= 1", n, endpoints)
	}
	rng := rand.New(rand.NewPCG(7, 11))
	base := Base()
	w := &Stream{Events: make([]events.Event, 0, n+4), Bodies: make([][]byte, 0, n+4)}
	term := uint64(1)
	nextID := uint64(1)
	type active struct{ id, epoch uint64 }
	var starting, running []active
	where := map[uint64]int{} // worker id -> index in its list
	byEndpoint := map[int]active{}
	remove := func(list *[]active, id uint64) bool {
		i, ok := where[id]
		if !ok || i >= len(*list) || (*list)[i].id != id {
			return false
		}
		last := (*list)[len(*list)-1]
		(*list)[i] = last
		where[last.id] = i
		*list = (*list)[:len(*list)-1]
		delete(where, id)
		return true
	}
	push := func(list *[]active, a active) {
		where[a.id] = len(*list)
		*list = append(*list, a)
	}
	const stores, shards = 12, 200
	ccid := make([]uint64, shards+1)
	members := make([]map[uint64]string, shards+1)
	nextReplica := make([]uint64, shards+1)
	var err error
	add := func(d events.Payload) uint64 {
		seq := uint64(len(w.Events) + 1)
		ev := events.Event{Seq: seq, Term: term, Writer: fmt.Sprintf("meta-%d", 1+term%3), At: base.Add(time.Duration(seq) * time.Millisecond), Data: d}
		body, eerr := events.Encode(ev)
		if eerr != nil && err == nil {
			err = eerr
		}
		w.Events = append(w.Events, ev)
		w.Bodies = append(w.Bodies, body)
		w.Bytes += len(body)
		return seq
	}
	add(events.TermStarted{Term: term, Leader: "meta-2"})
	for i := range stores {
		add(events.StoreRegistered{Store: fmt.Sprintf("store-%d", i), Incarnation: "i1", RaftAddr: fmt.Sprintf("10.0.1.%d:63000", i)})
	}
	for sh := 1; sh <= shards; sh++ {
		members[sh] = map[uint64]string{}
		for r := range 3 {
			members[sh][uint64(r+1)] = fmt.Sprintf("store-%d", (sh+r)%stores)
		}
		nextReplica[sh] = 4
		add(events.ShardCreated{Shard: uint64(sh), Replicas: members[sh]})
	}
	for len(w.Events) < n {
		switch x := rng.IntN(100); {
		case x < 40 || len(starting)+len(running) == 0:
			ep := rng.IntN(endpoints)
			if old, ok := byEndpoint[ep]; ok {
				if !remove(&starting, old.id) {
					remove(&running, old.id)
				}
			}
			seq := add(events.WorkerRegistered{ID: nextID, Incarnation: fmt.Sprintf("inc-%d", nextID),
				Endpoint: fmt.Sprintf("10.%d.%d.%d:5688", 1+ep/65536, ep/256%256, ep%256), Kind: "compute", Parallelism: 4})
			a := active{nextID, seq}
			push(&starting, a)
			byEndpoint[ep] = a
			nextID++
		case x < 65 && len(starting) > 0:
			a := starting[rng.IntN(len(starting))]
			add(events.WorkerActivated{ID: a.id, Epoch: a.epoch})
			remove(&starting, a.id)
			push(&running, a)
		case x < 90 && len(running) > 0:
			a := running[rng.IntN(len(running))]
			if rng.IntN(10) == 0 {
				add(events.WorkerDeregistered{ID: a.id, Epoch: a.epoch})
			} else {
				add(events.WorkerExpired{ID: a.id, Epoch: a.epoch})
			}
			remove(&running, a.id)
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
			add(events.TermStarted{Term: term, Leader: fmt.Sprintf("meta-%d", 1+term%3)})
		default:
			sh := 1 + rng.IntN(shards)
			old := uint64(1 << 63)
			for r := range members[sh] {
				old = min(old, r)
			}
			oldStore := members[sh][old]
			used := map[string]bool{}
			for _, st := range members[sh] {
				used[st] = true
			}
			target := ""
			for i := range stores {
				if st := fmt.Sprintf("store-%d", i); !used[st] {
					target = st
					break
				}
			}
			op := fmt.Sprintf("op-%d", len(w.Events))
			add(events.ShardReplicaRemoving{Shard: uint64(sh), Replica: old, Store: oldStore, CCID: ccid[sh], Op: op})
			ccid[sh]++
			add(events.ShardReplicaRemoved{Shard: uint64(sh), Replica: old, Store: oldStore, CCID: ccid[sh], Op: op})
			next := make(map[uint64]string, len(members[sh])+1) // earlier events keep theirs
			for k, v := range members[sh] {
				if k != old {
					next[k] = v
				}
			}
			r := nextReplica[sh]
			nextReplica[sh]++
			add(events.ShardReplicaAdding{Shard: uint64(sh), Replica: r, Store: target, CCID: ccid[sh], Op: op})
			ccid[sh]++
			add(events.ShardReplicaAdded{Shard: uint64(sh), Replica: r, Store: target, CCID: ccid[sh], Op: op})
			next[r] = target
			members[sh] = next
		}
	}
	if err != nil {
		return nil, err
	}
	for _, b := range w.Bodies[n:] {
		w.Bytes -= len(b)
	}
	w.Events, w.Bodies = w.Events[:n], w.Bodies[:n]
	return w, nil
}
