package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strings"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"
	"github.com/spf13/cobra"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// Status is what `termlog status --json` prints: read from the stream and
// the lease bucket, never from a leader RPC, so it works without a leader.
type Status struct {
	Cluster     string `json:"cluster"`
	LeaseHolder string `json:"lease_holder"`
	// LeaseError is why the lease bucket could not be read (LeaseHolder is
	// then unknown, not empty).
	LeaseError string                `json:"lease_error,omitempty"`
	Seq        uint64                `json:"seq"`
	Term       uint64                `json:"term"`
	TermLease  uint64                `json:"term_lease,omitempty"` // the term's fencing token: the lease revision its leader took
	Leader     string                `json:"leader"`
	At         time.Time             `json:"at"`
	Hash       string                `json:"hash"`
	Workers    []projections.Worker  `json:"workers"`
	Stores     []projections.Store   `json:"stores"`
	Shards     []projections.Shard   `json:"shards"`
	Counters   projections.Counters  `json:"counters"`
	Anomalies  []projections.Anomaly `json:"anomalies"`
	// FromSnapshot is the snapshot the fold started from (absent: seq 1).
	FromSnapshot *events.SnapshotInfo `json:"from_snapshot,omitempty"`
	// Health is the leader's published shard and store health, its age,
	// and what keeps the cluster from healthy.
	Health Health `json:"health"`
	// Stale, when set, says this status is not a read of the stream but a
	// copy (the leader's last health record) read while the stream's
	// leader did not answer: never healthy, exit 1.
	Stale *Stale `json:"stale,omitempty"`
}

// loadStatus folds the stream, from the newest usable snapshot when the
// cluster has a snapshot bucket (snapshots passed over are logged to logger).
func loadStatus(ctx context.Context, nc *nats.Conn, lc natslog.Config, logger zerolog.Logger) (Status, error) {
	lg, err := natslog.Open(ctx, nc, lc)
	if err != nil {
		return Status{}, err
	}
	return loadStatusLog(ctx, nc, lg, lc.Cluster, logger)
}

// loadStatusFrom is loadStatus on a session's open stream, each request
// bounded by --timeout and failing at a permission violation.
func loadStatusFrom(ctx context.Context, s *session, lg *natslog.Log, logger zerolog.Logger) (Status, error) {
	var st Status
	err := s.call(ctx, func(ctx context.Context) error {
		var err error
		st, err = loadStatusLog(ctx, s.nc, lg, s.g.cluster, logger)
		return err
	})
	if errors.Is(err, nats.ErrPermissionViolation) {
		return st, s.refused(err, "read the cluster's stream, snapshots or lease")
	}
	if err != nil {
		return st, s.timeoutError(err, "reading stream "+lg.Stream())
	}
	return st, nil
}

// loadStatusLog is loadStatus on an open stream.
func loadStatusLog(ctx context.Context, nc *nats.Conn, lg *natslog.Log, cluster string, logger zerolog.Logger) (Status, error) {
	var store events.SnapshotStore
	if snaps, err := natslog.BindSnapshots(ctx, lg); err == nil {
		store = snaps
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		logger.Warn().Err(err).Msg("snapshots unreadable; folding from seq 1")
	}
	// The lease and health buckets are read while the stream is folded, so
	// each has the whole of the caller's deadline: read after the fold, a
	// fold that took most of --timeout left the lease read nothing.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg        sync.WaitGroup
		holder    string
		ttl       time.Duration
		leaseErr  error
		rec       *meta.HealthRecord
		healthErr error
	)
	wg.Go(func() { holder, ttl, leaseErr = leaseHolder(sctx, nc, cluster) })
	wg.Go(func() { rec, healthErr = readHealth(sctx, nc, cluster) })
	st, origin, err := view.LoadFrom(ctx, lg, store, logger, clock.Real{})
	if err != nil {
		cancel()
	}
	wg.Wait()
	if err != nil {
		return Status{}, err
	}
	s := Status{
		Cluster: cluster, Seq: st.Seq, Term: st.Term, TermLease: st.Lease, Leader: st.Leader, At: st.At, Hash: st.Hash(),
		Workers: st.ListWorkers(), Stores: st.ListStores(), Shards: st.ListShards(), Counters: st.Counters, Anomalies: st.Anomalies,
		FromSnapshot: origin.Snapshot,
		LeaseHolder:  holder,
	}
	if leaseErr != nil {
		s.LeaseError = leaseErr.Error()
	}
	lease := 3 * time.Second
	if ttl > 0 {
		lease = ttl
	}
	if healthErr != nil {
		return Status{}, fmt.Errorf("health bucket %s: %w", meta.HealthBucket(cluster), healthErr)
	}
	var age time.Duration
	if rec != nil {
		age = max(time.Since(rec.At), 0)
	}
	s.Health = Health{Record: rec, AgeMS: age.Milliseconds(), Problems: judge(s, rec, age, healthStale(lease))}
	s.Health.Healthy = len(s.Health.Problems) == 0
	return s, nil
}

