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
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/meta/sched"
	"github.com/termlog/termlog/view"
)

// Status is what `termlog status --json` prints (health.Status).
type Status = health.Status

// loadStatus folds the stream, from the newest usable snapshot when the
// cluster has a snapshot bucket (snapshots passed over are logged to logger).
func loadStatus(ctx context.Context, nc *nats.Conn, lc natslog.Config, logger zerolog.Logger) (Status, error) {
	lg, err := natslog.Open(ctx, nc, lc)
	if err != nil {
		return Status{}, err
	}
	return loadStatusLog(ctx, nc, lg, lc.Cluster, logger, nil)
}

// loadStatusFrom is loadStatus on a session's open stream, each request
// bounded by --timeout and failing at a permission violation.
func loadStatusFrom(ctx context.Context, s *session, lg *natslog.Log, logger zerolog.Logger) (Status, error) {
	return loadStatusWatched(ctx, s, lg, logger, nil)
}

// loadStatusWatched is loadStatusFrom telling w (nil: nobody) what the
// read waits for.
func loadStatusWatched(ctx context.Context, s *session, lg *natslog.Log, logger zerolog.Logger, w *readWatch) (Status, error) {
	var st Status
	err := s.call(ctx, func(ctx context.Context) error {
		var err error
		st, err = loadStatusLog(ctx, s.nc, lg, s.g.cluster, logger, w)
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

// loadStatusLog is loadStatus on an open stream, telling w (nil: nobody)
// what it waits for.
func loadStatusLog(ctx context.Context, nc *nats.Conn, lg *natslog.Log, cluster string, logger zerolog.Logger, w *readWatch) (Status, error) {
	// The lease and health buckets are read while the stream is folded, so
	// each has the whole of the caller's deadline: read after the fold, a
	// fold that took most of --timeout left the lease read nothing.
	sctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var (
		wg      sync.WaitGroup
		read    health.Read
		readErr error
	)
	wg.Go(func() { read, readErr = readBuckets(sctx, nc, cluster) })
	// The replicas are asked beside the fold and taken if they are there
	// when the rest is (see replicasGrace): never waited for.
	rctx, rcancel := context.WithTimeout(sctx, replicasRead)
	defer rcancel()
	replicasCh := make(chan *health.StreamReplicas, 1)
	wg.Go(func() { replicasCh <- streamReplicas(rctx, lg) })
	w.begin(stepSnapshots)
	var store events.SnapshotStore
	if snaps, err := natslog.BindSnapshots(ctx, lg); err == nil {
		store = snaps
		if w != nil {
			store = watchedSnapshots{snaps, w}
		}
	} else if !errors.Is(err, jetstream.ErrBucketNotFound) {
		logger.Warn().Err(err).Msg("snapshots unreadable; folding from seq 1")
	}
	var log events.Log = lg
	if w != nil {
		log = watchedLog{lg, w}
	}
	st, origin, err := view.LoadFrom(ctx, log, store, logger, clock.Real{})
	if err != nil {
		cancel()
	}
	w.begin(stepBuckets)
	var replicas *health.StreamReplicas
	select {
	case replicas = <-replicasCh:
	case <-time.After(replicasGrace):
		rcancel() // the stream's leader is slow or gone: without them
	}
	wg.Wait()
	if err != nil {
		return Status{}, err
	}
	if readErr != nil {
		return Status{}, readErr
	}
	out := health.Assemble(cluster, st, origin.Snapshot, read, time.Now())
	out.Stream = replicas
	return out, nil
}

// replicasRead bounds status's stream info, which only the stream's
// leader answers (in a millisecond or two): the replicas are what status
// adds when it has them, never what it waits for.
const replicasRead = staleAfter

// replicasGrace is how long status waits for the replicas once the rest
// of its read is done.
const replicasGrace = 100 * time.Millisecond

// streamReplicas is the event stream's replicas as its leader sees them,
// judged (nil: one server, or no answer within replicasRead).
func streamReplicas(ctx context.Context, lg *natslog.Log) *health.StreamReplicas {
	leader, rs, err := lg.Replicas(ctx)
	if err != nil || len(rs) == 0 {
		return nil
	}
	out := &health.StreamReplicas{Stream: lg.Stream(), Leader: leader}
	for _, r := range rs {
		out.Replicas = append(out.Replicas, health.StreamReplica{Name: r.Name, Current: r.Current, Offline: r.Offline, LastSeenMS: r.LastSeen.Milliseconds(), Lag: r.Lag, Unheard: r.Unheard})
	}
	out.Judge()
	return out
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
	if s.Stream != nil {
		fmt.Fprintln(w, s.Stream.String())
	}
	if si := s.FromSnapshot; si != nil {
		fmt.Fprintf(w, "folded from snapshot %s (seq %d, written by %s in term %d)\n", si.Name, si.Seq, si.Writer, si.LeaderTerm)
	}
	fmt.Fprintf(w, "workers (%d):\n", len(s.Workers))
	if len(s.Workers) > 0 {
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tENDPOINT\tSTATE\tEPOCH\tKIND")
		for _, wk := range s.Workers {
			fmt.Fprintf(tw, "  %d\t%s\t%s\t%d\t%s\n", wk.ID, wk.Endpoint, wk.State, wk.Epoch, wk.Kind)
		}
		_ = tw.Flush()
	}
	if len(s.Stores) > 0 {
		fmt.Fprintf(w, "stores (%d):\n", len(s.Stores))
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "  ID\tSTATE\tRAFT ADDRESS\tINCARNATION\tNOTE")
		for _, st := range s.Stores {
			note := ""
			switch {
			case st.PlannedStop():
				note = "stopped for a planned restart at " + st.StoppedAt.Format(time.RFC3339) + ", drained until " + st.Until.Format(time.RFC3339)
			case !st.Until.IsZero():
				note = "until " + st.Until.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\n", st.ID, st.State, st.RaftAddr, st.Incarnation, note)
		}
		_ = tw.Flush()
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

func newStatus(g *globals) *cobra.Command {
	var (
		asJSON      bool
		watch       bool
		waitHealthy bool
		every       time.Duration
		stableFor   time.Duration
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
record); 2 when the cluster cannot be read. While a leader the read waits on is
elected (the event stream's, the JetStream meta group's, a bucket's: a NATS node
lost), status answers within about half a second from the copy any replica serves
(the leader's last health record), marked STALE naming that leader, and exits 1.

--watch redraws whenever something changes (in place at a terminal, appended when
piped). --wait-healthy blocks until the cluster
is healthy on every read for --stable-for (a rolling-upgrade gate: every shard with
all its members running on a live process whose report is of that process, not of
the one before a restart, and a Raft leader; no operator or pending change; no store
stopped, down or draining while silent; every worker running; a record of the
current leader built after its stores reported) and exits 1 naming what is still
wrong once --timeout (then the bound of the whole wait; default 5m) has passed.`,
		Args:        cobra.NoArgs,
		Annotations: map[string]string{readCommand: "status"},
		RunE: func(cmd *cobra.Command, _ []string) (err error) {
			out := cmd.OutOrStdout()
			printed := false
			defer func() {
				// -o json: a machine reading stdout gets a JSON answer
				// when status fails too (the line on stderr stays).
				if err != nil && asJSON && !printed {
					_ = json.NewEncoder(out).Encode(statusError{Error: err.Error(), Exit: exitCode(cmd, err)})
				}
			}()
			if stableFor < 0 {
				return usage(fmt.Errorf("--stable-for %s: want >= 0", stableFor))
			}
			show := func(s Status) error {
				printed = true
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
			var stable stability
			// --watch redraws in place at a terminal (a table, not JSON),
			// and appends when piped.
			redraw := watch && !asJSON && isTerminal(out)
			for {
				var err error
				s, err = g.status(ctx)
				if err != nil && ctx.Err() == nil {
					lastErr = err
					stable.see(false, time.Now(), stableFor)
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
							if redraw {
								// At a terminal: draw over the last one
								// (cursor home, clear the screen).
								fmt.Fprint(out, "\x1b[H\x1b[2J")
							}
							fmt.Fprintf(out, "--- %s\n", time.Now().Format("15:04:05.000"))
							if err := show(s); err != nil {
								return err
							}
						}
					}
					// Healthy on every read for --stable-for: a flapping
					// cluster does not pass.
					if stable.see(s.Health.Healthy, time.Now(), stableFor) && waitHealthy {
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
				case <-time.After(pause(every, stableFor, stable.since, waitHealthy)):
				}
			}
		},
	}
	outputFlags(cmd.Flags(), &asJSON)
	cmd.Flags().BoolVar(&watch, "watch", false, "redraw whenever something changes, until interrupted")
	cmd.Flags().BoolVar(&waitHealthy, "wait-healthy", false, "wait until the cluster is healthy; exit 1 naming what is wrong after --timeout (default 5m here)")
	cmd.Flags().Var(positiveDuration(&every, time.Second), "every", "how often --watch and --wait-healthy read the cluster")
	cmd.Flags().DurationVar(&stableFor, "stable-for", 2*time.Second, "with --wait-healthy: healthy on every read for this long before it returns (0: the first healthy read)")
	return cmd
}

// statusError is what `status -o json` prints on stdout when it fails.
type statusError struct {
	Error string `json:"error"`
	Exit  int    `json:"exit"`
}

// stability is --wait-healthy's memory: since when every read was healthy.
type stability struct {
	since time.Time // zero: the last read was not healthy (or failed)
}

// see records a read at now and reports whether every read has been
// healthy for at least d.
func (s *stability) see(healthy bool, now time.Time, d time.Duration) bool {
	switch {
	case !healthy:
		s.since = time.Time{}
		return false
	case s.since.IsZero():
		s.since = now
	}
	return now.Sub(s.since) >= d
}

// pause is how long the status loop waits before its next read: --every,
// but while --wait-healthy waits for a healthy cluster to stay so, at most
// a quarter of --stable-for (at least 100ms), so that a flap is seen.
func pause(every, stableFor time.Duration, healthySince time.Time, waitHealthy bool) time.Duration {
	if waitHealthy && !healthySince.IsZero() && stableFor > 0 {
		return min(every, max(stableFor/4, 100*time.Millisecond))
	}
	return every
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
		Use:         "list",
		Short:       "List the workers (read from the projection of the stream)",
		Args:        cobra.NoArgs,
		Annotations: map[string]string{readCommand: "worker list"},
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
