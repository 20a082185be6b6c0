package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/chaos/netns"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// Probe is a worker the runner plays itself, so that every register,
// activate, heartbeat and deregister has a recorded invoke and return: it
// listens for control streams on its endpoint (acking barriers like any
// worker) and sends each RPC once, with a bounded wait, recording what
// came back. It deregisters now and then and registers again with a new
// incarnation, so the history has every kind of operation.
type Probe struct {
	Name     string
	Endpoint string

	nc    *nats.Conn
	agent *client.Agent
	rec   Recorder
	rng   *rand.Rand

	quiet atomic.Bool // no deregistration (while the runner checks a healed cluster)

	mu  sync.Mutex
	ref client.WorkerRef
	inc int
}

// Quiet stops (true) or resumes (false) the probe's deregistrations, so a
// healed cluster is not made degraded by the probe's own churn while the
// runner waits for it to be healthy and checks it.
func (p *Probe) Quiet(q bool) { p.quiet.Store(q) }

// NewProbe connects a probe with the worker role's key and listens on a
// free port of 127.0.0.1, or in Netns mode of the client namespace (its
// NATS connection dialled from there too).
func NewProbe(c *Cluster, name string, seed uint64, rec Recorder) (*Probe, error) {
	return newProbe(name, c.Auth, c.URLs, c.Node(ClientNode), seed, rec)
}

// newProbe is NewProbe for any cluster: its NATS URLs and keys, and the
// namespace it runs in (nil: the host's 127.0.0.1).
func newProbe(name, auth string, urls []string, nd *netns.Node, seed uint64, rec Recorder) (*Probe, error) {
	opts, err := natsserver.RoleOptions(auth, natsserver.RoleWorker)
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name(name), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectBufSize(-1), nats.RetryOnFailedConnect(true))
	listen := "127.0.0.1:0"
	if nd != nil {
		opts = append(opts, nats.SetCustomDialer(nsDialer{nd}))
		listen = net.JoinHostPort(nd.IP, "0")
	}
	nc, err := nats.Connect(strings.Join(urls, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("probe %s: %w", name, err)
	}
	p := &Probe{Name: name, nc: nc, rec: rec, rng: rand.New(rand.NewPCG(seed, 7))}
	listenAgent := func() (err error) {
		p.agent, err = client.ListenAgent(listen, zerolog.Nop(), p.Ref)
		return err
	}
	if nd != nil {
		err = nd.Do(listenAgent)
	} else {
		err = listenAgent()
	}
	if err != nil {
		nc.Close()
		return nil, err
	}
	p.Endpoint = p.agent.Addr()
	return p, nil
}

// nsDialer dials NATS from inside a namespace (every reconnect too).
type nsDialer struct{ nd *netns.Node }

func (d nsDialer) Dial(_, addr string) (net.Conn, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	return d.nd.Dial(ctx, addr)
}

// Ref is the probe's current registration.
func (p *Probe) Ref() client.WorkerRef {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ref
}

// Run plays the worker until ctx ends, then closes the probe.
func (p *Probe) Run(ctx context.Context) {
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		_ = p.agent.Run(ctx)
	}()
	defer func() {
		wg.Wait()
		p.nc.Close()
	}()
	incarnation := p.newIncarnation()
	activated := false
	for ctx.Err() == nil {
		ref := p.Ref()
		if ref.ID == 0 {
			op, rep := p.call(ctx, OpRegister, client.RPCRegister, client.RegisterRequest{Incarnation: incarnation, Endpoint: p.Endpoint, Kind: "probe", Parallelism: 1},
				Op{Endpoint: p.Endpoint, Incarnation: incarnation})
			if op.Outcome == OutcomeOK {
				p.mu.Lock()
				p.ref = client.WorkerRef{ID: rep.ID, Epoch: rep.Epoch, Incarnation: incarnation}
				p.mu.Unlock()
				activated = false
				continue
			}
			p.sleep(ctx, 200*time.Millisecond)
			continue
		}
		if !activated {
			// Until an activate is acknowledged (as client.Worker retries it).
			op, _ := p.call(ctx, OpActivate, client.RPCActivate, ref, refOp(ref, p.Endpoint))
			switch op.Outcome {
			case OutcomeOK:
				activated = true
			case client.CodeReregister:
				p.forget(ref)
			default:
				p.sleep(ctx, 200*time.Millisecond)
			}
			continue
		}
		p.sleep(ctx, 300*time.Millisecond+time.Duration(p.rng.Int64N(int64(400*time.Millisecond))))
		if p.rng.IntN(25) == 0 && !p.quiet.Load() {
			op, _ := p.call(ctx, OpDeregister, client.RPCDeregister, ref, refOp(ref, p.Endpoint))
			if op.Outcome == OutcomeOK || op.Outcome == client.CodeReregister {
				p.forget(ref)
				incarnation = p.newIncarnation()
			}
			continue
		}
		op, _ := p.call(ctx, OpHeartbeat, client.RPCHeartbeat, ref, refOp(ref, p.Endpoint))
		if op.Outcome == client.CodeReregister {
			p.forget(ref) // expired: register again, same incarnation (as worker.Run does)
		}
	}
}

func refOp(ref client.WorkerRef, ep string) Op {
	return Op{Endpoint: ep, Incarnation: ref.Incarnation, ID: ref.ID, Epoch: ref.Epoch}
}

func (p *Probe) forget(ref client.WorkerRef) {
	p.mu.Lock()
	if p.ref == ref {
		p.ref = client.WorkerRef{}
	}
	p.mu.Unlock()
}

func (p *Probe) newIncarnation() string {
	p.inc++
	return fmt.Sprintf("%s-%d-%x", p.Name, p.inc, p.rng.Uint32())
}

func (p *Probe) sleep(ctx context.Context, d time.Duration) {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// call sends one request (no retry), waits at most a second, and records
// it: a refusal's code, ok, or unknown when no reply came.
func (p *Probe) call(ctx context.Context, kind OpKind, rpc string, req any, op Op) (Op, client.Reply) {
	op.Client, op.Kind = p.Name, kind
	body, _ := json.Marshal(req)
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	returned := p.rec.Invoke(op)
	msg, err := p.nc.RequestWithContext(rctx, client.RPCSubject("termlog", rpc), body)
	cancel()
	var rep client.Reply
	switch {
	case errors.Is(err, nats.ErrNoResponders):
		op.Outcome = "no_responders" // nobody served the subject: nothing happened
	case err != nil:
		op.Outcome = OutcomeUnknown
	default:
		if jerr := json.Unmarshal(msg.Data, &rep); jerr != nil {
			op.Outcome = OutcomeUnknown
		} else if rep.Error != nil {
			op.Outcome = rep.Error.Code
		} else {
			op.Outcome = OutcomeOK
		}
		op.ReplyID, op.ReplyEpoch, op.Term = rep.ID, rep.Epoch, rep.Term
	}
	returned(op)
	return op, rep
}