// leaseRead bounds status's read of the lease holder: the lease bucket
// elects a leader within a lease or two after a NATS node is lost.
const leaseRead = 5 * time.Second

// leaseHolder reads who holds the lease ("" when nobody does: no bucket
// yet, or no key) and the bucket's TTL (0 when unknown), asking again
// while the bucket does not answer, for at most leaseRead. err says why
// the holder could not be read: then it is unknown, not "".
func leaseHolder(ctx context.Context, nc *nats.Conn, cluster string) (holder string, ttl time.Duration, err error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return "", 0, err
	}
	ctx, cancel := context.WithTimeout(ctx, leaseRead)
	defer cancel()
	bucket := meta.LeaseBucket(cluster)
	var kv jetstream.KeyValue
	err = natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) (err error) {
		kv, err = js.KeyValue(ctx, bucket)
		return err
	})
	if errors.Is(err, jetstream.ErrBucketNotFound) {
		return "", 0, nil // no meta has run yet: no holder
	}
	if err != nil {
		return "", 0, fmt.Errorf("lease bucket %s: %w", bucket, err)
	}
	err = natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) error {
		e, err := kv.Get(ctx, meta.LeaseKey)
		if errors.Is(err, jetstream.ErrKeyNotFound) {
			return nil // no holder: the lease expired or was released
		}
		if err == nil {
			holder = string(e.Value())
		}
		return err
	})
	if err != nil {
		return "", 0, fmt.Errorf("lease bucket %s: get %s: %w", bucket, meta.LeaseKey, err)
	}
	_ = natslog.AskAgain(ctx, nc, time.Second, func(ctx context.Context) error {
		ks, err := kv.Status(ctx)
		if err == nil {
			ttl = ks.TTL()
		}
		return err
	})
	return holder, ttl, nil
}

func printStatus(w io.Writer, s Status) {
	holder := s.LeaseHolder
	switch {
	case s.LeaseError != "":
		holder = "unknown (" + s.LeaseError + ")"
	case holder == "":
		holder = "none (no leader holds the lease)"
	}
	term := fmt.Sprint(s.Term)
	if s.TermLease != 0 {
		term += fmt.Sprintf(" (lease rev %d)", s.TermLease)
	}
	if s.Stale != nil {
		fmt.Fprintln(w, s.Stale.String())
	}
	fmt.Fprintf(w, "cluster %s  seq %d  term %s  leader %s  lease holder %s  hash %s\n", s.Cluster, s.Seq, term, s.Leader, holder, s.Hash)
	if si := s.FromSnapshot; si != nil {
		fmt.Fprintf(w, "folded from snapshot %s (seq %d, written by %s in term %d)\n", si.Name, si.Seq, si.Writer, si.LeaderTerm)
	}
	fmt.Fprintf(w, "workers (%d):\n", len(s.Workers))
	for _, wk := range s.Workers {
		fmt.Fprintf(w, "  %-4d %-22s %-9s epoch %-6d %s\n", wk.ID, wk.Endpoint, wk.State, wk.Epoch, wk.Kind)
	}
	if len(s.Stores) > 0 {
		fmt.Fprintf(w, "stores (%d):\n", len(s.Stores))
		for _, st := range s.Stores {
			line := fmt.Sprintf("  %-10s %-9s raft %s", st.ID, st.State, st.RaftAddr)
			if !st.Until.IsZero() {
				line += " until " + st.Until.Format(time.RFC3339)
			}
			fmt.Fprintln(w, line)
		}
	}
	if len(s.Shards) > 0 {
		fmt.Fprintf(w, "shards (%d):\n", len(s.Shards))
		for _, sh := range s.Shards {
			members := ""
			down := 0
			for _, r := range sortedIDs(sh.Members) {
				members += fmt.Sprintf(" %d@%s", r, sh.Members[r])
				for _, st := range s.Stores {
					if st.ID == sh.Members[r] && st.State == events.StoreDown {
						down++
					}
				}
			}
			line := fmt.Sprintf("  %-4d members %d (%d on down stores) leader %d ccid %d:%s", sh.ID, len(sh.Members), down, sh.Leader, sh.CCID, members)
			if sh.Operator != "" {
				line += "  operator " + sh.Operator
			}
			if sh.Blocked != "" {
				line += "  blocked: " + sh.Blocked
			}
			fmt.Fprintln(w, line)
		}
	}
	c := s.Counters
	fmt.Fprintf(w, "events applied %d  noops %d  rejected %d (stale term %d)  corrupt %d\n", c.Applied, c.NoOps, c.Rejected, c.StaleTerm, c.Corrupt)
	printHealth(w, s.Health)
}

