package tests

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/network"
	"github.com/chromedp/chromedp"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/console"
	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/replay"
)

// screenshotDir is where the browser tests save their screenshots (the
// README shows two of them, copied to docs/screenshots).
const screenshotDir = "testdata/screenshots"

// browser starts a headless Chromium (Debian's package) for the test; the
// test skips, naming why, when there is none.
func browser(t *testing.T) context.Context {
	t.Helper()
	path, err := exec.LookPath("chromium")
	if err != nil {
		t.Skip("no chromium on PATH (apt-get install -y chromium; .ci/run installs it): the browser tests need a real Chromium")
	}
	opts := append(chromedp.DefaultExecAllocatorOptions[:],
		chromedp.ExecPath(path), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.WindowSize(1280, 900))
	actx, cancelA := chromedp.NewExecAllocator(context.Background(), opts...)
	ctx, cancel := chromedp.NewContext(actx)
	t.Cleanup(func() {
		cancel()
		cancelA()
	})
	if err := chromedp.Do(ctx); err != nil {
		t.Fatalf("start chromium: %v", err)
	}
	return ctx
}

func screenshot(t *testing.T, ctx context.Context, name string) {
	t.Helper()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		t.Fatalf("screenshot %s: %v", name, err)
	}
	if err := os.MkdirAll(screenshotDir, 0o755); err != nil {
		t.Fatal(err)
	}
	p := filepath.Join(screenshotDir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Logf("screenshot %s (%d bytes)", p, len(png))
}

// run runs chromedp actions, bounded by within.
func run(t *testing.T, ctx context.Context, within time.Duration, what string, actions ...chromedp.Action[chromedp.Void]) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		t.Fatalf("%s: %v", what, err)
	}
}

// value runs one chromedp action and returns its value, bounded.
func value[T any](t *testing.T, ctx context.Context, what string, a chromedp.Action[T]) T {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, a)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return v
}

// textNow reads the text of the element sel in one evaluation: the live
// page redraws its parts, and chromedp.Text's node lookup then its read
// can fall between a redraw ("No node with given id found", ci12).
func textNow(sel string) chromedp.Action[string] {
	return chromedp.Evaluate[string](fmt.Sprintf(`(document.querySelector(%q) || {innerText: ""}).innerText`, sel))
}

// until waits (at most timeout) for the page's expression to be true.
func until(expr string, timeout time.Duration) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Poll[bool](expr, chromedp.WithPollingTimeout(timeout), chromedp.WithPollingInterval(20*time.Millisecond))(ctx, tg)
		return chromedp.Void{}, err
	}
}

// eval runs a script for its side effect.
func eval(expr string) chromedp.Action[chromedp.Void] {
	return func(ctx context.Context, tg *chromedp.Target) (chromedp.Void, error) {
		_, err := chromedp.Evaluate[any](expr)(ctx, tg)
		return chromedp.Void{}, err
	}
}

// bucketProbe reads the lease holder and the health record as `status`
// does (cmd/termlog's probe does the same through its session).
func bucketProbe(nc *nats.Conn) console.Probe {
	js, _ := jetstream.New(nc)
	return func(ctx context.Context) health.Read {
		var r health.Read
		kv, err := js.KeyValue(ctx, meta.LeaseBucket(cluster))
		if err != nil {
			r.LeaseErr = err
		} else {
			if e, err := kv.Get(ctx, meta.LeaseKey); err == nil {
				r.Holder = string(e.Value())
			} else if err != jetstream.ErrKeyNotFound {
				r.LeaseErr = err
			}
			if st, err := kv.Status(ctx); err == nil {
				r.TTL = st.TTL()
			}
		}
		if hkv, err := meta.BindHealthKV(ctx, js, cluster); err == nil {
			if rec, err := hkv.Get(ctx); err == nil {
				r.Record = &rec
			}
		}
		return r
	}
}

// serveConsole runs a console over l on a free loopback port until the
// test ends; it returns its URL.
func serveConsole(t *testing.T, l events.Log, probe console.Probe) string {
	t.Helper()
	c := console.New(console.Config{Cluster: cluster, Log: l, Probe: probe, ProbeEvery: 100 * time.Millisecond, Logger: testkit.Logger(t)})
	ln, err := console.Listen("127.0.0.1:0", "", "")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	wg.Go(func() { _ = ln.Serve(ctx, c.Handler(), testkit.Logger(t)) })
	t.Cleanup(func() {
		cancel()
		wg.Wait()
	})
	return ln.URL()
}

