package meta

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// termLog records the OnTerm events of every replica.
type termLog struct {
	mu  sync.Mutex
	evs []TermEvent
}

func (l *termLog) add(e TermEvent) { l.mu.Lock(); l.evs = append(l.evs, e); l.mu.Unlock() }

// of returns the phases replica saw in term, in order.
func (l *termLog) of(replica string, term uint64) []TermPhase {
	l.mu.Lock()
	defer l.mu.Unlock()
	// A session is known by its lease: TermAcquired comes before the term
	// is chosen (Term 0).
	var lease uint64
	for _, e := range l.evs {
		if e.Replica == replica && e.Term == term && term != 0 {
			lease = e.Lease
		}
	}
	var out []TermPhase
	for _, e := range l.evs {
		if e.Replica == replica && lease != 0 && e.Lease == lease {
			out = append(out, e.Phase)
		}
	}
	return out
}

// TestOpenAndOnTerm: Open makes the stream and the buckets on a bare server
// and returns a replica that leads; OnTerm sees its term acquired, started
// and recovered, in that order, and ended, with the reason, when the
// replica steps down; a second replica opened on the same buckets takes
// the next term and reports the same phases.
func TestOpenAndOnTerm(t *testing.T) {
	srv, _ := testkit.NATS(t)
	var seen termLog
	open := func(id string) (*Replica, func()) { return openRunning(t, srv, id, &seen) }
	a, stopA := open("meta-1")
	defer stopA()
	testkit.Eventually(t, 10*time.Second, "meta-1 to lead and recover", func() bool {
		r, term := LeaderOf(a)
		return r == a && slices.Contains(seen.of("meta-1", term), TermRecovered)
	})
	_, t1 := LeaderOf(a)
	if got := seen.of("meta-1", t1); !slices.Equal(got, []TermPhase{TermAcquired, TermStarted, TermRecovered}) {
		t.Fatalf("meta-1 term %d phases %v, want acquired, started, recovered", t1, got)
	}
	b, stopB := open("meta-2")
	defer stopB()
	a.StepDown()
	testkit.Eventually(t, 10*time.Second, "meta-2 to lead and recover", func() bool {
		r, term := LeaderOf(a, b)
		return r == b && slices.Contains(seen.of("meta-2", term), TermRecovered)
	})
	_, t2 := LeaderOf(a, b)
	if t2 <= t1 {
		t.Fatalf("meta-2 leads term %d, not above %d", t2, t1)
	}
	if got := seen.of("meta-1", t1); !slices.Equal(got, []TermPhase{TermAcquired, TermStarted, TermRecovered, TermEnded}) {
		t.Errorf("meta-1 term %d phases %v, want acquired, started, recovered, ended", t1, got)
	}
	seen.mu.Lock()
	for _, e := range seen.evs {
		if e.Replica == "meta-1" && e.Term == t1 && e.Phase == TermEnded && e.Reason != reasonStepDown {
			t.Errorf("meta-1's term ended for %q, want %q", e.Reason, reasonStepDown)
		}
	}
	seen.mu.Unlock()
	if got := seen.of("meta-2", t2); !slices.Equal(got, []TermPhase{TermAcquired, TermStarted, TermRecovered}) {
		t.Errorf("meta-2 term %d phases %v, want acquired, started, recovered", t2, got)
	}
}

// openRunning opens replica id of cluster "open" on srv (a lease of 1 s,
// a snapshot every 5 events, its terms seen by seen), checks what Open
// waited for and made, and runs it until stop.
func openRunning(t *testing.T, srv *natsserver.Server, id string, seen *termLog) (r *Replica, stop func()) {
	t.Helper()
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	var waited []string
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r, err = Open(ctx, nc, Config{
		ID: id, Cluster: "open", LeaseTTL: time.Second, SnapshotEvery: 5, OnTerm: seen.add,
		Logger: testkit.Logger(t),
		Wait: func(ctx context.Context, what string, f func(context.Context) error) error {
			waited = append(waited, what)
			return f(ctx)
		},
	})
	if err != nil {
		t.Fatalf("Open %s: %v", id, err)
	}
	want := []string{"the event stream TERMLOG_OPEN", "the lease bucket open_leader", "the snapshot bucket open_snapshots", "the health bucket open_health"}
	if !slices.Equal(waited, want) {
		t.Errorf("Open %s waited for %q, want %q", id, waited, want)
	}
	if _, ok := r.Log().(*natslog.Log); !ok || r.cfg.Snapshots == nil || r.cfg.Health == nil || r.cfg.NC != nc {
		t.Errorf("Open %s: log %T, snapshots %v, health %v, nc set %v", id, r.Log(), r.cfg.Snapshots, r.cfg.Health, r.cfg.NC == nc)
	}
	rctx, rcancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(rctx) }()
	return r, func() { rcancel(); <-done; nc.Close() }
}

