package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net"
	"strconv"
	"sync"
	"time"

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
)

// agentConn is the worker end of a control stream, in memory: it answers
// every barrier with an ack, as client.Agent does, without a goroutine or a
// socket of its own. 10,000 real agents would need 30,000 file descriptors
// in one process; the leader's side (its session reader goroutine, the
// hello, the barrier, the ack) is unchanged.
type agentConn struct {
	endpoint string

	mu     sync.Mutex
	cond   *sync.Cond
	in     []byte // partial line written by the leader
	out    []byte // acks for the leader to read
	closed bool
}

// dialAgent is a meta.Config.ControlDialer that connects to an in-memory agent.
func dialAgent(_ context.Context, endpoint string) (meta.ControlConn, error) {
	c := &agentConn{endpoint: endpoint}
	c.cond = sync.NewCond(&c.mu)
	return c, nil
}

func (c *agentConn) Write(b []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return 0, net.ErrClosed
	}
	c.in = append(c.in, b...)
	for {
		i := bytes.IndexByte(c.in, '\n')
		if i < 0 {
			break
		}
		m, err := client.DecodeControl(c.in[:i])
		c.in = c.in[i+1:]
		if err == nil && m.Type == client.MsgBarrier {
			c.out = append(c.out, `{"type":"ack","barrier":`...)
			c.out = strconv.AppendUint(c.out, m.Barrier, 10)
			c.out = append(c.out, "}\n"...)
			c.cond.Broadcast()
		}
	}
	if len(c.in) == 0 {
		c.in = nil
	}
	return len(b), nil
}

func (c *agentConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for len(c.out) == 0 && !c.closed {
		c.cond.Wait()
	}
	if len(c.out) == 0 {
		return 0, io.EOF
	}
	n := copy(p, c.out)
	c.out = c.out[n:]
	if len(c.out) == 0 {
		c.out = nil
	}
	return n, nil
}

func (c *agentConn) Close() error {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.closed = true
	c.cond.Broadcast()
	return nil
}

type fakeAddr string

func (a fakeAddr) Network() string { return "mem" }
func (a fakeAddr) String() string  { return string(a) }

func (c *agentConn) LocalAddr() net.Addr              { return fakeAddr("meta") }
func (c *agentConn) RemoteAddr() net.Addr             { return fakeAddr(c.endpoint) }
func (c *agentConn) SetDeadline(time.Time) error      { return nil }
func (c *agentConn) SetReadDeadline(time.Time) error  { return nil }
func (c *agentConn) SetWriteDeadline(time.Time) error { return nil }

// logMark is one leader milestone read from a replica's log.
type logMark struct {
	At      time.Time
	Replica string
	Term    uint64
	Message string
}

// Milestones logged by meta replicas.
const (
	msgLeaseAcquired    = "lease acquired"
	msgTermStarted      = "term started"
	msgRecoveryComplete = "initial barrier recovery complete"
)

// logWatch is the replicas' log writer: it drops the lines (their encoding
// cost is paid, as in production at info level) and notes the milestones.
type logWatch struct {
	mu      sync.Mutex
	marks   []logMark
	changed chan struct{}
}

func newLogWatch() *logWatch { return &logWatch{changed: make(chan struct{})} }

var milestoneKeys = [][]byte{[]byte(`"` + msgLeaseAcquired + `"`), []byte(`"` + msgTermStarted + `"`), []byte(`"` + msgRecoveryComplete + `"`)}

func (w *logWatch) Write(p []byte) (int, error) {
	now := time.Now()
	for _, k := range milestoneKeys {
		if !bytes.Contains(p, k) {
			continue
		}
		var m struct {
			Replica string `json:"replica"`
			Term    uint64 `json:"term"`
			Message string `json:"message"`
		}
		if json.Unmarshal(p, &m) == nil {
			w.mu.Lock()
			w.marks = append(w.marks, logMark{At: now, Replica: m.Replica, Term: m.Term, Message: m.Message})
			close(w.changed)
			w.changed = make(chan struct{})
			w.mu.Unlock()
		}
		break
	}
	return len(p), nil
}

// wait returns the first mark that matches.
func (w *logWatch) wait(ctx context.Context, match func(logMark) bool) (logMark, error) {
	for {
		w.mu.Lock()
		ch := w.changed
		for _, m := range w.marks {
			if match(m) {
				w.mu.Unlock()
				return m, nil
			}
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return logMark{}, ctx.Err()
		case <-ch:
		}
	}
}
