package bench

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
)

const appendCluster = "benchappend"

// appendGroup is the group size of the grouped append series.
const appendGroup = 256

// appendInFlight is how many events of chained groups the grouped series
// keeps in flight: the meta leader's bound (meta maxFlightEvents).
const appendInFlight = 2048

// appendPipelined appends evs after seq base in groups of appendGroup,
// each chained to the one before, keeping up to appendInFlight events in
// flight, as the leader does under a burst (or until bound passes). It
// returns the series (took) and the events stored.
func appendPipelined(ctx context.Context, log events.Log, evs []events.Event, base uint64, bound time.Duration) (series, int, error) {
	runtime.GC()
	type inFlight struct {
		p    events.Pending
		want uint64
		n    int
	}
	var (
		s       series
		q       []inFlight
		stored  int
		prevID  string
		start   = time.Now()
		timeout = start.Add(bound)
	)
	settle := func() error {
		f := q[0]
		q = q[1:]
		last, err := f.p.Wait(ctx)
		if err == nil && last != f.want {
			err = fmt.Errorf("group appended up to %d, want %d", last, f.want)
		}
		if err == nil {
			stored += f.n
		}
		return err
	}
	for lo := 0; lo < len(evs); lo += appendGroup {
		if time.Now().After(timeout) {
			s.partial = true
			break
		}
		hi := min(lo+appendGroup, len(evs))
		for len(q) > 0 && (len(q)+1)*appendGroup > appendInFlight {
			if err := settle(); err != nil {
				return s, stored, err
			}
		}
		expected := base + uint64(lo)
		last := expected + uint64(hi-lo)
		q = append(q, inFlight{p: log.AppendAsync(ctx, expected, prevID, evs[lo:hi]...), want: last, n: hi - lo})
		prevID = events.MsgID(evs[hi-1], last)
	}
	for len(q) > 0 {
		if err := settle(); err != nil {
			return s, stored, err
		}
	}
	s.took = time.Since(start)
	s.n = stored
	return s, stored, nil
}

// registrations returns n worker.registered events of term 1 (what a
// registration burst appends) and their encoded bodies.
func registrations(n int) ([]events.Event, [][]byte, error) {
	evs := make([]events.Event, n)
	bodies := make([][]byte, n)
	base := eventgen.Base()
	for i := range n {
		// Sealed, as the leader's committer seals each event: encoded once,
		// the log sends that body.
		ev, b, err := events.Seal(events.Event{Term: 1, Writer: "meta-1", At: base.Add(time.Duration(i) * time.Millisecond),
			Data: events.WorkerRegistered{ID: uint64(i + 1), Incarnation: fmt.Sprintf("bench-%d", i), Endpoint: fakeEndpoint(i), Kind: "compute", Parallelism: 4}})
		if err != nil {
			return nil, nil, err
		}
		evs[i], bodies[i] = ev, b
	}
	return evs, bodies, nil
}

// fakeEndpoint is worker i's endpoint: unique, valid, never dialled over TCP.
func fakeEndpoint(i int) string {
	return fmt.Sprintf("10.%d.%d.%d:5688", 100+i/65536, i/256%256, i%256)
}

type series struct {
	n       int
	took    time.Duration
	lat     []time.Duration
	partial bool
}

func (s series) rate() float64 { return float64(s.n) / s.took.Seconds() }

// oneAtATime calls op n times (or until bound passes) and records each latency.
func oneAtATime(ctx context.Context, n int, bound time.Duration, op func(ctx context.Context, i int) error) (series, error) {
	runtime.GC()
	s := series{lat: make([]time.Duration, 0, n)}
	deadline := time.Now().Add(bound)
	start := time.Now()
	for i := range n {
		if time.Now().After(deadline) {
			s.partial = true
			break
		}
		t := time.Now()
		if err := op(ctx, i); err != nil {
			return s, err
		}
		s.lat = append(s.lat, time.Since(t))
	}
	s.took = time.Since(start)
	s.n = len(s.lat)
	return s, nil
}

