// Package logtest is the conformance suite of events.Log. Every
// implementation runs it from its own tests:
//
//	func TestConformance(t *testing.T) {
//		logtest.Run(t, func(t *testing.T) events.Log { return newLog(t) })
//	}
//
// newLog must return a fresh, empty log for each call; it is called once per
// subtest and should register its own cleanup with t.Cleanup.
package logtest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
)

// Timeout bounds every wait of the suite; a log that does not answer within
// it fails the subtest instead of hanging it.
const Timeout = 10 * time.Second

// Run runs the conformance suite against the logs made by newLog.
func Run(t *testing.T, newLog func(t *testing.T) events.Log) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, events.Log)
	}{
		{"EmptyTail", testEmptyTail},
		{"AppendConsecutive", testAppendConsecutive},
		{"AppendMany", testAppendMany},
		{"ReadAll", testReadAll},
		{"ReadFromMiddle", testReadFromMiddle},
		{"ReadPastTail", testReadPastTail},
		{"ReadEmpty", testReadEmpty},
		{"ReadStopsAtCallTail", testReadStopsAtCallTail},
		{"ReadFnError", testReadFnError},
		{"ReadCanceled", testReadCanceled},
		{"WatchExistingAndLater", testWatchExistingAndLater},
		{"WatchFromMiddle", testWatchFromMiddle},
		{"WatchFromFuture", testWatchFromFuture},
		{"WatchFnError", testWatchFnError},
		{"WatchCanceledWhileIdle", testWatchCanceledWhileIdle},
		{"FencedTooLow", testFencedTooLow},
		{"FencedTooHigh", testFencedTooHigh},
		{"FencedOtherTermSameSeq", testFencedOtherTermSameSeq},
		{"FencedMultiStoresNothing", testFencedMultiStoresNothing},
		{"AppendLargeGroups", testAppendLargeGroups},
		{"FencedGroupNoSuffixAfterForeign", testFencedGroupNoSuffixAfterForeign},
		{"RacingWriters", testRacingWriters},
		{"RetrySameAppend", testRetrySameAppend},
		{"RetryMultiAfterPrefix", testRetryMultiAfterPrefix},
		{"RetryAfterOtherWrites", testRetryAfterOtherWrites},
		{"AsyncChained", testAsyncChained},
		{"AsyncChainRefusedAfterForeign", testAsyncChainRefusedAfterForeign},
		{"AsyncChainWrongPrev", testAsyncChainWrongPrev},
		{"AsyncRetryStoredOnce", testAsyncRetryStoredOnce},
		{"SameIDOtherEventFenced", testSameIDOtherEventFenced},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.fn(t, newLog(t))
		})
	}
}

// at is a fixed, millisecond-precise instant so that encoded events compare
// equal after a round trip.
var at = time.Date(2026, 11, 30, 3, 0, 0, 123_000_000, time.UTC)

// ev returns a distinct event: a worker registration whose payload encodes n.
func ev(term uint64, n int) events.Event {
	return events.Event{
		Term:   term,
		Writer: fmt.Sprintf("meta-%d", term),
		At:     at.Add(time.Duration(n) * time.Millisecond),
		Data: events.WorkerRegistered{
			ID:          uint64(n),
			Incarnation: fmt.Sprintf("inc-%d", n),
			Endpoint:    fmt.Sprintf("10.0.0.%d:5688", n%250+1),
			Kind:        "compute",
			Parallelism: n%8 + 1,
		},
	}
}

// evs returns events ev(term, first) ... ev(term, first+n-1).
func evs(term uint64, first, n int) []events.Event {
	out := make([]events.Event, n)
	for i := range out {
		out[i] = ev(term, first+i)
	}
	return out
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), Timeout)
	t.Cleanup(cancel)
	return ctx
}

