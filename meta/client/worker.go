package client

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/internal/clock"
)

// WorkerConfig configures a worker's link to meta.
type WorkerConfig struct {
	Cluster     string
	Incarnation string // unique per process start
	Endpoint    string // host:port of the worker's control-stream listener
	Kind        string
	Parallelism int
	// Heartbeat is the heartbeat interval (default 1s).
	Heartbeat time.Duration
	// RequestTimeout bounds one RPC (default 2s).
	RequestTimeout time.Duration
	Logger         zerolog.Logger
	Clock          clock.Clock
	// DeregisterOnStop makes Run deregister (best effort, 2 s) when its
	// context ends, so a planned stop does not wait for the expiry.
	DeregisterOnStop bool
	// HeartbeatOffset is added to the wait before the first heartbeat after
	// each activation (0: none). Workers started together (a fleet on one
	// host, every worker after a failover) spread their heartbeats over
	// the interval by each taking a different offset in [0, Heartbeat).
	HeartbeatOffset time.Duration
	// Observe, when set, is called once each Register, Activate, Heartbeat
	// and Deregister has its outcome (retries included), on the calling
	// goroutine: what a process exports as metrics. It must not block.
	Observe func(Call)
}

// Call is one request's outcome, as Observe sees it.
type Call struct {
	RPC   string        // RPCRegister, RPCActivate, RPCHeartbeat or RPCDeregister
	Start time.Time     // when the request was first sent (cfg.Clock)
	Took  time.Duration // until its outcome, retries included
	Reply Reply         // the reply (zero when Err is not an RPC error)
	Err   error
}

// Worker registers with the meta leader, activates and heartbeats, and
// registers again when told to. It follows the leader: requests go to
// whichever replica leads and are retried with backoff while there is none.
type Worker struct {
	nc  *nats.Conn
	cfg WorkerConfig

	mu  sync.Mutex
	ref WorkerRef

	lastReply atomic.Int64 // UnixNano (cfg.Clock) of the last reply from meta, any reply
}

// NewWorker returns a worker client on nc.
func NewWorker(nc *nats.Conn, cfg WorkerConfig) (*Worker, error) {
	if cfg.Cluster == "" {
		cfg.Cluster = "termlog"
	}
	if cfg.Heartbeat <= 0 {
		cfg.Heartbeat = time.Second
	}
	if cfg.RequestTimeout <= 0 {
		cfg.RequestTimeout = 2 * time.Second
	}
	if cfg.Clock == nil {
		cfg.Clock = clock.Real{}
	}
	if err := ValidateEndpoint(cfg.Endpoint); err != nil {
		return nil, err
	}
	if cfg.Incarnation == "" {
		return nil, errors.New("worker needs an incarnation")
	}
	return &Worker{nc: nc, cfg: cfg}, nil
}

// Ref is the current registration (zero before the first one). It carries
// the worker's incarnation, which activate, heartbeat and deregister send so
// the leader can refuse another process naming this id and epoch.
func (w *Worker) Ref() WorkerRef {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.ref
}

// call sends one request and retries transient failures with backoff until
// ctx is done. It returns the reply or a permanent error.
func (w *Worker) call(ctx context.Context, rpc string, req any) (Reply, error) {
	if w.cfg.Observe == nil {
		return w.send(ctx, rpc, req)
	}
	start := w.cfg.Clock.Now()
	rep, err := w.send(ctx, rpc, req)
	w.cfg.Observe(Call{RPC: rpc, Start: start, Took: w.cfg.Clock.Now().Sub(start), Reply: rep, Err: err})
	return rep, err
}

// send is call without the observer.
func (w *Worker) send(ctx context.Context, rpc string, req any) (Reply, error) {
	body, err := json.Marshal(req)
	if err != nil {
		return Reply{}, err
	}
	subj := RPCSubject(w.cfg.Cluster, rpc)
	backoff := 50 * time.Millisecond
	for {
		rctx, cancel := context.WithTimeout(ctx, w.cfg.RequestTimeout)
		msg, err := w.nc.RequestWithContext(rctx, subj, body)
		cancel()
		var rep Reply
		if err == nil {
			w.lastReply.Store(w.cfg.Clock.Now().UnixNano())
			if jerr := json.Unmarshal(msg.Data, &rep); jerr != nil {
				err = fmt.Errorf("malformed reply: %v", jerr)
			} else if rep.Error != nil {
				switch rep.Error.Code {
				case CodeNotLeader, CodeUnavailable:
					err = rep.Error
				default:
					return rep, rep.Error
				}
			} else {
				return rep, nil
			}
		}
		if ctx.Err() != nil {
			return Reply{}, fmt.Errorf("%s: %w (last error: %v)", rpc, ctx.Err(), err)
		}
		w.cfg.Logger.Debug().Err(err).Str("rpc", rpc).Dur("retry_in", backoff).Msg("meta not answering; retrying")
		select {
		case <-ctx.Done():
			return Reply{}, fmt.Errorf("%s: %w (last error: %v)", rpc, ctx.Err(), err)
		case <-w.cfg.Clock.After(backoff):
		}
		backoff = min(backoff*2, time.Second)
	}
}

