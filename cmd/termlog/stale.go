package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/health"
	"github.com/termlog/termlog/natsserver"
)

// staleAfter is how long status waits for the event stream's leader to
// answer before it answers from a copy instead (marked stale, exit 1):
// while a replicated stream elects a leader after a NATS node was lost
// (4-9 s), nothing answers a read of the stream, and a user asking what
// the cluster is doing should not wait that long to hear "an election".
const staleAfter = 750 * time.Millisecond

// staleRead bounds the read of the copy.
const staleRead = 500 * time.Millisecond

// Stale is a status answered from a copy (health.StaleCopy).
type Stale = health.StaleCopy

// directGet reads the last message on subject of a KV stream with a
// direct get: any replica that is current answers it from its own copy,
// with or without a stream leader. found is false when there is none.
func directGet(ctx context.Context, nc *nats.Conn, stream, subject string) (data []byte, found bool, err error) {
	m, err := nc.RequestWithContext(ctx, "$JS.API.DIRECT.GET."+stream+"."+subject, nil)
	if err != nil {
		return nil, false, err
	}
	switch st := m.Header.Get("Status"); st {
	case "":
		return m.Data, true, nil
	case "404":
		return nil, false, nil
	default:
		return nil, false, fmt.Errorf("direct get %s: status %s %s", subject, st, m.Header.Get("Description"))
	}
}

// staleStatus is a status from the copies: the leader's last health record
// (its provenance: leader, term, projected seq, time) and the lease holder,
// marked stale with why. It fails when there is no record to answer from.
func staleStatus(ctx context.Context, nc *nats.Conn, cluster, why string) (Status, error) {
	health := meta.HealthBucket(cluster)
	b, found, err := directGet(ctx, nc, "KV_"+health, "$KV."+health+"."+meta.HealthKey)
	if err != nil {
		return Status{}, fmt.Errorf("health record copy: %w", err)
	}
	if !found {
		return Status{}, errors.New("no health record to answer from")
	}
	var rec meta.HealthRecord
	if err := json.Unmarshal(b, &rec); err != nil {
		return Status{}, fmt.Errorf("health record copy: %w", err)
	}
	s := Status{Cluster: cluster, Seq: rec.Seq, Term: rec.Term, Leader: rec.Leader, At: rec.At}
	lease := meta.LeaseBucket(cluster)
	if h, found, err := directGet(ctx, nc, "KV_"+lease, "$KV."+lease+"."+meta.LeaseKey); err != nil {
		s.LeaseError = "lease copy: " + err.Error()
	} else if found {
		s.LeaseHolder = string(h)
	}
	age := max(time.Since(rec.At), 0)
	server := nc.ConnectedServerName()
	if server == "" {
		server = nc.ConnectedUrlRedacted()
	}
	s.Stale = &Stale{Reason: why, Seq: rec.Seq, AgeMS: age.Milliseconds(),
		Source: fmt.Sprintf("the health record of term %d by %s, read through %s", rec.Term, rec.Leader, server)}
	s.Health = Health{Record: &rec, AgeMS: age.Milliseconds(), Problems: []string{s.Stale.String()}}
	return s, nil
}

// status connects and reads the cluster: the stream (folded), the lease
// and the health record, each step within --timeout, a failure naming its
// cause. When allowStale and the event stream's leader has not answered
// within staleAfter, it answers from the copies instead (Status.Stale,
// which is never healthy); when there is no copy either, it goes on
// waiting for the stream.
func (g *globals) statusRead(ctx context.Context, allowStale bool) (Status, error) {
	lg, err := g.logger()
	if err != nil {
		return Status{}, err
	}
	s, err := g.dialSession("termlog-status", natsserver.RoleObserver)
	if err != nil {
		return Status{}, err
	}
	defer s.Close()
	type result struct {
		st  Status
		err error
	}
	fctx, fcancel := context.WithCancel(ctx)
	defer fcancel()
	answered := make(chan struct{}) // the stream's leader answered
	silent := make(chan struct{})   // ... and then stopped answering
	done := make(chan result, 1)
	began := time.Now()
	go func() {
		l, err := s.openStream(fctx, false)
		if err == nil {
			// The stream's leader answers its last seq: from here on the
			// read is the stream's, however long the fold takes, as long
			// as the leader goes on answering.
			err = s.call(fctx, func(ctx context.Context) error { _, err := l.Tail(ctx); return err })
			if err != nil {
				err = s.timeoutError(err, "stream "+l.Stream()+" did not answer")
			}
		}
		if err != nil {
			done <- result{err: err}
			return
		}
		close(answered)
		pctx, pcancel := context.WithCancel(fctx)
		var probe sync.WaitGroup
		if allowStale {
			probe.Go(func() { probeLeader(pctx, l, silent) })
		}
		// Only snapshots passed over are worth a line next to the answer.
		st, err := loadStatusFrom(fctx, s, l, lg.Level(max(lg.GetLevel(), zerolog.WarnLevel)))
		pcancel()
		probe.Wait()
		done <- result{st, err}
	}()
	wait := func() (Status, error) { r := <-done; return r.st, r.err }
	if !allowStale {
		return wait()
	}
	timer := time.NewTimer(staleAfter)
	defer timer.Stop()
	select {
	case r := <-done:
		if r.err == nil || !natslog.Unanswered(r.err) {
			return r.st, r.err
		}
		// Refused at once by a node whose JetStream is stopping or
		// electing (503): the copy, like an unanswered read.
		sctx, scancel := context.WithTimeout(ctx, staleRead)
		st, serr := staleStatus(sctx, s.nc, g.cluster, fmt.Sprintf("the event stream could not be read (%v)", r.err))
		scancel()
		if serr != nil {
			return r.st, r.err
		}
		return st, nil
	case <-answered:
		select {
		case r := <-done:
			return r.st, r.err
		case <-silent:
		}
	case <-timer.C:
	}
	why := fmt.Sprintf("the event stream's leader did not answer within %s (a NATS node lost, its Raft group electing a leader?)", time.Since(began).Round(10*time.Millisecond))
	select {
	case <-silent:
		why = fmt.Sprintf("the event stream's leader stopped answering during the read (for %s: a NATS node lost, its Raft group electing a leader?)", staleAfter)
	default:
	}
	// The copy is asked again until the stream's own read ends: right
	// after a node is lost, a direct get may first go to the lost node's
	// replica and stay unanswered (seen in CI: one 500 ms attempt failed
	// and status waited its whole --timeout, exit 2).
	for {
		sctx, scancel := context.WithTimeout(ctx, staleRead)
		st, serr := staleStatus(sctx, s.nc, g.cluster, why)
		scancel()
		if serr == nil {
			select {
			case r := <-done: // the read came meanwhile: it, not the copy
				if r.err == nil {
					return r.st, nil
				}
			default:
				fcancel()
				<-done
			}
			return st, nil
		}
		select {
		case r := <-done: // no copy, and the stream's answer or its error
			return r.st, r.err
		case <-ctx.Done():
			return wait()
		case <-time.After(staleRetry):
		}
	}
}

// staleRetry is the pause between two reads of the copy.
const staleRetry = 100 * time.Millisecond

// probeLeader asks the stream's leader for its last seq every staleAfter
// while a status read folds the stream, and closes silent when it does not
// answer within staleAfter (the leader's node lost mid-read).
func probeLeader(ctx context.Context, l *natslog.Log, silent chan struct{}) {
	for {
		pctx, cancel := context.WithTimeout(ctx, staleAfter)
		_, err := l.Tail(pctx)
		cancel()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			close(silent)
			return
		}
		t := time.NewTimer(staleAfter)
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		}
	}
}
