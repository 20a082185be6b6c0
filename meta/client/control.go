package client

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"sync"
	"time"

	"github.com/rs/zerolog"
)

// Control-stream messages: newline-delimited JSON over one TCP connection
// (optionally TLS, see ListenAgentTLS) from the meta leader to the worker's
// endpoint.
const (
	MsgHello   = "hello"   // meta -> worker: the session's worker id, epoch, term
	MsgBarrier = "barrier" // meta -> worker: inject barrier N
	MsgAck     = "ack"     // worker -> meta: barrier N collected
)

// ControlMsg is one control-stream message.
type ControlMsg struct {
	Type    string `json:"type"`
	Worker  uint64 `json:"worker,omitempty"`
	Epoch   uint64 `json:"epoch,omitempty"`
	Term    uint64 `json:"term,omitempty"`
	Leader  string `json:"leader,omitempty"`
	Barrier uint64 `json:"barrier,omitempty"`
}

// MaxControlLine bounds one control message.
const MaxControlLine = 4096

// DecodeControl decodes one control message.
func DecodeControl(b []byte) (ControlMsg, error) {
	var m ControlMsg
	if len(b) > MaxControlLine {
		return m, errors.New("control message too long")
	}
	if err := json.Unmarshal(b, &m); err != nil {
		return m, fmt.Errorf("malformed control message: %v", err)
	}
	switch m.Type {
	case MsgHello, MsgBarrier, MsgAck:
	default:
		return m, fmt.Errorf("unknown control message type %q", m.Type)
	}
	return m, nil
}

// NewControlScanner returns a scanner bounded to MaxControlLine.
func NewControlScanner(c net.Conn) *bufio.Scanner {
	sc := bufio.NewScanner(c)
	sc.Buffer(make([]byte, 0, 512), MaxControlLine)
	return sc
}

// WriteControl writes one message and its newline.
func WriteControl(c net.Conn, m ControlMsg) error {
	b, err := AppendControl(nil, m)
	if err != nil {
		return err
	}
	_, err = c.Write(b)
	return err
}

// AppendControl appends one message and its newline to b.
func AppendControl(b []byte, m ControlMsg) ([]byte, error) {
	j, err := json.Marshal(m)
	if err != nil {
		return b, err
	}
	return append(append(b, j...), '\n'), nil
}

// Answer is the worker's reply to a message of an open session: a barrier
// is acked once collected (here: at once); nothing else is answered. Agent
// answers with it, and so does any other worker end of a control stream
// (the bench's in-memory one), so the protocol has one implementation.
func Answer(m ControlMsg) (ControlMsg, bool) {
	if m.Type != MsgBarrier {
		return ControlMsg{}, false
	}
	return ControlMsg{Type: MsgAck, Barrier: m.Barrier}, true
}

// Agent is the worker side of the control stream, listening on the worker's
// endpoint. Like a compute node's barrier worker it keeps one session: a new
// session resets the previous one, and every reset is counted. A session
// must open with a hello naming this worker's current registration (id and
// epoch); any other is refused without touching the current session, so a
// leader holding a stale id for this endpoint cannot reset it.
//
// With a TLS config (ListenAgentTLS) every connection must complete the
// TLS handshake, within HelloTimeout, before its hello is read; one that
// fails is dropped and counted.
type Agent struct {
	ln       net.Listener
	tls      *tls.Config // nil: plaintext
	logger   zerolog.Logger
	identity func() WorkerRef

	mu       sync.Mutex
	current  net.Conn
	hello    ControlMsg
	accepted int
	refused  int
	tlsFails int
	resets   int
	acked    uint64 // last barrier acked on the current session
	conns    sync.WaitGroup
	changed  chan struct{}
}

// AgentStats is what an Agent has seen.
type AgentStats struct {
	Accepted int        // sessions accepted in total
	Refused  int        // sessions refused (hello for another registration, or malformed)
	TLSFails int        // connections dropped in the TLS handshake (TLS agents only)
	Resets   int        // sessions reset by a newer one
	Active   bool       // a session is open now
	Hello    ControlMsg // the current session's hello
	Acked    uint64     // last barrier acked on the current session
}

// HelloTimeout bounds the wait for a new session's hello.
const HelloTimeout = 2 * time.Second

// ListenAgent listens on endpoint (host:port) for plaintext control
// streams. identity returns the worker's current registration (zero before
// the first one).
func ListenAgent(endpoint string, logger zerolog.Logger, identity func() WorkerRef) (*Agent, error) {
	return ListenAgentTLS(endpoint, nil, logger, identity)
}

