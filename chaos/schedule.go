package chaos

import (
	"fmt"
	"math/rand/v2"
	"strings"
	"time"
)

// Fault is a kind of fault a schedule injects.
type Fault string

const (
	// MetaLeaderKill SIGKILLs the meta leader and starts it again after
	// Hold (longer than the lease): another replica must take over.
	MetaLeaderKill Fault = "meta-leader-kill"
	// MetaLeaderPause SIGSTOPs the meta leader for Hold, past its lease,
	// then SIGCONTs it: the first report's paused leader, which wakes up
	// believing it still leads.
	MetaLeaderPause Fault = "meta-leader-pause"
	// WorkerKill SIGKILLs a worker and starts it again at the same
	// endpoint after Hold (sometimes before, sometimes after its expiry).
	WorkerKill Fault = "worker-kill-restart"
	// StoreRapidRestart SIGKILLs a store and starts it again at once,
	// Repeat times, Hold apart.
	StoreRapidRestart Fault = "store-rapid-restart"
	// StoreReplaced SIGKILLs a store and keeps it down past the store
	// timeout until the leader has removed its replicas (the first step of
	// their replacement), starts it with the removed replicas' data on
	// disk (the second report's zombie candidate), SIGKILLs it again Hold
	// later, while its new replicas are being added, then starts it for
	// good.
	StoreReplaced Fault = "store-down-replaced"
	// NATSKill SIGKILLs a NATS node (on R3 one of three; standalone, the
	// only server) and starts it again after Hold.
	NATSKill Fault = "nats-kill"
)

// The partition faults cut links silently (chaos/netns: no reset, no
// refusal; a connect times out, an open connection stalls) and heal them
// after Hold. They need a Netns cluster.
const (
	// PartitionMetaLeader cuts the meta leader from every NATS node for
	// Hold (past its lease): it must stop acting within its lease while a
	// new leader takes over, and nothing it sends late may land.
	PartitionMetaLeader Fault = "partition-meta-leader"
	// PartitionStoreNATS cuts a store from every NATS node while its Raft
	// traffic still flows, for Hold (sometimes past the store timeout: it
	// is marked down and its replicas replaced while they still run; no
	// change may lose quorum, and none of them may survive the heal as a
	// zombie).
	PartitionStoreNATS Fault = "partition-store-nats"
	// PartitionStoreRaft cuts a store from its Raft peers (the other
	// stores) for Hold, while it still reaches NATS.
	PartitionStoreRaft Fault = "partition-store-raft"
	// PartitionNATSNode cuts a NATS node for Hold: on R3 from its two
	// peers (the majority elects without it; clients connected to it are
	// cut with it), standalone from everyone (every role at once sees a
	// silent network instead of NATSKill's refused connections).
	PartitionNATSNode Fault = "partition-nats-node"
)

// ProcessFaults are the kinds every cluster can run; Partitions need a
// Netns cluster (see faultTable).
var (
	ProcessFaults = faultsOf(false)
	Partitions    = faultsOf(true)
)

// Faults is every kind, in a fixed order (for counts).
var Faults = append(append([]Fault{}, ProcessFaults...), Partitions...)

// kinds is what Generate draws from for cfg.
func kinds(cfg Config) []Fault {
	if cfg.Netns {
		return Faults
	}
	return ProcessFaults
}

// Step is one fault of a schedule.
type Step struct {
	At     time.Duration // after the schedule's start
	Fault  Fault
	Target int           // index of the worker, store or NATS node (the meta leader is found when the step runs)
	Hold   time.Duration // how long the fault lasts (see each Fault)
	Repeat int           // StoreRapidRestart: restarts in a row
}

func (s Step) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "+%s %s", s.At.Round(time.Millisecond), s.Fault)
	if unit := kindOf(s.Fault).unit; unit != "" {
		fmt.Fprintf(&b, " %s-%d", unit, s.Target+1)
	}
	fmt.Fprintf(&b, " hold %s", s.Hold.Round(time.Millisecond))
	if s.Repeat > 0 {
		fmt.Fprintf(&b, " x%d", s.Repeat)
	}
	return b.String()
}

// Schedule is a seeded list of faults. The same seed, topology and config
// always give the same schedule.
type Schedule struct {
	Seed     uint64
	Topology Topology
	Steps    []Step
}

func (s Schedule) String() string {
	parts := make([]string, len(s.Steps))
	for i, st := range s.Steps {
		parts[i] = st.String()
	}
	return fmt.Sprintf("seed %d %s: %s", s.Seed, s.Topology, strings.Join(parts, "; "))
}

// Generate draws a schedule of 1 to 3 faults from seed: each fault starts
// 0-3 s after the one before, so their effects overlap (a worker killed
// while the leader is paused, a store restarted while NATS elects).
func Generate(seed uint64, cfg Config) Schedule {
	// Neighbouring seeds (a run's schedules are seed, seed+1, ...) must not
	// give neighbouring streams: mix the seed and the topology first.
	h := splitmix(seed ^ splitmix(uint64(len(cfg.Topology))*0x100000001b3+uint64(cfg.Topology[0])))
	r := rand.New(rand.NewPCG(h, splitmix(h)))
	s := Schedule{Seed: seed, Topology: cfg.Topology}
	d := drawer{r}
	n := 1 + r.IntN(3)
	var at time.Duration
	for i := range n {
		if i > 0 {
			at += d.between(0, 3*time.Second)
		}
		ks := kinds(cfg)
		st := Step{At: at, Fault: ks[r.IntN(len(ks))]}
		kindOf(st.Fault).draw(d, cfg, &st)
		s.Steps = append(s.Steps, st)
	}
	return s
}

// splitmix is SplitMix64's finaliser: a bijective mix of 64 bits.
func splitmix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}
