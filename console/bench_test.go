package console

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
)

// benchConsole is a console over a log of 10,000 registered, running
// workers, folded.
func benchConsole(b *testing.B) http.Handler {
	l := events.NewMemLog()
	evs := []events.Event{{Term: 1, Writer: "meta-1", Data: events.TermStarted{Term: 1, Leader: "meta-1"}}}
	for i := 1; i <= 10000; i++ {
		evs = append(evs, events.Event{Term: 1, Writer: "meta-1", Data: events.WorkerRegistered{ID: uint64(i), Incarnation: fmt.Sprint("inc-", i), Endpoint: fmt.Sprintf("10.0.%d.%d:5688", i/250, i%250), Kind: "compute", Parallelism: 4}})
	}
	for i := 1; i <= 10000; i++ {
		// epoch = the registration's seq (i+1)
		evs = append(evs, events.Event{Term: 1, Writer: "meta-1", Data: events.WorkerActivated{ID: uint64(i), Epoch: uint64(i + 1)}})
	}
	if _, err := l.Append(context.Background(), 0, evs...); err != nil {
		b.Fatal(err)
	}
	c := New(Config{Cluster: "termlog", Log: l, Logger: testkit.Logger(b)})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = c.Run(ctx) }()
	b.Cleanup(func() { cancel(); <-done })
	testkit.Eventually(b, time.Minute, "folded", func() bool { return c.x.seq() == uint64(len(evs)) })
	if n := c.status().WorkerStates["running"]; n != 10000 {
		b.Fatalf("%d running", n)
	}
	return c.Handler()
}

// BenchmarkConsole10kWorkers: what the overview costs with 10,000 workers
// registered: the page itself (/), the status it polls (brief), the whole
// status (as status -o json), and one page of workers.
func BenchmarkConsole10kWorkers(b *testing.B) {
	h := benchConsole(b)
	for _, path := range []string{"/", "/api/v1/status?brief=1", "/api/v1/status", "/api/v1/workers?offset=5000&limit=100", "/api/v1/events?order=desc&limit=100"} {
		b.Run(path, func(b *testing.B) {
			for b.Loop() {
				rec := httptest.NewRecorder()
				h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
				if rec.Code != 200 {
					b.Fatalf("%s: %d", path, rec.Code)
				}
				_, _ = io.Copy(io.Discard, rec.Body)
			}
		})
	}
}
