package meta

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/wire"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/meta/decide"
)

// rpcRow is one RPC the leader serves: how its request is decoded and what
// answers it. decode validates every field, so serve sees only requests
// that decoded; a request that does not is answered bad_request.
type rpcRow struct {
	decode func(data []byte) (any, error)
	serve  func(ctx context.Context, req any) client.Reply
	// memory: answered from memory, never by an append; served on a queue
	// of its own so that it never waits behind appends, the requests
	// waiting there together by serveMany (one visit to the term's loop
	// for all of them, not one each).
	memory    bool
	serveMany func(reqs []any) []client.Reply
}

// row is the row of an RPC whose requests decode to Req and are answered
// by serve.
func row[Req any](decode func([]byte) (Req, error), serve func(context.Context, Req) client.Reply) rpcRow {
	return rpcRow{
		decode: func(b []byte) (any, error) { return decode(b) },
		serve:  func(ctx context.Context, req any) client.Reply { return serve(ctx, req.(Req)) },
	}
}

// memoryRow is the row of an RPC answered from memory (see rpcRow.memory):
// serveMany answers the requests waiting together, in order.
func memoryRow[Req any](decode func([]byte) (Req, error), serveMany func([]Req) []client.Reply) rpcRow {
	r := row(decode, func(_ context.Context, req Req) client.Reply { return serveMany([]Req{req})[0] })
	r.memory = true
	r.serveMany = func(reqs []any) []client.Reply {
		typed := make([]Req, len(reqs))
		for i, q := range reqs {
			typed[i] = q.(Req)
		}
		return serveMany(typed)
	}
	return r
}

// memoryBatch is how many waiting requests answered from memory are
// served together at most.
const memoryBatch = 256

// leaderRPCs is the leader's RPC table: a row for each RPC name of
// internal/wire (TestRPCTableIsTheWire checks that), so adding an RPC is
// one row here and a name there.
// The rows call the duties of l's started term.
func leaderRPCs(l *leaderSession) map[string]rpcRow {
	w, st, lg, lose := l.duties.workers, l.duties.stores, l.logger, l.lose
	return map[string]rpcRow{
		wire.RPCRegister:       row(client.DecodeRegister, w.register),
		wire.RPCActivate:       row(client.DecodeWorkerRef, w.activate),
		wire.RPCHeartbeat:      memoryRow(client.DecodeWorkerRef, w.heartbeats),
		wire.RPCDeregister:     row(client.DecodeWorkerRef, w.deregister),
		wire.RPCStepDown:       row(decodeStepDown, func(context.Context, struct{}) client.Reply { return stepDown(lg, lose) }),
		wire.RPCStoreRegister:  row(client.DecodeStoreRegister, st.storeRegister),
		wire.RPCStoreHeartbeat: row(client.DecodeStoreHeartbeat, st.storeHeartbeat),
		wire.RPCStoreDrain:     row(client.DecodeDrain, st.storeDrain),
		wire.RPCStoreSelfDrain: row(client.DecodeSelfDrain, st.storeSelfDrain),
		wire.RPCShardRecover:   row(client.DecodeRecover, l.duties.shards.shardRecover),
	}
}

// decodeStepDown checks a step-down request (it carries nothing).
func decodeStepDown(b []byte) (struct{}, error) { return struct{}{}, client.DecodeStepDown(b) }

// stepDown answers a step-down request: the term ends, and the replica
// campaigns again after a lease (Replica.campaign).
func stepDown(lg zerolog.Logger, lose func(string)) client.Reply {
	lg.Info().Msg("step-down requested")
	lose(reasonStepDown)
	return client.Reply{}
}

// rpcHandlers is how many requests that may append are handled at once:
// their mutations are decided and appended in groups (see committer), so a
// registration burst costs one append per group, not one per worker.
const rpcHandlers = 2048

// rpcQueue is how many requests that may append wait for a handler. A
// registration burst of 10,000 workers fits: a refused request costs its
// worker a 50 ms..1 s backoff, which made the burst's tail.
const rpcQueue = 16384

