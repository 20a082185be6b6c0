package natslog_test

import (
	"context"
	"errors"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// The event stream is append-only on the server itself: a message delete
// and a purge are refused even to a user that may do anything (this open
// server's), and every event is still there afterwards.
func TestStreamDeniesDeleteAndPurge(t *testing.T) {
	t.Parallel()
	nc := connect(t, startServer(t, t.TempDir(), true))
	l := open(t, nc, natslog.Config{Cluster: "ledger"})
	if _, err := l.Append(ctxT(t), 0, ev(1, 0), ev(1, 1), ev(1, 2)); err != nil {
		t.Fatal(err)
	}
	st := streamOf(t, nc, l)
	cfg := st.CachedInfo().Config
	if !cfg.DenyDelete || !cfg.DenyPurge {
		t.Fatalf("stream config deny_delete %v deny_purge %v, want both", cfg.DenyDelete, cfg.DenyPurge)
	}
	if err := st.DeleteMsg(ctxT(t), 2); err == nil {
		t.Error("a message delete was accepted")
	}
	if err := st.SecureDeleteMsg(ctxT(t), 2); err == nil {
		t.Error("a secure message delete was accepted")
	}
	if err := st.Purge(ctxT(t)); err == nil {
		t.Error("a purge was accepted")
	}
	if err := st.Purge(ctxT(t), jetstream.WithPurgeSequence(3)); err == nil {
		t.Error("a purge below a seq was accepted")
	}
	// Nor can an update take the protection away.
	cfg.DenyPurge, cfg.DenyDelete = false, false
	if _, err := jsOf(t, nc).UpdateStream(ctxT(t), cfg); err == nil {
		t.Error("an update lifted deny delete and deny purge")
	}
	if recs := readAll(t, l); len(recs) != 3 {
		t.Fatalf("after the refused deletes: %d records, want 3", len(recs))
	}
}

func jsOf(t *testing.T, nc *nats.Conn) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	return js
}

// The stream's limits: every event kept forever (no count, byte or age
// limit; new events refused rather than old ones dropped should a limit
// ever apply) and one event at most StreamMaxMsgSize on the wire.
func TestStreamLimits(t *testing.T) {
	t.Parallel()
	nc := connect(t, startServer(t, t.TempDir(), true))
	l := open(t, nc, natslog.Config{Cluster: "limits"})
	cfg := streamOf(t, nc, l).CachedInfo().Config
	if cfg.MaxMsgs != -1 || cfg.MaxBytes != -1 || cfg.MaxAge != 0 || cfg.MaxMsgsPerSubject != -1 {
		t.Errorf("count/bytes/age limits: msgs %d bytes %d age %s per subject %d; want none", cfg.MaxMsgs, cfg.MaxBytes, cfg.MaxAge, cfg.MaxMsgsPerSubject)
	}
	if cfg.Discard != jetstream.DiscardNew {
		t.Errorf("discard %v, want new", cfg.Discard)
	}
	if cfg.MaxMsgSize != natslog.StreamMaxMsgSize {
		t.Errorf("max msg size %d, want %d", cfg.MaxMsgSize, natslog.StreamMaxMsgSize)
	}
	// An event over MaxEventBytes fails before anything is sent, with an
	// error saying so; the one before it in the same append is not stored
	// either, and the log takes the next append.
	big := ev(1, 1)
	big.Data = events.WorkerRegistered{ID: 1, Endpoint: "127.0.0.1:5688", Kind: strings.Repeat("k", natslog.MaxEventBytes), Parallelism: 4}
	for _, evs := range [][]events.Event{{big}, {ev(1, 0), big}} {
		last, err := l.Append(ctxT(t), 0, evs...)
		if !errors.Is(err, natslog.ErrEventTooLarge) || last != 0 || !strings.Contains(err.Error(), "nothing was sent") {
			t.Fatalf("append of an oversized event = %d, %v; want 0 and ErrEventTooLarge", last, err)
		}
	}
	if tail, err := l.Tail(ctxT(t)); err != nil || tail != 0 {
		t.Fatalf("tail after refused appends = %d, %v", tail, err)
	}
	if got := l.AppendAsync(ctxT(t), 0, "", big).Wait; got == nil {
		t.Fatal("no pending")
	} else if _, err := got(ctxT(t)); !errors.Is(err, natslog.ErrEventTooLarge) {
		t.Fatalf("AppendAsync of an oversized event: %v", err)
	}
	// The largest event allowed fits in the stream's message size with
	// every header a replicated batch adds.
	maxed := ev(1, 1)
	body := len(mustEncode(t, maxed))
	maxed.Data = events.WorkerRegistered{ID: 1, Endpoint: "127.0.0.1:5688", Kind: "compute" + strings.Repeat("k", natslog.MaxEventBytes-body), Parallelism: 4}
	if n := len(mustEncode(t, maxed)); n != natslog.MaxEventBytes {
		t.Fatalf("test event is %d bytes, want %d", n, natslog.MaxEventBytes)
	}
	if seq, err := l.Append(ctxT(t), 0, maxed, ev(1, 2)); err != nil || seq != 2 {
		t.Fatalf("append of an event of MaxEventBytes = %d, %v", seq, err)
	}
}

