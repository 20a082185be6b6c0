package logstore

import (
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/projections"
)

// fakeHost is an Actuator without a NodeHost.
type fakeHost struct {
	mu      sync.Mutex
	local   Local
	applied []Action
	fail    error
	calls   atomic.Int64
}

func (f *fakeHost) Local() Local {
	f.calls.Add(1)
	f.mu.Lock()
	defer f.mu.Unlock()
	return Local{Running: slices.Clone(f.local.Running), Persisted: slices.Clone(f.local.Persisted)}
}

func (f *fakeHost) apply(_ context.Context, a Action) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.applied = append(f.applied, a)
	if f.fail != nil {
		return f.fail
	}
	ref := projections.ReplicaRef{Shard: a.Shard, Replica: a.Replica}
	switch a.Kind {
	case ActStart:
		f.local.Running = append(f.local.Running, ref)
		if !slices.Contains(f.local.Persisted, ref) {
			f.local.Persisted = append(f.local.Persisted, ref)
		}
	case ActStop:
		f.local.Running = slices.DeleteFunc(f.local.Running, func(r projections.ReplicaRef) bool { return r == ref })
	case ActRemoveData:
		f.local.Running = slices.DeleteFunc(f.local.Running, func(r projections.ReplicaRef) bool { return r == ref })
		f.local.Persisted = slices.DeleteFunc(f.local.Persisted, func(r projections.ReplicaRef) bool { return r == ref })
	}
	return nil
}

func (f *fakeHost) actions() []Action {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.applied)
}

// fakeView is a settable view with a switchable stream.
type fakeView struct {
	mu       sync.Mutex
	state    *projections.State
	changed  chan struct{}
	healthy  bool
	catchUpE error
}

func newFakeView() *fakeView { return &fakeView{changed: make(chan struct{})} }

func (v *fakeView) set(st *projections.State, healthy bool, catchUpErr error) {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.state, v.healthy, v.catchUpE = st, healthy, catchUpErr
	close(v.changed)
	v.changed = make(chan struct{})
}

func (v *fakeView) view() View {
	return View{
		Current: func() *projections.State { v.mu.Lock(); defer v.mu.Unlock(); return v.state },
		Changed: func() <-chan struct{} { v.mu.Lock(); defer v.mu.Unlock(); return v.changed },
		CatchUp: func(ctx context.Context) error { v.mu.Lock(); defer v.mu.Unlock(); return v.catchUpE },
		Healthy: func() (bool, error) {
			v.mu.Lock()
			defer v.mu.Unlock()
			if !v.healthy {
				return false, errors.New("stream down")
			}
			return true, nil
		},
	}
}

func runReconciler(t *testing.T, r *Reconciler) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Run returned %v", err)
		}
	})
}

// TestReconcilerStartsNothingWithoutAView: while the stream cannot be read
// (catch-up fails, or the projector is unhealthy) a store with the stale
// bootstrap record of a removed replica starts nothing, even when the view it
// holds is a prefix in which that replica is still a member.
func TestReconcilerStartsNothingWithoutAView(t *testing.T) {
	prefix := fold(t, with(created())...) // replica 3 still a member
	full := fold(t, with(created(),
		events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3},
		events.ShardReplicaRemoved{Shard: 1, Replica: 3, Store: "s3", CCID: 6})...)
	host := &fakeHost{local: Local{Persisted: refs(ref(1, 3))}}
	fv := newFakeView()
	fv.set(prefix, true, errors.New("stream unreadable"))
	r := NewReconciler(ReconcilerConfig{Store: "s3", Host: host, View: fv.view(), Logger: testkit.Logger(t), Resync: 10 * time.Millisecond})
	runReconciler(t, r)

	time.Sleep(100 * time.Millisecond)
	if got := host.actions(); len(got) != 0 || host.calls.Load() != 0 {
		t.Fatalf("acted before catching up: %v (%d Local calls)", got, host.calls.Load())
	}
	if st := r.Status(); st.Ready || st.Err == "" {
		t.Fatalf("status before catch-up: %+v", st)
	}

	// Caught up, but the stream went unreadable: still nothing.
	fv.set(full, false, nil)
	time.Sleep(100 * time.Millisecond)
	if got := host.actions(); len(got) != 0 {
		t.Fatalf("acted on an unhealthy stream: %v", got)
	}

	// Healthy: replica 3's data is removed; it is never started.
	fv.set(full, true, nil)
	testkit.Eventually(t, 5*time.Second, "data removal", func() bool { return len(host.Local().Persisted) == 0 })
	for _, a := range host.actions() {
		if a.Kind == ActStart {
			t.Fatalf("started %v", a)
		}
	}
	testkit.Eventually(t, 5*time.Second, "status", func() bool { st := r.Status(); return st.Ready && st.Seq == full.Seq && st.Err == "" })
}

