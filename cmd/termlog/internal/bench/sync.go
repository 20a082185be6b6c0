package bench

import (
	"context"
	"fmt"
	"path/filepath"
	"runtime"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/termlog/termlog/natsserver"
)

// syncSingleMax caps the one-at-a-time series of the sync group: each
// append there waits for an fsync.
const syncSingleMax = 2000

// syncGroupedMin is the least events of the sync group's grouped series
// and its raw atomic-batch baseline. 10,000 events are about 0.2 s of
// either on this machine, and their ratio swung 1.09-1.41x between runs
// (R3, one quiet machine, 2026-12-02); 100,000 are about 2 s each, and
// swung 1.08-1.15x.
const syncGroupedMin = 100_000

// syncRun is what the sync group measures on one server.
type syncRun struct {
	what     string // the server configuration
	single   series // fenced appends one at a time
	grouped  series // fenced appends in chained groups
	rawBatch series // raw atomic batches of the same groups, one in flight
	burst    burstResult
}

// rawBatches publishes bodies on a plain stream of e (atomic batches
// allowed) in raw atomic batches of appendGroup messages, one batch at a
// time (jetstreamext.PublishMsgBatch: no Msg-Id, no expected last seq), or
// until bound passes: the floor of a grouped append with fsync before ack.
func rawBatches(ctx context.Context, e *env, nc *nats.Conn, bodies [][]byte, bound time.Duration) (series, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		return series{}, err
	}
	if _, err := e.rawStream(ctx, js, "BENCHRAW_BATCH", "benchraw.batch.>"); err != nil {
		return series{}, err
	}
	runtime.GC()
	var s series
	start := time.Now()
	deadline := start.Add(bound)
	for lo := 0; lo < len(bodies); lo += appendGroup {
		if time.Now().After(deadline) {
			s.partial = true
			break
		}
		hi := min(lo+appendGroup, len(bodies))
		msgs := make([]*nats.Msg, 0, hi-lo)
		for _, b := range bodies[lo:hi] {
			msgs = append(msgs, &nats.Msg{Subject: "benchraw.batch.worker", Data: b, Header: nats.Header{}})
		}
		var err error
		if len(msgs) == 1 {
			_, err = js.PublishMsg(ctx, msgs[0])
		} else {
			_, err = jetstreamext.PublishMsgBatch(ctx, js, msgs)
		}
		if err != nil {
			return s, fmt.Errorf("raw atomic batch at %d: %w", lo, err)
		}
		s.n += len(msgs)
	}
	s.took = time.Since(start)
	return s, nil
}

// syncCost measures what syncing before every acknowledgement costs: the
// same fenced appends (one at a time and in chained groups) and the same
// registration burst, on two servers of this run, one with the default
// policy (natsserver.SyncAlways: fsync before every ack) and one with
// nats-server's interval sync (natsserver.SyncInterval: fsync every 2 min).
// The baseline of each figure is the interval server.
func (r *run) syncCost(ctx context.Context) error {
	servers := map[natsserver.SyncPolicy]*env{}
	defer func() {
		for _, e := range servers {
			e.close()
		}
	}()
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		e, err := startEnvSync(filepath.Join(r.dir, "sync-"+p.String()), p, r.cfg.Replicas)
		if err != nil {
			return fmt.Errorf("server with sync %s: %w", p, err)
		}
		servers[p] = e
		r.progress("sync: NATS JetStream at %s (%s)", e.url(), e.what())
	}
	n := min(r.cfg.Appends, syncSingleMax)
	evs, bodies, err := registrations(r.cfg.GroupedAppends)
	if err != nil {
		return err
	}
	bound := r.cfg.PhaseTimeout / 3
	runs := map[natsserver.SyncPolicy]*syncRun{}
	// Appends on both servers, then the bursts: each pair side by side.
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		s := &syncRun{what: servers[p].what()}
		runs[p] = s
		nc, err := servers[p].connect("bench-sync-append")
		if err != nil {
			return err
		}
		log, err := servers[p].openLog(ctx, nc, appendCluster)
		if err != nil {
			return err
		}
		r.progress("sync %s: %d fenced appends, one at a time", p, n)
		r.profile("sync.append_single."+p.String(), func() {
			s.single, err = oneAtATime(ctx, n, bound, func(ctx context.Context, i int) error {
				last, err := log.Append(ctx, uint64(i), evs[i])
				if err == nil && last != uint64(i+1) {
					err = fmt.Errorf("appended at %d, want %d", last, i+1)
				}
				return err
			})
		})
		if err != nil {
			return fmt.Errorf("sync %s: fenced append: %w", p, err)
		}
		r.progress("sync %s: %d fenced appends in groups of %d, %d events in flight", p, len(evs), appendGroup, appendInFlight)
		r.profile("sync.append_grouped."+p.String(), func() {
			s.grouped, _, err = appendPipelined(ctx, log, evs, uint64(s.single.n), bound)
		})
		if err != nil {
			return fmt.Errorf("sync %s: grouped fenced append: %w", p, err)
		}
		r.progress("sync %s: %d raw atomic batches of %d", p, (len(bodies)+appendGroup-1)/appendGroup, appendGroup)
		r.profile("sync.append_raw_batch."+p.String(), func() {
			s.rawBatch, err = rawBatches(ctx, servers[p], nc, bodies, bound)
		})
		if err != nil {
			return fmt.Errorf("sync %s: %w", p, err)
		}
	}
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		err := r.withEnv(servers[p], func() error {
			conns, err := r.workerConns(r.cfg.Workers)
			defer func() {
				for _, nc := range conns {
					nc.Close()
				}
			}()
			if err != nil {
				return err
			}
			r.progress("sync %s: %d workers register at once against 3 meta replicas", p, r.cfg.Workers)
			runs[p].burst, err = r.runBurst(ctx, conns, r.cfg.Workers, "sync.register_burst."+p.String())
			return err
		})
		if err != nil {
			return fmt.Errorf("sync %s: burst: %w", p, err)
		}
	}
	r.addSync(runs[natsserver.SyncAlways], runs[natsserver.SyncInterval])
	return nil
}

