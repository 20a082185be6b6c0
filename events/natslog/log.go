// Package natslog is the JetStream implementation of events.Log, and an
// embedded NATS server to run it on.
//
// One stream, TERMLOG_<CLUSTER>, holds every event of a cluster on subjects
// <cluster>.ev.<type>. Appends are fenced by Nats-Expected-Last-Sequence and
// made idempotent by Nats-Msg-Id = events.MsgID(term, seq).
package natslog

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
)

// Defaults of Config.
const (
	DefaultCluster        = "termlog"
	DefaultReplicas       = 1
	DefaultDuplicates     = 2 * time.Minute
	DefaultRequestTimeout = 5 * time.Second
	DefaultOpenTimeout    = 30 * time.Second
)

// JetStream API error codes of a failed Nats-Expected-Last-Sequence check
// (server JSStreamWrongLastSequenceErrF and JSStreamWrongLastSequenceConstantErr).
const (
	codeWrongLastSeq         jetstream.ErrorCode = 10071
	codeWrongLastSeqConstant jetstream.ErrorCode = 10164
	// codeReplicasNotSupported: replicas > 1 asked of a standalone server
	// (JSStreamReplicasNotSupportedErr); retrying cannot help.
	codeReplicasNotSupported jetstream.ErrorCode = 10074
)

// Reader tuning: pull requests live pullExpiry and the server heartbeats
// every pullHeartbeat, so a lost consumer is noticed within 2*pullHeartbeat.
const (
	pullBatch         = 256
	pullExpiry        = 10 * time.Second
	pullHeartbeat     = 2 * time.Second
	consumerInactive  = 30 * time.Second
	readIdleCheck     = time.Second
	deleteTimeout     = time.Second
	maxReadRestarts   = 5
	restartBackoffMin = 50 * time.Millisecond
	restartBackoffMax = 2 * time.Second
)

// Config configures a Log. The zero value is the default.
type Config struct {
	// Cluster names the stream (TERMLOG_<CLUSTER>) and prefixes its
	// subjects; letters, digits, '-' and '_' only. Default "termlog".
	Cluster string
	// Replicas of the stream; default 1.
	Replicas int
	// Duplicates is the stream's Msg-Id dedupe window; default 2m.
	Duplicates time.Duration
	// RequestTimeout bounds each publish and API request made with a
	// context that has no deadline; default 5s.
	RequestTimeout time.Duration
	// OpenTimeout bounds Open when its context has no deadline; default 30s.
	OpenTimeout time.Duration
	// Bind makes Open never create the stream, only wait for it: for the
	// roles that may only read it (stores, status, replay), whose
	// credentials do not allow creating streams.
	Bind bool
}

func (c Config) withDefaults() Config {
	if c.Cluster == "" {
		c.Cluster = DefaultCluster
	}
	if c.Replicas <= 0 {
		c.Replicas = DefaultReplicas
	}
	if c.Duplicates <= 0 {
		c.Duplicates = DefaultDuplicates
	}
	if c.RequestTimeout <= 0 {
		c.RequestTimeout = DefaultRequestTimeout
	}
	if c.OpenTimeout <= 0 {
		c.OpenTimeout = DefaultOpenTimeout
	}
	return c
}

// StreamName is the name of the stream of cluster.
func StreamName(cluster string) string { return "TERMLOG_" + strings.ToUpper(cluster) }

func validCluster(c string) error {
	if c == "" {
		return errors.New("empty cluster name")
	}
	for _, r := range c {
		if !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_') {
			return fmt.Errorf("cluster name %q: only letters, digits, '-' and '_' are allowed", c)
		}
	}
	return nil
}

// Log is an events.Log on a JetStream stream. It is safe for concurrent use.
// It does not own the connection: close it after the last call returned.
type Log struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	name    string
	cluster string
	cfg     Config
}

var _ events.Log = (*Log)(nil)