// TestReconcilerReportsZombiesAndRetries: a persisted replica the view does
// not list is reported and never started; a failing action is retried.
func TestReconcilerReportsZombiesAndRetries(t *testing.T) {
	view := fold(t, with(created())...)
	host := &fakeHost{local: Local{Persisted: refs(ref(1, 3), ref(1, 8))}, fail: errors.New("boom")}
	fv := newFakeView()
	fv.set(view, true, nil)
	r := NewReconciler(ReconcilerConfig{Store: "s3", Host: host, View: fv.view(), Logger: testkit.Logger(t), Resync: time.Hour})
	runReconciler(t, r)

	testkit.Eventually(t, 5*time.Second, "retries of the failing start", func() bool {
		n := 0
		for _, a := range host.actions() {
			if a.Kind == ActStart && a.Replica == 3 {
				n++
			}
		}
		return n >= 3
	})
	if sk := r.Skipped(); len(sk) != 1 || sk[0] != (Skip{Shard: 1, Replica: 8, Reason: ReasonNotMember}) {
		t.Fatalf("skipped %v", sk)
	}
	host.mu.Lock()
	host.fail = nil
	host.mu.Unlock()
	testkit.Eventually(t, 5*time.Second, "start succeeds", func() bool {
		return slices.Contains(host.Local().Running, ref(1, 3))
	})
	for _, a := range host.actions() {
		if a.Replica == 8 {
			t.Fatalf("touched the zombie: %v", a)
		}
	}
}

func TestReconcilerNoViewYet(t *testing.T) {
	host := &fakeHost{local: Local{Persisted: refs(ref(1, 3))}}
	fv := newFakeView()
	fv.set(projections.New(), true, nil) // an empty stream: seq 0
	r := NewReconciler(ReconcilerConfig{Store: "s3", Host: host, View: fv.view(), Logger: testkit.Logger(t)})
	if err := r.ReconcileOnce(context.Background()); !errors.Is(err, errNoView) {
		t.Fatalf("ReconcileOnce: %v", err)
	}
	if len(host.actions()) != 0 {
		t.Fatal("acted without a view")
	}
}

// TestReconcileOnceCatchesUpBeforeAStart: a view that lags the stream (its
// prefix still lists replica 3 on s3; the stream has removed it since) must
// not start the replica: ReconcileOnce catches up first and plans again, so
// the data of the removed replica is removed instead.
func TestReconcileOnceCatchesUpBeforeAStart(t *testing.T) {
	prefix := fold(t, with(created())...)
	full := fold(t, with(created(),
		events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3},
		events.ShardReplicaRemoved{Shard: 1, Replica: 3, Store: "s3", CCID: 6})...)
	host := &fakeHost{local: Local{Persisted: refs(ref(1, 3))}}
	var mu sync.Mutex
	cur, caughtUp := prefix, 0
	v := View{
		Current: func() *projections.State { mu.Lock(); defer mu.Unlock(); return cur },
		Changed: func() <-chan struct{} { return make(chan struct{}) },
		// The stream's tail is the full state: catching up reaches it.
		CatchUp: func(context.Context) error { mu.Lock(); defer mu.Unlock(); cur = full; caughtUp++; return nil },
	}
	r := NewReconciler(ReconcilerConfig{Store: "s3", Host: host, View: v, Logger: testkit.Logger(t)})
	if err := r.ReconcileOnce(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, a := range host.actions() {
		if a.Kind == ActStart {
			t.Fatalf("started %v from a view that lags the stream (caught up %d times)", a, caughtUp)
		}
	}
	if got := host.actions(); len(got) != 1 || got[0].Kind != ActRemoveData || got[0].Replica != 3 {
		t.Fatalf("actions %v, want the removed replica's data removed", got)
	}
}
