package chaos

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/chaos/netns"
)

var (
	flagSeed      = flag.Uint64("seed", 0, "seed of the first schedule (0: from the clock, printed); schedule i uses seed+i [$TERMLOG_CHAOS_SEED]")
	flagSchedules = flag.Int("schedules", 0, "schedules per topology (default 3) [$TERMLOG_CHAOS_SCHEDULES]")
	flagTopology  = flag.String("topology", "", "standalone, r3 or both (default both) [$TERMLOG_CHAOS_TOPOLOGY]")
	flagDir       = flag.String("dir", "", "keep every schedule's logs, exports and histories under this dir (default: a temp dir, kept only when a schedule fails) [$TERMLOG_CHAOS_DIR]")
	flagBound     = flag.Duration("recovery-bound", 60*time.Second, "a healed cluster must be healthy within this [$TERMLOG_CHAOS_RECOVERY_BOUND]")
	flagFresh     = flag.Int("fresh-every", 0, "start a fresh cluster every N schedules (0: one cluster per topology) [$TERMLOG_CHAOS_FRESH_EVERY]")
	flagKeepGoing = flag.Bool("keep-going", false, "after a failing schedule, go on with a fresh cluster instead of stopping the topology (long runs) [$TERMLOG_CHAOS_KEEP_GOING]")
	flagRace      = flag.Bool("race-bin", raceEnabled, "build the binary with -race (default: when the test runs with -race) [$TERMLOG_CHAOS_RACE]")
	flagNetns     = flag.String("netns", "auto", "run every role in a network namespace of its own and draw partition faults too: on, off, or auto (on where this process may build namespaces: root and iproute2) [$TERMLOG_CHAOS_NETNS]")
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m, goleak.Cleanup(func(code int) {
		if binDir != "" {
			os.RemoveAll(binDir)
		}
		os.Exit(code)
	}))
}

// env fills a flag left at its default from its environment variable.
func env[T any](name string, v *T, parse func(string) (T, error)) {
	s := os.Getenv(name)
	if s == "" {
		return
	}
	x, err := parse(s)
	if err != nil {
		fmt.Fprintf(os.Stderr, "%s=%q: %v\n", name, s, err)
		os.Exit(2)
	}
	*v = x
}

func setFromEnv(t *testing.T) {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	id := func(s string) (string, error) { return s, nil }
	if !set["seed"] {
		env("TERMLOG_CHAOS_SEED", flagSeed, func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) })
	}
	if !set["schedules"] {
		env("TERMLOG_CHAOS_SCHEDULES", flagSchedules, strconv.Atoi)
	}
	if !set["topology"] {
		env("TERMLOG_CHAOS_TOPOLOGY", flagTopology, id)
	}
	if !set["dir"] {
		env("TERMLOG_CHAOS_DIR", flagDir, id)
	}
	if !set["recovery-bound"] {
		env("TERMLOG_CHAOS_RECOVERY_BOUND", flagBound, time.ParseDuration)
	}
	if !set["fresh-every"] {
		env("TERMLOG_CHAOS_FRESH_EVERY", flagFresh, strconv.Atoi)
	}
	if !set["keep-going"] {
		env("TERMLOG_CHAOS_KEEP_GOING", flagKeepGoing, strconv.ParseBool)
	}
	if !set["race-bin"] {
		env("TERMLOG_CHAOS_RACE", flagRace, strconv.ParseBool)
	}
	if !set["netns"] {
		env("TERMLOG_CHAOS_NETNS", flagNetns, id)
	}
}

// useNetns resolves -netns: whether the clusters run in namespaces, and
// why (for the log).
func useNetns(t *testing.T) (bool, string) {
	why := netns.Available()
	switch *flagNetns {
	case "off":
		return false, "-netns off: roles on 127.0.0.1, no partition faults"
	case "on":
		if why != nil {
			t.Fatalf("-netns on: %v", why)
		}
		return true, "-netns on: roles in network namespaces, partition faults drawn"
	case "auto", "":
		if why != nil {
			return false, fmt.Sprintf("-netns auto: roles on 127.0.0.1, no partition faults (%v)", why)
		}
		return true, "-netns auto: roles in network namespaces, partition faults drawn"
	}
	t.Fatalf("-netns %q: want on, off or auto", *flagNetns)
	return false, ""
}

