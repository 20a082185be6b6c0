package natslog_test

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/natsserver"
)

// electionRounds is how many fresh starts TestOpenDuringElection makes.
const electionRounds = 20

// What a role opens at startup, as termlog's roles do (cmd/termlog: 30 s
// for all of it): a meta replica the stream, the lease bucket and the
// snapshot bucket, creating what is missing; a store binds the stream
// (waiting for a meta to create it) and the snapshot bucket if it exists.
const startBudget = 30 * time.Second

// TestOpenDuringElection starts a fresh cluster's roles on a 3-node
// JetStream cluster while a node is shut down, electionRounds times:
// every round a new termlog cluster (a fresh stream and fresh buckets,
// their Raft groups created during the round), three metas, three stores
// and an observer opening what they open at startup (the metas the health
// bucket too), and the JetStream meta leader (or,
// every other round, another node) shut down a random moment after they
// start. Clustered JetStream may leave a request unanswered while it
// elects a leader; every open must bound its attempts and ask again, so
// every role opens within its startup budget. The node is started again
// 1-4 s later, while the roles still open, and the cluster is whole before
// the next round.
func TestOpenDuringElection(t *testing.T) {
	t.Parallel()
	srvs, cfgs := start3Restartable(t, natsserver.ServerConfig{})
	rounds := electionRounds
	if testing.Short() {
		rounds = 3
	}
	seed := time.Now().UnixNano()
	t.Logf("seed %d", seed)
	rng := rand.New(rand.NewPCG(uint64(seed), 14))
	urls := func() string {
		var out []string
		for _, c := range cfgs {
			out = append(out, fmt.Sprintf("nats://127.0.0.1:%d", c.Port))
		}
		return strings.Join(out, ",")
	}()
	for round := range rounds {
		cluster := fmt.Sprintf("elect-%d", round)
		victim := srvs.metaLeader(t)
		if round%2 == 1 {
			victim = (victim + 1 + rng.IntN(2)) % 3
		}
		delay := time.Duration(rng.Int64N(int64(400 * time.Millisecond)))
		outage := time.Second + time.Duration(rng.Int64N(int64(3*time.Second)))
		t.Logf("round %d: cluster %s, node %s shut down %s after the roles start, for %s", round, cluster, cfgs[victim].Name, delay, outage)

		var wg sync.WaitGroup
		errs := make(chan error, 7)
		start := time.Now()
		role := func(name string, open func(ctx context.Context, nc *nats.Conn) error) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				nc, err := nats.Connect(urls, nats.Name(name), nats.Timeout(5*time.Second),
					nats.MaxReconnects(-1), nats.ReconnectWait(50*time.Millisecond), nats.ReconnectBufSize(-1))
				if err != nil {
					errs <- fmt.Errorf("%s: connect: %w", name, err)
					return
				}
				defer nc.Close()
				ctx, cancel := context.WithTimeout(t.Context(), startBudget)
				defer cancel()
				if err := open(ctx, nc); err != nil {
					errs <- fmt.Errorf("%s (after %s): %w", name, time.Since(start).Round(time.Millisecond), err)
				}
			}()
		}
		// Three metas: the first two open as cmd/termlog's startMeta does
		// (stream, lease, snapshots), the third the lease first, so that
		// every open is under way when the node goes.
		for i := 1; i <= 3; i++ {
			role(fmt.Sprintf("meta-%d", i), func(ctx context.Context, nc *nats.Conn) error {
				js, err := jetstream.New(nc)
				if err != nil {
					return err
				}
				lease := func() error {
					_, err := meta.OpenKVLease(ctx, js, cluster, 3*time.Second, 3)
					return err
				}
				if i == 3 {
					if err := lease(); err != nil {
						return err
					}
				}
				l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: 3})
				if err != nil {
					return err
				}
				if i != 3 {
					if err := lease(); err != nil {
						return err
					}
				}
				if _, err = natslog.OpenSnapshots(ctx, l); err != nil {
					return err
				}
				_, err = meta.OpenHealthKV(ctx, js, cluster, 3)
				return err
			})
		}
		for i := 1; i <= 3; i++ {
			role(fmt.Sprintf("store-%d", i), func(ctx context.Context, nc *nats.Conn) error {
				l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: 3, Bind: true})
				if err != nil {
					return err
				}
				if _, err := natslog.BindSnapshots(ctx, l); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
					return err
				}
				// And its first read: the stream's tail.
				_, err = l.Tail(ctx)
				return err
			})
		}
		// An observer (status): it binds what exists and reads the lease
		// and the health record if they are there yet.
		role("observer", func(ctx context.Context, nc *nats.Conn) error {
			l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: cluster, Replicas: 3, Bind: true})
			if err != nil {
				return err
			}
			if _, err := natslog.BindSnapshots(ctx, l); err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) {
				return err
			}
			if _, err := l.Tail(ctx); err != nil {
				return err
			}
			js, err := jetstream.New(nc)
			if err != nil {
				return err
			}
			err = natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) error {
				kv, err := js.KeyValue(ctx, meta.LeaseBucket(cluster))
				if err != nil {
					return err
				}
				_, err = kv.Get(ctx, meta.LeaseKey)
				return err
			})
			if err != nil && !errors.Is(err, jetstream.ErrBucketNotFound) && !errors.Is(err, jetstream.ErrKeyNotFound) {
				return fmt.Errorf("read lease: %w", err)
			}
			if _, err := meta.BindHealthKV(ctx, js, cluster); err != nil && !errors.Is(err, meta.ErrNoHealth) {
				return err
			}
			return nil
		})
		time.Sleep(delay) // the moment of the fault, not a synchronisation
		srvs.stop(victim)
		// The node comes back while the roles still open (a reboot): an R3
		// stream or bucket cannot be placed at all while a peer is
		// offline ("no suitable peers for placement"), so an open that
		// runs after the cluster noticed waits for the node, as a daemon
		// does; what must not happen is an attempt that never ends.
		time.Sleep(outage) // the length of the fault, not a synchronisation
		srvs.start(t, victim)
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Errorf("round %d: %v", round, err)
		}
		srvs.waitWhole(t)
		if t.Failed() {
			return
		}
	}
}