func mustAppend(t *testing.T, l events.Log, expectedLast uint64, es ...events.Event) uint64 {
	t.Helper()
	got, err := l.Append(ctxT(t), expectedLast, es...)
	if err != nil {
		t.Fatalf("Append(expected %d, %d events): %v", expectedLast, len(es), err)
	}
	if want := expectedLast + uint64(len(es)); got != want {
		t.Fatalf("Append(expected %d, %d events) = %d, want %d", expectedLast, len(es), got, want)
	}
	return got
}

func tail(t *testing.T, l events.Log) uint64 {
	t.Helper()
	n, err := l.Tail(ctxT(t))
	if err != nil {
		t.Fatalf("Tail: %v", err)
	}
	return n
}

func wantTail(t *testing.T, l events.Log, want uint64) {
	t.Helper()
	if got := tail(t, l); got != want {
		t.Fatalf("Tail = %d, want %d", got, want)
	}
}

// readAll reads every record from seq from up to the tail.
func readAll(t *testing.T, l events.Log, from uint64) []events.Record {
	t.Helper()
	var out []events.Record
	err := l.Read(ctxT(t), from, func(r events.Record) error {
		out = append(out, r)
		return nil
	})
	if err != nil {
		t.Fatalf("Read(from %d): %v", from, err)
	}
	return out
}

// checkRecords checks that recs hold exactly want at seqs first, first+1, ...
func checkRecords(t *testing.T, recs []events.Record, first uint64, want []events.Event) {
	t.Helper()
	if len(recs) != len(want) {
		t.Fatalf("got %d records (%s), want %d from seq %d", len(recs), seqs(recs), len(want), first)
	}
	for i, r := range recs {
		seq := first + uint64(i)
		if r.Seq != seq {
			t.Fatalf("record %d has seq %d, want %d (got %s)", i, r.Seq, seq, seqs(recs))
		}
		checkEvent(t, r, seq, want[i])
	}
}

func checkEvent(t *testing.T, r events.Record, seq uint64, want events.Event) {
	t.Helper()
	got, err := events.Decode(r.Seq, r.Data)
	if err != nil {
		t.Fatalf("seq %d: decode: %v", seq, err)
	}
	if got.Seq != seq || got.Term != want.Term || got.Writer != want.Writer || !got.At.Equal(want.At) ||
		!reflect.DeepEqual(got.Data, want.Data) {
		t.Fatalf("seq %d: got %+v, want %+v", seq, got, want)
	}
}

func seqs(recs []events.Record) string {
	s := make([]uint64, len(recs))
	for i, r := range recs {
		s[i] = r.Seq
	}
	return fmt.Sprint(s)
}

func testEmptyTail(t *testing.T, l events.Log) {
	wantTail(t, l, 0)
}

func testAppendConsecutive(t *testing.T, l events.Log) {
	for i := 1; i <= 5; i++ {
		got, err := l.Append(ctxT(t), uint64(i-1), ev(1, i))
		if err != nil {
			t.Fatalf("append %d: %v", i, err)
		}
		if got != uint64(i) {
			t.Fatalf("append %d returned seq %d", i, got)
		}
		wantTail(t, l, uint64(i))
	}
	checkRecords(t, readAll(t, l, 1), 1, evs(1, 1, 5))
}

func testAppendMany(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(1, 1))
	mustAppend(t, l, 1, evs(1, 2, 4)...)
	mustAppend(t, l, 5, evs(2, 6, 3)...)
	wantTail(t, l, 8)
	want := append(append([]events.Event{ev(1, 1)}, evs(1, 2, 4)...), evs(2, 6, 3)...)
	checkRecords(t, readAll(t, l, 1), 1, want)
}

func testReadAll(t *testing.T, l events.Log) {
	want := evs(1, 1, 7)
	mustAppend(t, l, 0, want...)
	checkRecords(t, readAll(t, l, 1), 1, want)
	// From 0 means from the start.
	checkRecords(t, readAll(t, l, 0), 1, want)
}

