package chaos

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/chaos/lazyfs"
	"github.com/termlog/termlog/internal/testkit"
)

var (
	flagPLSync    = flag.String("powerloss-sync", "always", "--sync of the NATS nodes in TestPowerLoss: always (must lose nothing) or interval (the mutation: it loses acknowledged events and the test says how many) [$TERMLOG_POWERLOSS_SYNC]")
	flagPLCrashes = flag.Int("powerloss-crashes", 1, "power losses per case of TestPowerLoss, each on the cluster the last one left [$TERMLOG_POWERLOSS_CRASHES]")
	flagPLDirs    = flag.String("powerloss-dirs", "journal", "when a name on the lazy filesystem is durable: journal (any fsync commits every earlier create and rename, as ext4's journal) or strict (only an fsync of its directory, POSIX's letter) [$TERMLOG_POWERLOSS_DIRS]")
	flagPLCases   = flag.String("powerloss-cases", "r1,r3-all,r3-minority", "which cases TestPowerLoss runs [$TERMLOG_POWERLOSS_CASES]")
)

func powerLossFlags() {
	set := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { set[f.Name] = true })
	id := func(s string) (string, error) { return s, nil }
	if !set["powerloss-sync"] {
		env("TERMLOG_POWERLOSS_SYNC", flagPLSync, id)
	}
	if !set["powerloss-crashes"] {
		env("TERMLOG_POWERLOSS_CRASHES", flagPLCrashes, strconv.Atoi)
	}
	if !set["powerloss-dirs"] {
		env("TERMLOG_POWERLOSS_DIRS", flagPLDirs, id)
	}
	if !set["powerloss-cases"] {
		env("TERMLOG_POWERLOSS_CASES", flagPLCases, id)
	}
	if !set["seed"] {
		env("TERMLOG_CHAOS_SEED", flagSeed, func(s string) (uint64, error) { return strconv.ParseUint(s, 10, 64) })
	}
}

// plCase is one power-loss case: a topology and which NATS nodes lose
// power at once.
type plCase struct {
	name    string
	top     Topology
	victims func(rng *rand.Rand, nodes int) []int
}

var plCases = []plCase{
	{"r1", Standalone, func(*rand.Rand, int) []int { return []int{0} }},
	// Every node at once: the coordinated failure Jepsen used.
	{"r3-all", R3, func(_ *rand.Rand, n int) []int { return []int{0, 1, 2}[:n] }},
	// One node: the other two keep a quorum and keep acknowledging.
	{"r3-minority", R3, func(rng *rand.Rand, n int) []int { return []int{rng.IntN(n)} }},
}

// plRow is one line of the Jepsen-style table.
type plRow struct {
	cas           string
	crashes       int
	acked, lost   int
	violations    int
	unknown       bool // the stream could not be read: lost is not known
	dropped       []string
	appendsPerSec float64
}

