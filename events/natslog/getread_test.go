package natslog_test

import (
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/logtest"
	"github.com/termlog/termlog/events/natslog"
)

// The reader's guarantees (in order, no gaps, no duplicates, Read ending at
// the tail, compaction reported) hold when it reads by message get because
// no consumer can be made (see TestWatchWithoutMetaLeader for why).
func TestConformanceWithoutConsumers(t *testing.T) {
	t.Parallel()
	logtest.Run(t, func(t *testing.T) events.Log {
		s := startServer(t, t.TempDir(), false)
		return natslog.WithoutConsumers(open(t, connect(t, s), natslog.Config{}))
	})
}

func TestCompactionConformanceWithoutConsumers(t *testing.T) {
	t.Parallel()
	logtest.RunCompaction(t, func(t *testing.T) (events.Log, logtest.Compact) {
		s := startServer(t, t.TempDir(), false)
		nc := connect(t, s)
		l := openPurgeable(t, nc, natslog.Config{})
		return natslog.WithoutConsumers(l), purger(t, nc, l)
	})
}