func testReadFromMiddle(t *testing.T, l events.Log) {
	want := evs(3, 1, 7)
	mustAppend(t, l, 0, want...)
	checkRecords(t, readAll(t, l, 4), 4, want[3:])
	checkRecords(t, readAll(t, l, 7), 7, want[6:])
}

func testReadPastTail(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, evs(1, 1, 3)...)
	for _, from := range []uint64{4, 100} {
		if recs := readAll(t, l, from); len(recs) != 0 {
			t.Fatalf("Read(from %d) past tail 3 delivered %s", from, seqs(recs))
		}
	}
}

func testReadEmpty(t *testing.T, l events.Log) {
	for _, from := range []uint64{0, 1, 5} {
		if recs := readAll(t, l, from); len(recs) != 0 {
			t.Fatalf("Read(from %d) of an empty log delivered %s", from, seqs(recs))
		}
	}
}

// Read must stop at the tail it saw when called, even while the log grows.
func testReadStopsAtCallTail(t *testing.T, l events.Log) {
	want := evs(1, 1, 3)
	mustAppend(t, l, 0, want...)
	next := uint64(3)
	var got []events.Record
	err := l.Read(ctxT(t), 1, func(r events.Record) error {
		got = append(got, r)
		// Grow the log under the reader. (fn may run on another goroutine
		// than the test's: it reports a failure by returning it.)
		last, err := l.Append(ctxT(t), next, ev(1, int(next)+1))
		if err != nil {
			return fmt.Errorf("append under the reader after %d: %w", next, err)
		}
		if last != next+1 {
			return fmt.Errorf("append under the reader after %d returned seq %d", next, last)
		}
		next = last
		return nil
	})
	if err != nil {
		t.Fatalf("Read: %v", err)
	}
	checkRecords(t, got, 1, want)
	wantTail(t, l, 6)
}

func testReadFnError(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, evs(1, 1, 5)...)
	stop := errors.New("stop here")
	var got []uint64
	err := l.Read(ctxT(t), 1, func(r events.Record) error {
		got = append(got, r.Seq)
		if r.Seq == 2 {
			return stop
		}
		return nil
	})
	if !errors.Is(err, stop) {
		t.Fatalf("Read returned %v, want fn's error", err)
	}
	if !reflect.DeepEqual(got, []uint64{1, 2}) {
		t.Fatalf("Read delivered %v after fn failed, want [1 2]", got)
	}
}

func testReadCanceled(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, evs(1, 1, 3)...)
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := l.Read(ctx, 1, func(events.Record) error { return nil })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("Read with a canceled context returned %v, want context.Canceled", err)
	}
}

