package bench

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"github.com/synadia-io/orbit.go/jetstreamext"

	"github.com/termlog/termlog/meta/client"
)

// rawBatcher is the raw register baseline's group commit on a server that
// syncs before every ack: the requests that wait while a batch is being
// stored are stored next as one atomic batch (up to 1000 messages, the
// server's limit), one batch in flight, each request answered once the
// server acknowledged its batch's commit.
type rawBatcher struct {
	js      jetstream.JetStream
	subject string

	mu   sync.Mutex
	q    []rawReq
	wake chan struct{}
	done chan struct{}
	once sync.Once
}

type rawReq struct {
	m  *nats.Msg
	id func(ack *jetstream.PubAck) client.Reply
}

func newRawBatcher(js jetstream.JetStream, subject string) *rawBatcher {
	return &rawBatcher{js: js, subject: subject, wake: make(chan struct{}, 1), done: make(chan struct{})}
}

// add queues a request (from a subscription's handler).
func (b *rawBatcher) add(m *nats.Msg, id func(ack *jetstream.PubAck) client.Reply) {
	b.mu.Lock()
	b.q = append(b.q, rawReq{m, id})
	b.mu.Unlock()
	select {
	case b.wake <- struct{}{}:
	default:
	}
}

// close stops run (requests still queued are not answered).
func (b *rawBatcher) close() { b.once.Do(func() { close(b.done) }) }

// run stores the queue in batches until close or ctx ends.
func (b *rawBatcher) run(ctx context.Context) {
	for {
		select {
		case <-b.wake:
		case <-b.done:
			return
		case <-ctx.Done():
			return
		}
		for {
			b.mu.Lock()
			n := min(len(b.q), 1000)
			batch := append([]rawReq(nil), b.q[:n]...)
			b.q = append(b.q[:0], b.q[n:]...)
			b.mu.Unlock()
			if n == 0 {
				break
			}
			b.store(ctx, batch)
		}
	}
}

func (b *rawBatcher) store(ctx context.Context, batch []rawReq) {
	msgs := make([]*nats.Msg, len(batch))
	for i, rq := range batch {
		msgs[i] = &nats.Msg{Subject: b.subject, Data: rq.m.Data, Header: nats.Header{}}
	}
	var last uint64
	var err error
	if len(msgs) == 1 {
		var ack *jetstream.PubAck
		if ack, err = b.js.PublishMsg(ctx, msgs[0]); err == nil {
			last = ack.Sequence
		}
	} else {
		var ack *jetstreamext.BatchAck
		if ack, err = jetstreamext.PublishMsgBatch(ctx, b.js, msgs); err == nil {
			last = ack.Sequence
		}
	}
	for i, rq := range batch {
		var reply client.Reply
		if err != nil {
			reply = client.Reply{Error: &client.RPCError{Code: client.CodeUnavailable, Message: err.Error()}}
		} else {
			reply = rq.id(&jetstream.PubAck{Sequence: last - uint64(len(batch)-1-i)})
		}
		body, _ := json.Marshal(reply)
		_ = rq.m.Respond(body)
	}
}
