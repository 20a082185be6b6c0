package meta

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/rs/zerolog"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/projections"
	"github.com/termlog/termlog/view"
)

// ControlConn is one control-stream connection to a worker.
type ControlConn = net.Conn

// DialControl opens a control stream to a worker endpoint over TCP.
func DialControl(ctx context.Context, endpoint string) (ControlConn, error) {
	var d net.Dialer
	return d.DialContext(ctx, "tcp", endpoint)
}

// clientTLS runs the TLS client handshake of a control stream over conn
// (Config.ControlTLS); without a ServerName in cfg the worker is checked
// against the host of its endpoint. conn is closed when it fails.
func clientTLS(ctx context.Context, conn ControlConn, cfg *tls.Config, endpoint string) (ControlConn, error) {
	if cfg.ServerName == "" {
		host, _, err := net.SplitHostPort(endpoint)
		if err != nil {
			conn.Close()
			return nil, fmt.Errorf("control stream TLS: endpoint %q: %w", endpoint, err)
		}
		cfg = cfg.Clone()
		cfg.ServerName = host
	}
	tc := tls.Client(conn, cfg)
	if err := tc.HandshakeContext(ctx); err != nil {
		conn.Close()
		return nil, fmt.Errorf("control stream TLS handshake with %s: %w", endpoint, err)
	}
	return tc, nil
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
	Seq         uint64            `json:"seq,omitempty"` // complete: every worker active at this projection seq acked
	Rounds      int               `json:"rounds"`        // reconcile rounds
	Attempts    int               `json:"attempts"`      // barrier injections
	Sessions    map[string]uint64 `json:"sessions"`      // endpoint -> worker id, one per endpoint
	Waiting     []uint64          `json:"waiting,omitempty"`
	StartedAt   time.Time         `json:"started_at"`
	CompletedAt time.Time         `json:"completed_at,omitzero"`
	Took        time.Duration     `json:"took,omitempty"`
}

// recovery is the term's barrier recovery as status shows it: a copy made
// on the term's loop.
func (l *leaderSession) recovery() Recovery {
	var r Recovery
	l.loop.read(func() { r = l.recov.snapshot() })
	return r
}

// recoveryState is a term's barrier recovery. It belongs to the term's
// loop: the control loop changes it, and status reads copies, by messages.
type recoveryState struct {
	rec     Recovery            // Waiting is kept in waiting instead
	waiting map[uint64]struct{} // active workers without an acked control session
}

// snapshot returns a copy of the recovery, Waiting sorted.
func (rs *recoveryState) snapshot() Recovery {
	r := rs.rec
	r.Sessions = make(map[string]uint64, len(rs.rec.Sessions))
	for k, v := range rs.rec.Sessions {
		r.Sessions[k] = v
	}
	r.Waiting = make([]uint64, 0, len(rs.waiting))
	for id := range rs.waiting {
		r.Waiting = append(r.Waiting, id)
	}
	slices.Sort(r.Waiting)
	if len(r.Waiting) == 0 {
		r.Waiting = nil
	}
	return r
}

type session struct {
	endpoint string
	id       uint64
	epoch    uint64
	conn     ControlConn
	acked    bool
	closed   bool
	round    uint64 // last reconcile round that found it matching the projection
}

type sessionEvent struct {
	s       *session
	barrier uint64 // 0: the session ended
}

// controlDebounce is how long the control loop lets changes of the
// projection accumulate before it reconciles its sessions with them: a
// registration burst changes the projection thousands of times a second,
// and each reconcile looks at every worker.
const controlDebounce = 20 * time.Millisecond

// controller is the state of one term's control loop; only the loop's
// goroutine touches it.
type controller struct {
	rd       *recoveryDuty
	barrier  uint64
	sessions map[string]*session // by endpoint
	round    uint64
	// seq and workers describe the projection the last reconcile saw: the
	// waiting set is exact for seq only.
	seq     uint64
	workers int
	evc     chan sessionEvent
	wg      sync.WaitGroup
}

// recoveryDuty is the term's control sessions and its initial barrier
// recovery (controlLoop).
type recoveryDuty struct {
	cfg       *Config
	proj      *view.Projector
	loop      *termLoop // owns recov
	recov     *recoveryState
	term      uint64
	recovered func() // tells the replica the recovery is complete
	logger    zerolog.Logger
}

