package natslog

// The reading session: Tail, Read and Watch, folded to the last seq the
// stream's leader holds, on ordered sessions of ephemeral consumers.

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
)

// Reader tuning: pull requests live pullExpiry and the server heartbeats
// every pullHeartbeat, so a consumer lost with its server is noticed within
// 2*pullHeartbeat (a reader whose own connection dropped starts over as
// soon as it is back: see session). A heartbeat costs one small message a
// second per idle reader.
const (
	pullBatch         = 1024
	pullExpiry        = 10 * time.Second
	pullHeartbeat     = time.Second
	consumerInactive  = 30 * time.Second
	readIdleCheck     = time.Second
	deleteTimeout     = time.Second
	stopTimeout       = time.Second
	maxReadRestarts   = 5
	restartBackoffMin = 50 * time.Millisecond
	// restartBackoffMax caps the pause between retries of a request
	// nobody answers (a reader's consumer, a batch while the stream elects
	// a leader). It was 2 s: a follower's reader that failed through a
	// 4-9 s election paused up to 2 s after it, and a new leader's
	// catch-up with it (nodeloss, the lease leader's node killed: termlog
	// 1.6 s beyond the later of its two elections). A retry is one small
	// request; a bounded Read still gives up after maxReadRestarts.
	restartBackoffMax = 500 * time.Millisecond
)

// state is the stream's state (first and last seq, message count).
//
// Stream info alone is not a read of the stream: a member of a replicated
// stream that sees its group leaderless (a node cut from its peers, or one
// rejoining after a partition) answers it from its own copy, which may be
// behind what a reader already saw (the chaos suite caught a status read
// going back from seq 25 to 22 that way). So the state must reach the last
// seq the stream's leader holds (leaderTail); a state behind it is asked
// again, and the leader's own answer comes.
func (l *Log) state(ctx context.Context) (jetstream.StreamState, error) {
	tail, _, err := l.leaderTail(ctx)
	if err != nil {
		return jetstream.StreamState{}, err
	}
	for {
		info, err := l.info(ctx)
		if err != nil {
			return jetstream.StreamState{}, err
		}
		if info.State.LastSeq >= tail {
			return info.State, nil
		}
		if werr := wait(ctx, restartBackoffMin); werr != nil {
			return jetstream.StreamState{}, fmt.Errorf("natslog: stream %s info: last seq %d, behind its leader's %d: %w", l.name, info.State.LastSeq, tail, werr)
		}
	}
}

// leaderTail is the seq of the stream's last message as its leader holds
// it: a message read (not direct: the stream denies direct gets) is
// answered by the stream leader only, and a member that sees no leader
// answers "not available", which is asked again. found is false when the
// stream holds no message (empty, or compacted to its tail): then only
// its state knows the last seq.
func (l *Log) leaderTail(ctx context.Context) (seq uint64, found bool, err error) {
	err = l.askAgain(ctx, leaderAsk, func(ctx context.Context) error {
		m, err := l.stream.GetLastMsgForSubject(ctx, l.subjectAll())
		switch {
		case errors.Is(err, jetstream.ErrMsgNotFound):
			seq, found = 0, false
			return nil
		case err != nil:
			return err
		}
		seq, found = m.Sequence, true
		return nil
	})
	if err != nil {
		return 0, false, fmt.Errorf("natslog: stream %s last message: %w", l.name, err)
	}
	return seq, found, nil
}

// info reads the stream's info, asking again while it is not answered.
func (l *Log) info(ctx context.Context) (*jetstream.StreamInfo, error) {
	var info *jetstream.StreamInfo
	err := l.askAgain(ctx, leaderAsk, func(ctx context.Context) (err error) {
		info, err = l.stream.Info(ctx)
		return err
	})
	if err != nil {
		return nil, fmt.Errorf("natslog: stream %s info: %w", l.name, err)
	}
	return info, nil
}

// Tail implements events.Log: the last seq as the stream's leader holds it
// (see state).
func (l *Log) Tail(ctx context.Context) (uint64, error) {
	seq, found, err := l.leaderTail(ctx)
	if err != nil || found {
		return seq, err
	}
	info, err := l.info(ctx) // no message: the state's last seq (0 when empty)
	if err != nil {
		return 0, err
	}
	return info.State.LastSeq, nil
}

