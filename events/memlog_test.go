package events_test

import (
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
