package bench

import (
	"context"
	"fmt"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// NATS's own floor under a loss: the event stream, the lease bucket's
// stream and the raw stream are three Raft groups, each electing a new
// leader on its own random 4-9 s timer. termlog appends only once both the
// event stream and the bucket have one; raw needs its stream's alone. The
// watch below records when each was first seen elected, so a report can
// tell termlog's own share of its blackout from the elections'.
const (
	nlElectAttempt = 250 * time.Millisecond // one stream info request
	nlElectPoll    = 20 * time.Millisecond  // between requests
)

// electWatch polls the info of some streams through a surviving node from
// t0 on and records, per stream, the first answer naming a leader that is
// not the lost node. An error, no answer, or an empty or lost leader is
// "not elected yet".
type electWatch struct {
	t0     time.Time
	at     []time.Time // per stream: the first answer naming a new leader (zero: none)
	nc     *nats.Conn
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// watchElections starts one poller per stream on nc (a connection to a
// surviving node, which the watch closes when it stops).
func watchElections(nc *nats.Conn, lost string, t0 time.Time, streams ...string) (*electWatch, error) {
	js, err := jetstream.New(nc)
	if err != nil {
		nc.Close()
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	w := &electWatch{t0: t0, at: make([]time.Time, len(streams)), nc: nc, cancel: cancel}
	for i, name := range streams {
		w.wg.Go(func() {
			for ctx.Err() == nil {
				actx, acancel := context.WithTimeout(ctx, nlElectAttempt)
				st, err := js.Stream(actx, name)
				acancel()
				if err == nil {
					if ci := st.CachedInfo().Cluster; ci != nil && ci.Leader != "" && ci.Leader != lost {
						w.at[i] = time.Now()
						return
					}
				}
				sleepCtx(ctx, nlElectPoll)
			}
		})
	}
	return w, nil
}

// stop ends the watch at end and returns each stream's election, since t0:
// end - t0 and unseen where no new leader was seen.
func (w *electWatch) stop(end time.Time) (els []time.Duration, unseen []bool) {
	w.cancel()
	w.wg.Wait()
	w.nc.Close()
	for _, at := range w.at {
		if at.IsZero() {
			els, unseen = append(els, end.Sub(w.t0)), append(unseen, true)
			continue
		}
		els, unseen = append(els, at.Sub(w.t0)), append(unseen, false)
	}
	return els, unseen
}

// elections names a loss's three elections: "stream elected 6.12s, lease
// 8.3s, raw 4.4s", a "(unseen)" one being the window's end.
func (s nlSample) elections() string {
	one := func(name string, d time.Duration) string {
		t := d.Round(10 * time.Millisecond).String()
		if slices.Contains(s.elUnseen, name) {
			t = ">" + t + " (unseen)"
		}
		return t
	}
	return "stream elected " + one("stream", s.elStream) + ", lease " + one("lease", s.elLease) + ", raw " + one("raw", s.elRaw)
}

// spread is the min, median and max of f over the losses ss (at least one).
func spread(ss []nlSample, f func(nlSample) time.Duration) (lo, med, hi time.Duration) {
	ds := make([]time.Duration, len(ss))
	for i, s := range ss {
		ds[i] = f(s)
	}
	slices.Sort(ds)
	return ds[0], ds[len(ds)/2], ds[len(ds)-1]
}

// own is termlog's own share of a loss's append blackout: beyond the later
// of the two elections it needs (the event stream's and the bucket's).
func (s nlSample) own() time.Duration { return s.appends - max(s.elStream, s.elLease) }

// nlOwnFigure is termlog's own addition on top of NATS's floor over the
// crashes of a stream or lease leader's node: the max over losses.
func nlOwnFigure(prefix, how, what string, ss []nlSample) Figure {
	pick := func(f func(nlSample) time.Duration) (lo, med, hi time.Duration) { return spread(ss, f) }
	lo, med, hi := pick(nlSample.own)
	_, stMed, _ := pick(func(s nlSample) time.Duration { return s.elStream })
	_, leMed, _ := pick(func(s nlSample) time.Duration { return s.elLease })
	_, rawMed, _ := pick(func(s nlSample) time.Duration { return s.elRaw })
	unseen := 0
	for _, s := range ss {
		unseen += len(s.elUnseen)
	}
	r := func(d time.Duration) string { return d.Round(10 * time.Millisecond).String() }
	f := Figure{
		Name: prefix + ".termlog_own",
		What: fmt.Sprintf("%s of %s: termlog's append blackout minus the later of its two NATS elections (event stream, lease bucket; first seen from a surviving node), max of %d (own median %s, max %s; elected medians: stream %s, lease %s, raw %s)",
			how, what, len(ss), r(med), r(hi), r(stMed), r(leMed), r(rawMed)),
		Unit: "s", Value: hi.Seconds(), Baseline: 0,
		BaselineWhat: "0 s: termlog appends as soon as NATS has elected both the stream's and the bucket's leader",
		Target:       &Target{Of: "value", Op: "<=", Limit: 1, Text: "<= 1 s (termlog's own addition on top of the later of its two NATS elections)"},
		Extra: map[string]float64{"own_min_s": lo.Seconds(), "own_median_s": med.Seconds(), "own_max_s": hi.Seconds(),
			"elected_stream_median_s": stMed.Seconds(), "elected_lease_median_s": leMed.Seconds(), "elected_raw_median_s": rawMed.Seconds(),
			"elections_unseen": float64(unseen)},
	}
	if unseen > 0 {
		f.Note = fmt.Sprintf("%d elections not seen within their loss's window (counted as the window's end: own is then an underestimate)", unseen)
	}
	return f
}
