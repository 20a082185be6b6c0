package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/natsserver"
)

// staleAfter is how long status lets its read of the cluster stand still,
// waiting on a leader that does not answer, before it answers from a copy
// instead (marked stale, exit 1; see statusRead): while a
// replicated stream, the JetStream meta group or a bucket elects a leader
// after a NATS node was lost (4-9 s), nothing answers the request the read
// waits on, and a user asking what the cluster is doing should not wait
// that long to hear "an election".
const staleAfter = 500 * time.Millisecond

// staleRead bounds one read of the copy, and of a bucket's copy in a read:
// a direct get is answered in a millisecond or two, and one that went to
// a replica on a node just lost is never answered, so it is asked again
// soon (the next may go to a live replica).
const staleRead = 250 * time.Millisecond

// staleRetry is the pause between two reads of the copy.
const staleRetry = 25 * time.Millisecond

// watchTick is how often status's watchdog looks at its read.
const watchTick = 25 * time.Millisecond

// Stale is a status answered from a copy (health.StaleCopy).
type Stale = health.StaleCopy

// directGet reads the last message on subject of a KV stream with a
// direct get: any replica that is current answers it from its own copy,
// with or without a stream leader. found is false when there is none (or
// the key was deleted). A stream that does not exist has no responders.
func directGet(ctx context.Context, nc *nats.Conn, stream, subject string) (data []byte, found bool, err error) {
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream+"."+subject, nil)
	if err != nil {
		return nil, false, err
	}
	switch st := m.Header.Get("Status"); st {
	case "":
		switch m.Header.Get("KV-Operation") {
		case "DEL", "PURGE":
			return nil, false, nil
		}
		return m.Data, true, nil
	case "404":
		return nil, false, nil
	default:
		return nil, false, fmt.Errorf("direct get %s: status %s %s", subject, st, m.Header.Get("Description"))
	}
}

// healthCopy reads the meta leader's last health record with a direct get
// (nil, nil: none published). A bucket that does not exist has no
// responders: err wraps nats.ErrNoResponders.
func healthCopy(ctx context.Context, nc *nats.Conn, cluster string) (*meta.HealthRecord, error) {
	bucket := meta.HealthBucket(cluster)
	b, found, err := directGet(ctx, nc, "KV_"+bucket, "$KV."+bucket+"."+meta.HealthKey)
	if err != nil || !found {
		return nil, err
	}
	var rec meta.HealthRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return nil, fmt.Errorf("health record: %w", err)
	}
	return &rec, nil
}

// leaseCopy reads the lease holder with a direct get ("" nobody).
func leaseCopy(ctx context.Context, nc *nats.Conn, cluster string) (string, error) {
	bucket := meta.LeaseBucket(cluster)
	h, _, err := directGet(ctx, nc, "KV_"+bucket, "$KV."+bucket+"."+meta.LeaseKey)
	return string(h), err
}

// readCopy reads the copies status answers from while its read of the
// stream stands still. It fails when there is no health record.
func readCopy(ctx context.Context, nc *nats.Conn, cluster string) (health.Copy, error) {
	rec, err := healthCopy(ctx, nc, cluster)
	if err != nil {
		return health.Copy{}, fmt.Errorf("health record copy: %w", err)
	}
	if rec == nil {
		return health.Copy{}, errors.New("no health record to answer from")
	}
	c := health.Copy{Record: *rec, Via: serverName(nc)}
	if c.Holder, err = leaseCopy(ctx, nc, cluster); err != nil {
		c.LeaseErr = "lease copy: " + err.Error()
	}
	return c, nil
}

func serverName(nc *nats.Conn) string {
	if s := nc.ConnectedServerName(); s != "" {
		return s
	}
	return nc.ConnectedUrlRedacted()
}