// watcher runs Watch in a goroutine and hands its records to the test.
type watcher struct {
	t      *testing.T
	recs   chan events.Record
	done   chan error
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// startWatch starts Watch(from); failAt, when non-zero, makes fn fail with
// errFn on that seq. The watcher is stopped and joined at cleanup.
func startWatch(t *testing.T, l events.Log, from, failAt uint64, errFn error) *watcher {
	t.Helper()
	ctx, cancel := context.WithCancel(t.Context())
	w := &watcher{t: t, recs: make(chan events.Record), done: make(chan error, 1), cancel: cancel}
	w.wg.Go(func() {
		w.done <- l.Watch(ctx, from, func(r events.Record) error {
			select {
			case w.recs <- r:
			case <-ctx.Done():
				return ctx.Err()
			}
			if r.Seq == failAt {
				return errFn
			}
			return nil
		})
	})
	t.Cleanup(func() {
		cancel()
		w.wg.Wait()
	})
	return w
}

// next waits for n records.
func (w *watcher) next(n int) []events.Record {
	w.t.Helper()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	var out []events.Record
	for len(out) < n {
		select {
		case r := <-w.recs:
			out = append(out, r)
		case err := <-w.done:
			w.done <- err
			w.t.Fatalf("Watch returned %v after %d of %d records (%s)", err, len(out), n, seqs(out))
		case <-timer.C:
			w.t.Fatalf("Watch delivered %d of %d records (%s) in %s", len(out), n, seqs(out), Timeout)
		}
	}
	return out
}

// result waits for Watch to return.
func (w *watcher) result() error {
	w.t.Helper()
	timer := time.NewTimer(Timeout)
	defer timer.Stop()
	for {
		select {
		case r := <-w.recs:
			w.t.Fatalf("Watch delivered seq %d, want it to return", r.Seq)
		case err := <-w.done:
			w.wg.Wait()
			return err
		case <-timer.C:
			w.t.Fatalf("Watch did not return in %s", Timeout)
		}
	}
}

// stop cancels Watch and checks that it returns ctx.Err().
func (w *watcher) stop() {
	w.t.Helper()
	w.cancel()
	if err := w.result(); !errors.Is(err, context.Canceled) {
		w.t.Fatalf("Watch returned %v after cancel, want context.Canceled", err)
	}
}

func testWatchExistingAndLater(t *testing.T, l events.Log) {
	first := evs(1, 1, 3)
	mustAppend(t, l, 0, first...)
	w := startWatch(t, l, 1, 0, nil)
	checkRecords(t, w.next(3), 1, first)
	later := evs(1, 4, 2)
	mustAppend(t, l, 3, later[0])
	checkRecords(t, w.next(1), 4, later[:1])
	mustAppend(t, l, 4, later[1])
	checkRecords(t, w.next(1), 5, later[1:])
	more := evs(2, 6, 4)
	mustAppend(t, l, 5, more...)
	checkRecords(t, w.next(4), 6, more)
	w.stop()
}

func testWatchFromMiddle(t *testing.T, l events.Log) {
	all := evs(1, 1, 6)
	mustAppend(t, l, 0, all[:4]...)
	w := startWatch(t, l, 3, 0, nil)
	checkRecords(t, w.next(2), 3, all[2:4])
	mustAppend(t, l, 4, all[4:]...)
	checkRecords(t, w.next(2), 5, all[4:])
	w.stop()
}

func testWatchFromFuture(t *testing.T, l events.Log) {
	all := evs(1, 1, 5)
	mustAppend(t, l, 0, all[:2]...)
	w := startWatch(t, l, 4, 0, nil)
	mustAppend(t, l, 2, all[2:]...)
	checkRecords(t, w.next(2), 4, all[3:])
	w.stop()
}

func testWatchFnError(t *testing.T, l events.Log) {
	stop := errors.New("projection failed")
	all := evs(1, 1, 4)
	mustAppend(t, l, 0, all[:2]...)
	w := startWatch(t, l, 0, 3, stop)
	checkRecords(t, w.next(2), 1, all[:2])
	mustAppend(t, l, 2, all[2:]...)
	checkRecords(t, w.next(1), 3, all[2:3])
	if err := w.result(); !errors.Is(err, stop) {
		t.Fatalf("Watch returned %v, want fn's error", err)
	}
}

func testWatchCanceledWhileIdle(t *testing.T, l events.Log) {
	w := startWatch(t, l, 1, 0, nil)
	mustAppend(t, l, 0, ev(1, 1))
	checkRecords(t, w.next(1), 1, []events.Event{ev(1, 1)})
	w.stop()
}

func wantFenced(t *testing.T, err error, what string) {
	t.Helper()
	if !errors.Is(err, events.ErrFenced) {
		t.Fatalf("%s: got %v, want an error wrapping events.ErrFenced", what, err)
	}
}

func testFencedTooLow(t *testing.T, l events.Log) {
	want := evs(1, 1, 3)
	mustAppend(t, l, 0, want...)
	for _, expected := range []uint64{0, 1, 2} {
		_, err := l.Append(ctxT(t), expected, ev(2, 10+int(expected)))
		wantFenced(t, err, fmt.Sprintf("append expecting %d on tail 3", expected))
	}
	wantTail(t, l, 3)
	checkRecords(t, readAll(t, l, 1), 1, want)
}

func testFencedTooHigh(t *testing.T, l events.Log) {
	_, err := l.Append(ctxT(t), 1, ev(1, 1))
	wantFenced(t, err, "append expecting 1 on an empty log")
	wantTail(t, l, 0)
	want := evs(1, 1, 2)
	mustAppend(t, l, 0, want...)
	_, err = l.Append(ctxT(t), 5, ev(1, 3))
	wantFenced(t, err, "append expecting 5 on tail 2")
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, want)
}

