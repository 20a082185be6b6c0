package natsserver_test

import (
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"

	"github.com/termlog/termlog/natsserver"
)

// TestInitAuthOnce: processes racing to create the same auth dir end up
// with one set of keys, secret files 0600 in a 0700 dir; a later call
// keeps it.
func TestInitAuthOnce(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	const n = 8
	created := make([]bool, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() { defer wg.Done(); created[i], errs[i] = natsserver.InitAuth(dir) }()
	}
	wg.Wait()
	winners := 0
	for i := range n {
		if errs[i] != nil {
			t.Fatalf("InitAuth %d: %v", i, errs[i])
		}
		if created[i] {
			winners++
		}
	}
	if winners != 1 {
		t.Fatalf("%d callers generated keys, want exactly 1", winners)
	}
	if fi, err := os.Stat(dir); err != nil || fi.Mode().Perm() != 0o700 {
		t.Fatalf("auth dir: %v mode %v, want 0700", err, fi.Mode().Perm())
	}
	a, err := natsserver.LoadServerAuth(dir, "termlog")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[string]bool{}
	for _, r := range natsserver.Roles() {
		fi, err := os.Stat(natsserver.SeedFile(dir, r))
		if err != nil || fi.Mode().Perm() != 0o600 {
			t.Fatalf("%s seed: %v mode %v, want 0600", r, err, fi.Mode().Perm())
		}
		if seen[a.Keys[r]] {
			t.Fatalf("role %s shares its key with another role", r)
		}
		seen[a.Keys[r]] = true
		if _, err := natsserver.RoleOptions(dir, r); err != nil {
			t.Fatalf("%s client options: %v", r, err)
		}
	}
	if again, err := natsserver.InitAuth(dir); err != nil || again {
		t.Fatalf("second InitAuth: created %v, %v; want the set kept", again, err)
	}
	b, err := natsserver.LoadServerAuth(dir, "termlog")
	if err != nil || b.Keys[natsserver.RoleMeta] != a.Keys[natsserver.RoleMeta] {
		t.Fatalf("keys changed: %v", err)
	}
	leftovers, _ := filepath.Glob(filepath.Join(filepath.Dir(dir), ".auth-*"))
	if len(leftovers) > 0 {
		t.Fatalf("temporary dirs left behind: %v", leftovers)
	}
}

// TestInitAuthRefusesPartialDir: a dir holding something else is not
// overwritten or mixed into.
func TestInitAuthRefusesPartialDir(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	if err := os.WriteFile(filepath.Join(dir, "meta.nk"), []byte("SUxxx\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := natsserver.InitAuth(dir); err == nil || !strings.Contains(err.Error(), "lacks") {
		t.Fatalf("InitAuth on a partial dir: %v, want an error", err)
	}
	if _, err := natsserver.LoadServerAuth(dir, "termlog"); err == nil {
		t.Fatal("LoadServerAuth accepted a dir without public keys")
	}
	if _, err := natsserver.RoleOptions(dir, natsserver.RoleMeta); err == nil {
		t.Fatal("RoleOptions accepted a bad seed")
	}
}

// TestInitTLS: the generated server certificate verifies against the
// generated CA for 127.0.0.1; the key is 0600.
func TestInitTLS(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "tls")
	if created, err := natsserver.InitTLS(dir); err != nil || !created {
		t.Fatalf("InitTLS: %v, %v", created, err)
	}
	if fi, err := os.Stat(filepath.Join(dir, natsserver.TLSKeyFile)); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("server key: %v mode %v", err, fi.Mode().Perm())
	}
	if _, err := natsserver.ServerTLSConfig(filepath.Join(dir, natsserver.TLSCertFile), filepath.Join(dir, natsserver.TLSKeyFile)); err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	caPEM, err := os.ReadFile(filepath.Join(dir, natsserver.TLSCAFile))
	if err != nil || !pool.AppendCertsFromPEM(caPEM) {
		t.Fatalf("CA: %v", err)
	}
	certPEM, err := os.ReadFile(filepath.Join(dir, natsserver.TLSCertFile))
	if err != nil {
		t.Fatal(err)
	}
	block, _ := pem.Decode(certPEM)
	if block == nil {
		t.Fatal("server certificate is not PEM")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		t.Fatal(err)
	}
	for _, host := range []string{"127.0.0.1", "localhost"} {
		if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: host}); err != nil {
			t.Errorf("certificate for %s: %v", host, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: pool, DNSName: "10.0.0.1"}); err == nil {
		t.Error("certificate verifies for 10.0.0.1")
	}
	if again, err := natsserver.InitTLS(dir); err != nil || again {
		t.Fatalf("second InitTLS: %v, %v; want the files kept", again, err)
	}
}