// readBuckets reads the lease holder, the lease bucket's TTL and the
// health record for a status read. Holder and record come from the copy
// any current replica serves (a direct get, as a KV get is: no bucket
// leader needed); only a bucket that is not there (no responders) is
// looked up through its stream, which needs its leader. The TTL is its
// stream's, asked of its leader for at most staleAfter (0: unknown).
func readBuckets(ctx context.Context, nc *nats.Conn, cluster string) (health.Read, error) {
	var (
		r         health.Read
		wg        sync.WaitGroup
		healthErr error
	)
	wg.Go(func() {
		err := natslog.AskAgain(ctx, nc, staleRead, func(ctx context.Context) (err error) {
			r.Holder, err = leaseCopy(ctx, nc, cluster)
			return err
		})
		if errors.Is(err, nats.ErrNoResponders) {
			r.Holder, _, r.LeaseErr = leaseHolder(ctx, nc, cluster)
			return
		}
		r.LeaseErr = err
		if err != nil {
			r.LeaseErr = fmt.Errorf("lease bucket %s: get %s: %w", meta.LeaseBucket(cluster), meta.LeaseKey, err)
		}
	})
	wg.Go(func() { r.TTL = leaseTTL(ctx, nc, cluster) })
	wg.Go(func() {
		healthErr = natslog.AskAgain(ctx, nc, staleRead, func(ctx context.Context) (err error) {
			r.Record, err = healthCopy(ctx, nc, cluster)
			return err
		})
		if errors.Is(healthErr, nats.ErrNoResponders) {
			r.Record, healthErr = readHealth(ctx, nc, cluster)
		}
	})
	wg.Wait()
	if healthErr != nil {
		return r, fmt.Errorf("health bucket %s: %w", meta.HealthBucket(cluster), healthErr)
	}
	return r, nil
}

// leaseTTL is the lease bucket's TTL, 0 when its stream's leader does not
// tell within staleAfter.
func leaseTTL(ctx context.Context, nc *nats.Conn, cluster string) time.Duration {
	js, err := jetstream.New(nc)
	if err != nil {
		return 0
	}
	ctx, cancel := context.WithTimeout(ctx, staleAfter)
	defer cancel()
	var ttl time.Duration
	_ = natslog.AskAgain(ctx, nc, staleRead, func(ctx context.Context) error {
		st, err := js.Stream(ctx, "KV_"+meta.LeaseBucket(cluster))
		if err == nil {
			ttl = st.CachedInfo().Config.MaxAge
		}
		return err
	})
	return ttl
}

// readStep is what a status read waits for.
type readStep int32

const (
	stepOpen        readStep = iota // connecting, opening the stream, its leader's last seq
	stepSnapshots                   // the snapshot bucket: bind, list
	stepSnapshotGet                 // fetching a snapshot (it may be large)
	stepFold                        // folding the stream's records
	stepBuckets                     // the lease and health buckets
)

// readWatch is what status's watchdog sees of its read: the step, when
// the read last moved (a step begun, a record folded) and the open stream.
// nil is a read nobody watches.
type readWatch struct {
	step    atomic.Int32
	moved   atomic.Int64 // unix nanoseconds of the last step begun
	records atomic.Uint64
	log     atomic.Pointer[natslog.Log]
}

func newReadWatch() *readWatch {
	w := &readWatch{}
	w.begin(stepOpen)
	return w
}

func (w *readWatch) begin(s readStep) {
	if w == nil {
		return
	}
	w.step.Store(int32(s))
	w.moved.Store(time.Now().UnixNano())
}

// watchedLog is the stream as a status read folds it: each record folded
// is progress.
type watchedLog struct {
	events.Log
	w *readWatch
}

func (l watchedLog) Read(ctx context.Context, from uint64, fn func(events.Record) error) error {
	l.w.begin(stepFold)
	return l.Log.Read(ctx, from, func(r events.Record) error {
		l.w.records.Add(1)
		return fn(r)
	})
}

// watchedSnapshots is the snapshot bucket as a status read uses it.
type watchedSnapshots struct {
	events.SnapshotStore
	w *readWatch
}

func (s watchedSnapshots) List(ctx context.Context) ([]events.SnapshotInfo, error) {
	s.w.begin(stepSnapshots)
	return s.SnapshotStore.List(ctx)
}

func (s watchedSnapshots) Get(ctx context.Context, name string) ([]byte, error) {
	s.w.begin(stepSnapshotGet)
	defer s.w.begin(stepSnapshots)
	return s.SnapshotStore.Get(ctx, name)
}

