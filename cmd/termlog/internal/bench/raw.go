package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime/pprof"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// responder is the raw baseline of the worker RPCs, on the same server and
// subjects' shape: register and activate store the request (raw async
// publish, or raw atomic batches on a server that syncs before every ack)
// and reply on the ack; heartbeat decodes and echoes.
type responder struct {
	ctx     context.Context // the run's: pending replies end with it
	nc      *nats.Conn
	js      jetstream.JetStream
	ids     atomic.Uint64
	pending sync.WaitGroup // replies waiting for an ack, and the batcher
	batcher *rawBatcher    // nil: raw async publish
	subs    []*nats.Subscription
}

// rawStoreWhat says how the register baseline's responder stores requests.
func (r *run) rawStoreWhat() string {
	if r.env != nil && r.env.sync == natsserver.SyncAlways {
		return "raw atomic batches of the requests that wait (one batch in flight, as with sync always the leader does)"
	}
	return "a raw async publish"
}

// startResponder starts the responder on its own connection, labelled
// labelResponder for the CPU profile.
func (r *run) startResponder(ctx context.Context) (*responder, error) {
	p := &responder{ctx: ctx}
	var err error
	pprof.Do(context.Background(), pprof.Labels(labelKey, labelResponder), func(context.Context) {
		if p.nc, err = r.env.connect("bench-responder"); err != nil {
			return
		}
		if p.js, err = jetstream.New(p.nc, jetstream.WithPublishAsyncMaxPending(4*asyncWindow)); err != nil {
			return
		}
		if _, err = r.env.rawStream(ctx, p.js, rawStreamN, rawSubject); err != nil {
			return
		}
		if r.env.sync == natsserver.SyncAlways {
			// A raw async publish would be one fsync per request: commit
			// the requests that wait as one atomic batch, as the leader does.
			p.batcher = newRawBatcher(p.js, rawSubject)
			p.pending.Go(func() { p.batcher.run(ctx) })
		}
		for rpc, h := range p.handlers() {
			var s *nats.Subscription
			if s, err = p.nc.Subscribe(client.RPCSubject(rawCluster, rpc), h); err != nil {
				return
			}
			p.subs = append(p.subs, s)
		}
	})
	if err != nil {
		p.close()
		return nil, err
	}
	return p, nil
}

func (p *responder) close() {
	for _, s := range p.subs {
		_ = s.Unsubscribe()
	}
	if p.batcher != nil {
		p.batcher.close()
	}
	p.pending.Wait()
}

func (p *responder) handlers() map[string]nats.MsgHandler {
	refReply := func(m *nats.Msg) client.Reply {
		var ref client.WorkerRef
		_ = json.Unmarshal(m.Data, &ref)
		return client.Reply{ID: ref.ID, Epoch: ref.Epoch, Term: 1}
	}
	return map[string]nats.MsgHandler{
		client.RPCRegister: func(m *nats.Msg) {
			p.store(m, func(ack *jetstream.PubAck) client.Reply {
				return client.Reply{ID: p.ids.Add(1), Epoch: ack.Sequence, Term: 1}
			})
		},
		client.RPCActivate: func(m *nats.Msg) {
			rep := refReply(m)
			p.store(m, func(*jetstream.PubAck) client.Reply { return rep })
		},
		client.RPCHeartbeat: func(m *nats.Msg) {
			b, _ := json.Marshal(refReply(m))
			_ = m.Respond(b)
		},
	}
}

// store stores the request and replies with id(ack) once it is stored.
func (p *responder) store(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply) {
	if p.batcher != nil {
		p.batcher.add(m, id)
		return
	}
	fut, err := p.js.PublishAsync(rawSubject, m.Data)
	if err != nil {
		b, _ := json.Marshal(client.Reply{Error: &client.RPCError{Code: client.CodeUnavailable, Message: err.Error()}})
		_ = m.Respond(b)
		return
	}
	p.pending.Go(func() {
		select {
		case ack := <-fut.Ok():
			b, _ := json.Marshal(id(ack))
			_ = m.Respond(b)
		case <-fut.Err():
		case <-p.ctx.Done():
		}
	})
}

