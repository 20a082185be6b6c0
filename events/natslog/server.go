package natslog

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

// loopback is the only address an embedded server listens on.
const loopback = "127.0.0.1"

// DefaultReadyTimeout bounds how long StartServer waits for the server to
// accept clients and for JetStream to answer.
const DefaultReadyTimeout = 10 * time.Second

// ServerConfig configures an embedded NATS server with JetStream. The zero
// value is not usable: DataDir is required.
type ServerConfig struct {
	// DataDir is the JetStream file store directory (required). Starting a
	// new server on the same directory recovers its streams.
	DataDir string
	// Host is the client listen address; only "127.0.0.1" (the default) is
	// accepted.
	Host string
	// Port is the client port; 0 picks a free one.
	Port int
	// DontListen serves in-process connections only (see Server.Connect).
	DontListen bool
	// Name is the server name; empty lets the server use its generated ID.
	Name string
	// ReadyTimeout bounds the start; 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// MaxStore and MaxMemory bound JetStream storage in bytes; 0 lets the
	// server pick its defaults.
	MaxStore, MaxMemory int64
	// LogWriter receives the server's log, one line per entry; nil
	// discards it. Debug and Trace make it verbose.
	LogWriter    io.Writer
	Debug, Trace bool
}

// Server is a running embedded NATS server.
type Server struct {
	ns  *server.Server
	cfg ServerConfig
}

// StartServer starts a NATS server with JetStream enabled and returns once it
// accepts clients and JetStream answers, or an error saying which did not
// happen in time. The caller must call Shutdown.
func StartServer(cfg ServerConfig) (*Server, error) {
	if cfg.DataDir == "" {
		return nil, errors.New("natslog: start server: DataDir is required")
	}
	if cfg.Host == "" {
		cfg.Host = loopback
	}
	if cfg.Host != loopback {
		return nil, fmt.Errorf("natslog: start server: host %q: only %s is allowed", cfg.Host, loopback)
	}
	port := cfg.Port
	if port == 0 {
		port = server.RANDOM_PORT
	}
	if cfg.ReadyTimeout <= 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	opts := &server.Options{
		ServerName:         cfg.Name,
		Host:               cfg.Host,
		Port:               port,
		DontListen:         cfg.DontListen,
		HTTPPort:           0, // no monitoring endpoint
		NoSigs:             true,
		NoLog:              true, // we install our own logger below
		Debug:              cfg.Debug,
		Trace:              cfg.Trace,
		JetStream:          true,
		StoreDir:           cfg.DataDir,
		JetStreamMaxStore:  cfg.MaxStore,
		JetStreamMaxMemory: cfg.MaxMemory,
	}
	ns, err := server.NewServer(opts)
	if err != nil {
		return nil, fmt.Errorf("natslog: start server: %w", err)
	}
	// Always our logger: the server reports fatal start errors (a port in
	// use) through it, and the stock logger would exit the process.
	logger := &serverLogger{w: cfg.LogWriter, fatal: make(chan string, 1)}
	ns.SetLoggerV2(logger, cfg.Debug, cfg.Trace, false)
	s := &Server{ns: ns, cfg: cfg}
	deadline := time.Now().Add(cfg.ReadyTimeout)
	ns.Start()
	for !ns.ReadyForConnections(50 * time.Millisecond) {
		select {
		case msg := <-logger.fatal:
			s.Shutdown()
			return nil, fmt.Errorf("natslog: start server: %s", msg)
		default:
		}
		if time.Now().After(deadline) {
			s.Shutdown()
			return nil, fmt.Errorf("natslog: start server: not ready for connections after %s (%s:%d, data dir %s)",
				cfg.ReadyTimeout, cfg.Host, cfg.Port, cfg.DataDir)
		}
	}
	if err := s.waitJetStream(deadline, logger.fatal); err != nil {
		s.Shutdown()
		return nil, err
	}
	return s, nil
}

// waitJetStream polls until JetStream answers an account info request.
func (s *Server) waitJetStream(deadline time.Time, fatal <-chan string) error {
	ctx, cancel := context.WithDeadline(context.Background(), deadline)
	defer cancel()
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for !s.ns.JetStreamEnabled() {
		select {
		case msg := <-fatal:
			return fmt.Errorf("natslog: start server: %s", msg)
		case <-ctx.Done():
			return fmt.Errorf("natslog: start server: JetStream not enabled after %s", s.cfg.ReadyTimeout)
		case <-tick.C:
		}
	}
	// In-process: the listener was checked above, and a loaded machine can
	// make a TCP dial time out.
	nc, err := nats.Connect(nats.DefaultURL, nats.InProcessServer(s.ns), nats.Name("natslog-ready-check"),
		nats.NoReconnect(), nats.Timeout(max(time.Until(deadline), time.Second)))
	if err != nil {
		return fmt.Errorf("natslog: start server: connect in-process: %w", err)
	}
	defer nc.Close()
	js, err := jetstream.New(nc)
	if err != nil {
		return fmt.Errorf("natslog: start server: %w", err)
	}
	for {
		actx, acancel := context.WithTimeout(ctx, time.Second)
		_, err := js.AccountInfo(actx)
		acancel()
		if err == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("natslog: start server: JetStream not usable after %s: %w", s.cfg.ReadyTimeout, err)
		case <-tick.C:
		}
	}
}

// ClientURL is the URL clients connect to ("" when the server does not
// listen).
func (s *Server) ClientURL() string {
	if s.cfg.DontListen {
		return ""
	}
	return s.ns.ClientURL()
}

// Connect opens a client connection: in-process when the server does not
// listen, else to ClientURL. opts come after the defaults, so they win.
func (s *Server) Connect(opts ...nats.Option) (*nats.Conn, error) {
	if s.cfg.DontListen {
		opts = append([]nats.Option{nats.InProcessServer(s.ns)}, opts...)
	}
	url := s.ClientURL()
	if url == "" {
		url = nats.DefaultURL // ignored for in-process connections
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		return nil, fmt.Errorf("natslog: connect to embedded server: %w", err)
	}
	return nc, nil
}

// NATS is the underlying server, for tests that need more than this wrapper.
func (s *Server) NATS() *server.Server { return s.ns }

// Shutdown stops the server and waits until it has stopped. It is safe to
// call more than once.
func (s *Server) Shutdown() {
	s.ns.Shutdown()
	s.ns.WaitForShutdown()
}

// serverLogger writes the server's log to w (if any) and hands the first
// fatal error to StartServer. It never exits the process.
type serverLogger struct {
	mu    sync.Mutex
	w     io.Writer
	fatal chan string
}

func (l *serverLogger) logf(level, format string, v ...any) string {
	msg := fmt.Sprintf(format, v...)
	if l.w != nil {
		l.mu.Lock()
		fmt.Fprintf(l.w, "nats-server %s %s\n", level, msg)
		l.mu.Unlock()
	}
	return msg
}

func (l *serverLogger) Noticef(format string, v ...any) { l.logf("INF", format, v...) }
func (l *serverLogger) Warnf(format string, v ...any)   { l.logf("WRN", format, v...) }
func (l *serverLogger) Errorf(format string, v ...any)  { l.logf("ERR", format, v...) }
func (l *serverLogger) Debugf(format string, v ...any)  { l.logf("DBG", format, v...) }
func (l *serverLogger) Tracef(format string, v ...any)  { l.logf("TRC", format, v...) }

func (l *serverLogger) Fatalf(format string, v ...any) {
	msg := l.logf("FTL", format, v...)
	select {
	case l.fatal <- msg:
	default:
	}
}
