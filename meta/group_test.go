package meta

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/internal/failpoint"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/group"
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
		var got int
		l.loop.read(func() { got = len(l.commit.queue) })
		if got == n {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d mutations queued, want %d", got, n)
		}
		time.Sleep(time.Millisecond) // polling the condition, not waiting it out
	}
}

// hold stops the committer from planning: what is submitted queues.
func (c *committer) hold() { c.loop.do(context.Background(), func() { c.held = true }) }

// release lets the committer plan again.
func (c *committer) release() {
	c.loop.do(context.Background(), func() { c.held = false; c.pump() })
}

// scratch is the seq and hash of the committer's scratch state (0, 0: none).
func (l *leaderSession) scratch() (seq uint64, hash string) {
	l.loop.read(func() {
		if sc := l.commit.scratch; sc != nil {
			seq, hash = sc.Seq, sc.Hash()
		}
	})
	return seq, hash
}

// registerGroup runs reqs concurrently while the committer is held, so
// that they all queue; then lets them go: they are decided and appended as
// one group. It returns the replies in reqs order.
func registerGroup(t *testing.T, tl *testLeader, reqs []client.RegisterRequest) []client.Reply {
	t.Helper()
	tl.commit.hold()
	replies := make([]client.Reply, len(reqs))
	var wg sync.WaitGroup
	for i, req := range reqs {
		wg.Go(func() { replies[i] = tl.duties.workers.register(ctxT(t), req) })
		queued(t, tl.leaderSession, i+1) // submission order = reqs order
	}
	tl.commit.release()
	wg.Wait()
	return replies
}