// TestConsoleInChromium drives a real Chromium against a live cluster
// (embedded NATS, two meta replicas, three stores, one shard, a worker):
// the overview shows the leader; after a stepdown the open page shows the
// new term within 2 s without a reload; the shard page shows a stopped
// store's replica as not running.
func TestConsoleInChromium(t *testing.T) {
	ctx := browser(t)
	c := newCluster(t)
	o := schedOpts()
	m1 := c.startMeta("meta-1", o)
	testkit.Eventually(t, 10*time.Second, "meta-1 leads", func() bool { ok, _ := m1.Leading(); return ok })
	m2 := c.startMeta("meta-2", o)
	stores := []*storeNode{c.newStore("store-1"), c.newStore("store-2"), c.newStore("store-3")}
	c.startWorker(testkit.FreeAddr(t), "w-1", 200*time.Millisecond)
	testkit.Eventually(t, 30*time.Second, "shard 1 runs 3/3", func() bool {
		l, _ := leaderOf(m1, m2)
		if l == nil {
			return false
		}
		_, ok := fullShard(l, 1, stores...)
		return ok
	})
	obs := c.connAs(natsserver.RoleObserver)
	url := serveConsole(t, c.openLogWith(obs, natslog.Config{Cluster: cluster, Bind: true}), bucketProbe(obs))

	leader, term := leaderOf(m1, m2)
	run(t, ctx, 15*time.Second, "overview shows the leader",
		chromedp.Navigate(url),
		chromedp.WaitVisible("#leader"),
		until(fmt.Sprintf(`document.querySelector('#leader') && document.querySelector('#leader').textContent === %q && document.querySelector('#term').textContent.startsWith(%q) && document.querySelector('#live').textContent === 'live'`, leader.ID(), fmt.Sprint(term)), 10*time.Second),
		eval(`window.__noReload = 1`),
	)
	// The overview reaches healthy once the leader's record catches up.
	run(t, ctx, 15*time.Second, "overview says healthy",
		until(`document.querySelector('#verdict') && document.querySelector('#verdict').textContent.startsWith('HEALTHY')`, 12*time.Second))
	screenshot(t, ctx, "console-overview.png")

	leader.StepDown()
	var next *metaNode
	var nextTerm uint64
	testkit.Eventually(t, 15*time.Second, "another replica leads a later term", func() bool {
		next, nextTerm = leaderOf(m1, m2)
		return next != nil && nextTerm > term
	})
	start := time.Now()
	run(t, ctx, 5*time.Second, "the open page shows the new term",
		until(fmt.Sprintf(`document.querySelector('#term').textContent.startsWith(%q) && document.querySelector('#leader').textContent === %q`, fmt.Sprint(nextTerm), next.ID()), 2*time.Second))
	shown := time.Since(start)
	if !value(t, ctx, "no reload", chromedp.Evaluate[bool](`window.__noReload === 1`)) {
		t.Fatal("the page was reloaded to show the new term")
	}
	t.Logf("stepdown: term %d (%s) -> %d (%s) on the open page %s after the new leader was known", term, leader.ID(), nextTerm, next.ID(), shown.Round(time.Millisecond))

	// The shard page: store-3 stops; its replica shows as not running.
	// First the new leader hears every store in its term: a store that
	// stops before that is, rightly, "not heard yet" until its timeout,
	// and then its replica is replaced (a clean-clone CI of 31c3b52: no store-3 row ever showed
	// "not running").
	testkit.Eventually(t, 10*time.Second, fmt.Sprintf("%s heard every store in term %d", next.ID(), nextTerm), func() bool {
		h := next.HealthReport()
		return h.Term == nextTerm && len(h.Collecting) == 0 && len(h.Shards) == 1 && h.Shards[0].Live == 3
	})
	run(t, ctx, 15*time.Second, "shard page",
		chromedp.Navigate(url+"#/shards"),
		until(`document.querySelectorAll('#shards tr[data-shard] .pill.ok').length >= 3`, 10*time.Second))
	stores[2].stop()
	run(t, ctx, 30*time.Second, "store-3's replica shows as not running",
		until(`Array.from(document.querySelectorAll('#shards tr[data-shard]')).some(tr => tr.children[2].textContent === 'store-3' && tr.querySelector('.replica-state').textContent === 'not running')`, 25*time.Second))
	text := value(t, ctx, "shards table", textNow(`#shards`))
	t.Logf("shards table: %s", strings.Join(strings.Fields(text), " "))
	screenshot(t, ctx, "console-shards.png")

	// A second store stops: shard 1 runs 1 of 3, no quorum; the overview
	// shows the red banner with what to do.
	stores[1].stop()
	run(t, ctx, 30*time.Second, "the red banner for shard 1",
		chromedp.Navigate(url),
		until(`document.querySelector('#red-banner') !== null && document.querySelector('#red-banner').textContent.includes('Shard 1 has no quorum: 1 of 3 replicas running')`, 25*time.Second))
	banner := value(t, ctx, "banner", textNow(`#red-banner`))
	_, named, _ := strings.Cut(banner, "Bring back the stores of its stopped replicas (")
	named, _, _ = strings.Cut(named, ")")
	if !strings.Contains(named, "@store-2") || !strings.Contains(named, "@store-3") || strings.Contains(named, "store-1") {
		t.Errorf("banner %q: want the remedy naming the stopped replicas, on store-2 and store-3 only", banner)
	}
	if v := value(t, ctx, "verdict", textNow(`#verdict`)); !strings.HasPrefix(v, "DEGRADED") || !strings.Contains(v, "exits 1") {
		t.Errorf("verdict %q, want DEGRADED with status's exit 1", v)
	}
	screenshot(t, ctx, "console-no-quorum.png")
}

