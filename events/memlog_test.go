package events_test

import (
	"errors"
	"testing"

	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/logtest"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}

func TestMemLogConformance(t *testing.T) {
	logtest.Run(t, func(t *testing.T) events.Log {
		l := events.NewMemLog()
		t.Cleanup(l.Close)
		return l
	})
}

func TestMemLogZeroValueConformance(t *testing.T) {
	logtest.Run(t, func(t *testing.T) events.Log { return new(events.MemLog) })
}

func TestMemLogCompactionConformance(t *testing.T) {
	logtest.RunCompaction(t, func(t *testing.T) (events.Log, logtest.Compact) {
		l := events.NewMemLog()
		t.Cleanup(l.Close)
		return l, func(before uint64) error { l.Compact(before); return nil }
	})
}

// Appends to a compacted MemLog check their chain and their retries against
// the records it still holds, and never index a dropped one.
func TestMemLogAppendAfterCompaction(t *testing.T) {
	ctx := t.Context()
	l := events.NewMemLog()
	ev := func(term, n uint64) events.Event {
		return events.Event{Term: term, Writer: "meta-1", Data: events.WorkerDeregistered{ID: n, Epoch: n}}
	}
	if _, err := l.Append(ctx, 0, ev(1, 1), ev(1, 2), ev(1, 3)); err != nil {
		t.Fatal(err)
	}
	l.Compact(3) // seqs 1 and 2 dropped, 3 held
	// A retry of a compacted seq cannot be recognised: fenced, not a panic.
	if _, err := l.Append(ctx, 0, ev(1, 1)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("retry of a compacted seq: %v, want ErrFenced", err)
	}
	// The chain is checked against the last record held.
	if _, err := l.AppendAsync(ctx, 3, events.MsgID(ev(1, 0), 2), ev(1, 4)).Wait(ctx); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("chained to the wrong id: %v, want ErrFenced", err)
	}
	if last, err := l.AppendAsync(ctx, 3, events.MsgID(ev(1, 0), 3), ev(1, 4)).Wait(ctx); err != nil || last != 4 {
		t.Fatalf("chained to the last record = %d, %v; want 4, nil", last, err)
	}
	// Everything compacted: a chain cannot be checked, so it is refused.
	l.Compact(5)
	if _, err := l.AppendAsync(ctx, 4, events.MsgID(ev(1, 0), 4), ev(1, 5)).Wait(ctx); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("chained append on a log holding no record: %v, want ErrFenced", err)
	}
	if last, err := l.Append(ctx, 4, ev(1, 5)); err != nil || last != 5 {
		t.Fatalf("append at the tail of a log holding no record = %d, %v; want 5, nil", last, err)
	}
}