// configError is a stream configuration Open will not work with; retrying
// does not help.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

// Open creates the cluster's stream, or binds to it when it exists (checking
// that its configuration keeps every event). While JetStream is not ready
// (no meta leader yet, no responders) it retries with backoff until ctx is
// done, or Config.OpenTimeout when ctx has no deadline.
func Open(ctx context.Context, nc *nats.Conn, cfg Config) (*Log, error) {
	cfg = cfg.withDefaults()
	if err := validCluster(cfg.Cluster); err != nil {
		return nil, fmt.Errorf("natslog: open: %w", err)
	}
	js, err := jetstream.New(nc, jetstream.WithDefaultTimeout(cfg.RequestTimeout))
	if err != nil {
		return nil, fmt.Errorf("natslog: open: %w", err)
	}
	l := &Log{nc: nc, js: js, name: StreamName(cfg.Cluster), cluster: cfg.Cluster, cfg: cfg}
	want := jetstream.StreamConfig{
		Name:        l.name,
		Description: "termlog events of cluster " + cfg.Cluster,
		Subjects:    []string{l.subjectAll()},
		Retention:   jetstream.LimitsPolicy,
		Storage:     jetstream.FileStorage,
		Replicas:    cfg.Replicas,
		Duplicates:  cfg.Duplicates,
		AllowDirect: false, // a direct get may be served by a stale replica
	}
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, cfg.OpenTimeout)
		defer cancel()
	}
	backoff := restartBackoffMin
	for attempt := 1; ; attempt++ {
		st, err := l.openStream(ctx, want)
		if err == nil {
			l.stream = st
			return l, nil
		}
		var ce *configError
		if errors.As(err, &ce) || nc.IsClosed() {
			return nil, fmt.Errorf("natslog: open stream %s: %w", l.name, err)
		}
		if werr := wait(ctx, backoff); werr != nil {
			return nil, fmt.Errorf("natslog: open stream %s: %w after %d attempts, last error: %w", l.name, werr, attempt, err)
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

func (l *Log) openStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.RequestTimeout)
	defer cancel()
	st, err := l.js.Stream(ctx, want.Name)
	if errors.Is(err, jetstream.ErrStreamNotFound) && l.cfg.Bind {
		return nil, fmt.Errorf("%w (waiting for a meta replica to create it)", err)
	}
	if errors.Is(err, jetstream.ErrStreamNotFound) {
		st, err = l.js.CreateStream(ctx, want)
		if errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
			// Created meanwhile by someone else, maybe differently.
			st, err = l.js.Stream(ctx, want.Name)
		}
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) && apiErr.ErrorCode == codeReplicasNotSupported {
		return nil, &configError{msg: fmt.Sprintf("%d replicas need a clustered JetStream, and this NATS server is standalone: use replicas 1, or a 3-node NATS cluster (%v)", want.Replicas, err)}
	}
	if err != nil {
		return nil, err
	}
	got := st.CachedInfo().Config
	if err := checkConfig(got, want); err != nil {
		return nil, err
	}
	if got.Replicas < want.Replicas {
		// Binding it would silently run with less redundancy than asked.
		return nil, &configError{msg: fmt.Sprintf("existing stream %s has %d replicas, %d asked: raise its replicas (nats stream edit %s --replicas %d) or ask for %d",
			got.Name, got.Replicas, want.Replicas, got.Name, want.Replicas, got.Replicas)}
	}
	return st, nil
}