// memoryQueue is how many requests answered from memory (heartbeats) wait:
// a short queue, as a renewal must not wait long behind others while the
// expiry decides.
const memoryQueue = 1024

// rpcServer serves a term's RPCs on NATS: every subject under
// <cluster>.rpc., each request decoded, decided and answered as its row
// of the table says (an unknown RPC gets a bad_request reply rather than no
// responders). Every reply names the term and the leader.
type rpcServer struct {
	nc     *nats.Conn // nil: no RPCs served
	prefix string     // <cluster>.rpc.
	rows   map[string]rpcRow
	term   uint64
	leader string
	logger zerolog.Logger
	lose   func(reason string)

	queued atomic.Int64 // requests waiting for a handler
}

// newRPCServer serves l's RPCs; l's term is chosen (startTerm) first.
func newRPCServer(l *leaderSession) *rpcServer {
	return &rpcServer{
		nc: l.r.cfg.NC, prefix: client.RPCSubject(l.r.cfg.Cluster, ""), rows: leaderRPCs(l),
		term: l.term, leader: l.r.cfg.ID, logger: l.logger, lose: l.lose,
	}
}

// termEnded is the reply to a request the term cannot answer any more: the
// next leader answers it, so the client asks there at once.
func termEnded() client.Reply {
	return unavailable(fmt.Errorf("%w: the term ended", ErrNotLeader))
}

// serve answers RPCs until ctx is done (the term ends). Requests that may
// append are handled by rpcHandlers goroutines; those answered from memory
// (heartbeats) have their own goroutine, so they never wait behind an
// append (the expiry must not decide on deadlines whose renewals are
// queued). No handler outlives serve, and what is still queued when it
// ends is answered "not the leader", so each client asks the next leader
// at once instead of waiting out its request timeout. Until the server has
// taken the drain's unsubscribe, a request that still arrives is answered
// "not the leader" by the subscription's callback, after serve returned:
// that callback only answers, it never handles.
func (s *rpcServer) serve(ctx context.Context) {
	if s.nc == nil {
		return
	}
	appends := make(chan *nats.Msg, rpcQueue)
	memory := make(chan *nats.Msg, memoryQueue)
	sub, err := s.nc.Subscribe(s.prefix+">", func(m *nats.Msg) { s.enqueue(ctx, m, appends, memory) })
	if err != nil {
		s.lose(fmt.Sprintf("subscribe %s>: %v", s.prefix, err))
		return
	}
	var wg sync.WaitGroup
	wg.Go(func() { s.serveMemory(ctx, memory) })
	for range rpcHandlers - 1 {
		wg.Go(func() { s.serveQueue(ctx, appends) })
	}
	s.serveQueue(ctx, appends)
	wg.Wait()
	s.drain(sub)
	s.answerQueued(appends, memory)
}

// drainWait bounds how long a term's end waits for its RPC subscription
// to hand over what the connection had already taken in.
const drainWait = time.Second

// drainQuiet is how long a drain waits, with nothing pending in the
// client, for the subscription to take in anything more before it takes
// NATS for silent (a leader cut from it) and ends. It is spent from the
// lease of a cut leader, which must stop within it (TestPartitions: the
// term ends at 2/3 of a 2 s lease there): short, but far longer than a
// starved read loop's pause between two reads.
const drainQuiet = 100 * time.Millisecond

