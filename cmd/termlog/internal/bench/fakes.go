package bench

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync"
	"time"

	"github.com/termlog/termlog/meta"
	"github.com/termlog/termlog/meta/client"
)

// agentConn is the worker end of a control stream, in memory: it decodes,
// answers and encodes each message with client.Agent's own functions
// (DecodeControl, Answer, AppendControl), without a goroutine or a socket
// of its own. 10,000 real agents would need 30,000 file descriptors in one
// process, and their goroutines would count in the memory figure; the
// leader's side (its session reader goroutine, the hello, the barrier, the
// ack) is unchanged. It does not check the hello: a simulated worker has
// no registration of its own to check it against.
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
		if err != nil {
			continue
		}
		if ack, ok := client.Answer(m); ok {
			if c.out, err = client.AppendControl(c.out, ack); err != nil {
				return 0, err
			}
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
