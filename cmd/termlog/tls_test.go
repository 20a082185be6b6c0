package main

import (
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

// TestPeerTLSFlags: how --tls and --tls-cert/--tls-key of meta, worker and
// logstore resolve to the files of mutual TLS, and that NATS then uses TLS.
func TestPeerTLSFlags(t *testing.T) {
	auth := filepath.Join(t.TempDir(), "auth")
	if _, err := natsserver.InitTLS(filepath.Join(auth, "tls")); err != nil {
		t.Fatal(err)
	}
	want := dirTLSFiles(filepath.Join(auth, "tls"))

	g := &globals{auth: authFlags{authDir: auth}}
	f, err := g.peerTLS(peerTLSFlags{on: true})
	if err != nil || f != want || g.auth.tlsCA != want.ca {
		t.Fatalf("--tls: %+v, NATS CA %q, %v; want %+v", f, g.auth.tlsCA, err, want)
	}
	c, err := f.config()
	if err != nil || c == nil || c.ClientAuth != tls.RequireAndVerifyClientCert || c.RootCAs == nil || len(c.Certificates) != 1 {
		t.Fatalf("--tls control stream config: %+v, %v", c, err)
	}
	if r := f.raft(); r == nil || r.CAFile != want.ca || r.CertFile != want.cert || r.KeyFile != want.key {
		t.Fatalf("--tls Raft files: %+v", r)
	}
	// An explicit --tls-ca is kept for NATS.
	g = &globals{auth: authFlags{authDir: auth, tlsCA: "/elsewhere/ca.pem"}}
	if f, err := g.peerTLS(peerTLSFlags{on: true}); err != nil || f != want || g.auth.tlsCA != "/elsewhere/ca.pem" {
		t.Fatalf("--tls with --tls-ca: %+v, NATS CA %q, %v", f, g.auth.tlsCA, err)
	}
	// Own files: with the CA of --tls-ca.
	g = &globals{auth: authFlags{tlsCA: want.ca}}
	if f, err := g.peerTLS(peerTLSFlags{cert: want.cert, key: want.key}); err != nil || f != want {
		t.Fatalf("--tls-cert: %+v, %v", f, err)
	}
	// Off: plaintext, no TLS config.
	g = &globals{}
	if f, err := g.peerTLS(peerTLSFlags{}); err != nil || f != (tlsFiles{}) || g.auth.tlsCA != "" {
		t.Fatalf("no flags: %+v, %v", f, err)
	}
	if c, err := (tlsFiles{}).config(); c != nil || err != nil || (tlsFiles{}).raft() != nil {
		t.Fatalf("plaintext: %+v, %v", c, err)
	}

	for name, tc := range map[string]struct {
		g    globals
		p    peerTLSFlags
		want string
	}{
		"--tls without the files": {globals{auth: authFlags{authDir: t.TempDir()}}, peerTLSFlags{on: true}, "auth init --tls"},
		"--tls-cert without key":  {globals{auth: authFlags{tlsCA: want.ca}}, peerTLSFlags{cert: want.cert}, "go together"},
		"--tls-cert without CA":   {globals{}, peerTLSFlags{cert: want.cert, key: want.key}, "needs --tls-ca"},
		"--tls and --tls-cert":    {globals{auth: authFlags{authDir: auth}}, peerTLSFlags{on: true, cert: want.cert, key: want.key}, "one or the other"},
	} {
		if _, err := tc.g.peerTLS(tc.p); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: %v, want an error saying %q", name, err, tc.want)
		}
	}
}

