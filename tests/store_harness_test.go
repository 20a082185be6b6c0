package tests

import (
	"context"
	"path/filepath"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/logstore"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/natsserver"
	"github.com/termlog/termlog/projections"
)

// storeNode is one log store process; restart keeps its data dir and raft
// address, as a pod restarting in place.
type storeNode struct {
	c    *cluster_
	id   string
	dir  string
	addr string

	// The connection and the log stay across restarts of the store, so a
	// store can start while the NATS server is down (the connection
	// reconnects by itself).
	nc  *nats.Conn
	log *natslog.Log

	mu     sync.Mutex
	s      *logstore.Store
	cancel context.CancelFunc
	done   chan struct{}
}

func (c *cluster_) newStore(id string) *storeNode {
	nc := c.connAs(natsserver.RoleStore)
	// A store may only read the stream: it waits for a meta to create it.
	lg := c.openLogWith(nc, natslog.Config{Cluster: cluster, Bind: c.auth != ""})
	n := &storeNode{c: c, id: id, dir: filepath.Join(c.t.TempDir(), id), addr: testkit.FreeAddr(c.t), nc: nc, log: lg}
	n.start()
	c.t.Cleanup(n.stop)
	return n
}

func (n *storeNode) start() {
	t := n.c.t
	t.Helper()
	var snaps events.SnapshotStore
	if n.c.storeSnapshots {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		s, err := natslog.BindSnapshots(ctx, n.log)
		cancel()
		if err != nil {
			t.Fatalf("store %s binds the snapshot bucket: %v", n.id, err)
		}
		snaps = s
	}
	s, err := logstore.OpenStore(logstore.StoreConfig{
		Host:    logstore.Config{StoreID: n.id, DataDir: n.dir, RaftAddr: n.addr, RTTMillisecond: 20},
		Cluster: cluster, NC: n.nc, Log: n.log, Heartbeat: 200 * time.Millisecond, Resync: 200 * time.Millisecond,
		Logger: testkit.Logger(t), Snapshots: snaps, Failpoints: n.c.storeFP,
	})
	if err != nil {
		t.Fatalf("open store %s: %v", n.id, err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = s.Run(ctx)
	}()
	n.mu.Lock()
	n.s, n.cancel, n.done = s, cancel, done
	n.mu.Unlock()
}

// stop ends the process: its goroutines, its NodeHost, its connection.
func (n *storeNode) stop() {
	n.mu.Lock()
	s, cancel, done := n.s, n.cancel, n.done
	n.s = nil
	n.mu.Unlock()
	if s == nil {
		return
	}
	cancel()
	<-done
	s.Close()
}

func (n *storeNode) restart() {
	n.stop()
	n.start()
}

func (n *storeNode) store() *logstore.Store {
	n.mu.Lock()
	defer n.mu.Unlock()
	return n.s
}

func (n *storeNode) running(shard, replica uint64) bool {
	s := n.store()
	return s != nil && s.Host().Running(shard, replica)
}

func (n *storeNode) info(shard uint64) (logstore.ShardInfo, bool) {
	s := n.store()
	if s == nil {
		return logstore.ShardInfo{}, false
	}
	for _, si := range s.Host().ShardInfos() {
		if si.Shard == shard {
			return si, true
		}
	}
	return logstore.ShardInfo{}, false
}

func schedOpts() metaOpts {
	return metaOpts{scheduler: meta.SchedulerConfig{Shards: 1, StoreTimeout: 2 * time.Second, StepTimeout: 15 * time.Second, Interval: 100 * time.Millisecond, Backoff: 500 * time.Millisecond}}
}

// fullShard reports whether shard has 3 members in the leader's view, each
// running on its store, all agreeing on one leader, with no operator.
func fullShard(m *metaNode, shard uint64, stores ...*storeNode) (*projections.Shard, bool) {
	v := m.View()
	sh := v.Shards[shard]
	if sh == nil || len(sh.Members) != 3 || sh.Operator != "" || len(sh.Pending) != 0 {
		return nil, false
	}
	var leader uint64
	for r, st := range sh.Members {
		var node *storeNode
		for _, s := range stores {
			if s.id == st {
				node = s
			}
		}
		if node == nil || !node.running(shard, r) {
			return nil, false
		}
		si, _ := node.info(shard)
		if si.Leader == 0 || (leader != 0 && si.Leader != leader) || len(si.Replicas) != 3 {
			return nil, false
		}
		leader = si.Leader
	}
	return sh, true
}

func replicaOn(sh *projections.Shard, store string) uint64 {
	for r, st := range sh.Members {
		if st == store {
			return r
		}
	}
	return 0
}