func (r *run) addSync(on, off *syncRun) {
	baseWhat := "the same on " + off.what + " (fsync every 2 min: nats-server's default)"
	onOff := on.what + "; baseline " + off.what
	partial := func(a, b bool) (bool, string) {
		if a || b {
			return true, "a series was stopped by its bound"
		}
		return false, ""
	}
	p, note := partial(on.single.partial, off.single.partial)
	r.add(Figure{
		Name: "sync.append_single", Unit: "events/s", Higher: true, Server: onOff,
		What:  fmt.Sprintf("fenced Log.Append of one worker.registered at a time on a server with sync always (fsync before every ack; %d appends)", on.single.n),
		Value: on.single.rate(), Baseline: off.single.rate(), BaselineWhat: baseWhat, Partial: p, Note: note,
		Extra: map[string]float64{"p50_ms": ms(percentile(on.single.lat, 50)), "p99_ms": ms(percentile(on.single.lat, 99)),
			"baseline_p50_ms": ms(percentile(off.single.lat, 50)), "baseline_p99_ms": ms(percentile(off.single.lat, 99))},
	})
	r.add(Figure{
		Name: "sync.append_p50", Unit: "ms", What: "fenced append latency with sync always, median", Server: onOff,
		Value: ms(percentile(on.single.lat, 50)), Baseline: ms(percentile(off.single.lat, 50)), BaselineWhat: baseWhat, Partial: p, Note: note,
	})
	p, note = partial(on.grouped.partial, on.rawBatch.partial)
	grouped := fmt.Sprintf("fenced Log.AppendAsync of chained groups of %d worker.registered (atomic batches, one in flight)", appendGroup)
	r.add(Figure{
		Name: "sync.append_grouped", Unit: "events/s", Higher: true, Server: on.what + "; baseline the same server",
		What:  fmt.Sprintf("%s with sync always (%d events)", grouped, on.grouped.n),
		Value: on.grouped.rate(), Baseline: on.rawBatch.rate(), Partial: p, Note: note,
		BaselineWhat: fmt.Sprintf("raw atomic batches of the same %d bodies (jetstreamext.PublishMsgBatch, no Msg-Id or CAS), one in flight, on the same server (%d events)", appendGroup, on.rawBatch.n),
		Target:       &Target{Of: "ratio", Op: "<=", Limit: 1.25, Text: "<= 1.25x raw atomic batches"},
		Extra:        map[string]float64{"raw_batch_interval_events_per_s": off.rawBatch.rate()},
	})
	p, note = partial(on.grouped.partial, off.grouped.partial)
	r.add(Figure{
		Name: "sync.append_grouped_vs_interval", Unit: "events/s", Higher: true, Server: onOff,
		What:  fmt.Sprintf("%s with sync always (%d events)", grouped, on.grouped.n),
		Value: on.grouped.rate(), Baseline: off.grouped.rate(), BaselineWhat: baseWhat, Partial: p, Note: note,
		Target: &Target{Of: "ratio", Op: "<=", Limit: 4, Text: ">= 25% of sync interval (<= 4x)"},
	})
	done := on.burst.done() && off.burst.done()
	note = ""
	if !done {
		note = fmt.Sprintf("a burst was stopped by the %s bound", r.cfg.BurstTimeout)
	}
	r.add(Figure{
		Name: "sync.register_burst", Unit: "s", Server: onOff,
		Target: &Target{Of: "value", Op: "<=", Limit: 1.5, Text: "<= 1.5 s (at 10,000 workers)"},
		What:   fmt.Sprintf("%d workers register at once against 3 meta replicas on a server with sync always; time until every reply is in and every projection holds them", r.cfg.Workers),
		Value:  on.burst.registered.Seconds(), Baseline: off.burst.registered.Seconds(), BaselineWhat: baseWhat,
		Partial: on.burst.regPartial || off.burst.regPartial, Note: note,
		Extra: map[string]float64{"all_active_s": on.burst.active.Seconds(), "baseline_all_active_s": off.burst.active.Seconds(),
			"register_p99_ms": ms(percentile(on.burst.regLat, 99)), "baseline_register_p99_ms": ms(percentile(off.burst.regLat, 99))},
	})
	r.add(Figure{
		Name: "sync.register_append_rate", Unit: "events/s", Higher: true, Server: onOff,
		What:  "fenced appends per second the leader achieved during that burst with sync always (registered + activated)",
		Value: float64(on.burst.appended) / on.burst.active.Seconds(), Baseline: float64(off.burst.appended) / off.burst.active.Seconds(),
		BaselineWhat: baseWhat, Partial: !done, Note: note,
	})
}

// withEnv runs fn with e as the run's server (the one startMeta and
// workerConns connect to).
func (r *run) withEnv(e *env, fn func() error) error {
	old := r.env
	r.env = e
	defer func() { r.env = old }()
	return fn()
}