// checkConfig refuses a stream that could lose events, miss ours or serve
// stale reads.
func checkConfig(got, want jetstream.StreamConfig) error {
	var bad []string
	hasSubject := false
	for _, s := range got.Subjects {
		hasSubject = hasSubject || s == want.Subjects[0]
	}
	if !hasSubject {
		bad = append(bad, fmt.Sprintf("subjects %q lack %q", got.Subjects, want.Subjects[0]))
	}
	if got.Retention != jetstream.LimitsPolicy {
		bad = append(bad, "retention "+got.Retention.String())
	}
	if got.MaxMsgs > 0 || got.MaxBytes > 0 || got.MaxAge > 0 || got.MaxMsgsPerSubject > 0 {
		bad = append(bad, fmt.Sprintf("limits drop events (max msgs %d, bytes %d, age %s, per subject %d)",
			got.MaxMsgs, got.MaxBytes, got.MaxAge, got.MaxMsgsPerSubject))
	}
	if got.AllowDirect {
		bad = append(bad, "allow_direct (reads may be stale)")
	}
	if got.Sealed {
		bad = append(bad, "sealed")
	}
	if len(bad) == 0 {
		return nil
	}
	return &configError{msg: "existing stream " + got.Name + " is unusable: " + strings.Join(bad, "; ")}
}

// Stream is the stream's name.
func (l *Log) Stream() string { return l.name }

// Subject is the subject events of type typ are published on.
func (l *Log) Subject(typ string) string { return l.cluster + ".ev." + typ }

func (l *Log) subjectAll() string { return l.cluster + ".ev.>" }

// reqCtx bounds one request: ctx as is when it has a deadline, else
// Config.RequestTimeout.
func (l *Log) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, l.cfg.RequestTimeout)
}

// Append implements events.Log. Event i is published with
// Nats-Expected-Last-Sequence expectedLast+i and Nats-Msg-Id
// events.MsgID(term, expectedLast+1+i). An error that does not wrap
// events.ErrFenced leaves the outcome of the failed event unknown: retry the
// same call, or re-read the log.
func (l *Log) Append(ctx context.Context, expectedLast uint64, evs ...events.Event) (uint64, error) {
	msgs := make([]*nats.Msg, len(evs))
	for i, ev := range evs {
		body, err := events.Encode(ev)
		if err != nil {
			return 0, fmt.Errorf("natslog: append: %w", err)
		}
		msgs[i] = &nats.Msg{Subject: l.Subject(ev.Type()), Data: body, Header: nats.Header{}}
	}
	last := expectedLast
	for i, m := range msgs {
		seq := expectedLast + 1 + uint64(i)
		if err := l.publish(ctx, m, seq, events.MsgID(evs[i].Term, seq)); err != nil {
			return last, err
		}
		last = seq
	}
	return last, nil
}

// publish stores m at seq with message id id, or finds it already there.
//
// The message id alone does not prove that seq holds m: ids are
// <term>-<seq>, so a leader that decides again on a stale view (after an
// append whose outcome it did not learn) sends a different event under the
// id its earlier attempt was stored with. Only m's own bytes at seq are
// "stored by an earlier attempt"; anything else there is fenced.
func (l *Log) publish(ctx context.Context, m *nats.Msg, seq uint64, id string) error {
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	ack, err := l.js.PublishMsg(ctx, m,
		jetstream.WithExpectStream(l.name),
		jetstream.WithExpectLastSequence(seq-1),
		jetstream.WithMsgID(id))
	switch {
	case err == nil && ack.Sequence != seq:
		// A duplicate ack (a clustered stream checks the Msg-Id before the
		// expected seq) names the seq the id was stored at.
		return fmt.Errorf("natslog: append %s: %w: acked at seq %d (duplicate %v), want %d",
			id, events.ErrFenced, ack.Sequence, ack.Duplicate, seq)
	case err == nil && !ack.Duplicate:
		return nil
	case err == nil:
		// Our id is at seq (clustered: Msg-Id checked first); is our event?
		return l.checkStored(ctx, m, seq, id, fmt.Errorf("duplicate ack at seq %d", seq))
	case isWrongLastSeq(err):
		// A standalone stream checks the expected last seq before the
		// Msg-Id, so the retry of an append that landed is refused too.
		return l.checkStored(ctx, m, seq, id, err)
	default:
		return fmt.Errorf("natslog: append %s at seq %d, outcome unknown: %w", id, seq, err)
	}
}