// TestPowerLoss puts every NATS node's store directory on a lazy
// filesystem (chaos/lazyfs), lets a real meta leader take a registration
// burst (64 registrations in flight: the leader groups their appends),
// and at a seeded moment SIGKILLs the NATS nodes of the case and drops,
// on their filesystems, every write no fsync had made durable: a power
// loss, where a SIGKILL alone keeps the page cache. After the restart
// every registration the leader acknowledged must be in the stream at its
// seq, no meta replica may have projected past the restarted stream's
// tail, and `replay --check` must pass. With --sync always (the default)
// nothing may be lost; -powerloss-sync interval is the mutation, and the
// test then fails saying how many acknowledged events were lost.
func TestPowerLoss(t *testing.T) {
	if testing.Short() {
		t.Skip("starts clusters of separate processes")
	}
	if err := lazyfs.Check(); err != nil {
		t.Skipf("lazyfs: FUSE mounts are not possible here: %v", err)
	}
	powerLossFlags()
	dirs, err := lazyfs.ParseDirMode(*flagPLDirs)
	if err != nil {
		t.Fatal(err)
	}
	if *flagPLSync != "always" && *flagPLSync != "interval" {
		t.Fatalf("-powerloss-sync %q: want always or interval", *flagPLSync)
	}
	seed := *flagSeed
	if seed == 0 {
		seed = uint64(time.Now().UnixNano() % 1_000_000_000)
	}
	// Kept when the test fails (the process logs, exports and backing
	// files of every case), removed when it passes.
	root, err := os.MkdirTemp("", "termlog-powerloss-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if t.Failed() {
			t.Logf("power loss: logs, exports and backing files kept under %s", root)
			return
		}
		os.RemoveAll(root)
	})
	bin := binary(t, root)
	t.Logf("power loss: seed %d, --sync %s, lazyfs dirs %s, %d crashes per case (reproduce: go test ./chaos -run TestPowerLoss -args -seed %d -powerloss-sync %s -powerloss-dirs %s)",
		seed, *flagPLSync, dirs, *flagPLCrashes, seed, *flagPLSync, dirs)
	var rows []plRow
	var mu sync.Mutex
	for i, pc := range plCases {
		if !slices.Contains(strings.Split(*flagPLCases, ","), pc.name) {
			continue
		}
		t.Run(pc.name, func(t *testing.T) {
			// The cases run at once: most of each is NATS's election
			// timeouts after the restart, not work.
			t.Parallel()
			row := runPowerLoss(t, bin, filepath.Join(root, pc.name), pc, seed+uint64(i), dirs)
			mu.Lock()
			rows = append(rows, row)
			mu.Unlock()
		})
	}
	t.Cleanup(func() { logPowerLossTable(t, rows, dirs, seed) })
}

func logPowerLossTable(t *testing.T, rows []plRow, dirs lazyfs.DirMode, seed uint64) {
	slices.SortFunc(rows, func(a, b plRow) int { return strings.Compare(a.cas, b.cas) })
	var b strings.Builder
	fmt.Fprintf(&b, "power loss, --sync %s, lazyfs dirs %s, seed %d (Jepsen, NATS 2.12.1, default 2-minute sync, one coordinated power failure: acknowledged 930,005, lost 131,418):\n", *flagPLSync, dirs, seed)
	fmt.Fprintf(&b, "  %-12s %8s %13s %6s %11s %14s\n", "case", "crashes", "acknowledged", "lost", "violations", "acks/s (load)")
	for _, r := range rows {
		lost := strconv.Itoa(r.lost)
		if r.unknown {
			lost = "?"
		}
		fmt.Fprintf(&b, "  %-12s %8d %13d %6s %11d %14.0f\n", r.cas, r.crashes, r.acked, lost, r.violations, r.appendsPerSec)
		for _, d := range r.dropped {
			fmt.Fprintf(&b, "    %s\n", d)
		}
	}
	t.Log(b.String())
}

