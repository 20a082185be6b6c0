package natslog

import (
	"fmt"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
)

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

// consume starts the consumer's delivery to d; stop ends it and waits
// (bounded) for the client's delivery goroutine.
func (d *delivery) consume(cons jetstream.Consumer) (stop func(), err error) {
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
		return nil, &restartError{fmt.Errorf("consume: %w", err), true, false}
	}
	return func() {
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
	}, nil
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