// peerConfig is the mutual TLS config of the generated certificate in auth.
func peerConfig(t *testing.T, auth string) *tls.Config {
	t.Helper()
	c, err := dirTLSFiles(filepath.Join(auth, "tls")).config()
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// plaintextRefused sends a plaintext hello line to a TLS listener and
// checks that it hangs up with nothing but (at most) a TLS alert.
func plaintextRefused(t *testing.T, addr string) {
	t.Helper()
	conn, err := net.DialTimeout("tcp", addr, 5*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write([]byte(`{"type":"hello","worker":1,"epoch":1,"term":1}` + "\n")); err != nil {
		return // already closed
	}
	b, err := io.ReadAll(conn)
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("%s kept a plaintext connection open (read %q)", addr, b)
	}
	const alert = 0x15 // TLS record type
	if len(b) > 0 && b[0] != alert {
		t.Fatalf("a plaintext client of %s got %q; want the connection dropped", addr, b)
	}
}

// TestCLIUpTLS: `up --tls` makes every connection TLS and still gets
// healthy, which needs the barrier acked over every control stream and the
// shards' Raft groups formed. A worker's control endpoint and a store's Raft
// port take mutual TLS with the generated certificate, and a worker's
// endpoint drops a plaintext client.
func TestCLIUpTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	data := t.TempDir()
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	auth := filepath.Join(data, "auth")
	ca := filepath.Join(auth, "tls", natsserver.TLSCAFile)

	p := startUp(t, bin, data, port, "--tls")
	p.waitFor(t, "healthy after")
	if out := p.out.String(); !strings.Contains(out, "TLS: control streams and Raft traffic are mutual TLS with "+ca) {
		t.Fatalf("up did not say the control streams and Raft use TLS:\n%s", out)
	}
	r := runEnv(t, bin, nil, "status", "--json", "--nats", url, "--auth-dir", auth, "--tls-ca", ca)
	var s Status
	// Exit 1 (degraded) is a read too: up's own health check can run ahead
	// of the health record status reads. Then stderr says why, so only
	// stdout is the document.
	if (r.code != 0 && r.code != exitDegraded) || json.Unmarshal([]byte(r.stdout), &s) != nil || len(s.Workers) == 0 {
		t.Fatalf("status over TLS: exit %d\nstdout:\n%s\nstderr:\n%s", r.code, r.stdout, r.stderr)
	}
	peer := peerConfig(t, auth)
	endpoint := s.Workers[0].Endpoint
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", endpoint, peer)
	if err != nil {
		t.Fatalf("mutual TLS to worker endpoint %s: %v", endpoint, err)
	}
	conn.Close()
	plaintextRefused(t, endpoint)

	b, err := os.ReadFile(filepath.Join(data, "store-1", "raft-addr"))
	if err != nil {
		t.Fatal(err)
	}
	raft := strings.TrimSpace(string(b))
	conn, err = tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", raft, peer)
	if err != nil {
		t.Fatalf("mutual TLS to store-1's Raft port %s: %v", raft, err)
	}
	conn.Close()
	p.stop(t)
}

// TestCLIRolesTLS runs the roles as separate processes with --tls: the meta
// leader's control stream to a --tls worker is accepted over TLS; a worker
// that uses TLS for NATS only (--tls-ca) refuses the leader's TLS stream; a
// --tls store's Raft port speaks mutual TLS.
func TestCLIRolesTLS(t *testing.T) {
	if testing.Short() {
		t.Skip("builds and runs the binary")
	}
	bin := buildBinary(t)
	dir := t.TempDir()
	auth := filepath.Join(dir, "auth")
	if out, err := run(t, bin, "auth", "init", "--dir", auth, "--tls"); err != nil {
		t.Fatalf("auth init --tls: %v\n%s", err, out)
	}
	port := testkit.FreePort(t)
	url := fmt.Sprintf("nats://127.0.0.1:%d", port)
	nats := startProc(t, bin, "nats", "--port", fmt.Sprint(port), "--data", filepath.Join(dir, "nats"), "--auth-dir", auth, "--tls")
	nats.waitFor(t, "NATS JetStream at")
	common := []string{"--nats", url, "--auth-dir", auth}
	meta := startProc(t, bin, append([]string{"meta", "run", "--id", "meta-1", "--lease", "1s", "--tls"}, common...)...)
	tlsEP := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	tlsWorker := startProc(t, bin, append([]string{"worker", "run", "--endpoint", tlsEP, "--tls"}, common...)...)
	plainEP := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	plainWorker := startProc(t, bin, append([]string{"worker", "run", "--endpoint", plainEP, "--tls-ca", filepath.Join(auth, "tls", natsserver.TLSCAFile)}, common...)...)

	tlsWorker.waitIn(t, &tlsWorker.errOut, `"message":"control stream accepted"`)
	for _, line := range strings.Split(tlsWorker.errOut.String(), "\n") {
		if strings.Contains(line, "control stream accepted") && !strings.Contains(line, `"tls":true`) {
			t.Fatalf("the --tls worker accepted a plaintext control stream: %s", line)
		}
	}
	plainWorker.waitIn(t, &plainWorker.errOut, "control stream refused")
	if strings.Contains(plainWorker.errOut.String(), "control stream accepted") {
		t.Fatalf("the plaintext worker accepted a control stream:\n%s", plainWorker.errOut.String())
	}
	// A --tls store's Raft port takes mutual TLS with the generated
	// certificate.
	raft := fmt.Sprintf("127.0.0.1:%d", testkit.FreePort(t))
	store := startProc(t, bin, append([]string{"logstore", "--id", "store-1", "--raft-addr", raft, "--data", filepath.Join(dir, "store-1"), "--tls"}, common...)...)
	store.waitIn(t, &store.errOut, `"tls":true`)
	conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", raft, peerConfig(t, auth))
	if err != nil {
		t.Fatalf("mutual TLS to the store's Raft port %s: %v", raft, err)
	}
	conn.Close()
	for _, p := range []*upProc{tlsWorker, plainWorker, store, meta, nats} {
		p.stop(t)
	}
}
