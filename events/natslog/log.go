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
	"errors"
	"fmt"
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

	// creating is since when some reader has been waiting for a consumer
	// create without a break (unix ns; 0: none waits), waiting how many
	// creates wait now; written by createConsumer only, under createMu
	// (see ConsumerWait).
	createMu sync.Mutex
	creating int64
	waiting  int

	mu       sync.Mutex
	lastID   string    // msg id of the last event this Log stored,
	lastSeq  uint64    // at this seq
	lastPipe *pipeline // the last single event AppendAsync sent
}

var _ events.Log = (*Log)(nil)

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

// leaderAsk bounds one attempt of a small read the stream's leader answers
// (its last message, its info, a message get). It was requestAttempt: a
// request sent just before the stream's election ended waited up to 1 s
// unanswered, and a new leader's catch-up with it (nodeloss, a crash of
// the stream leader's node: termlog 1.49 s after the stream's election).
// Consumer creation, the JetStream meta leader's work and heavier under a
// burst, keeps requestAttempt.
const leaderAsk = 500 * time.Millisecond

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
//
// A request made while the connection reconnects is not sent at all: with
// nats.ReconnectBufSize(-1) (termlog's roles buffer nothing through a
// reconnect) nats.go refuses it at once with ErrReconnectBufExceeded.
// It is asked again too: before this, a role opening its stream while its
// NATS node restarted failed its open instead of waiting for the
// reconnect (TestOpenDuringElection, "nats: outbound buffer limit
// exceeded").
func unanswered(err error) bool {
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, nats.ErrTimeout) || errors.Is(err, nats.ErrNoResponders) ||
		errors.Is(err, jetstream.ErrNoStreamResponse) || errors.Is(err, nats.ErrReconnectBufExceeded) {
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
