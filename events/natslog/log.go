// Package natslog is the JetStream implementation of events.Log: fenced
// appends, reads and watches, and the snapshot object store next to the
// stream. The embedded server it runs on in up, nats and the tests, with the
// roles' permissions and TLS generation, is package natsserver.
//
// One stream, TERMLOG_<CLUSTER>, holds every event of a cluster on subjects
// <cluster>.ev.<type>. Appends are fenced by Nats-Expected-Last-Sequence and
// made idempotent by Nats-Msg-Id = events.MsgID(event, seq).
package natslog

import (
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/wire"
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
	// A failed Nats-Expected-Last-Msg-Id check (JSStreamWrongLastMsgIDErrF):
	// the event before this one of a pipelined append is not the last.
	codeWrongLastMsgID jetstream.ErrorCode = 10070
	// codeReplicasNotSupported: replicas > 1 asked of a standalone server
	// (JSStreamReplicasNotSupportedErr); retrying cannot help.
	codeReplicasNotSupported jetstream.ErrorCode = 10074
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
func StreamName(cluster string) string { return wire.Stream(cluster) }

func validCluster(c string) error { return wire.ValidCluster(c) }

// Log is an events.Log on a JetStream stream. It is safe for concurrent use.
// It does not own the connection: close it after the last call returned.
type Log struct {
	nc      *nats.Conn
	js      jetstream.JetStream
	stream  jetstream.Stream
	name    string
	cluster string
	cfg     Config
	// replicated: the stream has more than one replica, so even a single
	// event of AppendAsync is appended before it returns (see Append).
	replicated bool

	mu       sync.Mutex
	lastID   string    // msg id of the last event this Log stored,
	lastSeq  uint64    // at this seq
	lastPipe *pipeline // the last single event AppendAsync sent
}

var _ events.Log = (*Log)(nil)

// configError is a stream or bucket configuration Open will not work with
// (or a bucket a reader may not create); retrying does not help. err, if
// any, is the cause.
type configError struct {
	msg string
	err error
}

func (e *configError) Error() string { return e.msg }
func (e *configError) Unwrap() error { return e.err }

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
	want := StreamConfig(cfg)
	err = l.openRetrying(ctx, "open stream "+l.name, func(ctx context.Context) error {
		st, err := l.openStream(ctx, want)
		if err != nil {
			return err
		}
		l.stream = st
		l.replicated = st.CachedInfo().Config.Replicas > 1
		return nil
	})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// The event stream's limits. The stream is the cluster's only memory, so
// it keeps every event: no limit on the number of messages, bytes or age
// (the server's JetStream storage, ServerConfig.MaxStore, is the bound;
// when it is full the server refuses appends, and nothing stored is lost),
// and it discards new events rather than old ones should a limit ever be
// set. Only the size of one event is bounded: MaxEventBytes.
const (
	// MaxEventBytes is the largest encoded event (JSON body) Append
	// sends: about a thousand times an ordinary event (a worker.registered
	// is about 200 bytes), well inside a JSONL export line
	// (events.MaxLineBytes) and NATS's default max_payload (1 MiB). A
	// larger event fails before anything is sent.
	MaxEventBytes = 256 << 10
	// maxHeaderBytes is the room the stream's message size limit leaves
	// for an event's headers (Msg-Id, expected last seq and msg id, batch
	// headers: about 200 bytes).
	maxHeaderBytes = 4 << 10
	// StreamMaxMsgSize is the stream's max_msg_size: body and headers.
	StreamMaxMsgSize = MaxEventBytes + maxHeaderBytes
)

// StreamConfig is the configuration Open gives the stream it creates:
// file storage, cfg's replicas and dedupe window, no direct gets (a direct
// get may be served by a stale replica), atomic batches (see Append),
// message deletes and purges denied (an append-only log: the server
// refuses them from every user, admin included, and a stream update can
// never allow them again), and the limits above.
func StreamConfig(cfg Config) jetstream.StreamConfig {
	cfg = cfg.withDefaults()
	return jetstream.StreamConfig{
		Name:               StreamName(cfg.Cluster),
		Description:        "termlog events of cluster " + cfg.Cluster,
		Subjects:           []string{wire.EventsWildcard(cfg.Cluster)},
		Retention:          jetstream.LimitsPolicy,
		Storage:            jetstream.FileStorage,
		Replicas:           cfg.Replicas,
		Duplicates:         cfg.Duplicates,
		AllowDirect:        false,
		AllowAtomicPublish: true,
		DenyDelete:         true,
		DenyPurge:          true,
		Discard:            jetstream.DiscardNew,
		MaxMsgs:            -1,
		MaxBytes:           -1,
		MaxAge:             0, // forever
		MaxMsgsPerSubject:  -1,
		MaxMsgSize:         StreamMaxMsgSize,
	}
}

// openRetrying runs try until it succeeds, with backoff, while JetStream is
// not ready: until ctx is done (Config.OpenTimeout when ctx has no
// deadline), the connection is closed, or try fails with a *configError,
// which retrying cannot mend. what names the operation in the error.
func (l *Log) openRetrying(ctx context.Context, what string, try func(context.Context) error) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, l.cfg.OpenTimeout)
		defer cancel()
	}
	backoff := restartBackoffMin
	for attempt := 1; ; attempt++ {
		err := try(ctx)
		if err == nil {
			return nil
		}
		var ce *configError
		if errors.As(err, &ce) || l.nc.IsClosed() {
			return fmt.Errorf("natslog: %s: %w", what, err)
		}
		if werr := wait(ctx, backoff); werr != nil {
			return fmt.Errorf("natslog: %s: %w after %d attempts, last error: %w", what, werr, attempt, err)
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}

func (l *Log) openStream(ctx context.Context, want jetstream.StreamConfig) (jetstream.Stream, error) {
	ctx, cancel := l.attemptCtx(ctx)
	defer cancel()
	// The info request is bounded as state's are (see requestAttempt):
	// a stream electing a leader leaves it unanswered, and a reader that
	// only binds should not wait a whole attempt for that.
	ictx, icancel := context.WithTimeout(ctx, requestAttempt)
	st, err := l.js.Stream(ictx, want.Name)
	icancel()
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
	if missing := upgrades(got); len(missing) > 0 && !l.cfg.Bind {
		// A stream made by an older termlog: give it what this one needs.
		// This changes nothing stored. A reader (Bind) never appends and
		// may not update streams: it uses the stream as it is.
		got.AllowAtomicPublish = true
		got.DenyDelete, got.DenyPurge = true, true
		if got.MaxMsgSize <= 0 {
			got.MaxMsgSize = want.MaxMsgSize
		}
		got.Discard = jetstream.DiscardNew
		if st, err = l.js.UpdateStream(ctx, got); err != nil {
			return nil, l.upgradeError(got.Name, missing, err)
		}
	}
	return st, nil
}

// upgrades lists what an existing stream lacks of StreamConfig that Open
// sets on it (the rest checkConfig requires).
func upgrades(got jetstream.StreamConfig) []string {
	var out []string
	if !got.AllowAtomicPublish {
		out = append(out, "atomic batches")
	}
	if !got.DenyDelete {
		out = append(out, "deny delete")
	}
	if !got.DenyPurge {
		out = append(out, "deny purge")
	}
	if got.MaxMsgSize <= 0 {
		out = append(out, fmt.Sprintf("max msg size %d", StreamMaxMsgSize))
	}
	if got.Discard != jetstream.DiscardNew {
		out = append(out, "discard new")
	}
	return out
}

// upgradeError is the error of an update of the existing stream name that
// failed with err. The meta role may create the stream but not update it
// (an update could set limits that drop events): its request is refused as
// a permissions violation, which the client sees only as no answer.
// Retrying mends neither that nor a server refusing the new settings. (The
// refusal's error is not wrapped: it is the request's timeout.)
func (l *Log) upgradeError(name string, missing []string, err error) error {
	what := fmt.Sprintf("existing stream %s lacks %s (made by an older termlog)", name, strings.Join(missing, ", "))
	last := l.nc.LastError()
	var apiErr *jetstream.APIError
	switch {
	case errors.Is(last, nats.ErrPermissionViolation) && strings.Contains(last.Error(), "STREAM.UPDATE."+name):
		return &configError{msg: fmt.Sprintf("%s, and this connection may not update it (%v): update it once with the admin key, setting deny_delete, deny_purge, allow_atomic, discard new and max_msg_size %d (nats stream edit %s)",
			what, last, StreamMaxMsgSize, name)}
	case errors.As(err, &apiErr):
		return &configError{msg: fmt.Sprintf("%s, and the server refused the update: %v", what, err), err: err}
	}
	return fmt.Errorf("%s: update: %w", what, err)
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
	if got.MaxMsgSize > 0 && got.MaxMsgSize < want.MaxMsgSize {
		bad = append(bad, fmt.Sprintf("max msg size %d refuses events up to %d bytes", got.MaxMsgSize, want.MaxMsgSize))
	}
	if got.PersistMode == jetstream.AsyncPersistMode {
		bad = append(bad, "async persist mode (acknowledged events may not be written yet)")
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
func (l *Log) Subject(typ string) string { return wire.EventSubject(l.cluster, typ) }

func (l *Log) subjectAll() string { return wire.EventsWildcard(l.cluster) }

// reqCtx bounds one request: ctx as is when it has a deadline, else
// Config.RequestTimeout.
func (l *Log) reqCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, l.cfg.RequestTimeout)
}

// requestAttempt bounds one stream info or consumer create request. A
// clustered stream that is electing a leader (its leader's server went
// away) does not answer an info request at all, however long one waits; a
// new request is answered as soon as the election is over. The same goes
// for creating a reader's consumer while the JetStream meta leader is
// elected. So state and session ask again every requestAttempt until
// reqCtx's deadline rather than waiting for it on a request nobody answers.
// A create asked again names the same consumer, so it makes no second one.
const requestAttempt = time.Second

// askAgain makes the request req, each attempt bounded by attempt, asking
// again while it is not answered, until reqCtx's deadline; it returns req's
// last error.
func (l *Log) askAgain(ctx context.Context, attempt time.Duration, req func(context.Context) error) error {
	ctx, cancel := l.reqCtx(ctx)
	defer cancel()
	return AskAgain(ctx, l.nc, attempt, req)
}

// AskAgain makes the NATS request (or requests) req, each attempt bounded
// by attempt, asking again while it goes unanswered (nobody answered in
// time, no responders, or a cluster saying it is electing a leader) until
// ctx is done or nc is closed; it returns req's last error. Clustered
// JetStream may leave a request unanswered while it elects a leader and
// answers the next one once it has: use it for every request that is
// safe to repeat, with ctx bounding the whole.
func AskAgain(ctx context.Context, nc *nats.Conn, attempt time.Duration, req func(context.Context) error) error {
	for {
		actx, acancel := context.WithTimeout(ctx, attempt)
		err := req(actx)
		acancel()
		if err == nil {
			return nil
		}
		if !unanswered(err) || ctx.Err() != nil || nc.IsClosed() {
			return err
		}
		if werr := wait(ctx, restartBackoffMin); werr != nil {
			return err
		}
	}
}

// Transient JetStream API errors of a cluster electing a leader
// (JSClusterNotAvailErr, JSClusterNotLeaderErr, JSClusterIncompleteErr):
// asked again a little later, the request succeeds.
const (
	codeClusterNotAvailable jetstream.ErrorCode = 10008
	codeClusterNotLeader    jetstream.ErrorCode = 10009
	codeClusterIncomplete   jetstream.ErrorCode = 10004
)

// Unanswered reports whether err is a request that went unanswered or was
// answered by a cluster electing a leader (see AskAgain): asking again,
// or elsewhere, may succeed.
func Unanswered(err error) bool { return unanswered(err) }

// unanswered reports whether a request failed without an answer (nobody
// answered in time, or nobody listened) or with a transient answer of a
// cluster electing a leader: asking again may succeed.
func unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) {
		return true
	}
	var apiErr *jetstream.APIError
	if errors.As(err, &apiErr) {
		switch apiErr.ErrorCode {
		case codeClusterNotAvailable, codeClusterNotLeader, codeClusterIncomplete:
			return true
		}
	}
	return false
}

