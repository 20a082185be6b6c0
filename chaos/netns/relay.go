package netns

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"time"

	"golang.org/x/sys/unix"
)

// inNS runs f on an OS thread switched into namespace ns. The thread is
// never given back to the scheduler (the goroutine exits locked, so the
// runtime ends the thread): no other goroutine ever runs in ns by
// accident. Sockets f creates belong to ns for their whole life.
func inNS(ns string, f func() error) error {
	errc := make(chan error, 1)
	go func() {
		runtime.LockOSThread()
		// No UnlockOSThread: the thread dies with this goroutine.
		fd, err := os.Open(filepath.Join("/var/run/netns", ns))
		if err != nil {
			errc <- fmt.Errorf("netns %s: %w", ns, err)
			return
		}
		defer fd.Close()
		if err := unix.Setns(int(fd.Fd()), unix.CLONE_NEWNET); err != nil {
			errc <- fmt.Errorf("netns %s: setns: %w", ns, err)
			return
		}
		errc <- f()
	}()
	return <-errc
}

// Do runs f on an OS thread inside node's namespace: sockets f opens (a
// listener, a connection) belong to the namespace for their whole life,
// whichever goroutine uses them later. Goroutines f starts do not run in
// the namespace.
func (nd *Node) Do(f func() error) error { return inNS(nd.NS, f) }

// Listen opens a TCP listener inside node's namespace.
func (nd *Node) Listen(addr string) (net.Listener, error) {
	var ln net.Listener
	err := inNS(nd.NS, func() (err error) {
		ln, err = net.Listen("tcp", addr)
		return err
	})
	return ln, err
}

// Dial opens a TCP connection from inside node's namespace.
func (nd *Node) Dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	err := inNS(nd.NS, func() (err error) {
		var d net.Dialer
		c, err = d.DialContext(ctx, "tcp", addr)
		return err
	})
	return c, err
}

// Relay forwards TCP connections made to an address of one namespace to a
// target reached from that namespace: for a server that listens on
// 127.0.0.1 only (the embedded NATS does), a relay on the node's address
// makes it reachable from the other nodes, and cuts of that node apply to
// it as to the server.
type Relay struct {
	nd     *Node
	ln     net.Listener
	target string
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup
	mu     sync.Mutex
	conns  map[net.Conn]struct{}
}

// Relay listens on listen inside node's namespace and forwards every
// connection to target, dialled inside the same namespace. Close stops it.
func (nd *Node) Relay(listen, target string) (*Relay, error) {
	ln, err := nd.Listen(listen)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &Relay{nd: nd, ln: ln, target: target, ctx: ctx, cancel: cancel, conns: map[net.Conn]struct{}{}}
	r.wg.Add(1)
	go r.accept()
	return r, nil
}

// Addr is the relay's listening address.
func (r *Relay) Addr() string { return r.ln.Addr().String() }

func (r *Relay) accept() {
	defer r.wg.Done()
	for {
		c, err := r.ln.Accept()
		if err != nil {
			return
		}
		if !r.track(c) {
			c.Close()
			return
		}
		r.wg.Add(1)
		go r.serve(c)
	}
}

func (r *Relay) track(c net.Conn) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.ctx.Err() != nil {
		return false
	}
	r.conns[c] = struct{}{}
	return true
}

func (r *Relay) untrack(c net.Conn) {
	r.mu.Lock()
	defer r.mu.Unlock()
	delete(r.conns, c)
}

func (r *Relay) serve(down net.Conn) {
	defer r.wg.Done()
	defer down.Close()
	defer r.untrack(down)
	// A target across a cut does not answer: give up after a while (the
	// client sees its connection close) instead of holding the goroutine.
	dctx, cancel := context.WithTimeout(r.ctx, 5*time.Second)
	up, err := r.nd.Dial(dctx, r.target)
	cancel()
	if err != nil {
		return
	}
	if !r.track(up) {
		up.Close()
		return
	}
	defer r.untrack(up)
	defer up.Close()
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Either side ending ends both (closing wakes the other copy).
		dst.Close()
		src.Close()
		done <- struct{}{}
	}
	go pipe(up, down)
	go pipe(down, up)
	<-done
	<-done
}

// Close stops accepting, ends every relayed connection and waits for the
// relay's goroutines.
func (r *Relay) Close() error {
	r.mu.Lock()
	r.cancel()
	err := r.ln.Close()
	for c := range r.conns {
		c.Close()
	}
	r.mu.Unlock()
	r.wg.Wait()
	if errors.Is(err, net.ErrClosed) {
		err = nil
	}
	return err
}