func runPowerLoss(t *testing.T, bin, dir string, pc plCase, seed uint64, dirs lazyfs.DirMode) plRow {
	rng := rand.New(rand.NewPCG(seed, 26))
	row := plRow{cas: pc.name}
	ctx := context.Background()
	cfg := Config{Bin: bin, Dir: dir, Topology: pc.top, Metas: 2, Lease: 2 * time.Second,
		WorkerTimeout: 3 * time.Second, StoreTimeout: 3 * time.Second, NATSArgs: []string{"--sync", *flagPLSync}}
	c, err := NewCluster(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	var fss []*lazyfs.FS
	for i := range c.NATS {
		fss = append(fss, lazyfs.MountAt(t, filepath.Join(dir, fmt.Sprintf("lazy-%d", i+1)), c.NATSStoreDir(i), lazyfs.Options{Dirs: dirs}))
	}
	// After the mounts' cleanups were registered, so it runs first: no
	// process holds a mount when it is unmounted.
	t.Cleanup(func() { _ = c.Stop() })
	if err := c.Start(); err != nil {
		t.Fatal(err)
	}
	reg, err := NewRegistrar(c, "pl-"+pc.name)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close()
	if !registered(ctx, reg, 90*time.Second) {
		t.Fatalf("no registration acknowledged 90s after the cluster started (logs in %s)", c.LogDir())
	}
	metas := procNames(c.Metas)
	var loadTime time.Duration
	loadAcks := 0
	for k := range *flagPLCrashes {
		row.crashes++
		// The load, and the meta replicas' projected seqs sampled while it
		// runs (what each projection had folded before the power loss).
		lctx, stopLoad := context.WithCancel(ctx)
		var wg sync.WaitGroup
		before := len(reg.Acks())
		began := time.Now()
		wg.Add(1)
		go func() { defer wg.Done(); reg.Burst(lctx, 64) }()
		sctx, stopSample := context.WithCancel(ctx)
		seen := map[string]uint64{}
		var smu sync.Mutex
		wg.Add(1)
		go func() {
			defer wg.Done()
			for sctx.Err() == nil {
				for _, m := range metas {
					if s, err := c.MetaSeq(sctx, m); err == nil {
						smu.Lock()
						seen[m] = max(seen[m], s)
						smu.Unlock()
					}
				}
				sleepCtx(sctx, 100*time.Millisecond)
			}
		}()
		after := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		sleepCtx(ctx, after)
		victims := pc.victims(rng, len(c.NATS))
		stopSample()
		// Power loss: every victim dies at once, then its filesystem
		// forgets what was not synced. SIGKILL before Crash: a dead
		// process cannot write anything more.
		var kwg sync.WaitGroup
		kerrs := make([]error, len(victims))
		for i, v := range victims {
			kwg.Add(1)
			go func() { defer kwg.Done(); kerrs[i] = c.NATS[v].Kill() }()
		}
		kwg.Wait()
		if err := errors.Join(kerrs...); err != nil {
			t.Fatalf("power loss: %v", err)
		}
		killedAt := time.Now()
		var reports []string
		for _, v := range victims {
			o := lazyfs.CrashOptions{}
			if rng.IntN(2) == 0 {
				o = lazyfs.CrashOptions{Torn: true, Rand: rand.New(rand.NewPCG(seed, uint64(k*10+v)))}
			}
			rep, err := crashWhenClosed(fss[v], o)
			if err != nil {
				t.Fatalf("crash of %s: %v", c.NATS[v].Name, err)
			}
			st := fss[v].Stats()
			detached := ""
			if st.Detached > 0 {
				detached = fmt.Sprintf(", %d crashes found the mount busy with no process holding it and detached it", st.Detached)
			}
			reports = append(reports, fmt.Sprintf("%s (%d writes, %d fsyncs so far%s): %s", c.NATS[v].Name, st.Writes, st.Fsyncs, detached, rep))
		}
		stopLoad()
		wg.Wait()
		loadTime += killedAt.Sub(began)
		acksNow := reg.Acks()
		loadAcks += len(acksNow) - before
		t.Logf("crash %d: after %v of load, %v lost power; %d registrations acknowledged so far (%d in this load; failed: %v); %s", k+1, after.Round(time.Millisecond), names(c.NATS, victims), len(acksNow), len(acksNow)-before, reg.Failures(), strings.Join(reports, "; "))
		for _, v := range victims {
			c.NATS[v].Reap()
			if err := c.NATS[v].Start(); err != nil {
				t.Fatal(err)
			}
		}
		// Back: a registration is acknowledged again (a leader leads and
		// the stream takes appends). Under the mutation it may never be.
		restarted := time.Now()
		up := registered(ctx, reg, 60*time.Second)
		var vs []string
		if !up {
			vs = append(vs, "no registration acknowledged within 60s of the restart")
		} else {
			t.Logf("crash %d: a registration acknowledged again %v after the restart", k+1, time.Since(restarted).Round(time.Millisecond))
		}
		// What each meta replica projects now, then the stream: a replica
		// projecting past the stream's tail folded events the stream lost.
		now := map[string]uint64{}
		for _, m := range metas {
			if s, err := c.MetaSeq(ctx, m); err == nil {
				now[m] = s
			}
		}
		cdir := filepath.Join(dir, fmt.Sprintf("crash-%d", k+1))
		_ = os.MkdirAll(cdir, 0o755)
		export := filepath.Join(cdir, "export.jsonl")
		evs, err := exportWithin(ctx, c, export, 30*time.Second)
		known := err == nil || strings.Contains(err.Error(), "no stream")
		if err != nil {
			vs = append(vs, "export: "+err.Error())
		} else {
			rc, err := c.ReplayCheck(ctx, export)
			if err != nil {
				vs = append(vs, "replay --check: "+err.Error())
			}
			for _, v := range LogContiguous(evs, rc.Code, rc.Stdout+rc.Stderr) {
				vs = append(vs, v.String())
			}
		}
		tail := uint64(len(evs))
		for _, m := range metas {
			if seen[m] > tail {
				vs = append(vs, fmt.Sprintf("%s had projected seq %d before the power loss; the stream now ends at %d", m, seen[m], tail))
			}
			if now[m] > tail {
				vs = append(vs, fmt.Sprintf("%s projects seq %d after the restart; the stream ends at %d", m, now[m], tail))
			}
		}
		acks := reg.Acks()
		var lost []string
		if known {
			// The stream as read, or none at all: what is not there is lost.
			lost = AckedLost(evs, acks)
		} else {
			row.unknown = true
		}
		row.acked, row.lost = len(acks), len(lost)
		row.violations += len(vs)
		if len(lost) > 0 {
			row.dropped = append(row.dropped, fmt.Sprintf("crash %d: first lost: %s", k+1, lost[0]))
			t.Errorf("%s crash %d: acknowledged %d registrations, lost %d (seed %d; export %s, logs %s):\n  %s",
				pc.name, k+1, len(acks), len(lost), seed, export, c.LogDir(), strings.Join(firstN(lost, 10), "\n  "))
		}
		if len(vs) > 0 {
			t.Errorf("%s crash %d: %d violations (seed %d; logs %s):\n  %s", pc.name, k+1, len(vs), seed, c.LogDir(), strings.Join(vs, "\n  "))
		}
		if len(lost) > 0 || !up || !known {
			break // the cluster's state is past checking further
		}
	}
	if loadTime > 0 {
		row.appendsPerSec = float64(loadAcks) / loadTime.Seconds()
	}
	return row
}

// exportWithin exports the stream, trying again for a while when it
// cannot be read (a restarted R3 stream may be without a leader for a
// few seconds); "no stream" is an answer, not a reason to try again.
func exportWithin(ctx context.Context, c *Cluster, path string, within time.Duration) ([]Event, error) {
	var evs []Event
	var err error
	_ = testkit.Poll(ctx, within, time.Second, func() error {
		evs, err = c.Export(ctx, path)
		if err != nil && strings.Contains(err.Error(), "no stream") {
			return nil // an answer: returned as it is
		}
		return err
	})
	return evs, err
}

// registered waits until a registration is acknowledged.
func registered(ctx context.Context, reg *Registrar, within time.Duration) bool {
	return testkit.Poll(ctx, within, 200*time.Millisecond, func() error {
		_, err := reg.Register(ctx, 2*time.Second)
		return err
	}) == nil
}

// crashWhenClosed crashes fs once the kernel has let go of the killed
// process's files (its last releases can trail its exit).
func crashWhenClosed(fs *lazyfs.FS, o lazyfs.CrashOptions) (lazyfs.CrashReport, error) {
	var rep lazyfs.CrashReport
	// Crash detaches a mount the kernel still counts busy once no live
	// process holds it (ci11 and ci29 saw one busy for 2-10+ s after the
	// killed node was reaped); a live holder is refused: wait up to 10 s
	// for it to go, then fail naming it.
	err := testkit.Poll(context.Background(), 10*time.Second, 100*time.Millisecond, func() (err error) {
		rep, err = fs.Crash(o)
		return err
	})
	if err != nil {
		return lazyfs.CrashReport{}, err
	}
	return rep, nil
}

func names(ps []*Proc, idx []int) []string {
	var out []string
	for _, i := range idx {
		out = append(out, ps[i].Name)
	}
	return out
}

func firstN(s []string, n int) []string {
	if len(s) > n {
		return append(s[:n:n], fmt.Sprintf("... and %d more", len(s)-n))
	}
	return s
}

// BenchmarkPowerLossBurst is what the lazy filesystem costs: bursts of
// 1,000 registrations (64 in flight, the leader grouping their appends;
// each appends one worker.registered), --sync always, on two clusters run
// side by side, one with its NATS stores on the plain disk and one on the
// lazy filesystem, the bursts alternating between them (a loaded machine
// slows both alike). The configuration is TestPowerLoss's.
//
//	go test -run '^$' -bench PowerLossBurst -benchtime 5x ./chaos
func BenchmarkPowerLossBurst(b *testing.B) {
	if err := lazyfs.Check(); err != nil {
		b.Skipf("lazyfs: FUSE mounts are not possible here: %v", err)
	}
	bin := binary(b, "")
	const burst = 1000
	ctx := context.Background()
	start := func(b *testing.B, top Topology, lazy bool) *Registrar {
		dir := b.TempDir()
		c, err := NewCluster(ctx, Config{Bin: bin, Dir: dir, Topology: top, Metas: 2, Lease: 2 * time.Second,
			WorkerTimeout: 3 * time.Second, StoreTimeout: 3 * time.Second, NATSArgs: []string{"--sync", "always"}})
		if err != nil {
			b.Fatal(err)
		}
		if lazy {
			for i := range c.NATS {
				lazyfs.MountAt(b, filepath.Join(dir, fmt.Sprintf("lazy-%d", i+1)), c.NATSStoreDir(i), lazyfs.Options{})
			}
		}
		b.Cleanup(func() { _ = c.Stop() })
		if err := c.Start(); err != nil {
			b.Fatal(err)
		}
		reg, err := NewRegistrar(c, "bench")
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(reg.Close)
		if !registered(ctx, reg, 90*time.Second) {
			b.Fatalf("no registration acknowledged 90s after the cluster started (logs in %s)", c.LogDir())
		}
		reg.BurstN(ctx, 64, burst) // warm up: the leader's first groups, the first blocks
		return reg
	}
	for _, top := range []Topology{Standalone, R3} {
		b.Run(string(top), func(b *testing.B) {
			plain, lazy := start(b, top, false), start(b, top, true)
			var tPlain, tLazy time.Duration
			b.ResetTimer()
			for range b.N {
				began := time.Now()
				plain.BurstN(ctx, 64, burst)
				tPlain += time.Since(began)
				began = time.Now()
				lazy.BurstN(ctx, 64, burst)
				tLazy += time.Since(began)
			}
			b.StopTimer()
			n := float64(b.N)
			b.ReportMetric(burst*n/tPlain.Seconds(), "plain-regs/s")
			b.ReportMetric(burst*n/tLazy.Seconds(), "lazyfs-regs/s")
			b.ReportMetric(tPlain.Seconds()/n, "plain-s/burst")
			b.ReportMetric(tLazy.Seconds()/n, "lazyfs-s/burst")
			b.ReportMetric(tLazy.Seconds()/tPlain.Seconds(), "lazyfs/plain")
		})
	}
}