func TestGroupedRegistrationsSeeEachOther(t *testing.T) {
	log := &recLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	reps := registerGroup(t, tl, []client.RegisterRequest{
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
	if seq, hash := tl.scratch(); seq != v.Seq || hash != v.Hash() {
		t.Fatalf("scratch at seq %d differs from the projection at seq %d", seq, v.Seq)
	}
	// The next group is decided on the kept scratch state and sees the first.
	reps = registerGroup(t, tl, []client.RegisterRequest{
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
	log.fail = &midFence{at: 4, stored: 2, foreign: events.Event{Term: 2, Writer: "meta-2", At: t0, Data: events.TermStarted{Term: 2, Leader: "meta-2", Lease: 2}}}
	log.mu.Unlock()
	reps := registerGroup(t, tl, []client.RegisterRequest{
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
	if rep := tl.duties.workers.register(ctx, client.RegisterRequest{Incarnation: "e", Endpoint: "10.0.0.5:1"}); rep.Error == nil || rep.Error.Code != client.CodeNotLeader {
		t.Fatalf("register after the fence: %+v", rep)
	}
	if got := len(log.appendSizes()); got != n {
		t.Fatalf("the deposed leader appended again (%d appends, was %d)", got, n)
	}
}

// A group whose whole append is fenced by a new leader's term.started
// (decided before it, appended after it) stores nothing and answers every
// caller with an error. The old leader is frozen between the group's
// decisions and its append, so the write-side CAS is what refuses it (its
// projection still shows term 1 when it decides).
func TestGroupFencedByNewTermStoresNothing(t *testing.T) {
	log := events.NewMemLog()
	clk := clock.NewManual(t0)
	ctx := ctxT(t)
	fp := failpoint.New()
	old := newTestLeader(t, "meta-1", log, clk, 1, func(c *Config) { c.Failpoints = fp })
	if err := old.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	const decided = "test-group-decided" // hit after the group's last decision
	fp.Freeze(decided)
	old.commit.hold()
	errs := make([]error, 3)
	var wg sync.WaitGroup
	for i := range 2 {
		wg.Go(func() {
			if rep := old.duties.workers.register(ctx, client.RegisterRequest{Incarnation: fmt.Sprint(i), Endpoint: fmt.Sprintf("10.0.0.%d:1", i+1)}); rep.Error != nil {
				errs[i] = errors.New(rep.Error.Message)
			}
		})
		queued(t, old.leaderSession, i+1)
	}
	wg.Go(func() {
		errs[2] = old.mutate(ctx, decided, func(v *projections.State) ([]events.Payload, error) {
			return []events.Payload{events.WorkerRegistered{ID: v.NextWorkerID, Incarnation: "2", Endpoint: "10.0.0.3:1"}}, nil
		})
	})
	queued(t, old.leaderSession, 3)
	old.commit.release()
	if err := fp.WaitPaused(ctx, decided); err != nil {
		t.Fatal(err)
	}
	if v := old.r.proj.View(); v.Term != 1 || v.Seq != 1 {
		t.Fatalf("old leader decided on term %d seq %d, want term 1 seq 1", v.Term, v.Seq)
	}
	nl := newTestLeader(t, "meta-2", log, clk, 2)
	if err := nl.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	fp.Resume(decided)
	wg.Wait()
	for i, err := range errs {
		if err == nil {
			t.Errorf("caller %d answered success after its group's append was fenced", i)
		}
	}
	if n := old.r.Fenced(); n != 1 {
		t.Errorf("old leader's fenced appends: %d, want 1 (the group's)", n)
	}
	select {
	case why := <-old.lost:
		t.Logf("old leader stepped down: %s", why)
	case <-ctx.Done():
		t.Fatal("the fenced leader did not step down")
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
	tl.commit.hold()
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
	tl.commit.release()
	queued(t, tl.leaderSession, 0)
	if decided || len(log.appendSizes()) != 1 {
		t.Fatalf("withdrawn mutation: decided %v, appends %v", decided, log.appendSizes())
	}
}

// hookLog runs hook before every append (call counts from 1: term.started
// is call 1). An error from hook is that call's outcome-unknown failure: the
// call itself stores nothing.
type hookLog struct {
	*events.MemLog
	mu    sync.Mutex
	calls int
	hook  func(call int, expected uint64, evs []events.Event) error
}

func (h *hookLog) Append(ctx context.Context, expected uint64, evs ...events.Event) (uint64, error) {
	return h.AppendAsync(ctx, expected, "", evs...).Wait(ctx)
}

func (h *hookLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	h.mu.Lock()
	h.calls++
	n, hook := h.calls, h.hook
	h.mu.Unlock()
	if hook != nil {
		if err := hook(n, expected, evs); err != nil {
			return events.Done{Last: expected, Err: err}
		}
	}
	return h.MemLog.AppendAsync(ctx, expected, prevID, evs...)
}

var errAckTimeout = errors.New("ack timeout (outcome unknown)")

// The caller that combines a group does not decide the outcome for the
// others: its context ends during the group's first append attempt (an
// operator step's timeout, say), the attempt's outcome is unknown, and the
// group is still retried with the same ids for the caller whose context
// lives on.
func TestGroupOutcomeNotDecidedByCombinersContext(t *testing.T) {
	xctx, xcancel := context.WithCancel(ctxT(t))
	defer xcancel()
	log := &hookLog{MemLog: events.NewMemLog()}
	log.hook = func(call int, _ uint64, evs []events.Event) error {
		if call == 2 {
			xcancel() // the combiner's own context ends mid-append
			return errAckTimeout
		}
		return nil
	}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	registration := func(id uint64, inc string) func(*projections.State) ([]events.Payload, error) {
		return func(*projections.State) ([]events.Payload, error) {
			return []events.Payload{events.WorkerRegistered{ID: id, Incarnation: inc, Endpoint: "10.0.0." + inc + ":1"}}, nil
		}
	}
	// y is queued first, by hand, then x: the group is [y, x].
	y := &mutation{ctx: ctxT(t), decide: registration(1, "1"), done: make(chan mutationResult, 1)}
	tl.commit.hold()
	tl.loop.do(ctxT(t), func() { tl.commit.queue = append(tl.commit.queue, y) })
	xdone := make(chan error, 1)
	go func() { xdone <- tl.mutate(xctx, "", registration(2, "2")) }()
	queued(t, tl.leaderSession, 2)
	tl.commit.release()
	res := <-y.done
	<-xdone // x's own answer may be its context's error; its event's fate is y's
	if res.err != nil || res.seen != 2 {
		t.Fatalf("y (live context): seen %d, err %v; want stored at seq 2", res.seen, res.err)
	}
	if err := tl.r.proj.AwaitSeq(ctxT(t), 3); err != nil {
		t.Fatal(err)
	}
	v := tl.r.proj.View()
	if got := workerList(v); got != "[1,2]" || v.Seq != 3 {
		t.Fatalf("workers %s at seq %d, want [1,2] at seq 3 (the group stored once)", got, v.Seq)
	}
}

// An append whose outcome stays unknown (every attempt's ack lost, its
// first attempt still in flight) is resent, with the same ids, before
// anything new is decided: the next decision is made on the state holding
// the resent group, not on the stale projection under the ids the group may
// have been stored with. Here the in-flight attempt lands just before the
// next append: deciding again at the same seq would be fenced (another
// event under the same id) and its caller told not_leader.
func TestGroupOutcomeUnknownResentBeforeDecidingAgain(t *testing.T) {
	type held struct {
		expected uint64
		evs      []events.Event
	}
	var inFlight *held
	const attemptBound = 100 * time.Millisecond // AppendTimeout: attempts of 100 ms
	attempts := appendAttemptsFor(attemptBound)
	log := &hookLog{MemLog: events.NewMemLog()}
	log.hook = func(call int, expected uint64, evs []events.Event) error {
		switch {
		case call >= 2 && call <= 1+attempts: // every attempt of the group
			if inFlight == nil {
				inFlight = &held{expected, evs}
			}
			return errAckTimeout
		case inFlight != nil: // the first attempt lands now, before this one
			if _, err := log.MemLog.Append(context.Background(), inFlight.expected, inFlight.evs...); err != nil {
				return fmt.Errorf("in-flight append: %w", err)
			}
			inFlight = nil
		}
		return nil
	}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1, func(c *Config) { c.AppendTimeout = attemptBound })
	ctx := ctxT(t)
	if err := tl.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	a := client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"}
	if rep := tl.duties.workers.register(ctx, a); rep.Error == nil || rep.Error.Code != client.CodeUnavailable {
		t.Fatalf("register a, outcome unknown: %+v, want an unavailable error", rep)
	}
	if rep := tl.duties.workers.register(ctx, client.RegisterRequest{Incarnation: "b", Endpoint: "10.0.0.2:1"}); rep.Error != nil || rep.ID != 2 || rep.Epoch != 3 {
		t.Fatalf("register b after a's unknown outcome: %+v, want id 2 epoch 3", rep)
	}
	if n := tl.r.Fenced(); n != 0 {
		t.Fatalf("%d appends fenced, want 0", n)
	}
	// a's registration landed: its retry finds it.
	if rep := tl.duties.workers.register(ctx, a); rep.Error != nil || rep.ID != 1 || rep.Epoch != 2 {
		t.Fatalf("register a again: %+v, want id 1 epoch 2", rep)
	}
	v := tl.r.proj.View()
	if got := workerList(v); got != "[1,2]" || v.Seq != 3 || v.Counters.Rejected != 0 {
		t.Fatalf("workers %s seq %d rejected %d, want [1,2] at seq 3, none rejected", got, v.Seq, v.Counters.Rejected)
	}
	select {
	case why := <-tl.lost:
		t.Fatalf("stepped down: %s", why)
	default:
	}
}

// A decision whose event the fold refuses (the leader's own bug) is that
// caller's error and is not appended: the caller is not told success for
// an event the projection would reject. The decisions after it in the
// group are decided on a fresh state and stored.
func TestGroupOwnEventRefusedByFoldFails(t *testing.T) {
	log := &recLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	ctx := ctxT(t)
	if err := tl.startTerm(ctx); err != nil {
		t.Fatal(err)
	}
	tl.commit.hold()
	var (
		wg     sync.WaitGroup
		a, b   client.Reply
		badErr error
	)
	wg.Go(func() {
		a = tl.duties.workers.register(ctx, client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
	})
	queued(t, tl.leaderSession, 1)
	wg.Go(func() {
		badErr = tl.mutate(ctx, "", func(*projections.State) ([]events.Payload, error) {
			// Term 1 started already: the fold rejects it.
			return []events.Payload{events.TermStarted{Term: 1, Leader: "meta-1"}}, nil
		})
	})
	queued(t, tl.leaderSession, 2)
	wg.Go(func() {
		b = tl.duties.workers.register(ctx, client.RegisterRequest{Incarnation: "b", Endpoint: "10.0.0.2:1"})
	})
	queued(t, tl.leaderSession, 3)
	tl.commit.release()
	wg.Wait()
	if !errors.Is(badErr, group.ErrRefused) {
		t.Errorf("refused decision: %v, want group.ErrRefused", badErr)
	}
	if a.Error != nil || a.ID != 1 || a.Epoch != 2 || b.Error != nil || b.ID != 2 || b.Epoch != 3 {
		t.Errorf("registrations around it: %+v, %+v; want id 1 epoch 2, id 2 epoch 3", a, b)
	}
	v := tl.r.proj.View()
	if got := workerList(v); got != "[1,2]" || v.Seq != 3 || v.Counters.Rejected != 0 {
		t.Fatalf("workers %s seq %d rejected %d, want [1,2] at seq 3, nothing rejected", got, v.Seq, v.Counters.Rejected)
	}
	if got := fmt.Sprint(log.appendSizes()); got != "[1 1 1]" {
		t.Errorf("append sizes %s, want [1 1 1]: term.started, a, then b on a fresh state", got)
	}
	if seq, hash := tl.scratch(); seq != v.Seq || hash != v.Hash() {
		t.Fatalf("scratch at seq %d differs from the projection at seq %d", seq, v.Seq)
	}
}

// gatedLog holds back every record from seq from on from readers (the
// projection) until gate is closed.
type gatedLog struct {
	*hookLog
	from uint64
	gate chan struct{}
}

func (g *gatedLog) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	return g.hookLog.Watch(ctx, from, func(r events.Record) error {
		if r.Seq >= g.from {
			select {
			case <-g.gate:
			case <-ctx.Done():
				return ctx.Err()
			}
		}
		return fn(r)
	})
}

// A caller whose context ends after its mutation was taken into a group
// gets its real outcome: its event is stored, so it is answered success,
// once the projection holds it, not with its context's error. (synctest:
// Wait returns once the caller is answered or blocked, the projection
// being held back at the gate.)
func TestGroupTakenCallerGetsRealOutcome(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		xctx, xcancel := context.WithCancel(context.Background())
		defer xcancel()
		log := &gatedLog{hookLog: &hookLog{MemLog: events.NewMemLog()}, from: 2, gate: make(chan struct{})}
		log.hook = func(call int, _ uint64, _ []events.Event) error {
			if call == 2 {
				xcancel() // during its group's append
			}
			return nil
		}
		tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
		if err := tl.startTerm(ctxT(t)); err != nil {
			t.Fatal(err)
		}
		type result struct {
			seen uint64
			err  error
		}
		done := make(chan result, 1)
		go func() {
			seen, err := tl.commit.Submit(xctx, "", func(v *projections.State) ([]events.Payload, error) {
				return []events.Payload{events.WorkerRegistered{ID: v.NextWorkerID, Incarnation: "x", Endpoint: "10.0.0.1:1"}}, nil
			})
			done <- result{seen, err}
		}()
		synctest.Wait()
		select {
		case r := <-done:
			t.Fatalf("answered (seen %d, err %v) before the projection held its event", r.seen, r.err)
		default:
		}
		close(log.gate)
		if r := <-done; r.err != nil || r.seen != 2 {
			t.Fatalf("mutate whose context ended during its append: seen %d, err %v; want stored at seq 2", r.seen, r.err)
		}
		if got := tl.r.proj.Seq(); got < 2 {
			t.Fatalf("answered before the projection held its event (projected seq %d)", got)
		}
	})
}

// sealLog records, for every event appended through it, whether it came
// encoded already (events.Seal): Encode then hands back the same body
// every time instead of encoding it again.
type sealLog struct {
	*events.MemLog
	mu       sync.Mutex
	appended int
	unsealed []string
}

func (s *sealLog) check(evs []events.Event) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range evs {
		s.appended++
		a, err1 := events.Encode(ev)
		b, err2 := events.Encode(ev)
		if err1 != nil || err2 != nil || len(a) == 0 || &a[0] != &b[0] {
			s.unsealed = append(s.unsealed, ev.Type())
		}
	}
}

func (s *sealLog) Append(ctx context.Context, expected uint64, evs ...events.Event) (uint64, error) {
	s.check(evs)
	return s.MemLog.Append(ctx, expected, evs...)
}

func (s *sealLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	s.check(evs)
	return s.MemLog.AppendAsync(ctx, expected, prevID, evs...)
}

// The committer encodes each event once: the log gets the body that was
// folded into the scratch state, not an event to encode again.
func TestCommitterEncodesEachEventOnce(t *testing.T) {
	log := &sealLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	registerGroup(t, tl, []client.RegisterRequest{
		{Incarnation: "a", Endpoint: "10.0.0.1:1"},
		{Incarnation: "b", Endpoint: "10.0.0.2:1"},
	})
	log.mu.Lock()
	defer log.mu.Unlock()
	if log.appended != 3 || len(log.unsealed) != 0 {
		t.Fatalf("%d events appended, encoded again by the log: %v", log.appended, log.unsealed)
	}
}

// lostLog loses the first append: it is never answered (its request went
// to a NATS node that died) and nothing of it is stored; it records each
// append's bound.
type lostLog struct {
	*events.MemLog
	mu     sync.Mutex
	bounds []time.Duration // each append's context deadline, from its call
}

func (l *lostLog) bound(ctx context.Context) int {
	dl, _ := ctx.Deadline()
	l.mu.Lock()
	defer l.mu.Unlock()
	l.bounds = append(l.bounds, time.Until(dl))
	return len(l.bounds)
}

func (l *lostLog) Append(ctx context.Context, expected uint64, evs ...events.Event) (uint64, error) {
	l.bound(ctx)
	return l.MemLog.Append(ctx, expected, evs...)
}

func (l *lostLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	if l.bound(ctx) == 2 { // the first after term.started
		return lostPending{expected}
	}
	return l.MemLog.AppendAsync(ctx, expected, prevID, evs...)
}

type lostPending struct{ expected uint64 }

func (p lostPending) Wait(ctx context.Context) (uint64, error) {
	<-ctx.Done()
	return p.expected, fmt.Errorf("outcome unknown: %w", ctx.Err())
}

// An append whose ack never comes is sent again, with the same ids, after
// one attempt of resendAfter, not after the whole AppendTimeout: a NATS
// node lost under the leader adds at most that to its append blackout. The
// group is stored once and its caller answered.
func TestUnansweredAppendResentAfterOneAttempt(t *testing.T) {
	log := &lostLog{MemLog: events.NewMemLog()}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1, func(c *Config) { c.AppendTimeout = 10 * time.Second })
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	rep := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
	if rep.Error != nil || rep.ID != 1 || rep.Epoch != 2 {
		t.Fatalf("register: %+v, want id 1 epoch 2", rep)
	}
	log.mu.Lock()
	bounds := append([]time.Duration(nil), log.bounds...)
	log.mu.Unlock()
	if len(bounds) != 3 {
		t.Fatalf("%d appends, want 3 (term.started, the lost one, its resend)", len(bounds))
	}
	for i, b := range bounds[1:] {
		if b > resendAfter {
			t.Errorf("attempt %d bounded by %s, want at most %s (AppendTimeout is 10s)", i+1, b, resendAfter)
		}
	}
	if got := workerList(tl.r.proj.View()); got != "[1]" {
		t.Fatalf("workers %s, want [1]: stored once", got)
	}
}

// movedLog loses the first append after term.started like lostLog, and
// reports when its wait begins and how it ended.
type movedLog struct {
	*events.MemLog
	n       atomic.Int32
	once    sync.Once
	waiting chan struct{}
	ended   chan error
}

func (l *movedLog) AppendAsync(ctx context.Context, expected uint64, prevID string, evs ...events.Event) events.Pending {
	if l.n.Add(1) == 2 {
		return movedPending{l: l, expected: expected}
	}
	return l.MemLog.AppendAsync(ctx, expected, prevID, evs...)
}

type movedPending struct {
	l        *movedLog
	expected uint64
}

func (p movedPending) Wait(ctx context.Context) (uint64, error) {
	p.l.once.Do(func() { close(p.l.waiting) })
	<-ctx.Done()
	select {
	case p.l.ended <- ctx.Err():
	default: // only the first wait is reported
	}
	return p.expected, fmt.Errorf("outcome unknown: %w", ctx.Err())
}

// An append waiting for an ack that will not come (its request reached a
// stream leader that handed over or died) is sent again as soon as the
// stream elects its next leader (JetStream's leader-elected advisory), not
// after its whole attempt: its wait ends cancelled, not at its deadline,
// and the group is stored once.
func TestAppendResentAtStreamLeaderElection(t *testing.T) {
	log := &movedLog{MemLog: events.NewMemLog(), waiting: make(chan struct{}), ended: make(chan error, 1)}
	tl := newTestLeader(t, "meta-1", log, clock.NewManual(t0), 1)
	if err := tl.startTerm(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	go func() {
		<-log.waiting
		tl.r.moves.moved() // the advisory
	}()
	rep := tl.duties.workers.register(ctxT(t), client.RegisterRequest{Incarnation: "a", Endpoint: "10.0.0.1:1"})
	if rep.Error != nil || rep.ID != 1 {
		t.Fatalf("register: %+v, want id 1", rep)
	}
	if err := <-log.ended; !errors.Is(err, context.Canceled) {
		t.Fatalf("the lost append's wait ended with %v, want cancelled by the election (not its %s deadline)", err, resendAfter)
	}
	if got := workerList(tl.r.proj.View()); got != "[1]" {
		t.Fatalf("workers %s, want [1]: stored once", got)
	}
}