// Read implements events.Log. fn runs on a goroutine of the JetStream
// client, one record at a time, in order, and never after Read returned.
// From above 1 it fails with events.ErrCompacted when seq from is no longer
// in the stream (purged), before fn sees anything.
func (l *Log) Read(ctx context.Context, from uint64, fn func(events.Record) error) error {
	from = max(from, 1)
	st, err := l.state(ctx)
	if err != nil {
		return err
	}
	if from > st.LastSeq {
		return nil
	}
	if err := l.checkHeld(from, st); err != nil || st.Msgs == 0 {
		return err
	}
	return l.consume(ctx, from, max(from, st.FirstSeq), st.LastSeq, fn)
}

// Watch implements events.Log; fn runs as Read's does, and it fails with
// events.ErrCompacted as Read does.
func (l *Log) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	from = max(from, 1)
	return l.consume(ctx, from, from, 0, fn)
}

// checkHeld fails with events.ErrCompacted when from (> 1, at most the last
// seq) is below the stream's first seq. Reading from 1 means reading from
// the first seq the stream holds, whatever it is.
func (l *Log) checkHeld(from uint64, st jetstream.StreamState) error {
	switch {
	case from <= 1:
		return nil
	case st.Msgs == 0:
		return l.compacted(from, fmt.Sprintf("it holds no record, its last seq is %d", st.LastSeq))
	case from < st.FirstSeq:
		return l.compacted(from, fmt.Sprintf("its first record is seq %d", st.FirstSeq))
	}
	return nil
}

// compacted is the error of a read that cannot start at seq from: it is
// gone from the stream (why says what is left).
func (l *Log) compacted(from uint64, why string) error {
	return fmt.Errorf("natslog: read %s from seq %d: %w (%s)", l.name, from, events.ErrCompacted, why)
}

// restartError asks consume for a new consumer after the last seq
// delivered; created says whether the failed session got its consumer, and
// lost whether that consumer is likely gone with its server or connection.
type restartError struct {
	err     error
	created bool
	lost    bool
}

func (e *restartError) Error() string { return "natslog: reader restart: " + e.err.Error() }
func (e *restartError) Unwrap() error { return e.err }

