package natslog

// Stream and bucket admin: creating or binding the cluster's stream and its
// snapshot bucket, and the configuration checks that refuse a stream which
// could lose events, miss ours or serve stale reads.

import (
	"context"
	"errors"
	"fmt"
	"strings"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/internal/wire"
)

// codeReplicasNotSupported: replicas > 1 asked of a standalone server
// (JSStreamReplicasNotSupportedErr); retrying cannot help.
const codeReplicasNotSupported jetstream.ErrorCode = 10074

// StreamName is the name of the stream of cluster.
func StreamName(cluster string) string { return wire.Stream(cluster) }

func validCluster(c string) error { return wire.ValidCluster(c) }

// configError is a stream or bucket configuration Open will not work with
// (or a bucket a reader may not create); retrying does not help. err, if
// any, is the cause.
type configError struct {
	msg string
	err error
}

func (e *configError) Error() string { return e.msg }
func (e *configError) Unwrap() error { return e.err }

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

// OpenSnapshots creates or binds the snapshot bucket of l's cluster, with
// l's replicas, retrying while JetStream is not ready until ctx is done (or
// the Log's OpenTimeout when ctx has no deadline).
func OpenSnapshots(ctx context.Context, l *Log) (*Snapshots, error) {
	return openSnapshots(ctx, l, true)
}

// BindSnapshots binds the snapshot bucket of l's cluster if it exists (a
// reader such as replay creates nothing); when it does not, the error wraps
// jetstream.ErrBucketNotFound.
func BindSnapshots(ctx context.Context, l *Log) (*Snapshots, error) {
	return openSnapshots(ctx, l, false)
}

func openSnapshots(ctx context.Context, l *Log, create bool) (*Snapshots, error) {
	cfg := jetstream.ObjectStoreConfig{
		Bucket:      SnapshotBucket(l.cluster),
		Description: "termlog projection snapshots of stream " + l.name,
		Storage:     jetstream.FileStorage,
		Replicas:    l.cfg.Replicas,
	}
	var obs jetstream.ObjectStore
	// Each attempt is bounded (a request left unanswered during a
	// JetStream election must not use the whole budget); openRetrying asks
	// again until ctx's deadline. Asking again is safe: a create that
	// landed unanswered makes the next attempt find the bucket.
	err := l.openRetrying(ctx, "open snapshot bucket "+cfg.Bucket, func(ctx context.Context) (err error) {
		ctx, cancel := l.attemptCtx(ctx)
		defer cancel()
		obs, err = l.js.ObjectStore(ctx, cfg.Bucket)
		if errors.Is(err, jetstream.ErrBucketNotFound) && !create {
			return &configError{msg: err.Error(), err: err}
		}
		if errors.Is(err, jetstream.ErrBucketNotFound) {
			obs, err = l.js.CreateObjectStore(ctx, cfg)
			if errors.Is(err, jetstream.ErrBucketExists) || errors.Is(err, jetstream.ErrStreamNameAlreadyInUse) {
				obs, err = l.js.ObjectStore(ctx, cfg.Bucket)
			}
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return &Snapshots{log: l, obs: obs}, nil
}