// ListenAgentTLS is ListenAgent with TLS: every control stream is a TLS
// server connection with cfg (nil: plaintext). For mutual TLS, cfg
// requires and verifies client certificates (ClientAuth
// tls.RequireAndVerifyClientCert with ClientCAs), and the meta leader dials
// with Config.ControlTLS; a plaintext leader is then refused, and so is a
// leader without a certificate signed by ClientCAs.
func ListenAgentTLS(endpoint string, cfg *tls.Config, logger zerolog.Logger, identity func() WorkerRef) (*Agent, error) {
	if cfg != nil && len(cfg.Certificates) == 0 && cfg.GetCertificate == nil {
		return nil, fmt.Errorf("control stream listen on %s: TLS config has no certificate", endpoint)
	}
	ln, err := net.Listen("tcp", endpoint)
	if err != nil {
		return nil, fmt.Errorf("control stream listen on %s: %w", endpoint, err)
	}
	return &Agent{ln: ln, tls: cfg, logger: logger, identity: identity, changed: make(chan struct{})}, nil
}

// Addr is the address the agent listens on.
func (a *Agent) Addr() string { return a.ln.Addr().String() }

// Stats returns a copy of the agent's counters.
func (a *Agent) Stats() AgentStats {
	a.mu.Lock()
	defer a.mu.Unlock()
	return AgentStats{Accepted: a.accepted, Refused: a.refused, TLSFails: a.tlsFails, Resets: a.resets, Active: a.current != nil, Hello: a.hello, Acked: a.acked}
}

// Changed returns a channel closed at the next change of Stats.
func (a *Agent) Changed() <-chan struct{} {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.changed
}

func (a *Agent) notifyLocked() {
	close(a.changed)
	a.changed = make(chan struct{})
}

// Run accepts sessions until ctx is done, then closes everything and waits
// for its goroutines.
func (a *Agent) Run(ctx context.Context) error {
	stop := context.AfterFunc(ctx, func() { a.ln.Close() })
	defer stop()
	defer a.conns.Wait()
	defer func() {
		a.mu.Lock()
		if a.current != nil {
			a.current.Close()
		}
		a.mu.Unlock()
	}()
	for {
		c, err := a.ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("control stream accept: %w", err)
		}
		if a.tls != nil {
			c = tls.Server(c, a.tls)
		}
		a.conns.Add(1)
		go func() {
			defer a.conns.Done()
			a.serve(ctx, c)
		}()
	}
}

func (a *Agent) serve(ctx context.Context, c net.Conn) {
	stop := context.AfterFunc(ctx, func() { c.Close() })
	defer stop()
	defer func() {
		c.Close()
		a.mu.Lock()
		if a.current == c {
			a.current = nil
			a.notifyLocked()
		}
		a.mu.Unlock()
	}()
	if tc, ok := c.(*tls.Conn); ok {
		hctx, cancel := context.WithTimeout(ctx, HelloTimeout)
		err := tc.HandshakeContext(hctx)
		cancel()
		if err != nil {
			if ctx.Err() != nil {
				return // shutting down
			}
			a.mu.Lock()
			a.tlsFails++
			a.notifyLocked()
			a.mu.Unlock()
			a.logger.Warn().Err(err).Str("remote", c.RemoteAddr().String()).Msg("control stream refused: TLS handshake failed")
			return
		}
	}
	sc := NewControlScanner(c)
	_ = c.SetReadDeadline(time.Now().Add(HelloTimeout))
	if !sc.Scan() {
		return
	}
	hello, err := DecodeControl(sc.Bytes())
	me := WorkerRef{}
	if a.identity != nil {
		me = a.identity()
	}
	if err != nil || hello.Type != MsgHello || me.ID == 0 || hello.Worker != me.ID || hello.Epoch != me.Epoch {
		a.mu.Lock()
		a.refused++
		a.notifyLocked()
		a.mu.Unlock()
		if err != nil {
			msg := "control stream refused: malformed hello"
			if a.tls == nil {
				msg += " (is the leader dialling with TLS?)"
			}
			a.logger.Warn().Err(err).Msg(msg)
			return
		}
		a.logger.Warn().Uint64("hello_worker", hello.Worker).Uint64("hello_epoch", hello.Epoch).Uint64("worker_id", me.ID).Uint64("epoch", me.Epoch).Msg("control stream refused: not for this registration")
		return
	}
	_ = c.SetReadDeadline(time.Time{})
	a.mu.Lock()
	if a.current != nil {
		a.current.Close()
		a.resets++
		a.logger.Warn().Int("resets", a.resets).Msg("control stream has been reset to a new one")
	}
	a.current = c
	a.hello = hello
	a.acked = 0
	a.accepted++
	a.notifyLocked()
	a.mu.Unlock()
	a.logger.Info().Str("leader", hello.Leader).Uint64("term", hello.Term).Uint64("worker_id", hello.Worker).Bool("tls", a.tls != nil).Msg("control stream accepted")
	for sc.Scan() {
		m, err := DecodeControl(sc.Bytes())
		if err != nil {
			a.logger.Warn().Err(err).Msg("bad control message; closing session")
			return
		}
		ack, ok := Answer(m)
		if !ok {
			continue
		}
		if err := WriteControl(c, ack); err != nil {
			return
		}
		a.mu.Lock()
		if a.current == c {
			a.acked = ack.Barrier
			a.notifyLocked()
		}
		a.mu.Unlock()
	}
}