// A deposed leader (term 1) retrying at a seq the new leader (term 2) took is
// fenced: the message id differs, so it is not an idempotent retry.
func testFencedOtherTermSameSeq(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(1, 1))
	won := ev(2, 2)
	mustAppend(t, l, 1, won)
	_, err := l.Append(ctxT(t), 1, ev(1, 2))
	wantFenced(t, err, "append of term 1 at the seq term 2 took")
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, []events.Event{ev(1, 1), won})
}

func testFencedMultiStoresNothing(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, evs(1, 1, 2)...)
	_, err := l.Append(ctxT(t), 1, evs(2, 3, 3)...)
	wantFenced(t, err, "multi-event append expecting 1 on tail 2")
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, evs(1, 1, 2))
}

// Groups of hundreds of events (what a leader appends under a registration
// burst) land in order at consecutive seqs, group after group.
func testAppendLargeGroups(t *testing.T, l events.Log) {
	const group = 300
	first, second := evs(1, 1, group), evs(1, group+1, group)
	mustAppend(t, l, 0, first...)
	mustAppend(t, l, group, second...)
	wantTail(t, l, 2*group)
	checkRecords(t, readAll(t, l, 1), 1, append(first, second...))
}

// A foreign event took the seq of a group's first event. Each later event's
// expected last seq now matches the log (the foreign event filled the gap
// the first one left), yet none of them may land: nothing a fenced writer
// decided may follow another writer's event.
func testFencedGroupNoSuffixAfterForeign(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(3, 1))
	foreign := ev(4, 2)
	mustAppend(t, l, 1, foreign)
	_, err := l.Append(ctxT(t), 1, evs(3, 10, 5)...)
	wantFenced(t, err, "group whose first seq a foreign event took")
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, []events.Event{ev(3, 1), foreign})
	// The writer's own next group, decided on the log as it is, lands.
	mustAppend(t, l, 2, evs(3, 20, 3)...)
	wantTail(t, l, 5)
}

// Two writers of different terms append at the same expected seq at once:
// exactly one wins, the other is fenced, the tail moves by one.
func testRacingWriters(t *testing.T, l events.Log) {
	const rounds = 10
	var stored []events.Event
	for round := range rounds {
		before := tail(t, l)
		termA, termB := uint64(2*round+1), uint64(2*round+2)
		evA, evB := ev(termA, 100+round), ev(termB, 200+round)
		var (
			wg         sync.WaitGroup
			start      = make(chan struct{})
			seqA, seqB uint64
			errA, errB error
		)
		ctx := ctxT(t)
		wg.Go(func() { <-start; seqA, errA = l.Append(ctx, before, evA) })
		wg.Go(func() { <-start; seqB, errB = l.Append(ctx, before, evB) })
		close(start)
		wg.Wait()
		switch {
		case errA == nil && errB != nil:
			wantFenced(t, errB, fmt.Sprintf("round %d: losing writer", round))
			if seqA != before+1 {
				t.Fatalf("round %d: winner got seq %d, want %d", round, seqA, before+1)
			}
			stored = append(stored, evA)
		case errB == nil && errA != nil:
			wantFenced(t, errA, fmt.Sprintf("round %d: losing writer", round))
			if seqB != before+1 {
				t.Fatalf("round %d: winner got seq %d, want %d", round, seqB, before+1)
			}
			stored = append(stored, evB)
		default:
			t.Fatalf("round %d: want exactly one winner, got errA=%v errB=%v", round, errA, errB)
		}
		wantTail(t, l, before+1)
	}
	checkRecords(t, readAll(t, l, 1), 1, stored)
}