// controlLoop keeps at most one control session per endpoint, matching the
// projected workers, and runs the initial barrier recovery of this term.
//
// It is incremental: a change of the projection schedules one reconcile
// controlDebounce later (changes meanwhile join it), and a reconcile costs
// one pass over the projected workers without copying or sorting them,
// plus work only for the workers whose session must change. A session's
// ack or end is handled on its own, without a reconcile (an end schedules
// one, to reconnect). Status (recovery) sorts on demand.
func (rd *recoveryDuty) controlLoop(ctx context.Context) {
	cfg := rd.cfg
	c := &controller{rd: rd, barrier: rd.term, sessions: map[string]*session{}, evc: make(chan sessionEvent, 1024)}
	defer func() {
		for _, s := range c.sessions {
			s.conn.Close()
		}
		c.wg.Wait()
	}()
	start := Recovery{Term: rd.term, State: RecoveryRecovering, Barrier: c.barrier, StartedAt: cfg.Clock.Now(), Sessions: map[string]uint64{}}
	if !rd.loop.do(ctx, func() { rd.recov.rec, rd.recov.waiting = start, map[uint64]struct{}{} }) {
		return
	}

	changed := rd.proj.Changed()
	c.reconcile(ctx)
	var due <-chan time.Time // a reconcile is scheduled
	schedule := func() {
		if due == nil {
			due = cfg.Clock.After(controlDebounce)
		}
	}
	retry := cfg.Clock.After(cfg.RecoveryRetry)
	for {
		select {
		case <-ctx.Done():
			return
		case <-changed:
			changed = rd.proj.Changed()
			schedule()
		case ev := <-c.evc:
			if c.event(ev) {
				schedule()
			}
		case <-due:
			due = nil
			c.reconcile(ctx)
		case <-retry:
			// Dials that failed are tried again.
			retry = cfg.Clock.After(cfg.RecoveryRetry)
			c.reconcile(ctx)
		}
	}
}