// probe asks the leaders the read's step needs whether they answer, each
// within staleAfter/2, and returns the first one that did not ("": all
// answered). Stream info, a consumer, the snapshot bucket's info are each
// answered by one server only (a stream's leader, the JetStream meta
// leader); while its Raft group elects after a node was lost, nobody does.
func probe(ctx context.Context, nc *nats.Conn, cluster string, step readStep, l *natslog.Log) string {
	// A fold waiting for its reader's consumer waits on a create: after a
	// node's loss the JetStream meta leader may answer account info and
	// still leave creates unanswered (the consumer placed on the lost
	// node), for 1-3 s, while a long Read cannot read by get. A create
	// unanswered this long is that leader silent.
	if step == stepFold && l != nil {
		if w := l.ConsumerWait(); w >= staleAfter/2 {
			return fmt.Sprintf("the JetStream meta leader (it creates the reader's consumer: one asked for %s ago is not made yet)", w.Round(10*time.Millisecond))
		}
	}
	js, err := jetstream.New(nc)
	if err != nil {
		return ""
	}
	type ask struct {
		who string
		req func(context.Context) error
	}
	meta := ask{"the JetStream meta leader (it answers account info and creates the reader's consumer)", func(ctx context.Context) error {
		_, err := js.AccountInfo(ctx)
		return err
	}}
	var asks []ask
	switch step {
	case stepOpen:
		asks = append(asks, meta)
		if l == nil {
			name := natslog.StreamName(cluster)
			asks = append(asks, ask{"the event stream's leader", func(ctx context.Context) error { _, err := js.Stream(ctx, name); return err }})
		}
	case stepSnapshots, stepSnapshotGet:
		name := "OBJ_" + natslog.SnapshotBucket(cluster)
		asks = append(asks, meta, ask{"the snapshot bucket's leader", func(ctx context.Context) error { _, err := js.Stream(ctx, name); return err }})
	case stepFold:
		asks = append(asks, meta)
	}
	if l != nil {
		asks = append(asks, ask{"the event stream's leader", func(ctx context.Context) error { _, err := l.Tail(ctx); return err }})
	}
	silent := make([]bool, len(asks))
	var wg sync.WaitGroup
	for i, a := range asks {
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, staleAfter/2)
			defer cancel()
			err := a.req(pctx)
			silent[i] = err != nil && natslog.Unanswered(err)
		})
	}
	wg.Wait()
	for i, a := range asks {
		if silent[i] && ctx.Err() == nil {
			return a.who
		}
	}
	return ""
}

