package console

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/http"
	"time"

	"github.com/rs/zerolog"
)

//go:embed assets
var assets embed.FS

var indexHTML = mustAsset("assets/index.html")

func mustAsset(name string) []byte {
	b, err := assets.ReadFile(name)
	if err != nil {
		panic(err) // embedded at build time: cannot fail at run time
	}
	return b
}

func assetHandler() http.Handler {
	sub, _ := fs.Sub(assets, "assets")
	fsrv := http.FileServerFS(sub)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "no-cache")
		fsrv.ServeHTTP(w, r)
	})
}

// ErrNeedTLS is a non-loopback address without a certificate.
var ErrNeedTLS = errors.New("a console on a non-loopback address needs a TLS certificate and key")

// CheckAddr checks a listen address: a loopback host (127.0.0.0/8, ::1,
// localhost) may serve plain HTTP; any other (an empty host included,
// which listens on every interface) only with a certificate and key.
func CheckAddr(addr, cert, key string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("address %q: want host:port: %w", addr, err)
	}
	if (cert == "") != (key == "") {
		return errors.New("--tls-cert and --tls-key go together")
	}
	if cert != "" {
		return nil
	}
	if host == "localhost" {
		return nil
	}
	if ip := net.ParseIP(host); ip != nil && ip.IsLoopback() {
		return nil
	}
	return fmt.Errorf("%w (address %q is not loopback)", ErrNeedTLS, addr)
}

// Listener is a console's HTTP server on its listener.
type Listener struct {
	ln   net.Listener
	srv  *http.Server
	cert string
	key  string
	tls  bool
}

// Listen checks addr (CheckAddr) and listens on it.
func Listen(addr, cert, key string) (*Listener, error) {
	if err := CheckAddr(addr, cert, key); err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("console: %w", err)
	}
	return &Listener{ln: ln, cert: cert, key: key, tls: cert != ""}, nil
}

// URL is where the console answers.
func (l *Listener) URL() string {
	scheme := "http"
	if l.tls {
		scheme = "https"
	}
	return scheme + "://" + l.ln.Addr().String() + "/"
}

// Serve serves h until ctx ends, then shuts the server down (open event
// streams end with ctx) and returns once every handler returned.
func (l *Listener) Serve(ctx context.Context, h http.Handler, lg zerolog.Logger) error {
	l.srv = &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		BaseContext:       func(net.Listener) context.Context { return ctx },
		ErrorLog:          nil,
	}
	errc := make(chan error, 1)
	go func() {
		if l.tls {
			errc <- l.srv.ServeTLS(l.ln, l.cert, l.key)
		} else {
			errc <- l.srv.Serve(l.ln)
		}
	}()
	select {
	case err := <-errc:
		return fmt.Errorf("console: %w", err)
	case <-ctx.Done():
	}
	sctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := l.srv.Shutdown(sctx); err != nil {
		lg.Warn().Err(err).Msg("console: shutdown")
		_ = l.srv.Close()
	}
	if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("console: %w", err)
	}
	return nil
}

// Close closes a listener that was never served.
func (l *Listener) Close() error { return l.ln.Close() }