// checkStored decides an append that the server did not store now (why):
// nil if seq holds m's id and m's bytes (an earlier attempt stored it),
// ErrFenced if seq holds anything else or nothing, and an outcome-unknown
// error if seq cannot be read.
func (l *Log) checkStored(ctx context.Context, m *nats.Msg, seq uint64, id string, why error) error {
	stored, err := l.stream.GetMsg(ctx, seq)
	switch {
	case err == nil && stored.Header.Get(jetstream.MsgIDHeader) == id && stored.Subject == m.Subject && bytes.Equal(stored.Data, m.Data):
		return nil // stored by an earlier attempt
	case err == nil && stored.Header.Get(jetstream.MsgIDHeader) == id:
		return fmt.Errorf("natslog: append %s: %w: seq %d holds another event under the same msg id (%w)",
			id, events.ErrFenced, seq, why)
	case err == nil:
		return fmt.Errorf("natslog: append %s: %w: seq %d holds %q (%w)",
			id, events.ErrFenced, seq, stored.Header.Get(jetstream.MsgIDHeader), why)
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return fmt.Errorf("natslog: append %s: %w: seq %d not stored (%w)", id, events.ErrFenced, seq, why)
	default:
		return fmt.Errorf("natslog: append %s at seq %d, outcome unknown: %v; reading seq %d failed: %w", id, seq, why, seq, err)
	}
}

func isWrongLastSeq(err error) bool {
	var apiErr *jetstream.APIError
	return errors.As(err, &apiErr) &&
		(apiErr.ErrorCode == codeWrongLastSeq || apiErr.ErrorCode == codeWrongLastSeqConstant)
}

// infoAttempt bounds one stream info request. A clustered stream that is
// electing a leader (its leader's server went away) does not answer an info
// request at all, however long one waits; a new request is answered as soon
// as the election is over. So state asks again every infoAttempt until
// reqCtx's deadline rather than waiting for it on a request nobody answers.
const infoAttempt = time.Second

func (l *Log) state(ctx context.Context) (jetstream.StreamState, error) {
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	for {
		actx, acancel := context.WithTimeout(ctx, infoAttempt)
		info, err := l.stream.Info(actx)
		acancel()
		if err == nil {
			return info.State, nil
		}
		unanswered := errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders)
		if !unanswered || ctx.Err() != nil || l.nc.IsClosed() {
			return jetstream.StreamState{}, fmt.Errorf("natslog: stream %s info: %w", l.name, err)
		}
		if werr := wait(ctx, restartBackoffMin); werr != nil {
			return jetstream.StreamState{}, fmt.Errorf("natslog: stream %s info: %w", l.name, err)
		}
	}
}

// Tail implements events.Log.
func (l *Log) Tail(ctx context.Context) (uint64, error) {
	st, err := l.state(ctx)
	return st.LastSeq, err
}

// Read implements events.Log.
func (l *Log) Read(ctx context.Context, from uint64, fn func(events.Record) error) error {
	from = max(from, 1)
	st, err := l.state(ctx)
	if err != nil {
		return err
	}
	if from > st.LastSeq || st.Msgs == 0 {
		return nil
	}
	return l.consume(ctx, max(from, st.FirstSeq), st.LastSeq, fn)
}

// Watch implements events.Log.
func (l *Log) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	return l.consume(ctx, max(from, 1), 0, fn)
}

// restartError asks consume for a new consumer after the last seq
// delivered; created says whether the failed session got its consumer.
type restartError struct {
	err     error
	created bool
}

func (e *restartError) Error() string { return "natslog: reader restart: " + e.err.Error() }
func (e *restartError) Unwrap() error { return e.err }