// drain ends the term's subscription without dropping what the connection
// had already taken in: Drain tells the server to send no more, and every
// request still pending in the client goes through enqueue, which answers
// it "not the leader" (the term ended), so its client asks the next leader
// at once. An Unsubscribe would drop them unanswered, each to wait out its
// request timeout.
//
// It waits for the drain's end: nats.go ends it once the server has
// answered a flush sent after the unsubscribe (so every request the server
// had routed here before it has been read) and nothing is pending. A
// client's pending count of 0 alone does not say that: the server may
// still be sending what it had routed here (a burst of 20,000 requests at
// a stepdown left 10,000 in flight when the count first read 0, and the
// Unsubscribe below dropped them unanswered: census 10 of
// docs/testing.md). A leader cut from NATS never gets the flush answered,
// and a term's end must not wait on NATS (the partition scenarios time it
// against the lease): so it also ends once nothing is pending and the
// subscription has taken in nothing for drainQuiet, and in any case after
// drainWait. The pending count drops after a callback returns, so at 0 no
// callback that saw the term still running can queue a request behind
// answerQueued; later ones see it ended and answer at once.
//
// The subscription must not outlive the term on the server. nats.go
// resends every subscription it holds at a reconnect, a draining one too,
// and later drops a drained one locally without an UNSUB. The server then
// delivers each request twice to this connection, and as the meta role
// may answer a request once, counted at each delivery, every answer of
// this replica's next term is refused (a permissions violation: its
// workers' heartbeats go unanswered and it expires them all). So a
// connection that is down only unsubscribes (held no more, nothing is
// resent; what it had received could not be answered before it is back
// anyway); the drain ends in an Unsubscribe of its own (an UNSUB again if
// the client still holds it); and a drain a reconnect overtook ends in a
// reconnect of its own, which leaves the server only the subscriptions
// the client holds.
func (s *rpcServer) drain(sub *nats.Subscription) {
	if !s.nc.IsConnected() {
		_ = sub.Unsubscribe()
		return
	}
	reconnects := s.nc.Stats().Reconnects
	defer func() {
		_ = sub.Unsubscribe()
		if s.nc.Stats().Reconnects != reconnects {
			s.logger.Warn().Msg("NATS reconnected while the term's RPC subscription drained; reconnecting once more so the server keeps none of it")
			_ = s.nc.ForceReconnect()
		}
	}()
	if err := sub.Drain(); err != nil {
		return
	}
	start := time.Now()
	deadline := start.Add(drainWait)
	delivered, _ := sub.Delivered()
	moved := start
	tick := time.NewTicker(2 * time.Millisecond)
	defer tick.Stop()
	for {
		if !sub.IsValid() {
			return // drained: the server sent everything before its flush answer, and each was answered
		}
		n, _, err := sub.Pending()
		if err != nil {
			return // closed meanwhile
		}
		now := time.Now()
		if d, _ := sub.Delivered(); d != delivered {
			delivered, moved = d, now
		}
		if n == 0 && now.Sub(moved) >= drainQuiet {
			s.logger.Info().Dur("quiet", drainQuiet).Msg("the term's RPC subscription drained nothing more and NATS did not answer its flush; ending it")
			return
		}
		if now.After(deadline) {
			s.logger.Warn().Int("pending", n).Dur("after", drainWait).Msg("the term's RPC subscription still had requests pending at its end; dropped unanswered")
			return
		}
		<-tick.C
	}
}

// enqueue queues request m for a handler, or answers it at once: the term
// ended, or its queue is full.
func (s *rpcServer) enqueue(ctx context.Context, m *nats.Msg, appends, memory chan<- *nats.Msg) {
	if ctx.Err() != nil {
		s.respond(m, termEnded())
		return
	}
	q := appends
	if s.rows[strings.TrimPrefix(m.Subject, s.prefix)].memory {
		q = memory
	}
	s.queued.Add(1)
	select {
	case q <- m:
	default:
		s.queued.Add(-1)
		s.respond(m, unavailable(errors.New("leader busy: request queue full")))
	}
}

// serveQueue handles the requests of one queue in order until ctx is done.
func (s *rpcServer) serveQueue(ctx context.Context, q <-chan *nats.Msg) {
	for {
		if ctx.Err() != nil {
			return // the term ended: serve answers what is still queued
		}
		select {
		case <-ctx.Done():
			return
		case m := <-q:
			s.queued.Add(-1)
			s.respond(m, s.handle(ctx, strings.TrimPrefix(m.Subject, s.prefix), m.Data))
		}
	}
}