// consume delivers records from seq next in order to fn, up to until (0:
// forever). It runs ordered sessions, each on a fresh ephemeral consumer
// starting after the last record delivered; a session ends on a gap, a lost
// consumer or heartbeat, or a reconnect. Failing to create the first
// consumer is an error; later failures are retried with backoff (Read gives
// up after maxReadRestarts failures in a row).
//
// The first record a session delivers must be seq next (the stream holds
// consecutive seqs; one missing was purged), else it fails with
// events.ErrCompacted: except before the first record of a call from seq 1
// (from), which starts wherever the stream does.
func (l *Log) consume(ctx context.Context, from, next, until uint64, fn func(events.Record) error) error {
	backoff := restartBackoffMin
	failures := 0
	start := next
	for first := true; ; first = false {
		before := next
		exact := from > 1 || next != start
		err := l.session(ctx, &next, exact, until, fn)
		var rerr *restartError
		if !errors.As(err, &rerr) {
			return err
		}
		if l.nc.IsClosed() {
			return fmt.Errorf("natslog: read %s: %w: %w", l.name, nats.ErrConnectionClosed, rerr.err)
		}
		if errors.Is(rerr.err, errConsumerBack) {
			failures, backoff = 0, restartBackoffMin
			continue // back to a consumer at once
		}
		if next != before {
			failures, backoff = 0, restartBackoffMin
		} else {
			failures++
		}
		if first && !rerr.created || until > 0 && failures >= maxReadRestarts {
			return fmt.Errorf("natslog: read %s from seq %d: %w", l.name, next, rerr.err)
		}
		if err := wait(ctx, backoff); err != nil {
			return err
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

// session reads from *next on one consumer, advancing *next past every
// record handed to fn. It returns nil when until was reached, fn's or ctx's
// error as is, an error wrapping events.ErrCompacted when exact and seq
// *next is gone, and *restartError when a new consumer is needed.
//
// fn runs on the consumer's delivery goroutine (jetstream Consume: no
// timer, context or select per message, unlike an iterator's Next), one
// record at a time, in order, and never after session returned.
func (l *Log) session(ctx context.Context, next *uint64, exact bool, until uint64, fn func(events.Record) error) (err error) {
	// A reconnect is watched from before the consumer exists: the consumer
	// may have been on the server the connection lost (see await).
	reconnected := l.nc.StatusChanged(nats.CONNECTED)
	defer l.nc.RemoveStatusListener(reconnected)
	// Only a live reader (Watch) or a Read near its end may read by get
	// while no consumer can be made: a get is a round trip a record, so a
	// long Read by get would outlast its caller's bound (status answers
	// from a copy while no consumer can be made); a long Read waits for
	// its consumer, as long as ctx allows.
	mayGet := until == 0 || until-*next < getFallbackMax
	within := time.Duration(0)
	if mayGet {
		within = consumerFallbackAfter
	}
	cons, err := l.createConsumer(ctx, *next, within)
	var rerr *restartError
	if mayGet && errors.As(err, &rerr) && unanswered(rerr.err) {
		// No consumer can be made now (the meta group is likely electing
		// a leader): read from the stream's leader meanwhile.
		return l.readByGet(ctx, next, exact, until, fn)
	}
	if err != nil {
		return err
	}
	defer func() {
		var rerr *restartError
		if errors.As(err, &rerr) && rerr.lost {
			// Its server is likely gone: a delete would wait deleteTimeout
			// for an answer before the next consumer is made. If it lives,
			// the server drops it after consumerInactive.
			return
		}
		l.deleteConsumer(ctx, cons.CachedInfo().Name)
	}()
	// The server starts a consumer at the stream's first seq when the one
	// asked for is gone: its info says where (delivered = start - 1).
	if start := cons.CachedInfo().Delivered.Stream + 1; exact && start != *next {
		return l.compacted(*next, fmt.Sprintf("its first record is seq %d", start))
	}
	d := &delivery{log: l, next: next, exact: exact, until: until, fn: fn, end: make(chan error, 1)}
	stop, err := d.consume(cons)
	if err != nil {
		return err
	}
	defer stop()
	return l.await(ctx, d, reconnected, until)
}

// createConsumer makes a reader's ephemeral consumer starting at seq
// start, asking again while it is not answered, for at most within (0:
// as long as ctx allows). It fails with ctx's error when ctx is done, else
// with *restartError.
func (l *Log) createConsumer(ctx context.Context, start uint64, within time.Duration) (jetstream.Consumer, error) {
	defer l.createWaits()()
	cfg := readerConfig(start)
	var cons jetstream.Consumer
	cctx, cancel := ctx, context.CancelFunc(func() {})
	if within > 0 {
		cctx, cancel = context.WithTimeout(ctx, within)
	}
	defer cancel()
	err := l.askAgain(cctx, requestAttempt, func(ctx context.Context) (err error) {
		cons, err = l.stream.CreateConsumer(ctx, cfg)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return nil, ctx.Err()
		}
		return nil, &restartError{err: fmt.Errorf("create consumer: %w", err)}
	}
	return cons, nil
}

// createWaits records a reader's consumer create from now until the
// returned func is called (see ConsumerWait).
func (l *Log) createWaits() (done func()) {
	l.createMu.Lock()
	if l.waiting == 0 {
		l.creating = time.Now().UnixNano()
	}
	l.waiting++
	l.createMu.Unlock()
	return func() {
		l.createMu.Lock()
		l.waiting--
		if l.waiting == 0 {
			l.creating = 0
		}
		l.createMu.Unlock()
	}
}

// ConsumerWait is how long a reader of this Log has been waiting for its
// consumer to be made (0: none waits). A create is answered in
// milliseconds on a healthy cluster; one that waits is the JetStream meta
// leader not answering, or answering for a server that was lost (the
// consumer placed on it): what a long Read waits on after a node's loss,
// while account info and the stream's leader answer. status's watchdog
// counts it as a silent leader.
func (l *Log) ConsumerWait() time.Duration {
	l.createMu.Lock()
	defer l.createMu.Unlock()
	if l.waiting == 0 {
		return 0
	}
	return time.Since(time.Unix(0, l.creating))
}

// readerConfig is a reader's consumer starting at seq start.
func readerConfig(start uint64) jetstream.ConsumerConfig {
	return jetstream.ConsumerConfig{
		Name:              consumerName(),
		Description:       "termlog reader",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       start,
		AckPolicy:         jetstream.AckNonePolicy,
		ReplayPolicy:      jetstream.ReplayInstantPolicy,
		InactiveThreshold: consumerInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
}

// await waits for the session's outcome: the delivery's end, ctx done, a
// reconnect, or (Read, until > 0) no record left below until once the
// consumer has been quiet for readIdleCheck.
func (l *Log) await(ctx context.Context, d *delivery, reconnected <-chan nats.Status, until uint64) error {
	var idle <-chan time.Time
	if until > 0 {
		t := time.NewTicker(readIdleCheck)
		defer t.Stop()
		idle = t.C
	}
	for {
		select {
		case err := <-d.end:
			return err
		case <-ctx.Done():
			return ctx.Err()
		case <-reconnected:
			// The connection was lost and is back. The consumer lived on
			// one server; if it was the one lost, it is gone, and the
			// client's own pull on the new connection would only be
			// noticed unanswered after two missed heartbeats. Start over
			// now (a consumer that survived costs one creation).
			return &restartError{errors.New("connection reconnected"), true, true}
		case <-idle:
			if done, err := l.idleCheck(ctx, d, until); done || err != nil {
				return err
			}
		}
	}
}

// idleCheck: quiet for a while, are the records left below until gone
// (purged after Read took the tail)? done with a nil error is the end of
// the read.
func (l *Log) idleCheck(ctx context.Context, d *delivery, until uint64) (done bool, err error) {
	from, quiet, exact := d.quiet()
	if !quiet {
		return false, nil
	}
	done, err = l.noneLeft(ctx, from, until)
	switch {
	case err != nil:
		return true, err
	case done && exact:
		return true, l.compacted(from, fmt.Sprintf("no record is left up to seq %d", until))
	}
	return done, nil
}

// noneLeft reports whether the stream holds no record in [next, until].
func (l *Log) noneLeft(ctx context.Context, next, until uint64) (bool, error) {
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	m, err := l.getMsg(ctx, next, jetstream.WithGetMsgSubject(l.subjectAll()))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, &restartError{fmt.Errorf("look up seq %d: %w", next, err), true, false}
	}
	return m.Sequence > until, nil
}

// getMsg reads the message at seq (a read: safe to ask again), asking
// again while it is not answered, until reqCtx's deadline.
func (l *Log) getMsg(ctx context.Context, seq uint64, opts ...jetstream.GetMsgOpt) (*jetstream.RawStreamMsg, error) {
	var m *jetstream.RawStreamMsg
	err := l.askAgain(ctx, leaderAsk, func(ctx context.Context) (err error) {
		m, err = l.stream.GetMsg(ctx, seq, opts...)
		return err
	})
	return m, err
}

// deleteConsumer removes a reader's consumer; if that fails, the server
// removes it after consumerInactive.
func (l *Log) deleteConsumer(ctx context.Context, name string) {
	if !l.nc.IsConnected() {
		return
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), deleteTimeout)
	defer cancel()
	_ = l.stream.DeleteConsumer(ctx, name)
}

// consumerName names a reader's consumer: random, so that readers never
// share one, and chosen before the first create request, so that asking
// again makes no second consumer.
func consumerName() string { return "termlog-reader-" + rand.Text() }

// Replica is one server's copy of the stream as the stream's leader sees
// it (jetstream.PeerInfo).
type Replica struct {
	Name     string
	Current  bool
	Offline  bool
	LastSeen time.Duration // since the leader last heard from it
	Lag      uint64
	// Unheard: the leader has not heard from it since it took over the
	// stream; LastSeen is then how long it has led.
	Unheard bool
}

// Replicas asks the stream's leader (one stream info, asked again while it
// is not answered, until ctx ends) who leads the stream and how it sees
// the other replicas. A stream of one replica has none.
func (l *Log) Replicas(ctx context.Context) (leader string, replicas []Replica, err error) {
	info, err := l.info(ctx)
	if err != nil {
		return "", nil, err
	}
	ci := info.Cluster
	if ci == nil {
		return "", nil, nil
	}
	for _, p := range ci.Replicas {
		if p == nil {
			continue
		}
		r := Replica{Name: p.Name, Current: p.Current, Offline: p.Offline, LastSeen: p.Active, Lag: p.Lag}
		// Active 0 and not current: this leader has not heard from it
		// since it took over (a replica on the node the old leader died
		// with): silent for as long as it has led.
		if p.Active == 0 && !p.Current && ci.LeaderSince != nil {
			r.LastSeen, r.Unheard = max(time.Since(*ci.LeaderSince), 0), true
		}
		replicas = append(replicas, r)
	}
	return ci.Leader, replicas, nil
}
