package projections_test

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// seedEvents is one valid event of every kind, in an order that applies.
func seedEvents() []events.Event {
	until := base.Add(time.Hour)
	return []events.Event{
		{Term: 1, Writer: "meta-1", Data: events.TermStarted{Term: 1, Leader: "meta-1"}},
		{Term: 1, Writer: "meta-1", Data: events.WorkerRegistered{ID: 1, Incarnation: "a", Endpoint: "10.0.0.1:5688", Kind: "compute", Parallelism: 4}},
		{Term: 1, Writer: "meta-1", Data: events.WorkerActivated{ID: 1, Epoch: 2}},
		{Term: 1, Writer: "meta-1", Data: events.WorkerRegistered{ID: 2, Incarnation: "b", Endpoint: "10.0.0.1:5688", Kind: "compute", Parallelism: 4}},
		{Term: 1, Writer: "meta-1", Data: events.WorkerExpired{ID: 1, Epoch: 2}},
		{Term: 1, Writer: "meta-1", Data: events.WorkerDeregistered{ID: 2, Epoch: 4}},
		{Term: 1, Writer: "meta-1", Data: events.StoreRegistered{Store: "s1", Incarnation: "i1", RaftAddr: "r1:63000"}},
		{Term: 1, Writer: "meta-1", Data: events.StoreRegistered{Store: "s2", Incarnation: "i2", RaftAddr: "r2:63000"}},
		{Term: 1, Writer: "meta-1", Data: events.StoreRegistered{Store: "s3", Incarnation: "i3", RaftAddr: "r3:63000"}},
		{Term: 1, Writer: "meta-1", Data: events.StoreState{Store: "s3", State: events.StoreDraining, Until: until}},
		{Term: 1, Writer: "meta-1", Data: events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2"}}},
		{Term: 1, Writer: "meta-1", Data: events.OperatorStarted{Op: "op-1", Shard: 1, Steps: []string{"remove 2", "add 3"}}},
		{Term: 1, Writer: "meta-1", Data: events.ShardReplicaRemoving{Shard: 1, Replica: 2, Store: "s2", CCID: 3, Op: "op-1"}},
		{Term: 1, Writer: "meta-1", Data: events.ShardReplicaRemoved{Shard: 1, Replica: 2, Store: "s2", CCID: 3, Op: "op-1"}},
		{Term: 1, Writer: "meta-1", Data: events.ShardReplicaAdding{Shard: 1, Replica: 3, Store: "s3", CCID: 4, Op: "op-1"}},
		{Term: 1, Writer: "meta-1", Data: events.ShardReplicaAdded{Shard: 1, Replica: 3, Store: "s3", CCID: 4, Op: "op-1"}},
		{Term: 1, Writer: "meta-1", Data: events.ShardObserved{Shard: 1, CCID: 6, Replicas: map[uint64]string{1: "s1", 3: "s3"}, Leader: 3}},
		{Term: 1, Writer: "meta-1", Data: events.OperatorFinished{Op: "op-1", Shard: 1}},
		{Term: 1, Writer: "meta-1", Data: events.OperatorStarted{Op: "op-2", Shard: 1}},
		{Term: 1, Writer: "meta-1", Data: events.OperatorFailed{Op: "op-2", Shard: 1, Reason: "timeout"}},
		{Term: 2, Writer: "meta-2", Data: events.TermStarted{Term: 2, Leader: "meta-2"}},
		{Term: 1, Writer: "meta-1", Data: events.StoreState{Store: "s2", State: events.StoreTombstone}},
	}
}

func seedBodies(tb testing.TB) [][]byte {
	var out [][]byte
	for i, ev := range seedEvents() {
		ev.At = base.Add(time.Duration(i+1) * time.Second)
		b, err := events.Encode(ev)
		if err != nil {
			tb.Fatal(err)
		}
		out = append(out, b)
	}
	return out
}

// FuzzDecodeApply folds the lines of the input as event bodies at seq 1, 2,
// ...: it never panics, the invariants and step rules hold after every line,
// a body below the current term changes nothing but the bookkeeping, and the
// result survives a snapshot round trip.
func FuzzDecodeApply(f *testing.F) {
	bodies := seedBodies(f)
	f.Add(bytes.Join(bodies, []byte("\n")))
	for _, b := range bodies {
		f.Add(b)
	}
	f.Add(append(append([]byte(nil), bodies[0]...), "\nnot json\n{}\nnull\n[1]\n"...))
	f.Add([]byte(`{"v":1,"term":0,"writer":"w","at":"2026-11-30T03:00:00Z","type":"worker.promoted","data":{}}`))
	f.Add([]byte(`{"v":2,"term":0,"writer":"w","at":"2026-11-30T03:00:00Z","type":"worker.registered","data":{"id":1,"endpoint":"a:1"}}`))
	f.Add([]byte(`{"v":1,"term":0,"writer":"w","at":"2026-11-30T03:00:00Z","type":"worker.registered","data":"x"}`))
	f.Add([]byte(`{"v":1,"term":0,"writer":"w","at":"2026-11-30T03:00:00Z","type":"store.registered","data":{"store":"s1","raft_addr":"r"}}` + "\n" +
		`{"v":1,"term":0,"writer":"w","at":"2026-11-30T03:00:00Z","type":"store.state","data":{"store":"s1","state":"draining","until":"9999-12-31T23:59:59-23:59"}}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		s := projections.New()
		lines := bytes.Split(in, []byte("\n"))
		if len(lines) > 100 {
			lines = lines[:100] // each line checks the whole state: keep execs fast
		}
		for i, line := range lines {
			seq := uint64(i + 1)
			before := s.Clone()
			ev, decErr := events.Decode(seq, line)
			r := s.DecodeApply(seq, line)
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("line %d %q -> %s: %v", i, line, r, err)
			}
			if err := projections.CheckStep(before.Provenance, s); err != nil {
				t.Fatalf("line %d %q -> %s: %v", i, line, r, err)
			}
			if s.Seq != seq {
				t.Fatalf("line %d: seq %d", i, s.Seq)
			}
			if decErr == nil && ev.Term < before.Term {
				if r.Outcome != projections.Rejected || r.Kind != projections.AnomalyStaleTerm {
					t.Fatalf("line %d %q: stale but %s", i, line, r)
				}
			}
			if r.Outcome != projections.Applied {
				if diff, ok := bookkeepingOnly(before, s); !ok {
					t.Fatalf("line %d %q -> %s changed the state:\n%s", i, line, r, diff)
				}
			}
		}
		_ = s.Render()
		got, err := projections.DecodeSnapshot(s.EncodeSnapshot())
		if err != nil {
			t.Fatalf("snapshot of\n%s: %v", s.Render(), err)
		}
		if got.Hash() != s.Hash() {
			t.Fatalf("snapshot round trip changed the hash")
		}
	})
}

// FuzzDecodeSnapshot: DecodeSnapshot of arbitrary bytes never panics, and
// what it accepts satisfies the invariants, round-trips and can be folded on.
// The input is also re-sealed with its own hash, so that the fuzzer gets
// past the hash check into the nil and invariant checks.
func FuzzDecodeSnapshot(f *testing.F) {
	s := projections.New()
	f.Add(s.EncodeSnapshot())
	for i, b := range seedBodies(f) {
		s.DecodeApply(uint64(i+1), b)
		f.Add(s.EncodeSnapshot())
	}
	f.Add([]byte(`{}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"format":1}`))
	f.Add([]byte(`{"format":1,"state":null}`))
	f.Add([]byte(`{"format":2,"state":{}}`))
	f.Add([]byte(`{"format":1,"hash":"x","state":{"workers":{"1":null}}}`))
	f.Add([]byte(`{"seq":3,"workers":{"1":{"id":1,"endpoint":"a:1"}},"endpoints":{"a:1":1},"next_worker_id":2}`))
	f.Add([]byte(`{"shards":{"1":{"id":1,"members":null,"leader":2}}}`))
	f.Add([]byte(`{"anomalies":[` + string(bytes.Repeat([]byte(`{"seq":1},`), 200)) + `{"seq":2}]}`))
	f.Fuzz(func(t *testing.T, in []byte) {
		check := func(b []byte) {
			s, err := projections.DecodeSnapshot(b)
			if err != nil {
				if s != nil {
					t.Fatalf("state and error")
				}
				return
			}
			if err := s.CheckInvariants(); err != nil {
				t.Fatalf("accepted a state that breaks the invariants: %v", err)
			}
			_ = s.Render()
			_ = s.ListWorkers()
			again, err := projections.DecodeSnapshot(s.EncodeSnapshot())
			if err != nil || again.Hash() != s.Hash() {
				t.Fatalf("re-encoded snapshot: %v", err)
			}
			before := s.Clone()
			for i, body := range seedBodies(t) {
				s.DecodeApply(before.Seq+uint64(i)+1, body)
				if err := s.CheckInvariants(); err != nil {
					t.Fatalf("after folding seed %d onto the snapshot: %v", i, err)
				}
			}
		}
		check(in)
		var st projections.State
		if json.Unmarshal(in, &st) != nil {
			return
		}
		sealed, err := json.Marshal(struct {
			Format int             `json:"format"`
			Hash   string          `json:"hash"`
			State  json.RawMessage `json:"state"`
		}{projections.SnapshotFormat, st.Hash(), json.RawMessage(in)})
		if err != nil {
			return
		}
		check(sealed)
	})
}
