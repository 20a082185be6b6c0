package console

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/replay"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// handoffPath is the first report (000_152df8e950350615) as a log, the one
// replay's own tests use: seq 5 is meta-1's expiry under term 1, rejected
// after meta-2 started term 7.
const handoffPath = "../replay/testdata/logs/handoff.jsonl"

// LoadJSONL appends the events of a JSONL export to a MemLog as they are
// (stale terms included: the log does not judge them, the fold does).
func loadJSONL(t testing.TB, path string) *events.MemLog {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	l := events.NewMemLog()
	err = replay.JSONL(f).Read(context.Background(), func(it replay.Item) error {
		if it.Err != nil {
			return it.Err
		}
		b, err := events.Encode(it.Event)
		if err != nil {
			return err
		}
		l.AppendRaw(b)
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return l
}

// startConsole runs a console over l until the test ends.
func startConsole(t testing.TB, l events.Log, probe Probe) (*Server, *httptest.Server) {
	t.Helper()
	c := New(Config{Cluster: "termlog", Log: l, Probe: probe, ProbeEvery: 20 * time.Millisecond, Logger: testkit.Logger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	srv := httptest.NewServer(c.Handler())
	t.Cleanup(func() {
		srv.Close()
		cancel()
		wg.Wait()
	})
	return c, srv
}

func getJSON(t testing.TB, url string, v any) int {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	if v != nil {
		if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
			t.Fatalf("%s: %v", url, err)
		}
	}
	return resp.StatusCode
}

// TestEventsRejectedInReplaysWords: the events API filtered to rejected
// gives the stale-term event of the handoff with the outcome and reason
// replay prints for it, in replay's words.
func TestEventsRejectedInReplaysWords(t *testing.T) {
	l := loadJSONL(t, handoffPath)
	c, srv := startConsole(t, l, nil)
	testkit.Eventually(t, 5*time.Second, "the console folded the log", func() bool { return c.x.seq() == 8 })

	var ev struct {
		Events []testRow `json:"events"`
		Next   uint64    `json:"next"`
	}
	if code := getJSON(t, srv.URL+"/api/v1/events?outcome=rejected", &ev); code != 200 {
		t.Fatalf("status %d", code)
	}
	if len(ev.Events) != 1 {
		t.Fatalf("rejected events %+v, want seq 5 only", ev.Events)
	}
	r := ev.Events[0]
	// replay's own timeline line for the same log, from replay's renderer.
	var out bytes.Buffer
	f, _ := os.Open(handoffPath)
	defer f.Close()
	if err := replay.Run(context.Background(), replay.JSONL(f), replay.Options{Filter: replay.Filter{FromSeq: 5, ToSeq: 5}}, &out); err != nil {
		t.Fatal(err)
	}
	line := strings.Split(out.String(), "\n")[1]
	if r.Seq != 5 || r.Writer != "meta-1" || r.OutcomeText != "rejected stale-term" || r.Reason != "term 1 < current term 7" {
		t.Fatalf("row %+v", r)
	}
	for _, part := range []string{r.OutcomeText, r.Summary, "# " + r.Reason} {
		if !strings.Contains(line, part) {
			t.Errorf("replay prints %q; the console's %q is not in it", line, part)
		}
	}
	// Filters combine; a bad one is a 400 naming it.
	getJSON(t, srv.URL+"/api/v1/events?worker=1&type=worker.expired", &ev)
	if len(ev.Events) != 2 || ev.Events[0].Seq != 5 || ev.Events[1].Seq != 7 {
		t.Errorf("worker 1 expiries: %+v", ev.Events)
	}
	getJSON(t, srv.URL+"/api/v1/events?term=7&writer=meta-2&limit=2", &ev)
	if len(ev.Events) != 2 || ev.Events[0].Seq != 4 || ev.Events[1].Seq != 6 || ev.Next != 7 {
		t.Errorf("term 7 page: %+v next %d", ev.Events, ev.Next)
	}
	getJSON(t, srv.URL+"/api/v1/events?order=desc&limit=3", &ev)
	if len(ev.Events) != 3 || ev.Events[0].Seq != 8 || ev.Next != 6 {
		t.Errorf("newest first: %+v next %d", ev.Events, ev.Next)
	}
	var e map[string]string
	if code := getJSON(t, srv.URL+"/api/v1/events?outcome=maybe", &e); code != 400 || !strings.Contains(e["error"], "outcome") {
		t.Errorf("bad outcome: %d %v", code, e)
	}
	if code := getJSON(t, srv.URL+"/api/v1/events/99", &e); code != 404 {
		t.Errorf("no event 99: %d", code)
	}
	// Time travel: the state at seq 3 has worker 1 running; at the end it
	// is gone (superseded by worker 2).
	var doc struct {
		State struct {
			Seq     uint64                     `json:"seq"`
			Workers map[string]json.RawMessage `json:"workers"`
		} `json:"state"`
	}
	getJSON(t, srv.URL+"/api/v1/state?seq=3", &doc)
	if doc.State.Seq != 3 || doc.State.Workers["1"] == nil {
		t.Errorf("state at 3: %+v", doc.State)
	}
	var tl Timeline
	getJSON(t, srv.URL+"/api/v1/timeline", &tl)
	if len(tl.Terms) != 2 || tl.Terms[0].Term != 1 || tl.Terms[1].Term != 7 || !tl.Terms[1].Current || len(tl.Marks) != 1 || tl.Marks[0].Seq != 5 || tl.Marks[0].Lane != 7 || tl.Terms[0].Fenced != 1 {
		t.Errorf("timeline %+v", tl)
	}
}

// testRow is a Row as a client decodes it (the data left as JSON).
type testRow struct {
	Seq         uint64          `json:"seq"`
	Term        uint64          `json:"term"`
	Writer      string          `json:"writer"`
	Type        string          `json:"type"`
	Outcome     string          `json:"outcome"`
	OutcomeText string          `json:"outcome_text"`
	Reason      string          `json:"reason"`
	Summary     string          `json:"summary"`
	Data        json.RawMessage `json:"data"`
}

// TestReadOnly: nothing on the console writes; every other method is
// refused.
func TestReadOnly(t *testing.T) {
	_, srv := startConsole(t, events.NewMemLog(), nil)
	for _, m := range []string{http.MethodPost, http.MethodPut, http.MethodDelete, http.MethodPatch} {
		for _, p := range []string{"/", "/api/v1/status", "/api/v1/events"} {
			req, _ := http.NewRequest(m, srv.URL+p, strings.NewReader("{}"))
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Fatal(err)
			}
			resp.Body.Close()
			if resp.StatusCode != http.StatusMethodNotAllowed {
				t.Errorf("%s %s: %d, want 405", m, p, resp.StatusCode)
			}
		}
	}
	resp, err := http.Get(srv.URL + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Errorf("/: %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
}

// TestCheckAddr: loopback serves plain HTTP; anything else needs a
// certificate and a key, both.
func TestCheckAddr(t *testing.T) {
	for _, ok := range []string{"127.0.0.1:8080", "[::1]:8080", "localhost:0", "127.0.0.2:1"} {
		if err := CheckAddr(ok, "", ""); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{":8080", "0.0.0.0:8080", "10.0.0.5:8080", "[::]:80"} {
		if err := CheckAddr(bad, "", ""); !errors.Is(err, ErrNeedTLS) {
			t.Errorf("%s without TLS: %v, want ErrNeedTLS", bad, err)
		}
		if err := CheckAddr(bad, "c.pem", "k.pem"); err != nil {
			t.Errorf("%s with TLS: %v", bad, err)
		}
	}
	if err := CheckAddr("0.0.0.0:1", "c.pem", ""); err == nil {
		t.Error("a cert without a key passed")
	}
	if _, err := Listen("0.0.0.0:0", "", ""); !errors.Is(err, ErrNeedTLS) {
		t.Errorf("Listen on every interface without TLS: %v", err)
	}
}

// TestWatchFollowsTheStream: an open watch gets a change event with the
// new term once a term.started is appended, without asking again.
func TestWatchFollowsTheStream(t *testing.T) {
	l := events.NewMemLog()
	if _, err := l.Append(context.Background(), 0, events.Event{Term: 1, Writer: "meta-1", At: time.Now(), Data: events.TermStarted{Term: 1, Leader: "meta-1"}}); err != nil {
		t.Fatal(err)
	}
	var mu sync.Mutex
	holder := "meta-1"
	probe := func(context.Context) health.Read {
		mu.Lock()
		defer mu.Unlock()
		return health.Read{Holder: holder}
	}
	_, srv := startConsole(t, l, probe)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, srv.URL+"/api/v1/watch", nil)
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	terms := make(chan uint64, 100)
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Go(func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if d, ok := strings.CutPrefix(sc.Text(), "data: "); ok {
				var v struct{ Term uint64 }
				_ = json.Unmarshal([]byte(d), &v)
				terms <- v.Term
			}
		}
	})
	waitTerm := func(want uint64) {
		t.Helper()
		for {
			select {
			case got := <-terms:
				if got == want {
					return
				}
			case <-ctx.Done():
				t.Fatalf("no change event with term %d", want)
			}
		}
	}
	waitTerm(1)
	mu.Lock()
	holder = "meta-2"
	mu.Unlock()
	if _, err := l.Append(context.Background(), 1, events.Event{Term: 2, Writer: "meta-2", At: time.Now(), Data: events.TermStarted{Term: 2, Leader: "meta-2"}}); err != nil {
		t.Fatal(err)
	}
	waitTerm(2)
	var st Status
	getJSON(t, srv.URL+"/api/v1/status?brief=1", &st)
	if st.Term != 2 || st.Leader != "meta-2" || st.LeaseHolder != "meta-2" || st.Workers != nil {
		t.Errorf("status after the new term: term %d leader %s holder %s", st.Term, st.Leader, st.LeaseHolder)
	}
	if st.Exit != 1 || !strings.Contains(strings.Join(st.Health.Problems, ";"), "no health record") {
		t.Errorf("no record published: exit %d problems %q", st.Exit, st.Health.Problems)
	}
}

// TestWorkersPaged: 10,000 workers come one page at a time, filtered on
// the server.
func TestWorkersPaged(t *testing.T) {
	l := events.NewMemLog()
	evs := []events.Event{{Term: 1, Writer: "meta-1", Data: events.TermStarted{Term: 1, Leader: "meta-1"}}}
	for i := 1; i <= 10000; i++ {
		evs = append(evs, events.Event{Term: 1, Writer: "meta-1", Data: events.WorkerRegistered{ID: uint64(i), Incarnation: fmt.Sprint("inc-", i), Endpoint: fmt.Sprintf("10.0.%d.%d:5688", i/250, i%250), Kind: "compute", Parallelism: 4}})
	}
	if _, err := l.Append(context.Background(), 0, evs...); err != nil {
		t.Fatal(err)
	}
	c, srv := startConsole(t, l, nil)
	testkit.Eventually(t, 20*time.Second, "folded", func() bool { return c.x.seq() == 10001 })
	var w Workers
	getJSON(t, srv.URL+"/api/v1/workers?offset=9990&limit=50", &w)
	if w.Total != 10000 || w.Matched != 10000 || len(w.Workers) != 10 || w.Workers[0].ID != 9991 {
		t.Errorf("last page: total %d matched %d, %d workers", w.Total, w.Matched, len(w.Workers))
	}
	getJSON(t, srv.URL+"/api/v1/workers?q=10.0.39.", &w)
	if w.Matched != 250 || len(w.Workers) != 100 {
		t.Errorf("endpoint filter: matched %d page %d", w.Matched, len(w.Workers))
	}
	getJSON(t, srv.URL+"/api/v1/workers?state=running", &w)
	if w.Matched != 0 {
		t.Errorf("none activated, %d running", w.Matched)
	}
	var e map[string]string
	if code := getJSON(t, srv.URL+"/api/v1/workers?limit=100000", &e); code != 400 {
		t.Errorf("limit too high: %d", code)
	}
}
