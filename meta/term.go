package meta

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// termLoop is the one goroutine that owns a leader term's mutable state,
// as hashicorp/raft's leaderState is owned by its leader loop: the
// committer's scratch state, queue and groups in flight (committer), the
// worker heartbeat deadlines (liveness), the barrier recovery
// (recoveryState) and the stores' reports (schedState). RPC handlers and
// timers send it messages — functions run on its goroutine, one at a time,
// in the order they arrive — and wait for them to have run; they never take
// a lock. I/O (appends, catching up, waiting for acks) runs on goroutines
// the loop starts and joins, which report back as messages, so the loop
// never blocks on NATS.
//
// Once run returns, done is closed and the state no longer changes: read
// runs its function directly then (status reads the last recovery after
// the term ended), while do refuses.
type termLoop struct {
	inbox chan func()
	done  chan struct{}
	wg    sync.WaitGroup // the I/O goroutines it started
}

func newTermLoop() *termLoop {
	return &termLoop{inbox: make(chan func(), 1024), done: make(chan struct{})}
}

// run handles messages until ctx ends, then lets c finish (it fails what
// is queued, and the groups in flight settle), joins every goroutine it
// started and closes done.
func (t *termLoop) run(ctx context.Context, c *committer) {
	defer close(t.done)
	for {
		select {
		case f := <-t.inbox:
			f()
		case <-ctx.Done():
			c.closing()
			t.drain(c)
			return
		}
	}
}

// drain handles messages until every goroutine the loop started has
// returned (they report back as messages), then whatever was sent last.
func (t *termLoop) drain(c *committer) {
	joined := make(chan struct{})
	go func() { t.wg.Wait(); close(joined) }()
	for {
		select {
		case f := <-t.inbox:
			f()
		case <-joined:
			for {
				select {
				case f := <-t.inbox:
					f()
				default:
					return
				}
			}
		}
	}
}

// goIO runs f on a goroutine the loop owns (joined before run returns).
// Called on the loop.
func (t *termLoop) goIO(f func()) {
	t.wg.Add(1)
	go func() {
		defer t.wg.Done()
		f()
	}()
}

// do runs f on the loop and returns once it ran. It returns false, f not
// run, when the loop has ended or ctx ended before the loop took f.
func (t *termLoop) do(ctx context.Context, f func()) bool {
	ran := make(chan struct{})
	msg := func() { f(); close(ran) }
	select {
	case t.inbox <- msg:
	case <-t.done:
		return false
	case <-ctx.Done():
		return false
	}
	select {
	case <-ran:
		return true
	case <-t.done:
		// Ended: f ran before the loop did, or never will (it stays in the
		// inbox's buffer).
		select {
		case <-ran:
			return true
		default:
			return false
		}
	}
}

// post sends f to the loop without waiting for it to run; an I/O goroutine
// reports back so. The loop drains its inbox before it ends, so f runs
// unless the loop has ended already.
func (t *termLoop) post(f func()) {
	select {
	case t.inbox <- f:
	case <-t.done:
	}
}

// read runs f, which must not change the state, on the loop, or directly
// once the loop has ended. The loop must be running or about to run
// (Replica.lead starts it first of the term's tasks).
func (t *termLoop) read(f func()) {
	if !t.do(context.Background(), f) {
		f()
	}
}

// atomicTime is a time written and read by several goroutines (the lease's
// last renewal), with its monotonic reading kept.
type atomicTime struct{ p atomic.Pointer[time.Time] }

func (a *atomicTime) Store(t time.Time) { a.p.Store(&t) }

func (a *atomicTime) Load() time.Time {
	if t := a.p.Load(); t != nil {
		return *t
	}
	return time.Time{}
}