// attemptCtx bounds one attempt of a multi-request operation that is
// retried as a whole (opening the stream or a bucket) by
// Config.RequestTimeout, within ctx.
func (l *Log) attemptCtx(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, l.cfg.RequestTimeout)
}

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
	err = l.askAgain(ctx, requestAttempt, func(ctx context.Context) error {
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
	err := l.askAgain(ctx, requestAttempt, func(ctx context.Context) (err error) {
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
	// may have been on the server the connection lost (see below).
	reconnected := l.nc.StatusChanged(nats.CONNECTED)
	defer l.nc.RemoveStatusListener(reconnected)
	cfg := jetstream.ConsumerConfig{
		Name:              consumerName(),
		Description:       "termlog reader",
		DeliverPolicy:     jetstream.DeliverByStartSequencePolicy,
		OptStartSeq:       *next,
		AckPolicy:         jetstream.AckNonePolicy,
		ReplayPolicy:      jetstream.ReplayInstantPolicy,
		InactiveThreshold: consumerInactive,
		MemoryStorage:     true,
		Replicas:          1,
	}
	var cons jetstream.Consumer
	err = l.askAgain(ctx, requestAttempt, func(ctx context.Context) (err error) {
		cons, err = l.stream.CreateConsumer(ctx, cfg)
		return err
	})
	if err != nil {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		return &restartError{err: fmt.Errorf("create consumer: %w", err)}
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
	cc, err := cons.Consume(d.handle,
		jetstream.PullMaxMessages(pullBatch),
		jetstream.PullExpiry(pullExpiry),
		jetstream.PullHeartbeat(pullHeartbeat),
		jetstream.ConsumeErrHandler(func(_ jetstream.ConsumeContext, err error) {
			// A missing heartbeat, a lost consumer, a reconnect: start over
			// on a new consumer after the last record delivered.
			d.finish(&restartError{fmt.Errorf("consume: %w", err), true, true})
		}))
	if err != nil {
		return &restartError{fmt.Errorf("consume: %w", err), true, false}
	}
	defer func() {
		d.stop() // waits for a record in fn; none is handed on after
		cc.Stop()
		// The client's delivery goroutine ends asynchronously: wait for it
		// (bounded: a stuck client must not hold the reader).
		t := time.NewTimer(stopTimeout)
		defer t.Stop()
		select {
		case <-cc.Closed():
		case <-t.C:
		}
	}()

	// Read (until > 0) looks for records gone from below until when the
	// consumer has been quiet for readIdleCheck.
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
			// Quiet for a while: are the records left below until gone
			// (purged after Read took the tail)?
			if from, quiet, exact := d.quiet(); quiet {
				done, err := l.noneLeft(ctx, from, until)
				switch {
				case err != nil:
					return err
				case done && exact:
					return l.compacted(from, fmt.Sprintf("no record is left up to seq %d", until))
				case done:
					return nil
				}
			}
		}
	}
}

// delivery is the consumer end of one session: it checks the order of the
// messages and hands their records to fn.
type delivery struct {
	log   *Log
	until uint64
	fn    func(events.Record) error
	end   chan error // the session's outcome; the first one counts

	mu      sync.Mutex
	next    *uint64 // the seq expected next, advanced past every record
	exact   bool    // the session's first record must be *next
	dseq    uint64  // consumer seq of the last message, for gap detection
	arrived bool    // a message came since the last quiet check
	stopped bool    // the session is over: drop what still comes
}

func (d *delivery) handle(msg jetstream.Msg) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	d.arrived = true
	dseq, seq, err := sequences(msg)
	switch {
	case err != nil:
		d.finishLocked(&restartError{fmt.Errorf("metadata: %w", err), true, false})
		return
	case dseq != d.dseq+1 || seq < *d.next:
		d.finishLocked(&restartError{fmt.Errorf("out of order: consumer seq %d after %d, stream seq %d, want >= %d",
			dseq, d.dseq, seq, *d.next), true, false})
		return
	case dseq == 1 && d.exact && seq != *d.next:
		// The consumer started at *next, which the stream no longer holds.
		d.finishLocked(d.log.compacted(*d.next, fmt.Sprintf("the first record left is seq %d", seq)))
		return
	}
	d.dseq = dseq
	if d.until > 0 && seq > d.until {
		d.finishLocked(nil)
		return
	}
	*d.next = seq + 1
	// The body is the message's own copy (nats.go copies every payload
	// out of its read buffer), so it is handed on without another.
	if err := d.fn(events.Record{Seq: seq, Data: msg.Data()}); err != nil {
		d.finishLocked(err)
		return
	}
	if d.until > 0 && seq >= d.until {
		d.finishLocked(nil)
	}
}

// finishLocked ends the session with err, unless it has ended already.
func (d *delivery) finishLocked(err error) {
	if d.stopped {
		return
	}
	d.stopped = true
	d.end <- err // the only send: end has room for it
}

func (d *delivery) finish(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.finishLocked(err)
}

func (d *delivery) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
}