// legacyStream creates cluster's stream by hand as an older termlog made it:
// no deny delete or purge, no atomic batches, no message size limit.
func legacyStream(t *testing.T, nc *nats.Conn, cluster string) jetstream.Stream {
	t.Helper()
	cfg := natslog.StreamConfig(natslog.Config{Cluster: cluster})
	cfg.DenyDelete, cfg.DenyPurge, cfg.AllowAtomicPublish, cfg.MaxMsgSize = false, false, false, 0
	cfg.Discard = jetstream.DiscardOld
	st, err := jsOf(t, nc).CreateStream(ctxT(t), cfg)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// openPurgeable opens a Log on a stream made by hand like Open's but
// without deny delete and purge (Bind never updates the stream), for tests
// that compact the log by purging it.
func openPurgeable(t *testing.T, nc *nats.Conn, cfg natslog.Config) *natslog.Log {
	t.Helper()
	sc := natslog.StreamConfig(cfg)
	sc.DenyDelete, sc.DenyPurge = false, false
	if _, err := jsOf(t, nc).CreateStream(ctxT(t), sc); err != nil {
		t.Fatal(err)
	}
	cfg.Bind = true
	return open(t, nc, cfg)
}

// A stream made by an older termlog is protected by the creating side
// (Open without Bind) and keeps its events; a reader (Bind) uses it as it
// is and never updates it.
func TestOpenProtectsOldStream(t *testing.T) {
	t.Parallel()
	nc := connect(t, startServer(t, t.TempDir(), true))
	js := jsOf(t, nc)
	st := legacyStream(t, nc, "old")
	if _, err := js.Publish(ctxT(t), "old.ev.worker.registered", mustEncode(t, ev(1, 0))); err != nil {
		t.Fatal(err)
	}
	open(t, nc, natslog.Config{Cluster: "old", Bind: true})
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if c := info.Config; c.DenyDelete || c.DenyPurge || c.AllowAtomicPublish || c.MaxMsgSize > 0 || c.Discard != jetstream.DiscardOld {
		t.Fatalf("a reader's Open updated the stream: %+v", c)
	}
	open(t, nc, natslog.Config{Cluster: "old"})
	if info, err = st.Info(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	if c := info.Config; !c.DenyDelete || !c.DenyPurge || !c.AllowAtomicPublish || c.MaxMsgSize != natslog.StreamMaxMsgSize || c.Discard != jetstream.DiscardNew || info.State.Msgs != 1 {
		t.Fatalf("after the creating side's Open: deny delete %v, deny purge %v, atomic %v, max msg size %d, discard %v, %d msgs",
			c.DenyDelete, c.DenyPurge, c.AllowAtomicPublish, c.MaxMsgSize, c.Discard, info.State.Msgs)
	}
	if err := st.Purge(ctxT(t)); err == nil {
		t.Fatal("the protected stream was purged")
	}
}

// A stream whose message size limit would refuse events is refused.
func TestOpenRejectsSmallMsgSize(t *testing.T) {
	t.Parallel()
	nc := connect(t, startServer(t, t.TempDir(), true))
	cfg := natslog.StreamConfig(natslog.Config{Cluster: "tiny"})
	cfg.MaxMsgSize = 1024
	if _, err := jsOf(t, nc).CreateStream(ctxT(t), cfg); err != nil {
		t.Fatal(err)
	}
	for _, bind := range []bool{false, true} {
		_, err := natslog.Open(ctxT(t), nc, natslog.Config{Cluster: "tiny", Bind: bind})
		if err == nil || !strings.Contains(err.Error(), "max msg size 1024") {
			t.Fatalf("bind %v: %v, want a refusal naming the max msg size", bind, err)
		}
		refusedAtOnce(t, err, "a stream with a small max msg size")
	}
}

// The meta role may create the stream but not update it: on a stream made
// by an older termlog, its Open fails at once with an error that says what
// is missing and who can add it, instead of retrying until its deadline;
// the admin's Open protects the stream, and then the meta role opens it.
func TestOpenOldStreamAsMeta(t *testing.T) {
	t.Parallel()
	dir := filepath.Join(t.TempDir(), "auth")
	if _, err := natsserver.InitAuth(dir); err != nil {
		t.Fatal(err)
	}
	a, err := natsserver.LoadServerAuth(dir, natslog.DefaultCluster)
	if err != nil {
		t.Fatal(err)
	}
	s, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Auth: a})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(s.Shutdown)
	as := func(r natsserver.Role) *nats.Conn {
		opts, err := natsserver.RoleOptions(dir, r)
		if err != nil {
			t.Fatal(err)
		}
		return connect(t, s, append(opts, nats.ErrorHandler(func(*nats.Conn, *nats.Subscription, error) {}))...)
	}
	admin := as(natsserver.RoleAdmin)
	legacyStream(t, admin, natslog.DefaultCluster)
	ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
	defer cancel()
	start := time.Now()
	_, err = natslog.Open(ctx, as(natsserver.RoleMeta), natslog.Config{RequestTimeout: time.Second})
	if err == nil || !strings.Contains(err.Error(), "deny purge") || !strings.Contains(err.Error(), "admin") {
		t.Fatalf("meta Open of an old stream: %v, want an error naming what is missing and the admin", err)
	}
	refusedAtOnce(t, err, "an old stream the meta role may not update")
	if took := time.Since(start); took > 10*time.Second {
		t.Errorf("meta Open took %s to refuse", took)
	}
	// A store (reader) binds it as it is.
	open(t, as(natsserver.RoleStore), natslog.Config{Bind: true})
	open(t, admin, natslog.Config{})
	l := open(t, as(natsserver.RoleMeta), natslog.Config{})
	if seq, err := l.Append(ctxT(t), 0, ev(1, 0), ev(1, 1)); err != nil || seq != 2 {
		t.Fatalf("meta append after the admin's upgrade = %d, %v", seq, err)
	}
}
