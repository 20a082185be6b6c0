package bench

import (
	"context"
	"fmt"
	"path/filepath"

	"github.com/termlog/termlog/natsserver"
)

// syncSingleMax caps the one-at-a-time series of the sync group: each
// append there waits for an fsync.
const syncSingleMax = 2000

// syncRun is what the sync group measures on one server.
type syncRun struct {
	single  series // fenced appends one at a time
	grouped series // fenced appends in chained groups
	burst   burstResult
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
		e, err := startEnvSync(filepath.Join(r.dir, "sync-"+p.String()), p)
		if err != nil {
			return fmt.Errorf("server with sync %s: %w", p, err)
		}
		servers[p] = e
		r.progress("sync: NATS JetStream with sync %s at %s", p, e.srv.ClientURL())
	}
	n := min(r.cfg.Appends, syncSingleMax)
	evs, _, err := registrations(r.cfg.Appends)
	if err != nil {
		return err
	}
	bound := r.cfg.PhaseTimeout / 3
	runs := map[natsserver.SyncPolicy]*syncRun{}
	// Appends on both servers, then the bursts: each pair side by side.
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		s := &syncRun{}
		runs[p] = s
		nc, err := servers[p].connect("bench-sync-append")
		if err != nil {
			return err
		}
		log, err := openLog(ctx, nc, appendCluster)
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
			runs[p].burst, err = r.runBurst(ctx, conns, "sync.register_burst."+p.String())
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
	const baseWhat = "the same on a server with sync interval (fsync every 2 min: nats-server's default)"
	partial := func(a, b bool) (bool, string) {
		if a || b {
			return true, "a series was stopped by its bound"
		}
		return false, ""
	}
	p, note := partial(on.single.partial, off.single.partial)
	r.add(Figure{
		Name: "sync.append_single", Unit: "events/s", Higher: true,
		What:  fmt.Sprintf("fenced Log.Append of one worker.registered at a time on a server with sync always (fsync before every ack; %d appends)", on.single.n),
		Value: on.single.rate(), Baseline: off.single.rate(), BaselineWhat: baseWhat, Partial: p, Note: note,
		Extra: map[string]float64{"p50_ms": ms(percentile(on.single.lat, 50)), "p99_ms": ms(percentile(on.single.lat, 99)),
			"baseline_p50_ms": ms(percentile(off.single.lat, 50)), "baseline_p99_ms": ms(percentile(off.single.lat, 99))},
	})
	r.add(Figure{
		Name: "sync.append_p50", Unit: "ms", What: "fenced append latency with sync always, median",
		Value: ms(percentile(on.single.lat, 50)), Baseline: ms(percentile(off.single.lat, 50)), BaselineWhat: baseWhat, Partial: p, Note: note,
	})
	p, note = partial(on.grouped.partial, off.grouped.partial)
	r.add(Figure{
		Name: "sync.append_grouped", Unit: "events/s", Higher: true,
		What:  fmt.Sprintf("fenced Log.AppendAsync of chained groups of %d worker.registered, %d events in flight, with sync always (%d events)", appendGroup, appendInFlight, on.grouped.n),
		Value: on.grouped.rate(), Baseline: off.grouped.rate(), BaselineWhat: baseWhat, Partial: p, Note: note,
	})
	done := on.burst.done() && off.burst.done()
	note = ""
	if !done {
		note = fmt.Sprintf("a burst was stopped by the %s bound", r.cfg.BurstTimeout)
	}
	r.add(Figure{
		Name: "sync.register_burst", Unit: "s",
		What:  fmt.Sprintf("%d workers register at once against 3 meta replicas on a server with sync always; time until every reply is in and every projection holds them", r.cfg.Workers),
		Value: on.burst.registered.Seconds(), Baseline: off.burst.registered.Seconds(), BaselineWhat: baseWhat,
		Partial: on.burst.regPartial || off.burst.regPartial, Note: note,
		Extra: map[string]float64{"all_active_s": on.burst.active.Seconds(), "baseline_all_active_s": off.burst.active.Seconds(),
			"register_p99_ms": ms(percentile(on.burst.regLat, 99)), "baseline_register_p99_ms": ms(percentile(off.burst.regLat, 99))},
	})
	r.add(Figure{
		Name: "sync.register_append_rate", Unit: "events/s", Higher: true,
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