// The outcome-unknown retry: the same writer repeats an append that landed.
func testRetrySameAppend(t *testing.T, l events.Log) {
	e1, e2 := ev(4, 1), ev(4, 2)
	mustAppend(t, l, 0, e1)
	for range 2 {
		got, err := l.Append(ctxT(t), 0, e1)
		if err != nil || got != 1 {
			t.Fatalf("retry of a landed append = %d, %v; want 1, nil", got, err)
		}
	}
	wantTail(t, l, 1)
	mustAppend(t, l, 1, e2)
	got, err := l.Append(ctxT(t), 1, e2)
	if err != nil || got != 2 {
		t.Fatalf("retry of the second landed append = %d, %v; want 2, nil", got, err)
	}
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, []events.Event{e1, e2})
}

// A multi-event append whose first events landed: retrying the whole batch
// stores the rest once and returns the last seq.
func testRetryMultiAfterPrefix(t *testing.T, l events.Log) {
	batch := evs(5, 1, 4)
	mustAppend(t, l, 0, batch[:2]...)
	got, err := l.Append(ctxT(t), 0, batch...)
	if err != nil || got != 4 {
		t.Fatalf("retry of a half-landed batch = %d, %v; want 4, nil", got, err)
	}
	got, err = l.Append(ctxT(t), 0, batch...)
	if err != nil || got != 4 {
		t.Fatalf("retry of a landed batch = %d, %v; want 4, nil", got, err)
	}
	wantTail(t, l, 4)
	checkRecords(t, readAll(t, l, 1), 1, batch)
}

// A retry whose events landed but after which another writer appended: the
// landed part is recognised, the rest is fenced.
func testRetryAfterOtherWrites(t *testing.T, l events.Log) {
	mine := evs(6, 1, 2)
	mustAppend(t, l, 0, mine[0])
	other := ev(7, 50)
	mustAppend(t, l, 1, other)
	_, err := l.Append(ctxT(t), 0, mine...)
	wantFenced(t, err, "retry whose second event's seq another writer took")
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, []events.Event{mine[0], other})
}

// wait waits for an append in flight.
func wait(t *testing.T, p events.Pending) (uint64, error) {
	t.Helper()
	return p.Wait(ctxT(t))
}

func wantStored(t *testing.T, p events.Pending, want uint64, what string) {
	t.Helper()
	if got, err := wait(t, p); err != nil || got != want {
		t.Fatalf("%s = %d, %v; want %d, nil", what, got, err, want)
	}
}

// Appends sent one after another, each chained to the one before, before
// any is answered: all land, in order.
func testAsyncChained(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(1, 1))
	ctx := ctxT(t)
	p1 := l.AppendAsync(ctx, 1, "", evs(1, 2, 3)...)
	p2 := l.AppendAsync(ctx, 4, events.MsgID(ev(1, 0), 4), evs(1, 5, 2)...)
	p3 := l.AppendAsync(ctx, 6, events.MsgID(ev(1, 0), 6), ev(1, 7))
	wantStored(t, p1, 4, "first append")
	wantStored(t, p2, 6, "second append, chained to the first")
	wantStored(t, p3, 7, "third append, chained to the second")
	wantTail(t, l, 7)
	checkRecords(t, readAll(t, l, 1), 1, evs(1, 1, 7))
}

// Another writer appended as many events as the first of two chained
// appends carries: the first is fenced, and the second, whose expected
// last seq now matches the log, must not land after the foreign events
// either: it is chained to an event that was not stored.
func testAsyncChainRefusedAfterForeign(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(3, 1))
	foreign := evs(4, 50, 2)
	mustAppend(t, l, 1, foreign...)
	ctx := ctxT(t)
	p1 := l.AppendAsync(ctx, 1, events.MsgID(ev(3, 0), 1), evs(3, 10, 2)...)
	p2 := l.AppendAsync(ctx, 3, events.MsgID(ev(3, 0), 3), evs(3, 20, 2)...)
	_, err := wait(t, p1)
	wantFenced(t, err, "append whose seqs another writer took")
	_, err = wait(t, p2)
	wantFenced(t, err, "append chained to a fenced one, expected last seq matching the log")
	wantTail(t, l, 3)
	checkRecords(t, readAll(t, l, 1), 1, append([]events.Event{ev(3, 1)}, foreign...))
}