// TestConsoleIncidentInChromium replays the first report's incident
// (replay's handoff.jsonl, seed 000_152df8e950350615): the events page
// filtered to outcome=rejected shows the stale-term event with its reason,
// and report.html of the same log, opened from disk with networking off,
// shows the same row. A 100,000-event report is measured: its size and
// how long Chromium takes to open it.
func TestConsoleIncidentInChromium(t *testing.T) {
	ctx := browser(t)
	const handoff = "../replay/testdata/logs/handoff.jsonl"
	f, err := os.Open(handoff)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := events.NewMemLog()
	if err := replay.JSONL(f).Read(context.Background(), func(it replay.Item) error {
		b, err := events.Encode(it.Event)
		if err == nil {
			l.AppendRaw(b)
		}
		return err
	}); err != nil {
		t.Fatal(err)
	}
	url := serveConsole(t, l, nil)
	const want = `rejected stale-term`
	const reason = `term 1 < current term 7`
	run(t, ctx, 15*time.Second, "events filtered to rejected",
		chromedp.Navigate(url+"#/events?outcome=rejected"),
		chromedp.WaitVisible(`#ev-5`))
	row := value(t, ctx, "row of seq 5", textNow(`#ev-5`))
	if !strings.Contains(row, want) || !strings.Contains(row, reason) || !strings.Contains(row, "meta-1") {
		t.Fatalf("row of seq 5: %q, want %q and %q", row, want, reason)
	}
	if rows := value(t, ctx, "rows", chromedp.Evaluate[int](`document.querySelectorAll('table.events tbody tr').length`)); rows != 1 {
		t.Fatalf("%d rows under outcome=rejected, want 1", rows)
	}
	screenshot(t, ctx, "console-events-rejected.png")

	// The timeline: term 1 and term 7 as lanes, the rejected event a mark
	// on term 7's lane; clicking it opens the event.
	run(t, ctx, 15*time.Second, "timeline",
		chromedp.Navigate(url+"#/timeline"),
		chromedp.WaitVisible(`svg.timeline [data-mark="5"]`))
	screenshot(t, ctx, "console-timeline.png")
	run(t, ctx, 15*time.Second, "click the mark",
		chromedp.Click(`svg.timeline [data-mark="5"] path`),
		until(`location.hash === '#/event/5' && document.querySelector('tr.target') !== null`, 10*time.Second))
	if ev := norm(value(t, ctx, "the event", textNow(`tr.target`))); !strings.Contains(ev, "rejected stale-term") || !strings.Contains(ev, reason) {
		t.Fatalf("event page after the click: %q", ev)
	}

	// report.html of the same log, from disk, offline.
	dir := t.TempDir()
	report := filepath.Join(dir, "report.html")
	writeReport(t, report, handoff, []replay.Subject{{Kind: replay.KindWorker, Name: "1", Num: 1}})
	offline(t, ctx)
	run(t, ctx, 15*time.Second, "report.html opened from disk",
		chromedp.Navigate("file://"+report),
		chromedp.WaitVisible(`body[data-ready="1"]`))
	// Networking is off: the console that served the page is unreachable.
	if reached := value(t, ctx, "fetch while offline", chromedp.Evaluate[bool](fmt.Sprintf(`fetch(%q).then(() => true, () => false)`, url+"api/v1/status"), chromedp.EvalAwaitPromise)); reached {
		t.Fatal("the page reached the console: networking is not off")
	}
	run(t, ctx, 15*time.Second, "the row of seq 5 in the report",
		chromedp.Navigate("file://"+report+"#ev-5"),
		chromedp.WaitVisible(`#evpage #ev-5`))
	reportRow := value(t, ctx, "report row", textNow(`#evpage #ev-5`))
	if norm(reportRow) != strings.TrimSuffix(norm(row), " state at this seq") {
		t.Fatalf("report row %q, console row %q", reportRow, row)
	}
	screenshot(t, ctx, "report.png")

	// 100,000 events.
	mix, err := eventgen.Mix(100000, 4000)
	if err != nil {
		t.Fatal(err)
	}
	big := events.NewMemLog()
	if _, err := big.Append(context.Background(), 0, mix.Events...); err != nil {
		t.Fatal(err)
	}
	bigPath := filepath.Join(dir, "big.html")
	out, err := os.Create(bigPath)
	if err != nil {
		t.Fatal(err)
	}
	if err := console.Report(context.Background(), replay.Stream(big), console.ReportOptions{Title: "100k"}, out); err != nil {
		t.Fatal(err)
	}
	out.Close()
	fi, _ := os.Stat(bigPath)
	if fi.Size() >= 5<<20 {
		t.Errorf("report of 100,000 events is %d bytes, want < 5 MB", fi.Size())
	}
	run(t, ctx, 10*time.Second, "blank page", chromedp.Navigate("about:blank"))
	start := time.Now()
	run(t, ctx, 60*time.Second, "open the 100k report", chromedp.Navigate("file://"+bigPath), chromedp.WaitVisible(`body[data-ready="1"]`))
	ms := float64(time.Since(start).Microseconds()) / 1000
	perf := value(t, ctx, "page clock", chromedp.Evaluate[float64](`performance.now()`))
	t.Logf("report timing: %s", value(t, ctx, "timing", chromedp.Evaluate[string](`JSON.stringify(window.__timing)`)))
	t.Logf("report of 100,000 events: %.2f MB, opened in Chromium in %.0f ms (until rendered; page clock %.0f ms)", float64(fi.Size())/(1<<20), ms, perf)
}

