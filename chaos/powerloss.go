package chaos

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/natsserver"
)

// Ack is a registration the meta leader acknowledged: it replied with the
// id and the epoch, and the epoch is the stream seq of the
// worker.registered event it appended before replying.
type Ack struct {
	ID, Epoch, Term       uint64
	Incarnation, Endpoint string
	At                    time.Time
}

// Registrar registers workers that never activate, as fast as the leader
// answers: each Burst goroutine sends its next request as soon as the
// last one returned, so the leader has many registrations at once and
// groups their appends. Every acknowledged registration is kept.
type Registrar struct {
	nc     *nats.Conn
	prefix string
	n      atomic.Uint64

	mu   sync.Mutex
	acks []Ack
	errs map[string]int // why registrations failed, by kind
}

// NewRegistrar connects with the worker role's key.
func NewRegistrar(c *Cluster, prefix string) (*Registrar, error) {
	opts, err := natsserver.RoleOptions(c.Auth, natsserver.RoleWorker)
	if err != nil {
		return nil, err
	}
	opts = append(opts, nats.Name(prefix), nats.MaxReconnects(-1), nats.ReconnectWait(100*time.Millisecond),
		nats.ReconnectBufSize(-1), nats.RetryOnFailedConnect(true))
	nc, err := nats.Connect(strings.Join(c.URLs, ","), opts...)
	if err != nil {
		return nil, fmt.Errorf("registrar: %w", err)
	}
	return &Registrar{nc: nc, prefix: prefix}, nil
}

// Close closes the connection.
func (r *Registrar) Close() { r.nc.Close() }

// Register sends one registration and waits at most timeout for the
// reply; only a reply without an error is an Ack.
func (r *Registrar) Register(ctx context.Context, timeout time.Duration) (Ack, error) {
	i := r.n.Add(1)
	// A loopback address of its own per worker (127/8 is all loopback):
	// the leader's control-stream dials are refused at once.
	a := Ack{Incarnation: fmt.Sprintf("%s-%d", r.prefix, i), Endpoint: fmt.Sprintf("127.77.%d.%d:9", (i/250)%250, i%250+1)}
	body, _ := json.Marshal(client.RegisterRequest{Incarnation: a.Incarnation, Endpoint: a.Endpoint, Kind: "powerloss", Parallelism: 1})
	rctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	msg, err := r.nc.RequestWithContext(rctx, client.RPCSubject("termlog", client.RPCRegister), body)
	if err != nil {
		r.failed(err.Error())
		return a, err
	}
	var rep client.Reply
	if err := json.Unmarshal(msg.Data, &rep); err != nil {
		r.failed("undecodable reply")
		return a, err
	}
	if rep.Error != nil {
		r.failed(rep.Error.Code)
		return a, errors.New(rep.Error.Code + ": " + rep.Error.Message)
	}
	a.ID, a.Epoch, a.Term, a.At = rep.ID, rep.Epoch, rep.Term, time.Now()
	r.mu.Lock()
	r.acks = append(r.acks, a)
	r.mu.Unlock()
	return a, nil
}

func (r *Registrar) failed(why string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.errs == nil {
		r.errs = map[string]int{}
	}
	r.errs[why]++
}

// Failures returns, and forgets, how many registrations failed, by why.
func (r *Registrar) Failures() map[string]int {
	r.mu.Lock()
	defer r.mu.Unlock()
	out := r.errs
	r.errs = nil
	return out
}

// Burst runs conc registrants until ctx ends and waits for them.
func (r *Registrar) Burst(ctx context.Context, conc int) {
	r.BurstN(ctx, conc, math.MaxInt)
}

// BurstN runs conc registrants until n more registrations were
// acknowledged (or ctx ends), and waits for them.
func (r *Registrar) BurstN(ctx context.Context, conc, n int) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var got atomic.Int64
	var wg sync.WaitGroup
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for ctx.Err() == nil {
				if _, err := r.Register(ctx, 2*time.Second); err != nil {
					sleepCtx(ctx, 50*time.Millisecond)
					continue
				}
				if got.Add(1) >= int64(n) {
					cancel()
				}
			}
		}()
	}
	wg.Wait()
}

// Acks is every acknowledged registration so far.
func (r *Registrar) Acks() []Ack {
	r.mu.Lock()
	defer r.mu.Unlock()
	return append([]Ack(nil), r.acks...)
}

// AckedLost returns the acknowledged registrations the export does not
// hold at their seq (a worker.registered of that id and incarnation).
func AckedLost(evs []Event, acks []Ack) []string {
	bySeq := make(map[uint64]Event, len(evs))
	for _, e := range evs {
		bySeq[e.Seq] = e
	}
	var lost []string
	for _, a := range acks {
		e, ok := bySeq[a.Epoch]
		if !ok {
			lost = append(lost, fmt.Sprintf("worker %d (%s) acknowledged at seq %d in term %d: the stream has no seq %d", a.ID, a.Incarnation, a.Epoch, a.Term, a.Epoch))
			continue
		}
		var d struct {
			ID          uint64 `json:"id"`
			Incarnation string `json:"incarnation"`
		}
		_ = json.Unmarshal(e.Data, &d)
		if e.Type != "worker.registered" || d.ID != a.ID || d.Incarnation != a.Incarnation {
			lost = append(lost, fmt.Sprintf("worker %d (%s) acknowledged at seq %d in term %d: seq %d now holds %s id %d (%s) of term %d",
				a.ID, a.Incarnation, a.Epoch, a.Term, a.Epoch, e.Type, d.ID, d.Incarnation, e.Term))
		}
	}
	return lost
}

// MetaSeq scrapes a meta replica's termlog_meta_projected_seq.
func (c *Cluster) MetaSeq(ctx context.Context, name string) (uint64, error) {
	fams, err := c.scrape(ctx, name)
	if err != nil {
		return 0, err
	}
	f, ok := fams["termlog_meta_projected_seq"]
	if !ok || len(f.GetMetric()) == 0 {
		return 0, fmt.Errorf("%s: no termlog_meta_projected_seq", name)
	}
	return uint64(f.GetMetric()[0].GetGauge().GetValue()), nil
}
