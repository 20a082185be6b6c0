package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// recLog records the size of every append. If fail is set, the append
// with fail.at events is cut: its first fail.stored events are stored, then
// fail.foreign is appended by "another writer" and the rest is fenced.
type recLog struct {
	*events.MemLog
	mu    sync.Mutex
	sizes []int
	fail  *midFence
}

type midFence struct {
	at      int // group size that triggers it
	stored  int
	foreign events.Event
}

func (r *recLog) Append(ctx context.Context, expected uint64, evs ...events.Event) (uint64, error) {
	return r.AppendAsync(ctx, expected, "", evs...).Wait(ctx)
}

func (r *recLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	r.mu.Lock()
	r.sizes = append(r.sizes, len(evs))
	f := r.fail
	if f != nil && len(evs) == f.at {
		r.fail = nil
	} else {
		f = nil
	}
	r.mu.Unlock()
	if f == nil {
		return r.MemLog.AppendAsync(ctx, expected, prevID, evs...)
	}
	last, err := r.MemLog.AppendAsync(ctx, expected, prevID, evs[:f.stored]...).Wait(ctx)
	if err != nil {
		return events.Done{Last: last, Err: err}
	}
	if _, err := r.MemLog.Append(ctx, last, f.foreign); err != nil {
		return events.Done{Last: last, Err: err}
	}
	_, err = r.MemLog.Append(ctx, last, evs[f.stored:]...)
	return events.Done{Last: last, Err: err}
}

func (r *recLog) appendSizes() []int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]int(nil), r.sizes...)
}

// queued polls until n mutations wait in l's queue.
func queued(t *testing.T, l *leaderSession, n int) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		l.qmu.Lock()
		got := len(l.queue)
		l.qmu.Unlock()
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d mutations queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond) // polling the condition, not waiting it out
	}
}

// group runs reqs concurrently while a group is "in flight" (sem held), so
// that they all queue; then lets them go: they are decided and appended as
// one group. It returns the replies in reqs order.
func group(t *testing.T, tl *testLeader, reqs []client.RegisterRequest) []client.Reply {
	t.Helper()
	tl.sem <- struct{}{}
	replies := make([]client.Reply, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() { replies[i] = tl.register(ctxT(t), req) })
		queued(t, tl.leaderSession, i+1) // submission order = reqs order
	}
	<-tl.sem
	wg.Wait()
	return replies
}

func TestGroupedRegistrationsSeeEachOther(t *testing.T) {
	log := &recLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	reps := group(t, tl, []client.RegisterRequest{
		{Incarnation: "a", Endpoint: "10.0.0.1:1", Kind: "compute"},
		{Incarnation: "b", Endpoint: "10.0.0.2:1", Kind: "compute"},
		{Incarnation: "a", Endpoint: "10.0.0.1:1", Kind: "compute"}, // a's retry: same id, no event
		{Incarnation: "c", Endpoint: "10.0.0.2:1", Kind: "compute"}, // replaces b at its endpoint
		{Incarnation: "d", Endpoint: "10.0.0.4:1", Kind: "compute"},
	})
	// term.started, then one group of four events.
	if got := fmt.Sprint(log.appendSizes()); got != "[1 4]" {
		t.Fatalf("append sizes %s, want [1 4]", got)
	}
	want := []struct{ id, epoch uint64 }{{1, 2}, {2, 3}, {1, 2}, {3, 4}, {4, 5}}
	for i, rep := range reps {
		if rep.Error != nil || rep.ID != want[i].id || rep.Epoch != want[i].epoch {
			t.Errorf("reply %d = %+v, want id %d epoch %d", i, rep, want[i].id, want[i].epoch)
		}
	}
	v := tl.r.proj.View()
	if got := workerList(v); got != "[1,3,4]" || v.NextWorkerID != 5 {
		t.Fatalf("workers %s next id %d, want [1,3,4] and 5", got, v.NextWorkerID)
	}
	// The scratch state the group was decided on is the projection.
	if tl.scratch.Seq != v.Seq || tl.scratch.Hash() != v.Hash() {
		t.Fatalf("scratch at seq %d differs from the projection at seq %d", tl.scratch.Seq, v.Seq)
	}
	// The next group is decided on the kept scratch state and sees the first.
	reps = group(t, tl, []client.RegisterRequest{
		{Incarnation: "c", Endpoint: "10.0.0.2:1"},
		{Incarnation: "e", Endpoint: "10.0.0.5:1"},
	})
	if reps[0].ID != 3 || reps[0].Epoch != 4 || reps[1].ID != 5 || reps[1].Epoch != 6 {
		t.Fatalf("second group: %+v", reps)
	}
}