func sortedIDs(m map[uint64]string) []uint64 {
	ids := make([]uint64, 0, len(m))
	for id := range m {
		ids = append(ids, id)
	}
	sort.Slice(ids, func(i, j int) bool { return ids[i] < ids[j] })
	return ids
}

// status is statusRead answering from a copy, marked stale, while the
// event stream elects a leader.
func (g *globals) status(ctx context.Context) (Status, error) { return g.statusRead(ctx, true) }

// Exit statuses of status.
const (
	exitDegraded   = 1 // the cluster is readable and not healthy
	exitUnreadable = 2 // the cluster could not be read
)

func newStatus(g *globals) *cobra.Command {
	var (
		asJSON      bool
		watch       bool
		waitHealthy bool
		every       time.Duration
	)
	cmd := &cobra.Command{
		Use:   "status",
		Short: "Show the cluster as projected from the event stream, and its health",
		Long: `Show the cluster as projected from the event stream, and the health the meta
leader publishes (per shard: replicas running on live stores out of expected, the
Raft leader as replica@store, pending changes, the operator, a blocked reason; per
store: state and last heartbeat; with the record's age).

Exit status: 0 when healthy; 1 when degraded (a shard under-replicated or without a
leader, an operator or pending change, a blocked shard, a store down or silent while
draining, workers not running, no meta leader, recovery incomplete, a stale health
record); 2 when the cluster cannot be read. While the event stream elects a leader
(a NATS node lost), status answers within a second from the copy any replica serves
(the leader's last health record), marked STALE, and exits 1.

--watch redraws whenever something changes. --wait-healthy blocks until the cluster
is healthy (a rolling-upgrade gate) and exits 1 naming what is still wrong once
--timeout (then the bound of the whole wait; default 5m) has passed.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			show := func(s Status) error {
				if asJSON {
					enc := json.NewEncoder(out)
					enc.SetIndent("", "  ")
					return enc.Encode(s)
				}
				printStatus(out, s)
				return nil
			}
			if !watch && !waitHealthy {
				s, err := g.status(cmd.Context())
				if err != nil {
					return exitWith(exitUnreadable, err)
				}
				if err := show(s); err != nil {
					return err
				}
				return degraded(s)
			}
			bound := 5 * time.Minute
			if f := cmd.Flag("timeout"); f != nil && f.Changed && waitHealthy {
				bound = g.timeout
				g.timeout = min(g.timeout, 5*time.Second)
			}
			ctx := cmd.Context()
			var cancel context.CancelFunc = func() {}
			if waitHealthy {
				ctx, cancel = context.WithTimeout(ctx, bound)
			}
			defer cancel()
			var last string
			var lastErr error
			var s Status
			for {
				var err error
				s, err = g.status(ctx)
				if err != nil && ctx.Err() == nil {
					lastErr = err
					if watch && err.Error() != last {
						last = err.Error()
						fmt.Fprintf(out, "%s  cannot read the cluster: %v\n", time.Now().Format("15:04:05"), err)
					}
				} else if err == nil {
					lastErr = nil
					if watch {
						key := renderKey(s)
						if key != last {
							last = key
							fmt.Fprintf(out, "--- %s\n", time.Now().Format("15:04:05.000"))
							if err := show(s); err != nil {
								return err
							}
						}
					}
					if waitHealthy && s.Health.Healthy {
						if !watch {
							if err := show(s); err != nil {
								return err
							}
						}
						return nil
					}
				}
				select {
				case <-ctx.Done():
					if waitHealthy && cmd.Context().Err() == nil {
						if lastErr != nil {
							return exitWith(exitUnreadable, fmt.Errorf("not healthy within %s: %w", bound, lastErr))
						}
						if !watch {
							_ = show(s)
						}
						return exitWith(exitDegraded, fmt.Errorf("not healthy within %s: %s", bound, strings.Join(s.Health.Problems, "; ")))
					}
					return nil
				case <-time.After(every):
				}
			}
		},
	}
	outputFlags(cmd.Flags(), &asJSON)
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw whenever something changes, until interrupted")
	cmd.Flags().BoolVar(&waitHealthy, "wait-healthy", false, "wait until the cluster is healthy; exit 1 naming what is wrong after --timeout (default 5m here)")
	cmd.Flags().Var(positiveDuration(&every, time.Second), "every", "how often --watch and --wait-healthy read the cluster")
	return cmd
}

// renderKey is what --watch compares: the status without what moves by
// itself (the health record's age and times).
func renderKey(s Status) string {
	s.Health.AgeMS = 0
	if r := s.Health.Record; r != nil {
		c := *r
		c.At, c.Health.At, c.Recovery = time.Time{}, time.Time{}, meta.Recovery{State: r.Recovery.State}
		c.Stores = append([]sched.StoreHealth(nil), r.Stores...)
		for i := range c.Stores {
			c.Stores[i].LastHeartbeat = time.Time{}
		}
		s.Health.Record = &c
	}
	b, _ := json.Marshal(s)
	return string(b)
}

// degraded is the exit status of a status that was read: nil when
// healthy, else exit 1 with the first problem (the output lists them all).
func degraded(s Status) error {
	if s.Health.Healthy {
		return nil
	}
	msg := "degraded: " + s.Health.Problems[0]
	if n := len(s.Health.Problems); n > 1 {
		msg += fmt.Sprintf(" (and %d more)", n-1)
	}
	return exitWith(exitDegraded, errors.New(msg))
}

// exitError is an error with the exit status main ends with.
type exitError struct {
	code int
	err  error
}

func (e *exitError) Error() string { return e.err.Error() }
func (e *exitError) Unwrap() error { return e.err }

func exitWith(code int, err error) error { return &exitError{code: code, err: err} }

func newWorkerCmd(g *globals) *cobra.Command {
	cmd := group(&cobra.Command{Use: "worker", Short: "Workers: run one, list them"})
	var asJSON bool
	list := &cobra.Command{
		Use:   "list",
		Short: "List the workers (read from the projection of the stream)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			s, err := g.statusRead(cmd.Context(), false)
			if err != nil {
				return err
			}
			if asJSON {
				enc := json.NewEncoder(cmd.OutOrStdout())
				enc.SetIndent("", "  ")
				return enc.Encode(s.Workers)
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 0, 2, ' ', 0)
			fmt.Fprintln(tw, "ID\tENDPOINT\tSTATE\tEPOCH\tKIND\tPARALLELISM\tINCARNATION")
			for _, w := range s.Workers {
				fmt.Fprintf(tw, "%d\t%s\t%s\t%d\t%s\t%d\t%s\n", w.ID, w.Endpoint, w.State, w.Epoch, w.Kind, w.Parallelism, w.Incarnation)
			}
			return tw.Flush()
		},
	}
	outputFlags(list.Flags(), &asJSON)
	cmd.AddCommand(newWorkerRunCmd(g), list)
	return cmd
}
