package natslog

// Reading by message get while no consumer can be made.
//
// A reader's consumer is created by the JetStream meta leader. When the
// node leading the meta group is lost, the others elect a new one only
// after NATS Raft's election timeout (4-9 s), while the stream, led
// elsewhere, keeps taking appends. A reader whose consumer went with a lost
// node (or whose connection moved) would wait that long to deliver
// anything, and everything waiting on it with it (the leader's projection,
// appends fenced at its seq). Instead it reads by message get, which the
// stream's leader answers alone (the stream denies direct gets: never a
// stale copy), one seq after another up to the tail, and tries a consumer
// again in the background; once one can be made, the reader goes back to
// consumers.
//
// The limit: nats-server (2.15, jsMsgGetRequest) refuses a message get
// with "JetStream system temporarily unavailable" from a server that knows
// its meta group leaderless (a candidate's view: from the survivors'
// election timeout until a vote), so gets cover the time before the
// survivors campaign, when the dead leader is still followed and a
// consumer create goes unanswered; while the meta group is known
// leaderless the reader asks again as before.

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
)

const (
	// consumerFallbackAfter bounds a session's consumer creation before
	// it reads by message get instead (trying on in the background). It
	// was requestAttempt (1 s): for 2-3 s after a follower node's kill no
	// consumer create is answered (measured on 3 termlog nats nodes: every
	// create from 0.9 s to 3.3 s after the kill unanswered, a retry with
	// the same name too), and status took 1.0-1.3 s there, its own bound.
	// A create answers in milliseconds on a healthy cluster, and a leader
	// whose reader's consumer went with that node (view.AwaitStored
	// notices it after 300 ms) reads on by get 250 ms later.
	consumerFallbackAfter = 250 * time.Millisecond
	// getPoll is how often a reader reading by get asks for a new record
	// at the tail.
	getPoll = 100 * time.Millisecond
	// getFallbackMax is how many records a Read may still have to go
	// when it reads by get instead of waiting for a consumer (a few
	// hundred ms of round trips); a longer Read waits for a consumer.
	getFallbackMax = 1000
)

// errConsumerBack ends a session reading by get: a consumer can be made
// again, so the reader goes back to consumers at once.
var errConsumerBack = errors.New("a consumer can be made again")

// readByGet delivers records from *next in order to fn as a session does
// (see session), by message get from the stream's leader, until until
// (Read), fn's or ctx's error, a gap (events.ErrCompacted), a get that goes
// unanswered (*restartError), or a consumer made in the background
// (*restartError wrapping errConsumerBack).
func (l *Log) readByGet(ctx context.Context, next *uint64, exact bool, until uint64, fn func(events.Record) error) error {
	pctx, cancel := context.WithCancel(ctx)
	back := make(chan struct{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		if l.probeConsumer(pctx) {
			close(back)
		}
	}()
	defer wg.Wait()
	defer cancel()

	delivered, checked := false, false
	for {
		select {
		case <-back:
			return &restartError{errConsumerBack, true, false}
		default:
		}
		if until > 0 && *next > until {
			return nil
		}
		// The first record at or after *next, as the stream's leader holds it.
		m, err := l.getNext(ctx, *next)
		switch {
		case ctx.Err() != nil:
			return ctx.Err()
		case errors.Is(err, jetstream.ErrMsgNotFound):
			// Nothing at or after *next: the tail.
			if until > 0 {
				// Read: the records left up to until are gone (purged).
				if exact && !delivered {
					return l.compacted(*next, fmt.Sprintf("no record is left up to seq %d", until))
				}
				return nil
			}
			if !checked && (exact || delivered) {
				// Watch: is seq *next yet to come, or gone (the stream
				// compacted to its tail)? Its state says, once.
				checked = true
				info, err := l.info(ctx)
				switch {
				case ctx.Err() != nil:
					return ctx.Err()
				case err != nil:
					return &restartError{err, true, false}
				case info.State.LastSeq >= *next:
					// Held by now, or gone: asked again after the state,
					// a record at or after *next is found unless gone.
					if _, err := l.getNext(ctx, *next); errors.Is(err, jetstream.ErrMsgNotFound) {
						return l.compacted(*next, fmt.Sprintf("it holds no record from it, its last seq is %d", info.State.LastSeq))
					}
					continue
				}
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-back:
			case <-time.After(getPoll):
			}
			continue
		case err != nil:
			return &restartError{fmt.Errorf("get seq %d: %w", *next, err), true, false}
		}
		seq := m.Sequence
		if seq != *next && (exact || delivered) {
			return l.compacted(*next, fmt.Sprintf("the first record left is seq %d", seq))
		}
		if until > 0 && seq > until {
			return nil
		}
		delivered = true
		*next = seq + 1
		if err := fn(events.Record{Seq: seq, Data: m.Data}); err != nil {
			return err
		}
		if until > 0 && seq >= until {
			return nil
		}
	}
}

// getNext reads the first message at or after seq (a read by the stream's
// leader), asking again while it is not answered, until reqCtx's deadline.
func (l *Log) getNext(ctx context.Context, seq uint64) (*jetstream.RawStreamMsg, error) {
	return l.getMsg(ctx, seq, jetstream.WithGetMsgSubject(l.subjectAll()))
}

// probeConsumer tries to make a consumer, with backoff, until one is made
// (then it is deleted, and probeConsumer reports true) or ctx is done.
func (l *Log) probeConsumer(ctx context.Context) bool {
	cfg := readerConfig(1)
	cfg.DeliverPolicy, cfg.OptStartSeq = jetstream.DeliverNewPolicy, 0
	backoff := restartBackoffMin
	for {
		actx, acancel := context.WithTimeout(ctx, requestAttempt)
		_, err := l.stream.CreateConsumer(actx, cfg)
		acancel()
		if err == nil {
			l.deleteConsumer(ctx, cfg.Name)
			return true
		}
		if wait(ctx, backoff) != nil {
			return false
		}
		backoff = min(2*backoff, restartBackoffMax)
	}
}