// serveMemory handles the requests answered from memory until ctx is done:
// each one with those waiting behind it (up to memoryBatch), each RPC's
// together by its row's serveMany (RPCs in the order of their first
// request, each RPC's replies in arrival order).
func (s *rpcServer) serveMemory(ctx context.Context, q <-chan *nats.Msg) {
	for {
		if ctx.Err() != nil {
			return // the term ended: serve answers what is still queued
		}
		var batch []*nats.Msg
		select {
		case <-ctx.Done():
			return
		case m := <-q:
			batch = append(batch, m)
		}
		for more := true; more && len(batch) < memoryBatch; {
			select {
			case m := <-q:
				batch = append(batch, m)
			default:
				more = false
			}
		}
		s.queued.Add(-int64(len(batch)))
		s.serveBatch(batch, s.respond)
	}
}

// serveBatch answers batch through respond: a request that does not decode
// is a bad_request; the others of each RPC are served together, each
// answered its own reply.
func (s *rpcServer) serveBatch(batch []*nats.Msg, respond func(*nats.Msg, client.Reply)) {
	byName := map[string][]int{}
	var names []string // in the order of each RPC's first request
	reqs := make([]any, len(batch))
	for i, m := range batch {
		name := strings.TrimPrefix(m.Subject, s.prefix)
		req, err := s.rows[name].decode(m.Data)
		if err != nil {
			respond(m, decide.BadRequest(err))
			continue
		}
		reqs[i] = req
		if _, seen := byName[name]; !seen {
			names = append(names, name)
		}
		byName[name] = append(byName[name], i)
	}
	for _, name := range names {
		idx := byName[name]
		in := make([]any, len(idx))
		for j, i := range idx {
			in[j] = reqs[i]
		}
		for j, rep := range s.rows[name].serveMany(in) {
			s.logForbidden(name, in[j], rep)
			respond(batch[idx[j]], rep)
		}
	}
}

// answerQueued answers "the term ended" to every request still queued.
func (s *rpcServer) answerQueued(qs ...chan *nats.Msg) {
	for _, q := range qs {
		for drained := false; !drained; {
			select {
			case m := <-q:
				s.queued.Add(-1)
				s.respond(m, termEnded())
			default:
				drained = true
			}
		}
	}
}

// handle answers one request of RPC name: decoded by its row (a request
// that does not decode, or an RPC without a row, is a bad_request), then
// served; a worker's request refused as another incarnation's is logged.
// It never panics on input.
func (s *rpcServer) handle(ctx context.Context, name string, data []byte) client.Reply {
	r, ok := s.rows[name]
	if !ok {
		return decide.BadRequest(fmt.Errorf("unknown rpc %q", name))
	}
	req, err := r.decode(data)
	if err != nil {
		return decide.BadRequest(err)
	}
	rep := r.serve(ctx, req)
	s.logForbidden(name, req, rep)
	return rep
}

// respond sends rep, naming the term and the leader, if m asks for a reply.
func (s *rpcServer) respond(m *nats.Msg, rep client.Reply) {
	if m.Reply == "" {
		return
	}
	rep.Term, rep.Leader = s.term, s.leader
	b, _ := json.Marshal(rep)
	_ = m.Respond(b)
}

// unavailable is the reply to a request that could not be served now: not
// the leader (the term ended, a fence showed a newer term), or another
// transient failure; the client retries, at the next leader or later.
func unavailable(err error) client.Reply {
	code := client.CodeUnavailable
	if errors.Is(err, ErrNotLeader) || errors.Is(err, events.ErrFenced) || errors.Is(err, context.Canceled) {
		code = client.CodeNotLeader
	}
	return client.Reply{Error: &client.RPCError{Code: code, Message: err.Error()}}
}

// logForbidden logs a worker's request refused because another
// incarnation registered the worker (a reply forbidden to a request that
// names a registration); other requests are not logged.
func (s *rpcServer) logForbidden(rpc string, req any, rep client.Reply) {
	ref, isRef := req.(client.WorkerRef)
	if !isRef || rep.Error == nil || rep.Error.Code != client.CodeForbidden {
		return
	}
	s.logger.Warn().Str("rpc", rpc).Uint64("worker_id", ref.ID).Uint64("epoch", ref.Epoch).
		Str("claimed_incarnation", ref.Incarnation).Msg("refused: the registration belongs to another incarnation")
}