func (r *run) appends(ctx context.Context) error {
	n := r.cfg.Appends
	evs, bodies, err := registrations(n)
	if err != nil {
		return err
	}
	e, err := r.server()
	if err != nil {
		return err
	}
	nc, err := e.connect("bench-append")
	if err != nil {
		return err
	}
	defer nc.Close()
	log, err := e.openLog(ctx, nc, appendCluster)
	if err != nil {
		return err
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(2*asyncWindow))
	if err != nil {
		return err
	}
	if _, err := e.rawStream(ctx, js, "BENCHRAW_SYNC", "benchraw.sync.>"); err != nil {
		return err
	}
	if _, err := e.rawStream(ctx, js, "BENCHRAW_ASYNC", "benchraw.async.>"); err != nil {
		return err
	}
	bound := r.cfg.PhaseTimeout / 3
	subj := "benchraw.sync." + events.TypeWorkerRegistered

	r.progress("append: %d fenced appends, one at a time", n)
	var fenced series
	r.profile("append.fenced", func() {
		fenced, err = oneAtATime(ctx, n, bound, func(ctx context.Context, i int) error {
			last, err := log.Append(ctx, uint64(i), evs[i])
			if err == nil && last != uint64(i+1) {
				err = fmt.Errorf("appended at %d, want %d", last, i+1)
			}
			return err
		})
	})
	if err != nil {
		if errors.Is(err, events.ErrFenced) {
			return fmt.Errorf("fenced append refused: %w", err)
		}
		return err
	}
	// Under a burst the leader appends what accumulated while earlier
	// groups were in flight as one group, each chained to the one before
	// (Log.AppendAsync), with up to appendInFlight events in flight;
	// appendGroup is about the group size measured in the 10,000-worker
	// register burst.
	r.progress("append: %d fenced appends in groups of %d, %d events in flight", n, appendGroup, appendInFlight)
	var grouped series
	groupedEvents := 0
	r.profile("append.grouped", func() {
		grouped, groupedEvents, err = appendPipelined(ctx, log, evs, uint64(fenced.n), bound)
	})
	if err != nil {
		return fmt.Errorf("grouped fenced append: %w", err)
	}
	r.progress("append: %d raw sync publishes", n)
	sync, err := oneAtATime(ctx, n, bound, func(ctx context.Context, i int) error {
		_, err := js.Publish(ctx, subj, bodies[i])
		return err
	})
	if err != nil {
		return err
	}
	r.progress("append: %d raw async publishes (window %d)", n, asyncWindow)
	runtime.GC()
	asyncSubj := "benchraw.async." + events.TypeWorkerRegistered
	actx, cancel := context.WithTimeout(ctx, bound)
	took, err := publishAsync(actx, js, n, func(int) string { return asyncSubj }, func(i int) []byte { return bodies[i] })
	cancel()
	if err != nil {
		return err
	}
	async := float64(n) / took.Seconds()
	partial := fenced.partial || sync.partial || grouped.partial
	note := ""
	if partial {
		note = fmt.Sprintf("a series was stopped by the %s bound: fenced %d, grouped %d, sync %d of %d", bound, fenced.n, groupedEvents, sync.n, n)
	}
	groupedRate := float64(groupedEvents) / grouped.took.Seconds()
	p50, p99 := percentile(fenced.lat, 50), percentile(fenced.lat, 99)
	sp50, sp99 := percentile(sync.lat, 50), percentile(sync.lat, 99)
	what := fmt.Sprintf("natslog Log.Append of one worker.registered with CAS + Msg-Id, one at a time as the leader does when idle (%d appends)", fenced.n)
	r.add(Figure{
		Name: "append.throughput", What: fmt.Sprintf("natslog Log.AppendAsync of groups of %d worker.registered as the leader appends under a burst (each an atomic batch: expected last seq on its first event, a Msg-Id on every one, chained to the group before; one in flight) (%d events)", appendGroup, groupedEvents),
		Unit: "events/s", Value: groupedRate, Baseline: async, Higher: true,
		BaselineWhat: fmt.Sprintf("raw async JetStream publish of the same bodies, %d in flight, no headers", asyncWindow),
		Target:       &Target{Of: "ratio", Op: "<=", Limit: 2, Text: ">= 50% of raw async"},
		Partial:      partial, Note: note,
	})
	r.add(Figure{
		Name: "append.single", What: what,
		Unit: "events/s", Value: fenced.rate(), Baseline: async, Higher: true,
		BaselineWhat: fmt.Sprintf("raw async JetStream publish of the same bodies, %d in flight, no headers", asyncWindow),
		Partial:      partial, Note: note,
	})
	r.add(Figure{
		Name: "append.vs_sync", What: what,
		Unit: "events/s", Value: fenced.rate(), Baseline: sync.rate(), Higher: true,
		BaselineWhat: "raw sync JetStream publish of the same bodies, one at a time, no headers",
		Partial:      partial, Note: note,
	})
	r.add(Figure{
		Name: "append.p50", What: "fenced append latency, median",
		Unit: "ms", Value: ms(p50), Baseline: ms(sp50), BaselineWhat: "raw sync publish latency, median",
		Partial: partial, Note: note,
	})
	r.add(Figure{
		Name: "append.p99", What: "fenced append latency, 99th percentile",
		Unit: "ms", Value: ms(p99), Baseline: ms(sp99), BaselineWhat: "raw sync publish latency, 99th percentile",
		Partial: partial, Note: note,
	})
	return nil
}