// rawReaders are three raw ordered consumers of the responder's stream,
// standing for the replicas' readers: each counts what it read.
type rawReaders struct {
	counts [3]atomic.Int64
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

func startReaders(ctx context.Context, js jetstream.JetStream) (*rawReaders, error) {
	rr := &rawReaders{}
	rctx, cancel := context.WithCancel(ctx)
	rr.cancel = cancel
	for i := range rr.counts {
		cons, err := js.OrderedConsumer(ctx, rawStreamN, jetstream.OrderedConsumerConfig{})
		if err != nil {
			rr.stop()
			return nil, err
		}
		it, err := cons.Messages()
		if err != nil {
			rr.stop()
			return nil, err
		}
		rr.wg.Go(func() {
			defer it.Stop()
			for {
				if _, err := it.Next(jetstream.NextContext(rctx)); err != nil {
					if rctx.Err() != nil {
						return
					}
					continue
				}
				rr.counts[i].Add(1)
			}
		})
	}
	return rr, nil
}

func (rr *rawReaders) stop() { rr.cancel(); rr.wg.Wait() }

// hold says whether every reader has read seq messages.
func (rr *rawReaders) hold(seq uint64) bool {
	for i := range rr.counts {
		if uint64(rr.counts[i].Load()) < seq {
			return false
		}
	}
	return true
}

// baseline runs n workers (client.Worker.Run, the same connections)
// against the responder: a burst, then (with heartbeat) a heartbeat window.
// A burst the bound stopped is returned partial.
func (r *run) baseline(ctx context.Context, conns []*nats.Conn, n int, heartbeat bool) (burstResult, hbSample, error) {
	p, err := r.startResponder(ctx)
	if err != nil {
		return burstResult{}, hbSample{}, err
	}
	defer p.close()
	rr, err := startReaders(ctx, p.js)
	if err != nil {
		return burstResult{}, hbSample{}, err
	}
	defer rr.stop()
	fl, err := newFleet(rawCluster, n, conns)
	if err != nil {
		return burstResult{}, hbSample{}, err
	}
	defer fl.stop()
	bctx, cancel := context.WithTimeout(ctx, r.cfg.BurstTimeout)
	defer cancel()
	t0 := fl.start(ctx)
	res, err := r.waitBurst(bctx, burstWait{fl: fl, t0: t0, visible: rr.hold,
		tail: func(context.Context) (uint64, error) { return uint64(2 * n), nil }})
	if err != nil {
		return res, hbSample{}, err
	}
	if !res.done() && heartbeat {
		// The heartbeat window needs every worker heartbeating: give the
		// rest of the burst the burst bound once more (not counted in its
		// time). A responder that falls behind its workers' retries (each
		// stored again) may never catch up: then there is no window.
		r.progress("baseline: the burst was stopped by its %s bound; waiting up to %s more for all %d active to measure heartbeats", r.cfg.BurstTimeout, r.cfg.BurstTimeout, n)
		wctx, cancel := context.WithTimeout(ctx, r.cfg.BurstTimeout)
		defer cancel()
		if err := poll(wctx, 5*time.Millisecond, func() bool { return fl.activated.Load() == int64(n) || fl.failed.Load() > 0 }); err != nil || fl.err() != nil {
			r.progress("baseline: %d of %d active after twice the bound: no heartbeat baseline", fl.activated.Load(), n)
			return res, hbSample{}, fl.err()
		}
	} else if !res.done() {
		return res, hbSample{}, nil
	}
	r.progress("baseline: %d registered and read by 3 consumers in %s, all active in %s (partial: %v)",
		n, res.registered.Round(time.Millisecond), res.active.Round(time.Millisecond), !res.done())
	var hb hbSample
	if heartbeat {
		time.Sleep(warmup)
		r.progress("baseline: measuring %d heartbeats/s against the responder for %s", n, r.cfg.HeartbeatFor)
		hb = fl.heartbeatWindow(r.cfg.HeartbeatFor)
		r.saveProfile(fmt.Sprintf("heartbeat.baseline.%d", n), hb.cpu.profile)
		if hb.errs > 0 {
			r.progress("baseline: %d heartbeat errors", hb.errs)
		}
	}
	return res, hb, nil
}