// offline turns the tab's networking off.
func offline(t *testing.T, ctx context.Context) {
	t.Helper()
	if _, err := chromedp.Call(ctx, network.Enable, network.EnableParams{}); err != nil {
		t.Fatal(err)
	}
	_, err := chromedp.Call(ctx, network.EmulateNetworkConditionsByRule, network.EmulateNetworkConditionsByRuleParams{MatchedNetworkConditions: []*network.Conditions{{Offline: true}}})
	if err == nil {
		return
	}
	// A Chromium older than that method (Debian bookworm's 148 answers
	// "Invalid parameters"): the deprecated whole-page emulation.
	if _, old := chromedp.Call(ctx, emulateNetworkConditions, emulateNetworkParams{Offline: true, Latency: 0, DownloadThroughput: -1, UploadThroughput: -1}); old != nil {
		t.Fatalf("networking off: %v; with Network.emulateNetworkConditions: %v", err, old)
	}
}

// emulateNetworkConditions is Network.emulateNetworkConditions, deprecated
// since Network.emulateNetworkConditionsByRule and not in cdproto any more.
var emulateNetworkConditions = cdp.Command[emulateNetworkParams, cdp.Empty]{Method: "Network.emulateNetworkConditions"}

type emulateNetworkParams struct {
	Offline            bool    `json:"offline"`
	Latency            float64 `json:"latency"`
	DownloadThroughput float64 `json:"downloadThroughput"`
	UploadThroughput   float64 `json:"uploadThroughput"`
}

func norm(s string) string { return strings.Join(strings.Fields(s), " ") }

func writeReport(t *testing.T, path, jsonl string, hist []replay.Subject) {
	t.Helper()
	in, err := os.Open(jsonl)
	if err != nil {
		t.Fatal(err)
	}
	defer in.Close()
	out, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	if err := console.Report(context.Background(), replay.JSONL(in), console.ReportOptions{Title: filepath.Base(jsonl), History: hist}, out); err != nil {
		t.Fatal(err)
	}
}
