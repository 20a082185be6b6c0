package logstore

import (
	"crypto/tls"
	"errors"
	"net"
	"path/filepath"
	"testing"
	"time"

	"github.com/termlog/termlog/natsserver"
)

// TestRaftMutualTLS: two NodeHosts with mutual TLS (a CA and a 127.0.0.1
// certificate from natsserver.InitTLS) form a shard and replicate an entry.
// Their Raft port speaks TLS with the CA's certificate, and refuses a
// peer that has no certificate signed by the CA.
func TestRaftMutualTLS(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "tls")
	if _, err := natsserver.InitTLS(dir); err != nil {
		t.Fatal(err)
	}
	files := &TLSFiles{
		CAFile:   filepath.Join(dir, natsserver.TLSCAFile),
		CertFile: filepath.Join(dir, natsserver.TLSCertFile),
		KeyFile:  filepath.Join(dir, natsserver.TLSKeyFile),
	}
	c := newCluster(t, 2, func(cfg *Config) { cfg.TLS = files })
	for i, h := range c.hosts {
		if err := h.startMember(1, uint64(i+1), c.initial(), false); err != nil {
			t.Fatal(err)
		}
	}
	waitAgree(t, 1, []uint64{1, 2}, c.hosts...)
	mustPropose(t, c.hosts[0], 1, "a")
	for _, h := range c.hosts {
		mustCount(t, h, 1, 1)
	}

	peer, err := natsserver.MutualTLSConfig(files.CertFile, files.KeyFile, files.CAFile)
	if err != nil {
		t.Fatal(err)
	}
	addr := c.cfgs[0].RaftAddr
	d := &net.Dialer{Timeout: 5 * time.Second}
	conn, err := tls.DialWithDialer(d, "tcp", addr, peer)
	if err != nil {
		t.Fatalf("TLS with the CA's certificate to the Raft port %s: %v", addr, err)
	}
	conn.Close()

	// Without a client certificate: TLS 1.3 finishes the client's side of
	// the handshake; the server's refusal arrives as an alert on the first
	// read (not as the read deadline passing).
	anon, err := tls.DialWithDialer(d, "tcp", addr, &tls.Config{RootCAs: peer.RootCAs, MinVersion: tls.VersionTLS12})
	if err == nil {
		_ = anon.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = anon.Read(make([]byte, 1))
		anon.Close()
	}
	var ne net.Error
	if err == nil || (errors.As(err, &ne) && ne.Timeout()) {
		t.Fatalf("a peer without a certificate must be refused, got %v", err)
	}
	t.Logf("peer without a certificate: %v", err)
}