// consume delivers records from seq next in order to fn, up to until (0:
// forever). It runs ordered sessions, each on a fresh ephemeral consumer
// starting after the last record delivered; a session ends on a gap, a lost
// consumer or heartbeat, or a reconnect. Failing to create the first
// consumer is an error; later failures are retried with backoff (Read gives
// up after maxReadRestarts failures in a row).
func (l *Log) consume(ctx context.Context, next, until uint64, fn func(events.Record) error) error {
	backoff := restartBackoffMin
	failures := 0
	for first := true; ; first = false {
		before := next
		err := l.session(ctx, &next, until, fn)
		var rerr *restartError
		if !errors.As(err, &rerr) {
			return err
		}
		if l.nc.IsClosed() {
			return fmt.Errorf("natslog: read %s: %w: %w", l.name, nats.ErrConnectionClosed, rerr.err)
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
// error as is, and *restartError when a new consumer is needed.
func (l *Log) session(ctx context.Context, next *uint64, until uint64, fn func(events.Record) error) error {
	cctx, cancel := l.reqCtx(ctx)
	cons, err := l.stream.CreateConsumer(cctx, jetstream.ConsumerConfig{
		Description:       "termlog reader",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       *next,
		AckPolicy:         jetstream.AckNonePolicy,
		ReplayPolicy:      jetstream.ReplayInstantPolicy,
		InactiveThreshold: consumerInactive,
		MemoryStorage:     true,
		Replicas:          1,
	})
	cancel()
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &restartError{err: fmt.Errorf("create consumer: %w", err)}
	}
	defer l.deleteConsumer(ctx, cons.CachedInfo().Name)
	it, err := cons.Messages(
		jetstream.PullMaxMessages(pullBatch),
		jetstream.PullExpiry(pullExpiry),
		jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.WithMessagesErrOnMissingHeartbeat(true))
	if err != nil {
		return &restartError{fmt.Errorf("consume: %w", err), true}
	}
	defer it.Stop()
	var dseq uint64 // consumer seq of the last message, for gap detection
	for {
		wctx, wcancel := ctx, context.CancelFunc(func() {})
		if until > 0 {
			wctx, wcancel = context.WithTimeout(ctx, readIdleCheck)
		}
		msg, err := it.Next(jetstream.NextContext(wctx))
		wcancel()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if until > 0 && errors.Is(err, context.DeadlineExceeded) {
				// Quiet for a while: are the records left below until gone
				// (deleted or purged after Read took the tail)?
				if done, err := l.noneLeft(ctx, *next, until); err != nil || done {
					return err
				}
				continue
			}
			return &restartError{fmt.Errorf("next: %w", err), true}
		}
		meta, err := msg.Metadata()
		if err != nil {
			return &restartError{fmt.Errorf("metadata: %w", err), true}
		}
		if meta.Sequence.Consumer != dseq+1 || meta.Sequence.Stream < *next {
			return &restartError{fmt.Errorf("out of order: consumer seq %d after %d, stream seq %d, want >= %d",
				meta.Sequence.Consumer, dseq, meta.Sequence.Stream, *next), true}
		}
		dseq = meta.Sequence.Consumer
		seq := meta.Sequence.Stream
		if until > 0 && seq > until {
			return nil
		}
		*next = seq + 1
		if err := fn(events.Record{Seq: seq, Data: bytes.Clone(msg.Data())}); err != nil {
			return err
		}
		if until > 0 && seq >= until {
			return nil
		}
	}
}

// noneLeft reports whether the stream holds no record in [next, until].
func (l *Log) noneLeft(ctx context.Context, next, until uint64) (bool, error) {
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	m, err := l.stream.GetMsg(ctx, next, jetstream.WithGetMsgSubject(l.subjectAll()))
	switch {
	case errors.Is(err, jetstream.ErrMsgNotFound):
		return true, nil
	case err != nil:
		return false, &restartError{fmt.Errorf("look up seq %d: %w", next, err), true}
	}
	return m.Sequence > until, nil
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

// wait sleeps d or until ctx is done.
func wait(ctx context.Context, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		return nil
	}
}
