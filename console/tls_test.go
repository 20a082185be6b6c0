package console

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
)

// TestServeTLS: with a certificate and key the console serves HTTPS (the
// only way it may listen beyond loopback), and a plain HTTP request to it
// gets no page.
func TestServeTLS(t *testing.T) {
	dir := t.TempDir()
	key, _ := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "console"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")}, KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	kb, _ := x509.MarshalECPrivateKey(key)
	certFile, keyFile := filepath.Join(dir, "c.pem"), filepath.Join(dir, "k.pem")
	if err := os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: kb}), 0o600); err != nil {
		t.Fatal(err)
	}

	ln, err := Listen("127.0.0.1:0", certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasPrefix(ln.URL(), "https://") {
		t.Fatalf("URL %s", ln.URL())
	}
	c := New(Config{Cluster: "termlog", Log: events.NewMemLog(), Logger: testkit.Logger(t)})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { _ = c.Run(ctx) })
	wg.Go(func() { _ = ln.Serve(ctx, c.Handler(), testkit.Logger(t)) })
	defer wg.Wait()
	defer cancel()

	pool := x509.NewCertPool()
	pool.AddCert(must(x509.ParseCertificate(der)))
	cl := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}, Timeout: 5 * time.Second}
	resp, err := cl.Get(ln.URL() + "api/v1/status")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("https status: %d", resp.StatusCode)
	}
	plain := "http://" + strings.TrimPrefix(ln.URL(), "https://")
	resp, err = (&http.Client{Timeout: 5 * time.Second}).Get(plain + "api/v1/status")
	if err == nil {
		resp.Body.Close()
		if resp.StatusCode == 200 {
			t.Fatal("plain HTTP got the status from a TLS console")
		}
	}
	cl.CloseIdleConnections()
}

func must[T any](v T, err error) T {
	if err != nil {
		panic(err)
	}
	return v
}