// statusRead connects and reads the cluster: the stream (folded), the
// lease and the health record, each step within --timeout, a failure
// naming its cause.
//
// When allowStale, a watchdog looks at the read every watchTick. Once the
// read has not moved (no step begun, no record folded) for staleAfter/4, it
// reads the copies any current replica serves (the meta leader's last
// health record, the lease; direct gets) and probes the leaders the step
// waits on (the stream's, the JetStream meta leader that creates the
// reader's consumer, the snapshot bucket's). Status answers from the copy
// (health.AssembleStale: marked stale, never healthy, exit 1) when the read
// has not moved for staleAfter and a probe found one of them silent, or
// for 2·staleAfter whatever the probes say (4·staleAfter while it fetches
// a snapshot, which may be large). A read that is slow but moves (a long
// fold) is waited for. When there is no copy (no health record yet), it
// goes on waiting for the stream.
func (g *globals) statusRead(ctx context.Context, allowStale bool) (Status, error) {
	lg, err := g.logger()
	if err != nil {
		return Status{}, err
	}
	s, err := g.dialSession("termlog-status", natsserver.RoleObserver)
	if err != nil {
		return Status{}, err
	}
	defer s.Close()
	type result struct {
		st  Status
		err error
	}
	var w *readWatch
	if allowStale {
		w = newReadWatch()
	}
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	done := make(chan result, 1)
	go func() {
		l, err := s.openStream(fctx, false)
		if err == nil {
			// The stream's leader answers its last seq: the read goes on.
			err = s.call(fctx, func(ctx context.Context) error { _, err := l.Tail(ctx); return err })
			if err != nil {
				err = s.timeoutError(err, "stream "+l.Stream()+" did not answer")
			}
		}
		if err != nil {
			done <- result{err: err}
			return
		}
		if w != nil {
			w.log.Store(l)
		}
		// Only snapshots passed over are worth a line next to the answer.
		st, err := loadStatusWatched(fctx, s, l, lg.Level(max(lg.GetLevel(), zerolog.WarnLevel)), w)
		done <- result{st, err}
	}()
	if !allowStale {
		r := <-done
		return r.st, r.err
	}

	// The watchdog's helpers: a copy read ahead (once the read stood still
	// for staleAfter/4) and probe rounds, each ended and joined on return.
	hctx, hcancel := context.WithCancel(ctx)
	var helpers sync.WaitGroup
	defer func() { hcancel(); helpers.Wait() }()
	copied := make(chan health.Copy, 1)
	copyFailed := make(chan error, 1)
	copyStarted := false
	startCopy := func() {
		if copyStarted {
			return
		}
		copyStarted = true
		helpers.Go(func() {
			var last error
			for hctx.Err() == nil {
				cctx, cancel := context.WithTimeout(hctx, staleRead)
				c, err := readCopy(cctx, s.nc, g.cluster)
				cancel()
				if err == nil {
					copied <- c
					return
				}
				if last == nil {
					copyFailed <- err
				}
				last = err
				// Right after a node is lost, a direct get may first go
				// to the lost node's replica and stay unanswered: ask
				// again until the read ends.
				t := time.NewTimer(staleRetry)
				select {
				case <-hctx.Done():
				case <-t.C:
				}
				t.Stop()
			}
		})
	}
	type probeResult struct {
		gen    int       // the watchdog's count of the read's moves when it began
		silent string    // who did not answer ("": all did)
		at     time.Time // when it ended
	}
	probes := make(chan probeResult, 1)
	probing := false
	last := probeResult{gen: -1} // the last round's
	var cp *health.Copy
	began := time.Now()
	gen := 0 // moves of the read seen
	lastMoved, lastRecords := w.moved.Load(), w.records.Load()
	moved := began
	tick := time.NewTicker(watchTick)
	defer tick.Stop()
	answer := func(why string, readEnded bool) (Status, error) {
		st := health.AssembleStale(g.cluster, *cp, why, time.Now())
		if !readEnded {
			// The copy is read: the connection is of no more use. Closing
			// it ends at once what the read still waits for (a request to
			// the leader being elected; its consumer's delete, which a
			// cancelled read still waits a second for), so the read ends
			// and is joined now.
			fcancel()
			s.Close()
			if r := <-done; r.err == nil {
				return r.st, nil // the read came meanwhile: it, not the copy
			}
		}
		return st, nil
	}
	for {
		select {
		case r := <-done:
			if r.err == nil || !natslog.Unanswered(r.err) {
				return r.st, r.err
			}
			// Unanswered in the end, or refused at once by a node whose
			// JetStream is stopping or electing (503): the copy, like a
			// read that stood still.
			if cp == nil {
				cctx, cancel := context.WithTimeout(ctx, staleRead)
				c, err := readCopy(cctx, s.nc, g.cluster)
				cancel()
				if err != nil {
					return r.st, r.err
				}
				cp = &c
			}
			return answer(fmt.Sprintf("the event stream could not be read (%v)", r.err), true)
		case c := <-copied:
			cp = &c
			continue
		case <-copyFailed:
			continue
		case p := <-probes:
			probing = false
			last = p
			continue
		case <-ctx.Done():
			r := <-done
			return r.st, r.err
		case <-tick.C:
		}
		now := time.Now()
		if m, n := w.moved.Load(), w.records.Load(); m != lastMoved || n != lastRecords {
			lastMoved, lastRecords, moved = m, n, now
			gen++
		}
		still := now.Sub(moved)
		step := readStep(w.step.Load())
		if still >= staleAfter/4 {
			startCopy()
			// Probe again unless a round since the last move found a
			// leader silent; a round that found all answering is asked
			// again after a pause of staleAfter/4.
			if !probing && (last.gen != gen || last.silent == "" && now.Sub(last.at) >= staleAfter/4) {
				probing = true
				g0, l := gen, w.log.Load()
				helpers.Go(func() {
					who := probe(hctx, s.nc, g.cluster, step, l)
					probes <- probeResult{gen: g0, silent: who, at: time.Now()}
				})
			}
		}
		if still < staleAfter || cp == nil {
			continue
		}
		who := ""
		if last.gen == gen {
			who = last.silent
		}
		hint := "a NATS node lost, its Raft group electing a leader?"
		took := still.Round(10 * time.Millisecond)
		switch {
		case who != "":
			return answer(fmt.Sprintf("%s did not answer for %s (%s)", who, took, hint), false)
		case still < 2*staleAfter, step == stepSnapshotGet && still < 4*staleAfter:
		case step == stepSnapshots, step == stepSnapshotGet:
			return answer(fmt.Sprintf("the snapshot bucket did not answer for %s (a NATS node lost?)", took), false)
		case step == stepOpen:
			return answer(fmt.Sprintf("the event stream did not answer within %s (%s)", now.Sub(began).Round(10*time.Millisecond), hint), false)
		case step == stepBuckets:
			return answer(fmt.Sprintf("the lease and health buckets' replicas did not answer for %s (a NATS node lost?)", took), false)
		case step == stepFold:
			return answer(fmt.Sprintf("the event stream's reader got no record for %s (its consumer's server lost?)", took), false)
		}
		// Slow, but what it waits on answers: wait for it.
	}
}
