package chaos

import (
	"bytes"
	"encoding/json"
	"io"
	"os"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
)

// Each check passes on data from a real run and fails on the same data
// doctored to break the property it guards.

func realExport(t *testing.T) []Event {
	t.Helper()
	f, err := os.Open("testdata/export.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	evs, err := ParseExport(f)
	if err != nil {
		t.Fatal(err)
	}
	if len(evs) < 20 {
		t.Fatalf("testdata/export.jsonl: %d events", len(evs))
	}
	return evs
}

func wantViolation(t *testing.T, what string, vs []Violation, check, substr string) {
	t.Helper()
	for _, v := range vs {
		if v.Check == check && strings.Contains(v.Detail, substr) {
			t.Logf("%s: %s", what, v)
			return
		}
	}
	t.Errorf("%s: want a %s violation containing %q, got %v", what, check, substr, vs)
}

func wantClean(t *testing.T, what string, vs []Violation) {
	t.Helper()
	if len(vs) != 0 {
		t.Errorf("%s: want no violation, got %v", what, vs)
	}
}

func TestLogContiguous(t *testing.T) {
	evs := realExport(t)
	wantClean(t, "real export", LogContiguous(evs, 0, ""))

	gap := append(append([]Event(nil), evs[:9]...), evs[10:]...) // seq 10 missing
	wantViolation(t, "a gap", LogContiguous(gap, 0, ""), CheckLog, "line 10 holds seq 11, want 10")

	dup := append(append([]Event(nil), evs[:5]...), evs[4:]...)
	wantViolation(t, "a duplicate", LogContiguous(dup, 0, ""), CheckLog, "line 6 holds seq 5, want 6")

	corrupt := append([]Event(nil), evs...)
	corrupt[3] = Event{Seq: 4, Raw: "{garbage", Error: "invalid character"}
	wantViolation(t, "an undecodable record", LogContiguous(corrupt, 0, ""), CheckLog, "seq 4 is undecodable")

	wantViolation(t, "replay --check failing", LogContiguous(evs, 1, "seq 7: invariant broken: two active workers at 10.0.0.5:5688\n"), CheckLog, "replay --check exited 1: seq 7: invariant")
	wantViolation(t, "an empty export", LogContiguous(nil, 0, ""), CheckLog, "empty")
}

func TestOneWriterPerTerm(t *testing.T) {
	evs := realExport(t)
	wantClean(t, "real export", OneWriterPerTerm(evs))

	two := append([]Event(nil), evs...)
	two[6].Writer = "meta-2" // a worker.registered of term 1 by another replica
	wantViolation(t, "two writers in a term", OneWriterPerTerm(two), CheckTerms, "term 1 has two writers: meta-3 and meta-2 (seq 7)")

	stale := append([]Event(nil), evs...)
	last := stale[len(stale)-1]
	stale = append(stale, Event{Seq: last.Seq + 1, Term: 5, Writer: "meta-1", Type: "worker.expired", Data: json.RawMessage(`{"id":1,"epoch":2}`)})
	wantViolation(t, "a deposed leader's write after the new term", OneWriterPerTerm(stale), CheckTerms, "worker.expired of term 5 by meta-1 landed in term 11")

	back := append([]Event(nil), evs...)
	back = append(back, Event{Seq: last.Seq + 1, Term: 10, Writer: "meta-3", Type: "term.started", Data: json.RawMessage(`{"term":10,"leader":"meta-3"}`)})
	wantViolation(t, "a term started twice", OneWriterPerTerm(back), CheckTerms, "term 10 started after term 11")

	early := append([]Event(nil), evs...)
	early = append(early, Event{Seq: last.Seq + 1, Term: 12, Writer: "meta-2", Type: "worker.expired", Data: json.RawMessage(`{"id":1,"epoch":2}`)})
	wantViolation(t, "an event before its term started", OneWriterPerTerm(early), CheckTerms, "of term 12 by meta-2 before term 12 started")

	leased := append([]Event(nil), evs...)
	leased = append(leased,
		Event{Seq: last.Seq + 1, Term: 12, Writer: "meta-2", Type: "term.started", Data: json.RawMessage(`{"term":12,"leader":"meta-2","lease":40}`)},
		Event{Seq: last.Seq + 2, Term: 13, Writer: "meta-3", Type: "term.started", Data: json.RawMessage(`{"term":13,"leader":"meta-3","lease":44}`)})
	wantClean(t, "leases growing", OneWriterPerTerm(leased))
	lapsed := append(leased[:len(leased):len(leased)],
		Event{Seq: last.Seq + 3, Term: 14, Writer: "meta-2", Type: "term.started", Data: json.RawMessage(`{"term":14,"leader":"meta-2","lease":40}`)},
		Event{Seq: last.Seq + 4, Term: 14, Writer: "meta-2", Type: "worker.expired", Data: json.RawMessage(`{"id":1,"epoch":2}`)})
	v := OneWriterPerTerm(lapsed)
	wantViolation(t, "a lapsed lease holder's term", v, CheckTerms, "term.started of term 14 by meta-2 under lease 40, not newer than term 13's lease 44")
	wantViolation(t, "a lapsed lease holder's write", v, CheckTerms, "worker.expired of term 14 by meta-2 before term 14 started")

	forged := append([]Event(nil), evs...)
	forged[20].Data = json.RawMessage(`{"term":5,"leader":"meta-2"}`)
	wantViolation(t, "term.started naming another leader", OneWriterPerTerm(forged), CheckTerms, "term.started of term 5 by meta-2 is stamped term 5 by meta-1")
}

func TestWorkers(t *testing.T) {
	ws := []StatusWorker{
		{ID: 1, Endpoint: "127.0.0.1:1001", State: "running"},
		{ID: 6, Endpoint: "127.0.0.1:1002", State: "running"},
		{ID: 4, Endpoint: "127.0.0.1:2001", State: "running"}, // a probe
	}
	running := map[string]uint64{"127.0.0.1:1001": 1, "127.0.0.1:1002": 6}
	probes := []string{"127.0.0.1:2001", "127.0.0.1:2002"}
	wantClean(t, "healthy", Workers(ws, running, probes))

	two := append(append([]StatusWorker(nil), ws...), StatusWorker{ID: 7, Endpoint: "127.0.0.1:1002", State: "running"})
	wantViolation(t, "two active workers at an endpoint", Workers(two, running, probes), CheckWorkers, "endpoint 127.0.0.1:1002 has 2 active workers: 6 (running), 7 (running)")

	stale := append([]StatusWorker(nil), ws...)
	stale[1].ID = 2 // the id of the process's previous life
	wantViolation(t, "a stale id at a restarted worker's endpoint", Workers(stale, running, probes), CheckWorkers, "id 2 is active but its process holds id 6")

	starting := append([]StatusWorker(nil), ws...)
	starting[0].State = "starting"
	wantViolation(t, "a running worker not active", Workers(starting, running, probes), CheckWorkers, "is starting (id 1), not running")

	missing := ws[1:]
	wantViolation(t, "a running worker unregistered", Workers(missing, running, probes), CheckWorkers, "holds id 1, which is not active")

	noReg := map[string]uint64{"127.0.0.1:1001": 1, "127.0.0.1:1002": 0}
	wantViolation(t, "a worker process without a registration", Workers(ws, noReg, probes), CheckWorkers, "127.0.0.1:1002 holds no registration")

	ghost := append(append([]StatusWorker(nil), ws...), StatusWorker{ID: 9, Endpoint: "127.0.0.1:3000", State: "running"})
	wantViolation(t, "a worker where nothing runs", Workers(ghost, running, probes), CheckWorkers, "worker 9 is active at 127.0.0.1:3000")

	dupID := append(append([]StatusWorker(nil), ws...), StatusWorker{ID: 1, Endpoint: "127.0.0.1:2002", State: "running"})
	wantViolation(t, "an id twice", Workers(dupID, running, probes), CheckWorkers, "worker id 1 listed twice")
}

func TestRegisteredID(t *testing.T) {
	log := `=== chaos: start 1 of worker-1, pid 10
{"level":"info","worker_id":2,"epoch":7,"message":"registered"}
{"level":"info","worker_id":8,"epoch":30,"message":"registered"}
=== chaos: worker-1 pid 10 exited
=== chaos: start 2 of worker-1, pid 11
{"level":"info","message":"waiting for NATS"}
`
	if id := RegisteredID(log); id != 0 {
		t.Errorf("restarted, not registered yet: id %d, want 0", id)
	}
	log += `{"level":"info","worker_id":12,"epoch":41,"message":"registered"}` + "\n"
	if id := RegisteredID(log); id != 12 {
		t.Errorf("id %d, want 12", id)
	}
}

func healthyShards() ShardsInput {
	members := map[uint64]string{1: "store-1", 2: "store-2", 3: "store-3"}
	var st Status
	st.Shards = []StatusShard{{ID: 1, Members: members}, {ID: 2, Members: map[uint64]string{1: "store-1", 5: "store-2", 3: "store-3"}}}
	st.Health.Record = &HealthRecord{Shards: []HealthShard{{Shard: 1, Live: 3, Healthy: true}, {Shard: 2, Live: 3, Healthy: true}}}
	return ShardsInput{Status: st, Shards: 2, Replicas: 3, LiveStores: []string{"store-1", "store-2", "store-3"},
		StoreReplicas: map[string][]ReplicaKey{
			"store-1": {{1, 1}, {2, 1}},
			"store-2": {{1, 2}, {2, 5}},
			"store-3": {{1, 3}, {2, 3}},
		}}
}

func TestShards(t *testing.T) {
	wantClean(t, "healthy", Shards(healthyShards()))

	in := healthyShards()
	in.StoreReplicas["store-2"] = []ReplicaKey{{1, 2}, {2, 5}, {2, 2}} // the removed replica 2 runs again
	wantViolation(t, "a zombie replica", Shards(in), CheckShards, "store-2 runs shard 2 replica 2, which the projection does not list on it")

	in = healthyShards()
	in.StoreReplicas["store-3"] = []ReplicaKey{{1, 3}}
	wantViolation(t, "a missing replica", Shards(in), CheckShards, "store-3 does not run shard 2 replica 3")

	in = healthyShards()
	delete(in.Status.Shards[0].Members, 3)
	wantViolation(t, "a shard at 2/3", Shards(in), CheckShards, "shard 1 has 2 members")

	in = healthyShards()
	in.LiveStores = in.LiveStores[:2]
	wantViolation(t, "a replica on a dead store", Shards(in), CheckShards, "is on store-3, which is not running")

	in = healthyShards()
	in.Status.Health.Record.Shards[1] = HealthShard{Shard: 2, Live: 2, Leader: 1, LeaderStore: "store-1"}
	wantViolation(t, "the health record at 2/3", Shards(in), CheckShards, "health: shard 2 runs 2/3")

	in = healthyShards()
	in.Status.Shards[1].Operator = "op-7"
	wantViolation(t, "an operator still running", Shards(in), CheckShards, `operator "op-7"`)

	in = healthyShards()
	in.Status.Shards = in.Status.Shards[:1]
	wantViolation(t, "a shard missing", Shards(in), CheckShards, "1 shards projected, want 2")

	in = healthyShards()
	in.Status.Shards[0].Members = map[uint64]string{1: "store-1", 2: "store-2", 4: "store-2"}
	wantViolation(t, "two replicas on one store", Shards(in), CheckShards, "shard 1 has two replicas on store-2")

	in = healthyShards()
	in.Status.Health.Record = nil
	wantViolation(t, "no health record", Shards(in), CheckShards, "no health record")
}

func TestNoPanics(t *testing.T) {
	clean := map[string]string{
		"meta-1":  `{"level":"warn","message":"stopped leading"}` + "\n",
		"store-1": `{"level":"info","message":"recovered from a panicky situation"}` + "\n",
	}
	wantClean(t, "clean logs", NoPanics(clean))
	for _, line := range []string{
		"panic: runtime error: index out of range [3] with length 3",
		"fatal error: concurrent map writes",
		"WARNING: DATA RACE",
		"[signal SIGSEGV: segmentation violation code=0x1 addr=0x0 pc=0x4a2b3c]",
	} {
		logs := map[string]string{"meta-1": clean["meta-1"], "worker-2": "{}\n" + line + "\ngoroutine 1 [running]:\n"}
		wantViolation(t, line, NoPanics(logs), CheckPanics, "worker-2 line 2: "+line)
	}
}

func TestNoExits(t *testing.T) {
	wantClean(t, "none", NoExits(nil))
	wantViolation(t, "a store that gave up", NoExits(map[string][]string{"store-2": {"pid 4242 exited by itself at 2026-12-01T12:00:00Z: exit status 1"}}),
		CheckExits, "store-2: pid 4242 exited by itself")
}

func TestRecovered(t *testing.T) {
	wantClean(t, "in time", Recovered(3*time.Second, time.Minute))
	wantViolation(t, "slow", Recovered(61*time.Second, time.Minute), CheckRecovery, "healthy 1m1s after the heal, bound 1m0s")
	wantViolation(t, "never", Recovered(-1, time.Minute), CheckRecovery, "not healthy within 1m0s")
}

func TestGenerateIsSeeded(t *testing.T) {
	for _, netns := range []bool{false, true} {
		cfg := DefaultConfig("termlog", "", R3)
		cfg.Netns = netns
		a, b := Generate(42, cfg), Generate(42, cfg)
		if a.String() != b.String() {
			t.Fatalf("same seed, two schedules:\n%s\n%s", a, b)
		}
		seen := map[Fault]bool{}
		for s := range uint64(300) {
			sc := Generate(s, cfg)
			if len(sc.Steps) < 1 || len(sc.Steps) > 3 {
				t.Fatalf("seed %d: %d steps", s, len(sc.Steps))
			}
			for _, st := range sc.Steps {
				seen[st.Fault] = true
				if (st.Fault == MetaLeaderKill || st.Fault == MetaLeaderPause || st.Fault == PartitionMetaLeader) && st.Hold <= cfg.Lease {
					t.Errorf("seed %d: %s held %s, not past the lease %s", s, st.Fault, st.Hold, cfg.Lease)
				}
			}
		}
		want := ProcessFaults
		if netns {
			want = Faults
		}
		for _, f := range Faults {
			if seen[f] != slices.Contains(want, f) {
				t.Errorf("netns %v: 300 seeds drew %s: %v", netns, f, seen[f])
			}
		}
		if reflect.DeepEqual(Generate(1, cfg).Steps, Generate(2, cfg).Steps) {
			t.Error("seeds 1 and 2 give the same schedule")
		}
	}
}

// QuorumKept on doctored exports: a replacement with 2 of 3 members on
// live stores passes; a change with 1 of 2 (or 1 of 3) is reported.
func TestQuorumKeptDoctored(t *testing.T) {
	base := func() []events.Payload {
		return []events.Payload{
			events.TermStarted{Term: 1, Leader: "meta-1"},
			events.StoreRegistered{Store: "s1", Incarnation: "a", RaftAddr: "10.231.0.5:63001"},
			events.StoreRegistered{Store: "s2", Incarnation: "b", RaftAddr: "10.231.0.6:63001"},
			events.StoreRegistered{Store: "s3", Incarnation: "c", RaftAddr: "10.231.0.7:63001"},
			events.ShardCreated{Shard: 1, Replicas: map[uint64]string{1: "s1", 2: "s2", 3: "s3"}},
			events.StoreState{Store: "s1", State: events.StoreDown},
		}
	}
	write := func(ps []events.Payload) io.Reader {
		var b bytes.Buffer
		for i, p := range ps {
			if err := events.WriteJSONL(&b, events.Event{Seq: uint64(i + 1), Term: 1, Writer: "meta-1", At: time.Unix(int64(i), 0).UTC(), Data: p}); err != nil {
				t.Fatal(err)
			}
		}
		return &b
	}
	remove1 := []events.Payload{
		events.OperatorStarted{Op: "op-1", Shard: 1, Steps: []string{"remove replica 1 from s1"}, Remove: 1},
		events.ShardReplicaRemoving{Shard: 1, Replica: 1, Store: "s1", CCID: 5, Op: "op-1"},
		events.ShardReplicaRemoved{Shard: 1, Replica: 1, Store: "s1", CCID: 6, Op: "op-1"},
	}
	for name, c := range map[string]struct {
		ps   []events.Payload
		want []string // seqs reported
	}{
		"replace a down store's replica with 2 of 3 live": {append(base(), remove1...), nil},
		"then a second store down, nothing changes":       {append(append(base(), remove1...), events.StoreState{Store: "s2", State: events.StoreDown}), nil},
		"remove with 1 of 2 live": {append(append(base(), remove1...),
			events.StoreState{Store: "s2", State: events.StoreDown},
			events.OperatorStarted{Op: "op-2", Shard: 1, Remove: 2},
			events.ShardReplicaRemoving{Shard: 1, Replica: 2, Store: "s2", CCID: 7, Op: "op-2"}), []string{"seq 11 operator.started", "seq 12 shard.replica.removing"}},
		"add with 2 of 3 live, 2 of 4 after": {append(base(),
			events.StoreRegistered{Store: "s4", Incarnation: "d", RaftAddr: "10.231.0.8:63001"},
			events.ShardReplicaAdding{Shard: 1, Replica: 4, Store: "s4", CCID: 5, Op: "op-3"}), []string{"seq 8 shard.replica.adding"}},
		"remove with 1 of 3 live": {append(base(),
			events.StoreState{Store: "s2", State: events.StoreDown},
			events.OperatorStarted{Op: "op-2", Shard: 1, Remove: 1}), []string{"seq 8 operator.started"}},
	} {
		t.Run(name, func(t *testing.T) {
			vs, err := QuorumKept(write(c.ps))
			if err != nil {
				t.Fatal(err)
			}
			if len(vs) != len(c.want) {
				t.Fatalf("got %d violations %v, want %v", len(vs), vs, c.want)
			}
			for i, v := range vs {
				if v.Check != CheckQuorum || !strings.HasPrefix(v.Detail, c.want[i]) {
					t.Errorf("violation %d: %s, want %q...", i, v, c.want[i])
				}
			}
		})
	}
}

func TestLeaderStopped(t *testing.T) {
	wantClean(t, "within the lease", LeaderStopped("meta-1", 1300*time.Millisecond, 4*time.Second, 2*time.Second, time.Second))
	wantViolation(t, "past the lease", LeaderStopped("meta-1", 3100*time.Millisecond, 4*time.Second, 2*time.Second, time.Second),
		CheckStepDown, "meta-1 stopped leading 3.1s after it was cut from NATS, past its lease 2s")
	wantViolation(t, "never", LeaderStopped("meta-2", -1, 4*time.Second, 2*time.Second, time.Second),
		CheckStepDown, "meta-2 still led 4s after it was cut")
}