// An append chained to an id that is not the last event's is fenced even
// when its expected last seq matches; chained to the right id it lands.
func testAsyncChainWrongPrev(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, evs(1, 1, 2)...)
	_, err := wait(t, l.AppendAsync(ctxT(t), 2, events.MsgID(ev(1, 0), 1), ev(1, 3)))
	wantFenced(t, err, "append chained to an event that is not the last")
	_, err = wait(t, l.AppendAsync(ctxT(t), 2, events.MsgID(ev(2, 0), 2), evs(1, 3, 2)...))
	wantFenced(t, err, "append chained to another term's id at the last seq")
	wantTail(t, l, 2)
	wantStored(t, l.AppendAsync(ctxT(t), 2, events.MsgID(ev(1, 0), 2), evs(1, 3, 2)...), 4, "append chained to the last event")
	checkRecords(t, readAll(t, l, 1), 1, evs(1, 1, 4))
}

// An append in flight whose answer was lost is retried with the same
// events (same ids): stored once, chained or not, in part or in whole.
func testAsyncRetryStoredOnce(t *testing.T, l events.Log) {
	mustAppend(t, l, 0, ev(5, 1))
	batch := evs(5, 2, 3)
	wantStored(t, l.AppendAsync(ctxT(t), 1, events.MsgID(ev(5, 0), 1), batch...), 4, "append")
	wantStored(t, l.AppendAsync(ctxT(t), 1, events.MsgID(ev(5, 0), 1), batch...), 4, "its chained retry")
	wantStored(t, l.AppendAsync(ctxT(t), 1, "", batch...), 4, "its retry without the chain")
	// Half of the next one landed; its retry stores the rest once.
	next := evs(5, 5, 4)
	mustAppend(t, l, 4, next[:2]...)
	wantStored(t, l.AppendAsync(ctxT(t), 4, events.MsgID(ev(5, 0), 4), next...), 8, "retry of a half-landed chained append")
	wantTail(t, l, 8)
	checkRecords(t, readAll(t, l, 1), 1, append(append([]events.Event{ev(5, 1)}, batch...), next...))
}

// The message id alone does not make an append a retry: a writer that
// decides again on a stale view sends another event under the id (same term,
// same seq) an earlier append was stored with. That event did not land, so
// it is fenced, alone or after a recognised prefix of the earlier append.
func testSameIDOtherEventFenced(t *testing.T, l events.Log) {
	first := evs(8, 1, 2)
	mustAppend(t, l, 0, first...)
	_, err := l.Append(ctxT(t), 0, ev(8, 30))
	wantFenced(t, err, "another event under the id of seq 1")
	got, err := l.Append(ctxT(t), 0, first[0], ev(8, 31))
	wantFenced(t, err, "the stored first event, then another event under the id of seq 2")
	if got != 1 {
		t.Fatalf("append of the stored event then another one = %d, want 1 (the stored prefix)", got)
	}
	wantTail(t, l, 2)
	checkRecords(t, readAll(t, l, 1), 1, first)
}

// Compact drops every record of a log below seq before, as a purge of a
// stream up to a seq does.
type Compact func(before uint64) error

// RunCompaction runs the suite's compaction cases against the logs made by
// newLog (as for Run), each with the function that compacts it: a read from
// a seq the log no longer holds fails with events.ErrCompacted rather than
// starting later, and a read from seq 1 starts at the first record held.
func RunCompaction(t *testing.T, newLog func(t *testing.T) (events.Log, Compact)) {
	t.Helper()
	for _, tc := range []struct {
		name string
		fn   func(*testing.T, events.Log, Compact)
	}{
		{"ReadFromCompacted", testReadFromCompacted},
		{"WatchFromCompacted", testWatchFromCompacted},
		{"CompactedEverything", testCompactedEverything},
	} {
		t.Run(tc.name, func(t *testing.T) {
			l, compact := newLog(t)
			tc.fn(t, l, compact)
		})
	}
}