// reconcile closes the sessions that no longer match the projection, opens
// one (and injects the barrier) for every active worker without a matching
// session, and recomputes who is waiting.
func (c *controller) reconcile(ctx context.Context) {
	c.round++
	open, waiting := c.match()
	var gone []string
	for ep, s := range c.sessions {
		if s.round != c.round {
			s.conn.Close()
			delete(c.sessions, ep)
			gone = append(gone, ep)
		}
	}
	slices.SortFunc(open, func(a, b projections.Worker) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	opened := make([]*session, 0, len(open))
	for _, w := range open {
		waiting = append(waiting, w.ID)
		if ctx.Err() != nil {
			continue
		}
		s := c.rd.openSession(ctx, w, &c.wg, c.evc)
		if s == nil {
			continue
		}
		s.round = c.round
		c.sessions[w.Endpoint] = s
		opened = append(opened, s)
		if err := client.WriteControl(s.conn, client.ControlMsg{Type: client.MsgBarrier, Barrier: c.barrier}); err != nil {
			s.closed = true
		}
	}
	c.rd.loop.do(ctx, func() { c.record(gone, opened, waiting) })
}

// match looks at the projection: the active workers without a matching
// session (to open), and those with an unacked one (waiting). The sessions
// that match are marked with this round.
func (c *controller) match() (open []projections.Worker, waiting []uint64) {
	c.rd.proj.Peek(func(v *projections.State) {
		c.seq, c.workers = v.Seq, len(v.Endpoints)
		for ep, id := range v.Endpoints {
			w := v.Workers[id]
			if w == nil {
				continue
			}
			if s := c.sessions[ep]; s != nil && s.id == w.ID && s.epoch == w.Epoch && !s.closed {
				s.round = c.round
				if !s.acked {
					waiting = append(waiting, w.ID)
				}
				continue
			}
			open = append(open, *w)
		}
	})
	return open, waiting
}

// record writes a reconcile's outcome into the recovery, on the term's loop.
func (c *controller) record(gone []string, opened []*session, waiting []uint64) {
	rs := c.rd.recov
	rs.rec.Rounds++
	rs.rec.Attempts += len(opened)
	for _, ep := range gone {
		delete(rs.rec.Sessions, ep)
	}
	for _, s := range opened {
		rs.rec.Sessions[s.endpoint] = s.id
	}
	clear(rs.waiting)
	for _, id := range waiting {
		rs.waiting[id] = struct{}{}
	}
	c.complete()
}

// complete ends the initial recovery once nobody waits, judged on the
// projection at c.seq: the waiting set holds every worker active at c.seq
// that has not acked. On the term's loop.
func (c *controller) complete() {
	rd := c.rd
	if rd.recov.rec.State != RecoveryRecovering || len(rd.recov.waiting) > 0 {
		return
	}
	rd.recov.rec.State = RecoveryComplete
	rd.recov.rec.Seq = c.seq
	rd.recov.rec.CompletedAt = rd.cfg.Clock.Now()
	rd.recov.rec.Took = rd.recov.rec.CompletedAt.Sub(rd.recov.rec.StartedAt)
	rd.logger.Info().Int("workers", c.workers).Dur("took", rd.recov.rec.Took).Uint64("seq", c.seq).Msg("initial barrier recovery complete")
	rd.recovered()
}

// event handles a session's ack or end; it reports whether a reconcile is
// needed (the session ended and must be reopened, or the last ack came
// after the projection moved on).
//
// The last awaited ack completes the recovery only while the projection is
// still at the seq of the last reconcile: a worker that joined since then
// has no session yet and is in no waiting set, so the reconcile decides.
func (c *controller) event(ev sessionEvent) bool {
	rd := c.rd
	if c.sessions[ev.s.endpoint] != ev.s {
		return false // an old session
	}
	if ev.barrier == 0 {
		ev.s.closed = true
		// Info, not a warning: a worker that stops (termlog up's Ctrl-C, a
		// deregistration) closes its stream first. The reconcile it
		// schedules opens it again while the projection holds the worker
		// active ("control stream opened"), and expiry deals with one gone.
		rd.logger.Info().Str("endpoint", ev.s.endpoint).Uint64("worker_id", ev.s.id).Msg("control stream closed by the worker's end; opened again while the worker is active")
		return true
	}
	if ev.s.acked || ev.s.closed {
		return false
	}
	if ev.barrier != c.barrier {
		// An ack counts for the barrier it names only: this term's. A
		// worker that acks another one (a confused or hostile peer) has
		// not collected ours, and stays waiting.
		rd.logger.Warn().Str("endpoint", ev.s.endpoint).Uint64("worker_id", ev.s.id).Uint64("acked", ev.barrier).
			Uint64("barrier", c.barrier).Msg("control ack names another barrier; ignored")
		return false
	}
	ev.s.acked = true
	again := false
	rd.loop.do(context.Background(), func() {
		delete(rd.recov.waiting, ev.s.id)
		if rd.recov.rec.State != RecoveryRecovering || len(rd.recov.waiting) > 0 {
			return
		}
		if rd.proj.Seq() != c.seq {
			again = true
			return
		}
		c.complete()
	})
	return again
}

// openSession dials the worker, says hello and starts the session's reader.
func (rd *recoveryDuty) openSession(ctx context.Context, w projections.Worker, wg *sync.WaitGroup, evc chan<- sessionEvent) *session {
	dctx, cancel := context.WithTimeout(ctx, time.Second)
	conn, err := rd.cfg.ControlDialer(dctx, w.Endpoint)
	if err == nil && rd.cfg.ControlTLS != nil {
		conn, err = clientTLS(dctx, conn, rd.cfg.ControlTLS, w.Endpoint)
	}
	cancel()
	if err != nil {
		rd.logger.Debug().Err(err).Str("endpoint", w.Endpoint).Uint64("worker_id", w.ID).Msg("control stream dial failed")
		return nil
	}
	hello := client.ControlMsg{Type: client.MsgHello, Worker: w.ID, Epoch: w.Epoch, Term: rd.term, Leader: rd.cfg.ID}
	if err := client.WriteControl(conn, hello); err != nil {
		conn.Close()
		return nil
	}
	s := &session{endpoint: w.Endpoint, id: w.ID, epoch: w.Epoch, conn: conn}
	rd.logger.Info().Str("endpoint", w.Endpoint).Uint64("worker_id", w.ID).Uint64("epoch", w.Epoch).Msg("control stream opened")
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
			rd.logger.Debug().Err(err).Str("endpoint", s.endpoint).Msg("control stream read")
		}
		send(sessionEvent{s: s})
	}()
	return s
}