// A fence in the middle of a group: the events before it are stored and
// their callers answered; every later caller, including one whose no-op
// decision saw a later event of the group, gets a not-leader error; the
// leader steps down because the projection shows a higher term.
func TestGroupFencedMidwayFailsTheRest(t *testing.T) {
	log := &recLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	ctx := ctxT(t)
	if err := tl.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	log.mu.Lock()
	log.fail = &midFence{at: 4, stored: 2, foreign: events.Event{Term: 2, Writer: "meta-2", At: t0, Data: events.TermStarted{Term: 2, Leader: "meta-2"}}}
	log.mu.Unlock()
	reps := group(t, tl, []client.RegisterRequest{
		{Incarnation: "a", Endpoint: "10.0.0.1:1"},
		{Incarnation: "b", Endpoint: "10.0.0.2:1"},
		{Incarnation: "c", Endpoint: "10.0.0.3:1"},
		{Incarnation: "c", Endpoint: "10.0.0.3:1"}, // saw c's unstored event
		{Incarnation: "d", Endpoint: "10.0.0.4:1"},
	})
	for i, rep := range reps[:2] {
		if rep.Error != nil || rep.ID != uint64(i+1) {
			t.Errorf("stored caller %d: %+v", i, rep)
		}
	}
	for i, rep := range reps[2:] {
		if rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
			t.Errorf("caller %d after the fence: %+v, want a not_leader error", i+2, rep)
		}
	}
	select {
	case why := <-tl.lost:
		t.Logf("stepped down: %s", why)
	case <-ctx.Done():
		t.Fatal("the fenced leader did not step down")
	}
	v, err := tl.r.proj.CatchUp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if got := workerList(v); got != "[1,2]" || v.Term != 2 || v.Seq != 4 {
		t.Fatalf("after the fence: workers %s term %d seq %d; want [1,2], term 2, seq 4", got, v.Term, v.Seq)
	}
	// A later mutation of the deposed term is refused without an append.
	n := len(log.appendSizes())
	if rep := tl.register(ctx, client.RegisterRequest{Incarnation: "e", Endpoint: "10.0.0.5:1"}); rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
		t.Fatalf("register after the fence: %+v", rep)
	}
	if got := len(log.appendSizes()); got != n {
		t.Fatalf("the deposed leader appended again (%d appends, was %d)", got, n)
	}
}

// A group whose whole append is fenced by a new leader's term.started
// (decided before it, appended after it) stores nothing and answers every
// caller with an error.
func TestGroupFencedByNewTermStoresNothing(t *testing.T) {
	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	ctx := ctxT(t)
	old := newTestLeader(t, "meta-1", log, clk, 1)
	if err := old.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	old.sem <- struct{}{}
	reps := make([]client.Reply, 3)
	var wg sync.WaitGroup
	for i := range reps {
		wg.Go(func() {
			reps[i] = old.register(ctx, client.RegisterRequest{Incarnation: fmt.Sprint(i), Endpoint: fmt.Sprintf("10.0.0.%d:1", i+1)})
		})
	}
	queued(t, old.leaderSession, 3)
	// The old leader's scratch state is at seq 1; a new term starts at 2.
	nl := newTestLeader(t, "meta-2", log, clk, 2)
	if err := nl.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	<-old.sem
	wg.Wait()
	for i, rep := range reps {
		if rep.Error == nil {
			t.Errorf("caller %d answered %+v after its append was fenced", i, rep)
		}
	}
	v, err := nl.r.proj.CatchUp(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if v.Seq != 2 || len(v.Workers) != 0 || v.Counters.StaleTerm != 0 {
		t.Fatalf("seq %d workers %d stale %d: something of the deposed term landed", v.Seq, len(v.Workers), v.Counters.StaleTerm)
	}
}

// A caller that gives up while queued is withdrawn: nothing is decided for it.
func TestQueuedMutationWithdrawnOnCancel(t *testing.T) {
	log := &recLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	tl.sem <- struct{}{}
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	decided := false
	go func() {
		done <- tl.mutate(ctx, "", func(*projections.State) ([]events.Payload, error) {
			decided = true
			return []events.Payload{events.WorkerRegistered{ID: 1, Incarnation: "x", Endpoint: "10.0.0.1:1"}}, nil
		})
	}()
	queued(t, tl.leaderSession, 1)
	cancel()
	if err := <-done; !errors.Is(err, context.Canceled) {
		t.Fatalf("mutate = %v, want context.Canceled", err)
	}
	<-tl.sem
	queued(t, tl.leaderSession, 0)
	if decided || len(log.appendSizes()) != 1 {
		t.Fatalf("withdrawn mutation: decided %v, appends %v", decided, log.appendSizes())
	}
}