// quiet reports whether no message came since the last call, the seq
// expected next, and whether it must be delivered (not skipped): the
// session is exact and has delivered nothing yet.
func (d *delivery) quiet() (next uint64, quiet, exact bool) {
	d.mu.Lock()
	defer d.mu.Unlock()
	quiet, d.arrived = !d.arrived, false
	return *d.next, quiet, d.exact && d.dseq == 0
}

// sequences returns the consumer and stream sequences of msg from its ack
// subject, as jetstream.Msg.Metadata does but without building the rest:
// $JS.ACK.<stream>.<consumer>.<delivered>.<stream seq>.<consumer seq>.<time>.<pending>,
// or the v2 form with <domain>.<account hash> after $JS.ACK. and a
// trailing token.
func sequences(msg jetstream.Msg) (consumer, stream uint64, err error) {
	reply := msg.Reply()
	rest, ok := strings.CutPrefix(reply, "$JS.ACK.")
	n := strings.Count(reply, ".") + 1
	var at int // token index of the stream seq, counted after $JS.ACK.
	switch {
	case !ok:
		return 0, 0, fmt.Errorf("ack subject %q does not start with $JS.ACK.", reply)
	case n == 9:
		at = 3
	case n >= 11:
		at = 5
	default:
		return 0, 0, fmt.Errorf("ack subject %q has %d tokens", reply, n)
	}
	for range at {
		_, rest, _ = strings.Cut(rest, ".")
	}
	sseq, rest, _ := strings.Cut(rest, ".")
	cseq, _, _ := strings.Cut(rest, ".")
	stream, err = strconv.ParseUint(sseq, 10, 64)
	if err == nil {
		consumer, err = strconv.ParseUint(cseq, 10, 64)
	}
	if err != nil {
		return 0, 0, fmt.Errorf("ack subject %q: %w", reply, err)
	}
	return consumer, stream, nil
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
	err := l.askAgain(ctx, requestAttempt, func(ctx context.Context) (err error) {
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