func mustCompact(t *testing.T, compact Compact, before uint64) {
	t.Helper()
	if err := compact(before); err != nil {
		t.Fatalf("compact below seq %d: %v", before, err)
	}
}

// wantCompacted checks that a Read from seq from fails with ErrCompacted
// before calling fn.
func wantCompacted(t *testing.T, l events.Log, from uint64) {
	t.Helper()
	var got []events.Record
	err := l.Read(ctxT(t), from, func(r events.Record) error {
		got = append(got, r)
		return nil
	})
	if !errors.Is(err, events.ErrCompacted) || len(got) != 0 {
		t.Fatalf("Read(from %d) of a compacted seq: %v after %s; want ErrCompacted and no record", from, err, seqs(got))
	}
}

// wantWatchCompacted checks that a Watch from seq from fails with
// ErrCompacted without delivering a record.
func wantWatchCompacted(t *testing.T, l events.Log, from uint64) {
	t.Helper()
	w := startWatch(t, l, from, 0, nil)
	if err := w.result(); !errors.Is(err, events.ErrCompacted) {
		t.Fatalf("Watch(from %d) of a compacted seq returned %v, want ErrCompacted", from, err)
	}
}

func testReadFromCompacted(t *testing.T, l events.Log, compact Compact) {
	all := evs(1, 1, 6)
	mustAppend(t, l, 0, all...)
	mustCompact(t, compact, 4)
	wantTail(t, l, 6)
	for _, from := range []uint64{2, 3} {
		wantCompacted(t, l, from)
	}
	checkRecords(t, readAll(t, l, 4), 4, all[3:])
	checkRecords(t, readAll(t, l, 5), 5, all[4:])
	// From the start: from the first record held.
	checkRecords(t, readAll(t, l, 1), 4, all[3:])
	checkRecords(t, readAll(t, l, 0), 4, all[3:])
}

func testWatchFromCompacted(t *testing.T, l events.Log, compact Compact) {
	all := evs(1, 1, 7)
	mustAppend(t, l, 0, all[:5]...)
	mustCompact(t, compact, 3)
	wantWatchCompacted(t, l, 2)
	w := startWatch(t, l, 3, 0, nil)
	checkRecords(t, w.next(3), 3, all[2:5])
	mustAppend(t, l, 5, all[5])
	checkRecords(t, w.next(1), 6, all[5:6])
	w.stop()
	w = startWatch(t, l, 1, 0, nil)
	checkRecords(t, w.next(4), 3, all[2:6])
	mustAppend(t, l, 6, all[6])
	checkRecords(t, w.next(1), 7, all[6:])
	w.stop()
}

// Compacted up to the tail: the log holds no record but keeps its tail.
func testCompactedEverything(t *testing.T, l events.Log, compact Compact) {
	all := evs(2, 1, 4)
	mustAppend(t, l, 0, all[:3]...)
	mustCompact(t, compact, 4)
	wantTail(t, l, 3)
	wantCompacted(t, l, 2)
	wantCompacted(t, l, 3)
	wantWatchCompacted(t, l, 3)
	for _, from := range []uint64{1, 4} {
		if recs := readAll(t, l, from); len(recs) != 0 {
			t.Fatalf("Read(from %d) of a log compacted to its tail delivered %s", from, seqs(recs))
		}
	}
	w := startWatch(t, l, 4, 0, nil)
	mustAppend(t, l, 3, all[3])
	checkRecords(t, w.next(1), 4, all[3:])
	w.stop()
	checkRecords(t, readAll(t, l, 1), 4, all[3:])
}
