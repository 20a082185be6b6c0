package natslog_test

import (
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/logtest"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// The conformance suite, compaction included, on R3 streams of a 3-node
// cluster: every subtest gets its own stream (cluster name) on one shared
// cluster, read through one connection to every node (the readers'
// consumers land on any of the three, the stream leader or a follower).
func TestConformanceR3(t *testing.T) {
	t.Parallel()
	_, urls := start3(t, natsserver.ServerConfig{})
	nc := connectAll(t, urls)
	var n atomic.Int64
	newLog := func(t *testing.T) *natslog.Log {
		return open(t, nc, natslog.Config{Cluster: fmt.Sprintf("r3-%d", n.Add(1)), Replicas: 3})
	}
	logtest.Run(t, func(t *testing.T) events.Log { return newLog(t) })
	logtest.RunCompaction(t, func(t *testing.T) (events.Log, logtest.Compact) {
		// The stream Open makes denies purges: compact one made without.
		l := openPurgeable(t, nc, natslog.Config{Cluster: fmt.Sprintf("r3-%d", n.Add(1)), Replicas: 3})
		return l, purger(t, nc, l)
	})
}