// ErrNoReply is AnsweredWithin's probe error: meta answered nothing lately.
var ErrNoReply = errors.New("no reply from meta")

// AnsweredWithin is a probe for natslog.WatchServer: nil while meta has
// answered one of this worker's requests (a not-leader reply too) within
// d, ErrNoReply after. Before the first reply it counts from now.
func (w *Worker) AnsweredWithin(d time.Duration) func(context.Context) error {
	w.lastReply.CompareAndSwap(0, w.cfg.Clock.Now().UnixNano())
	return func(context.Context) error {
		if w.cfg.Clock.Now().Sub(time.Unix(0, w.lastReply.Load())) > d {
			return ErrNoReply
		}
		return nil
	}
}

// Register obtains an id. The same incarnation gets the same id back while
// its registration is active.
func (w *Worker) Register(ctx context.Context) (WorkerRef, error) {
	rep, err := w.call(ctx, RPCRegister, RegisterRequest{
		Incarnation: w.cfg.Incarnation, Endpoint: w.cfg.Endpoint, Kind: w.cfg.Kind, Parallelism: w.cfg.Parallelism,
	})
	if err != nil {
		return WorkerRef{}, err
	}
	ref := WorkerRef{ID: rep.ID, Epoch: rep.Epoch, Incarnation: w.cfg.Incarnation}
	w.mu.Lock()
	w.ref = ref
	w.mu.Unlock()
	w.cfg.Logger.Info().Uint64("worker_id", ref.ID).Uint64("epoch", ref.Epoch).Uint64("term", rep.Term).Str("endpoint", w.cfg.Endpoint).Msg("registered")
	return ref, nil
}

// Activate marks the registration running.
func (w *Worker) Activate(ctx context.Context) error {
	_, err := w.call(ctx, RPCActivate, w.Ref())
	return err
}

// Heartbeat renews the registration; errors.Is(err, ErrReregister) means
// meta no longer knows it, errors.Is(err, ErrForbidden) that it belongs to
// another incarnation.
func (w *Worker) Heartbeat(ctx context.Context) error {
	_, err := w.call(ctx, RPCHeartbeat, w.Ref())
	return err
}

// Deregister ends the registration.
func (w *Worker) Deregister(ctx context.Context) error {
	_, err := w.call(ctx, RPCDeregister, w.Ref())
	return err
}

// Run registers, activates and heartbeats until ctx is done, registering
// again whenever meta says the registration is gone.
func (w *Worker) Run(ctx context.Context) error {
	// However Run ends because ctx did — between heartbeats, or while a
	// register, activate or heartbeat request was in flight — a planned
	// stop deregisters whatever registration it holds.
	defer func() {
		if ctx.Err() != nil {
			w.stop(ctx)
		}
	}()
	for {
		if _, err := w.Register(ctx); err != nil {
			return ctxOr(ctx, err)
		}
		if err := w.Activate(ctx); err != nil && !errors.Is(err, ErrReregister) {
			return ctxOr(ctx, err)
		}
		wait := w.cfg.Heartbeat + w.cfg.HeartbeatOffset
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-w.cfg.Clock.After(wait):
			}
			wait = w.cfg.Heartbeat
			err := w.Heartbeat(ctx)
			if errors.Is(err, ErrReregister) {
				w.cfg.Logger.Warn().Uint64("worker_id", w.Ref().ID).Msg("meta does not know this registration; registering again")
				break
			}
			if err != nil {
				return ctxOr(ctx, err)
			}
		}
	}
}

func (w *Worker) stop(ctx context.Context) {
	if !w.cfg.DeregisterOnStop || w.Ref().ID == 0 {
		return
	}
	dctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	if err := w.Deregister(dctx); err != nil {
		w.cfg.Logger.Warn().Err(err).Uint64("worker_id", w.Ref().ID).Msg("deregister on stop")
		return
	}
	w.cfg.Logger.Info().Uint64("worker_id", w.Ref().ID).Msg("deregistered")
}

func ctxOr(ctx context.Context, err error) error {
	if ctx.Err() != nil {
		return nil
	}
	return err
}
