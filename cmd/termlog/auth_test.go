package main

import (
	"fmt"
	"io"
	"path/filepath"
	"strings"
	"testing"

	"github.com/nats-io/nats.go"
	"github.com/termlog/termlog/natsserver"
)

// TestRoleOptions: which key a command connects with.
func TestRoleOptions(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := natsserver.InitAuth(dir); err != nil {
		t.Fatal(err)
	}
	// The role's file in --auth-dir: the key and the user's inbox prefix.
	g := &globals{auth: authFlags{authDir: dir}}
	if opts, err := g.roleOptions(natsserver.RoleWorker); err != nil || len(opts) != 2 {
		t.Fatalf("--auth-dir: %d options, %v", len(opts), err)
	}
	// An explicit --auth-dir without the role's file is an error, not an
	// anonymous connection.
	g = &globals{auth: authFlags{authDir: t.TempDir()}}
	if _, err := g.roleOptions(natsserver.RoleMeta); err == nil || !strings.Contains(err.Error(), "role meta") {
		t.Fatalf("--auth-dir without keys: %v, want an error naming the role", err)
	}
	// --creds wins over the dir.
	g = &globals{auth: authFlags{authDir: t.TempDir(), creds: natsserver.SeedFile(dir, natsserver.RoleObserver), tlsCA: "ca.pem"}}
	if opts, err := g.roleOptions(natsserver.RoleAdmin); err != nil || len(opts) != 3 {
		t.Fatalf("--creds and --tls-ca: %d options, %v", len(opts), err)
	}
	// No flag and no default dir (tests run in cmd/termlog): no credentials.
	g = &globals{}
	if opts, err := g.roleOptions(natsserver.RoleObserver); err != nil || len(opts) != 0 {
		t.Fatalf("no flags: %d options, %v", len(opts), err)
	}
}

func TestServerSecurity(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "auth")
	sec, err := (&serverSecurity{tls: true}).setup("termlog", dir, "", io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if sec.auth == nil || sec.tls == nil || sec.routeTLS == nil || sec.caFile != filepath.Join(dir, "tls", natsserver.TLSCAFile) {
		t.Fatalf("--tls: %+v", sec)
	}
	if sec.peer != dirTLSFiles(filepath.Join(dir, "tls")) {
		t.Fatalf("--tls: peer TLS files %+v, want the generated ones", sec.peer)
	}
	if opts, err := sec.clientOptions(natsserver.RoleMeta); err != nil || len(opts) != 3 {
		t.Fatalf("client options: %d, %v", len(opts), err)
	}
	// Reused on the next start.
	again, err := (&serverSecurity{}).setup("termlog", dir, "", io.Discard)
	if err != nil || again.auth.Keys[natsserver.RoleMeta] != sec.auth.Keys[natsserver.RoleMeta] || again.tls != nil || again.peer != (tlsFiles{}) {
		t.Fatalf("second start: %+v, %v", again, err)
	}
	// Own certificate: peers use mutual TLS only with the CA that signed it.
	own := &serverSecurity{tlsCert: sec.peer.cert, tlsKey: sec.peer.key}
	if s, err := own.setup("termlog", dir, sec.peer.ca, io.Discard); err != nil || s.peer != sec.peer || s.routeTLS == nil {
		t.Fatalf("--tls-cert with --tls-ca: %+v, %v", s, err)
	}
	if s, err := own.setup("termlog", dir, "", io.Discard); err != nil || s.peer != (tlsFiles{}) || s.tls == nil {
		t.Fatalf("--tls-cert without --tls-ca: %+v, %v", s, err)
	}
	open, err := (&serverSecurity{insecure: true}).setup("termlog", filepath.Join(t.TempDir(), "none"), "", io.Discard)
	if err != nil || open.auth != nil || open.authDir != "" {
		t.Fatalf("--insecure: %+v, %v", open, err)
	}
	if _, err := (&serverSecurity{tlsCert: "x.pem"}).setup("termlog", dir, "", io.Discard); err == nil {
		t.Fatal("--tls-cert without --tls-key accepted")
	}
}

// A refused reply (a response permission spent or expired) is not the
// wrong key: the role goes on; a refused publish to the role's own
// subjects is permanent.
func TestRefusedReplyIsNotPermanent(t *testing.T) {
	mk := func(subject string) error {
		return fmt.Errorf("%w: Permissions Violation for Publish to %q", nats.ErrPermissionViolation, subject)
	}
	if !refusedReply(mk("_INBOX.UAS46F7GFM75UUY7AQ.fhn5mmuc5g790TtvAT9DXW.8d7J21F1")) {
		t.Error("a refused reply to an inbox: want transient")
	}
	for _, subj := range []string{"termlog.rpc.register", "$JS.API.STREAM.INFO.TERMLOG_TERMLOG", "other._INBOX.x"} {
		if refusedReply(mk(subj)) {
			t.Errorf("publish to %s refused: want permanent", subj)
		}
	}
	if refusedReply(fmt.Errorf("%w: Permissions Violation for Subscription to \"_INBOX.x\"", nats.ErrPermissionViolation)) {
		t.Error("a refused subscription to an inbox: want permanent (the role cannot get replies at all)")
	}
}
