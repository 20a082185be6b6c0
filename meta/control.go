package meta

import (
	"context"
	"errors"
	"io"
	"net"
	"sort"
	"sync"
	"time"

	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
)

// ControlConn is one control-stream connection to a worker.
type ControlConn = net.Conn

// DialControl opens a control stream to a worker endpoint over TCP.
func DialControl(ctx context.Context, endpoint string) (ControlConn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", endpoint)
}

// Recovery states.
const (
	RecoveryRecovering = "recovering"
	RecoveryComplete   = "complete"
)

// Recovery is the barrier recovery of one term, as status shows it.
type Recovery struct {
	Term        uint64            `json:"term"`
	State       string            `json:"state"`
	Barrier     uint64            `json:"barrier"`
	Rounds      int               `json:"rounds"`   // reconcile rounds
	Attempts    int               `json:"attempts"` // barrier injections
	Sessions    map[string]uint64 `json:"sessions"` // endpoint -> worker id, one per endpoint
	Waiting     []uint64          `json:"waiting,omitempty"`
	StartedAt   time.Time         `json:"started_at"`
	CompletedAt time.Time         `json:"completed_at,omitzero"`
	Took        time.Duration     `json:"took,omitempty"`
}

func (l *leaderSession) recovery() Recovery {
	l.rmu.Lock()
	defer l.rmu.Unlock()
	r := l.rec
	r.Sessions = make(map[string]uint64, len(l.rec.Sessions))
	for k, v := range l.rec.Sessions {
		r.Sessions[k] = v
	}
	r.Waiting = append([]uint64(nil), l.rec.Waiting...)
	return r
}

type session struct {
	endpoint string
	id       uint64
	epoch    uint64
	conn     ControlConn
	sent     bool // barrier injected
	acked    bool
	closed   bool
}

type sessionEvent struct {
	s       *session
	barrier uint64 // 0: the session ended
}

// controlLoop keeps at most one control session per endpoint, matching the
// projected workers, and runs the initial barrier recovery of this term.
func (l *leaderSession) controlLoop(ctx context.Context) {
	cfg := &l.r.cfg
	barrier := l.term
	sessions := map[string]*session{}
	evc := make(chan sessionEvent, 64)
	var wg sync.WaitGroup
	defer func() {
		for _, s := range sessions {
			s.conn.Close()
		}
		wg.Wait()
	}()
	l.rmu.Lock()
	l.rec = Recovery{Term: l.term, State: RecoveryRecovering, Barrier: barrier, StartedAt: cfg.Clock.Now()}
	l.rmu.Unlock()

	for {
		changed := l.r.proj.Changed()
		v := l.r.proj.View()
		desired := map[string]projections.Worker{}
		for _, w := range v.ListWorkers() {
			desired[w.Endpoint] = w
		}
		// Close sessions that no longer match the projection.
		for ep, s := range sessions {
			w, ok := desired[ep]
			if !ok || w.ID != s.id || w.Epoch != s.epoch || s.closed {
				s.conn.Close()
				delete(sessions, ep)
			}
		}
		// Open one session per endpoint that has none.
		eps := make([]string, 0, len(desired))
		for ep := range desired {
			eps = append(eps, ep)
		}
		sort.Strings(eps)
		attempts := 0
		for _, ep := range eps {
			if ctx.Err() != nil {
				return
			}
			w := desired[ep]
			s, ok := sessions[ep]
			if !ok {
				s = l.openSession(ctx, w, &wg, evc)
				if s == nil {
					continue
				}
				sessions[ep] = s
			}
			if !s.sent {
				attempts++
				if err := client.WriteControl(s.conn, client.ControlMsg{Type: client.MsgBarrier, Barrier: barrier}); err != nil {
					s.closed = true
					continue
				}
				s.sent = true
			}
		}
		var waiting []uint64
		for _, ep := range eps {
			if s, ok := sessions[ep]; !ok || !s.acked {
				waiting = append(waiting, desired[ep].ID)
			}
		}
		sort.Slice(waiting, func(i, j int) bool { return waiting[i] < waiting[j] })
		l.rmu.Lock()
		l.rec.Rounds++
		l.rec.Attempts += attempts
		l.rec.Waiting = waiting
		l.rec.Sessions = map[string]uint64{}
		for ep, s := range sessions {
			l.rec.Sessions[ep] = s.id
		}
		if l.rec.State == RecoveryRecovering && len(waiting) == 0 {
			l.rec.State = RecoveryComplete
			l.rec.CompletedAt = cfg.Clock.Now()
			l.rec.Took = l.rec.CompletedAt.Sub(l.rec.StartedAt)
			l.logger.Info().Int("workers", len(desired)).Dur("took", l.rec.Took).Uint64("seq", v.Seq).Msg("initial barrier recovery complete")
		}
		l.rmu.Unlock()

		select {
		case <-ctx.Done():
			return
		case <-changed:
		case ev := <-evc:
			l.sessionEvent(sessions, ev)
		drain:
			for {
				select {
				case ev := <-evc:
					l.sessionEvent(sessions, ev)
				default:
					break drain
				}
			}
		case <-cfg.Clock.After(cfg.RecoveryRetry):
		}
	}
}

func (l *leaderSession) sessionEvent(sessions map[string]*session, ev sessionEvent) {
	if sessions[ev.s.endpoint] != ev.s {
		return // an old session
	}
	if ev.barrier == 0 {
		ev.s.closed = true
		l.logger.Warn().Str("endpoint", ev.s.endpoint).Uint64("worker_id", ev.s.id).Msg("control stream closed; reconnecting")
		return
	}
	ev.s.acked = true
}

// openSession dials the worker, says hello and starts the session's reader.
func (l *leaderSession) openSession(ctx context.Context, w projections.Worker, wg *sync.WaitGroup, evc chan<- sessionEvent) *session {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := l.r.cfg.ControlDialer(dctx, w.Endpoint)
	cancel()
	if err != nil {
		l.logger.Debug().Err(err).Str("endpoint", w.Endpoint).Uint64("worker_id", w.ID).Msg("control stream dial failed")
		return nil
	}
	hello := client.ControlMsg{Type: client.MsgHello, Worker: w.ID, Epoch: w.Epoch, Term: l.term, Leader: l.r.cfg.ID}
	if err := client.WriteControl(conn, hello); err != nil {
		conn.Close()
		return nil
	}
	s := &session{endpoint: w.Endpoint, id: w.ID, epoch: w.Epoch, conn: conn}
	l.logger.Info().Str("endpoint", w.Endpoint).Uint64("worker_id", w.ID).Uint64("epoch", w.Epoch).Msg("control stream opened")
	wg.Add(1)
	go func() {
		defer wg.Done()
		send := func(ev sessionEvent) bool {
			select {
			case evc <- ev:
				return true
			case <-ctx.Done():
				return false
			}
		}
		sc := client.NewControlScanner(conn)
		for sc.Scan() {
			m, err := client.DecodeControl(sc.Bytes())
			if err != nil || m.Type != client.MsgAck {
				continue
			}
			if !send(sessionEvent{s: s, barrier: m.Barrier}) {
				return
			}
		}
		if err := sc.Err(); err != nil && !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
			l.logger.Debug().Err(err).Str("endpoint", s.endpoint).Msg("control stream read")
		}
		send(sessionEvent{s: s})
	}()
	return s
}