// Open refuses a lease bucket of another TTL with a *LeaseTTLError, so that
// the caller can say how to fix it, and a replica without an ID at once.
func TestOpenRefuses(t *testing.T) {
	_, nc := testkit.NATS(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := Open(ctx, nc, Config{Cluster: "refuse"}); err == nil {
		t.Error("Open without an ID: no error")
	}
	if _, err := Open(ctx, nc, Config{ID: "meta-1", Cluster: "refuse", LeaseTTL: 2 * time.Second}); err != nil {
		t.Fatal(err)
	}
	_, err := Open(ctx, nc, Config{ID: "meta-2", Cluster: "refuse", LeaseTTL: 5 * time.Second})
	var te *LeaseTTLError
	if !errors.As(err, &te) || te.Have != 2*time.Second || te.Want != 5*time.Second {
		t.Errorf("Open with another lease TTL: %v, want a *LeaseTTLError 2s, 5s asked", err)
	}
}

// A term stops leading when something ends it, not when its last task is
// joined. Found by the chaos suite: a meta leader cut from NATS lost its
// term to a failed renewal 1.3 s after the cut (lease 2 s), but said it led
// (Leading, termlog_meta_is_leader) for 1.5 s more, until an append whose
// outcome was unknown timed out. Here the renewal task is frozen (it
// ignores cancellation, as that append did): the watchdog ends the term,
// and Leading must say so while the frozen task still holds the teardown.
func TestLeadingEndsWithTheTerm(t *testing.T) {
	const lease = 900 * time.Millisecond
	fp := failpoint.New()
	seen := &termLog{}
	r, err := New(Config{
		ID: "meta-1", Cluster: "lead", Log: events.NewMemLog(), Lease: NewMemLeaseStore(clock.Real{}, lease).Handle(), LeaseTTL: lease,
		WorkerTimeout: time.Hour, Scheduler: SchedulerConfig{StoreTimeout: time.Hour},
		ControlDialer: func(context.Context, string) (ControlConn, error) { return nil, errors.New("no workers here") },
		Failpoints:    fp, OnTerm: seen.add, Logger: testkit.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { fp.Resume(FPBeforeRenewal); cancel(); <-done }()

	var term uint64
	testkit.Eventually(t, 10*time.Second, "meta-1 to lead", func() bool {
		ok, tm := r.Leading()
		term = tm
		return ok
	})
	fp.Freeze(FPBeforeRenewal)
	wctx, wcancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer wcancel()
	if err := fp.WaitPaused(wctx, FPBeforeRenewal); err != nil {
		t.Fatalf("the renewal never reached its failpoint: %v", err)
	}
	testkit.Eventually(t, 10*time.Second, "Leading to turn false once the watchdog ends the term", func() bool {
		ok, _ := r.Leading()
		return !ok
	})
	if got := seen.of("meta-1", term); slices.Contains(got, TermEnded) {
		t.Fatalf("term %d already ended (%v): the frozen renewal should still hold the teardown, so this proves nothing", term, got)
	}
	fp.Resume(FPBeforeRenewal)
	testkit.Eventually(t, 10*time.Second, "the term's teardown once the renewal is released", func() bool {
		return slices.Contains(seen.of("meta-1", term), TermEnded)
	})
}

// Run reads the stream's tail for StreamTail, so that metrics never ask
// NATS themselves.
func TestStreamTailSampled(t *testing.T) {
	log := events.NewMemLog()
	last, err := log.Append(t.Context(), 0, events.Event{Term: 0, Writer: "test", At: time.Now().UTC(), Data: events.WorkerDeregistered{ID: 1, Epoch: 1}})
	if err != nil {
		t.Fatal(err)
	}
	r, err := New(Config{
		ID: "meta-1", Cluster: "tail", Log: log, Lease: NewMemLeaseStore(clock.Real{}, time.Hour).Handle(), LeaseTTL: time.Hour,
		WorkerTimeout: time.Hour, Scheduler: SchedulerConfig{StoreTimeout: time.Hour},
		ControlDialer: func(context.Context, string) (ControlConn, error) { return nil, errors.New("no workers here") },
		Logger:        testkit.Logger(t),
	})
	if err != nil {
		t.Fatal(err)
	}
	if _, _, ok := r.StreamTail(); ok {
		t.Fatal("a tail before Run read one")
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { defer close(done); _ = r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	// The replica leads (term.started lands after seq 1): the tail grows.
	testkit.Eventually(t, 10*time.Second, "StreamTail to reach the stream's tail", func() bool {
		seq, age, ok := r.StreamTail()
		tail, _ := log.Tail(t.Context())
		return ok && seq > last && seq == tail && age < 5*time.Second
	})
}