// The binary the tests of this process share (built once), and its dir,
// removed when the process ends.
var (
	binOnce sync.Once
	binDir  string
	binPath string
	binErr  error
)

// binary is TERMLOG_BIN, or the binary built once per test process (with
// -race when -race-bin); dir is unused now that TestChaos and
// TestPowerLoss share one build.
func binary(t testing.TB, _ string) string {
	if b := os.Getenv("TERMLOG_BIN"); b != "" {
		return b
	}
	binOnce.Do(func() {
		if binDir, binErr = os.MkdirTemp("", "termlog-chaos-bin-"); binErr != nil {
			return
		}
		binPath = filepath.Join(binDir, "termlog")
		args := []string{"build", "-o", binPath}
		if *flagRace {
			args = append(args, "-race")
		}
		cmd := exec.Command("go", append(args, "../cmd/termlog")...)
		if out, err := cmd.CombinedOutput(); err != nil {
			binErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if binErr != nil {
		t.Fatal(binErr)
	}
	return binPath
}

// Summary is a run's numbers (written to <dir>/summary.json).
type Summary struct {
	Seed       uint64           `json:"seed"`
	Netns      bool             `json:"netns"`
	Schedules  map[Topology]int `json:"schedules"`
	Faults     map[Fault]int    `json:"faults"`
	Violations []string         `json:"violations"`
	RecoveryMS struct {
		Min, Median, Max int64
		All              []int64 `json:"all"`
	} `json:"recovery_ms"`
	Failed []string `json:"failed,omitempty"` // "topology seed N (schedule i): dir"
	// Every meta leader cut from NATS: cut -> it stopped leading, and cut
	// -> another replica led a newer term (-1: not while the cut held).
	LeaderStopMS []int64 `json:"leader_stop_ms,omitempty"`
	TakeoverMS   []int64 `json:"takeover_ms,omitempty"`
}

// spread is "min/median/max" of ms (-1s, "not while the cut held", count
// apart).
func spread(ms []int64) string {
	var ok []int64
	never := 0
	for _, v := range ms {
		if v < 0 {
			never++
			continue
		}
		ok = append(ok, v)
	}
	if len(ok) == 0 {
		return fmt.Sprintf("none measured (%d not within the cut)", never)
	}
	slices.Sort(ok)
	return fmt.Sprintf("min %dms median %dms max %dms of %d (%d not within the cut)", ok[0], ok[len(ok)/2], ok[len(ok)-1], len(ok), never)
}

// TestChaos runs seeded fault schedules against clusters of separate
// processes (one per topology) and checks each from the outside. A
// failing schedule prints its seed, its steps and the dir of its logs.
func TestChaos(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters of separate processes")
	}
	setFromEnv(t)
	tops, err := ParseTopology(*flagTopology)
	if err != nil {
		t.Fatal(err)
	}
	n := *flagSchedules
	if n <= 0 {
		n = 3
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	root := *flagDir
	keep := root != ""
	if root == "" {
		root, err = os.MkdirTemp("", "termlog-chaos-")
		if err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(root, 0o755); err != nil {
		t.Fatal(err)
	}
	ns, why := useNetns(t)
	t.Logf("chaos: seed %d, %d schedules per topology %v, logs under %s; %s", seed, n, tops, root, why)
	bin := binary(t, root)

	// Ctrl-C (or SIGTERM) ends the run between steps and stops every
	// process it started, instead of leaving the roles running.
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	sum := Summary{Seed: seed, Netns: ns, Schedules: map[Topology]int{}, Faults: map[Fault]int{}}
	var recov []time.Duration
	failed := false
	for _, top := range tops {
		t.Run(string(top), func(t *testing.T) {
			ok := runTopology(ctx, t, bin, root, top, ns, seed, n, &sum, &recov)
			if !ok {
				failed = true
			}
		})
	}
	slices.Sort(recov)
	for _, d := range recov {
		sum.RecoveryMS.All = append(sum.RecoveryMS.All, d.Milliseconds())
	}
	if len(recov) > 0 {
		sum.RecoveryMS.Min, sum.RecoveryMS.Median, sum.RecoveryMS.Max = recov[0].Milliseconds(), recov[len(recov)/2].Milliseconds(), recov[len(recov)-1].Milliseconds()
	}
	b, _ := json.MarshalIndent(sum, "", "  ")
	_ = os.WriteFile(filepath.Join(root, "summary.json"), b, 0o644)
	var counts []string
	for _, f := range Faults {
		counts = append(counts, fmt.Sprintf("%s %d", f, sum.Faults[f]))
	}
	t.Logf("chaos summary: schedules %v; faults: %s; violations %d; recovery min %dms median %dms max %dms",
		sum.Schedules, strings.Join(counts, ", "), len(sum.Violations), sum.RecoveryMS.Min, sum.RecoveryMS.Median, sum.RecoveryMS.Max)
	if len(sum.LeaderStopMS) > 0 {
		t.Logf("chaos: meta leaders cut from NATS stopped leading %s; another led %s", spread(sum.LeaderStopMS), spread(sum.TakeoverMS))
	}
	if failed {
		t.Logf("chaos: logs of the failing schedules are kept under %s", root)
		return
	}
	if !keep {
		os.RemoveAll(root)
	}
}

// runTopology runs n schedules on a cluster of one topology (a fresh
// cluster every -fresh-every schedules); it stops at the first failing
// schedule and reports whether all passed.
func runTopology(ctx context.Context, t *testing.T, bin, root string, top Topology, ns bool, seed uint64, n int, sum *Summary, recov *[]time.Duration) bool {
	var (
		c      *Cluster
		r      *Runner
		rec    = &OpLog{}
		gen    int
		tdir   = filepath.Join(root, string(top))
		closeC = func() {
			if r != nil {
				r.Close()
			}
			if c != nil {
				if err := c.Stop(); err != nil {
					t.Errorf("stopping %s cluster %d: %v", top, gen, err)
				}
			}
			c, r = nil, nil
		}
	)
	defer closeC()
	ok := true
	for i := range n {
		if ctx.Err() != nil {
			t.Logf("%s: interrupted after %d schedules; the processes are stopped", top, i)
			return ok
		}
		if c == nil || (*flagFresh > 0 && i > 0 && i%*flagFresh == 0) {
			closeC()
			gen++
			cfg := DefaultConfig(bin, filepath.Join(tdir, fmt.Sprintf("cluster-%d", gen)), top)
			cfg.Netns = ns
			var err error
			c, err = NewCluster(ctx, cfg)
			if err != nil {
				t.Fatal(err)
			}
			if err := c.Start(); err != nil {
				t.Fatal(err)
			}
			r = &Runner{C: c, Rec: rec, RecoveryBound: *flagBound, Settle: cfg.StoreTimeout, Logf: t.Logf, CheckHistory: HistoryChecker(cfg.WorkerTimeout)}
			began := time.Now()
			if took, v := r.WaitHealthy(ctx, 120*time.Second); took < 0 && ctx.Err() == nil {
				t.Fatalf("%s cluster %d not healthy 120s after start: %v (logs in %s)", top, gen, v, c.LogDir())
			}
			t.Logf("%s cluster %d healthy %.1fs after start (logs in %s)", top, gen, time.Since(began).Seconds(), c.LogDir())
			if err := r.StartProbes(2, seed); err != nil {
				t.Fatal(err)
			}
		}
		s := Generate(seed+uint64(i), c.Cfg)
		dir := filepath.Join(tdir, fmt.Sprintf("schedule-%03d-seed-%d", i, s.Seed))
		res := r.Run(ctx, s, i, dir)
		if ctx.Err() != nil {
			t.Logf("%s: interrupted during schedule %d (%s); not counted; the processes are stopped", top, i, s)
			return ok
		}
		sum.Schedules[top]++
		for f, k := range res.Executed {
			sum.Faults[f] += k
		}
		if res.Recovery >= 0 {
			*recov = append(*recov, res.Recovery)
		}
		for _, d := range res.LeaderStops {
			sum.LeaderStopMS = append(sum.LeaderStopMS, msOrNever(d))
		}
		for _, d := range res.Takeovers {
			sum.TakeoverMS = append(sum.TakeoverMS, msOrNever(d))
		}
		appendResult(filepath.Join(root, "results.jsonl"), top, res)
		if len(res.Violations) > 0 {
			for _, v := range res.Violations {
				sum.Violations = append(sum.Violations, fmt.Sprintf("%s seed %d: %s", top, s.Seed, v))
			}
			sum.Failed = append(sum.Failed, fmt.Sprintf("%s seed %d (schedule %d of run seed %d): %s, process logs %s", top, s.Seed, i, seed, dir, c.LogDir()))
			t.Errorf("%s schedule %d FAILED: %s\n  %d violations:\n    %s\n  steps, export and history: %s\n  process logs: %s\n  reproduce: go test ./chaos -run 'TestChaos/%s' -args -seed %d -schedules %d -topology %s -netns %s   (or -seed %d -schedules 1 for this schedule alone on a fresh cluster)",
				top, i, s, len(res.Violations), joinViolations(res.Violations), dir, c.LogDir(), top, seed, i+1, top, onOff(ns), s.Seed)
			ok = false
			if !*flagKeepGoing {
				return false
			}
			closeC() // its state is suspect: the next schedule gets a fresh cluster
		}
	}
	return ok
}

// appendResult appends one schedule's outcome to path (a long run that is
// stopped keeps what it did).
func appendResult(path string, top Topology, res Result) {
	type line struct {
		Topology   Topology      `json:"topology"`
		Index      int           `json:"index"`
		Seed       uint64        `json:"seed"`
		Schedule   string        `json:"schedule"`
		Faults     map[Fault]int `json:"faults"`
		RecoveryMS int64         `json:"recovery_ms"` // -1: never
		// A meta leader cut from NATS: cut -> it stops leading, and cut ->
		// another replica leads (-1: not while the cut held).
		LeaderStopMS []int64   `json:"leader_stop_ms,omitempty"`
		TakeoverMS   []int64   `json:"takeover_ms,omitempty"`
		Violations   []string  `json:"violations,omitempty"`
		Dir          string    `json:"dir"`
		At           time.Time `json:"at"`
	}
	l := line{Topology: top, Index: res.Index, Seed: res.Schedule.Seed, Schedule: res.Schedule.String(), Faults: res.Executed,
		RecoveryMS: res.Recovery.Milliseconds(), Dir: res.Dir, At: time.Now().UTC()}
	if res.Recovery < 0 {
		l.RecoveryMS = -1
	}
	for _, d := range res.LeaderStops {
		l.LeaderStopMS = append(l.LeaderStopMS, msOrNever(d))
	}
	for _, d := range res.Takeovers {
		l.TakeoverMS = append(l.TakeoverMS, msOrNever(d))
	}
	for _, v := range res.Violations {
		l.Violations = append(l.Violations, v.String())
	}
	b, _ := json.Marshal(l)
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		return
	}
	defer f.Close()
	_, _ = f.Write(append(b, '\n'))
}

func joinViolations(vs []Violation) string {
	var s []string
	for _, v := range vs {
		s = append(s, v.String())
	}
	return strings.Join(s, "\n    ")
}

func onOff(b bool) string {
	if b {
		return "on"
	}
	return "off"
}

// msOrNever is d in ms, -1 for "never" (a negative d).
func msOrNever(d time.Duration) int64 {
	if d < 0 {
		return -1
	}
	return d.Milliseconds()
}