// cluster3 is a 3-node cluster whose nodes can be shut down and started
// again on the same ports and data dirs.
type cluster3 struct {
	mu   sync.Mutex
	cfgs []natsserver.ServerConfig
	srvs []*natsserver.Server // nil while down
}

// start3Restartable starts three nodes configured like base on fixed ports
// and waits for their meta leader; it returns the nodes' configurations too.
func start3Restartable(t testing.TB, base natsserver.ServerConfig) (*cluster3, []natsserver.ServerConfig) {
	t.Helper()
	c := &cluster3{}
	var routes []string
	var ports [3][2]int
	for i := range ports {
		for j := range ports[i] {
			ports[i][j] = testkit.FreePort(t)
		}
		routes = append(routes, natsserver.RouteURL(ports[i][1]))
	}
	for i := range ports {
		cfg := base
		cfg.DataDir, cfg.Name, cfg.Port = t.TempDir(), fmt.Sprintf("n%d", i+1), ports[i][0]
		cfg.ClusterName, cfg.ClusterPort, cfg.Routes, cfg.ReadyTimeout = "test", ports[i][1], routes, 20*time.Second
		c.cfgs = append(c.cfgs, cfg)
		c.srvs = append(c.srvs, nil)
	}
	for i := range c.cfgs {
		c.start(t, i)
	}
	c.waitWhole(t)
	return c, c.cfgs
}

// start starts node i (again).
func (c *cluster3) start(t testing.TB, i int) {
	t.Helper()
	s, err := natsserver.StartServer(c.cfgs[i])
	if err != nil {
		t.Fatalf("start %s: %v", c.cfgs[i].Name, err)
	}
	t.Cleanup(s.Shutdown)
	c.mu.Lock()
	c.srvs[i] = s
	c.mu.Unlock()
}

// stop shuts node i down.
func (c *cluster3) stop(i int) {
	c.mu.Lock()
	s := c.srvs[i]
	c.srvs[i] = nil
	c.mu.Unlock()
	if s != nil {
		s.Shutdown()
	}
}

// waitWhole waits until every node knows the meta leader and answers.
func (c *cluster3) waitWhole(t testing.TB) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 60*time.Second)
	defer cancel()
	c.mu.Lock()
	srvs := append([]*natsserver.Server(nil), c.srvs...)
	c.mu.Unlock()
	for _, s := range srvs {
		if _, err := s.WaitJetStream(ctx); err != nil {
			t.Fatal(err)
		}
	}
}

// metaLeader is the index of the JetStream meta leader.
func (c *cluster3) metaLeader(t testing.TB) int {
	t.Helper()
	leader := -1
	err := testkit.Poll(context.Background(), 30*time.Second, 20*time.Millisecond, func() error {
		c.mu.Lock()
		s := c.srvs[0]
		c.mu.Unlock()
		name := s.MetaLeader()
		leader = slices.IndexFunc(c.cfgs, func(cfg natsserver.ServerConfig) bool { return cfg.Name == name })
		if leader < 0 {
			return fmt.Errorf("meta leader %q", name)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("no meta leader: %v", err)
	}
	return leader
}
