package natslog_test

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/logtest"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/natsserver"
)

func TestMain(m *testing.M) {
	if cfg := os.Getenv(nodeEnv); cfg != "" {
		runNode(cfg) // a NATS node of killnode_test.go, until killed
		return
	}
	goleak.VerifyTestMain(m,
		// nats-server v2.15.2 can orphan one file store when a stream is
		// created while the server shuts down (TestOpenDuringElection
		// shuts nodes down under roles creating their stream and buckets):
		// Account.addStreamWithAssignment does not check for shutdown, so a
		// create that passed its checks completes after Shutdown stopped
		// the account's streams; its flush loop and the access-time ticker
		// it registered never stop (see tests/harness_test.go). A server
		// left running leaks dozens of goroutines, which this does not hide.
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server.(*fileStore).flushStreamStateLoop"),
		goleak.IgnoreTopFunction("github.com/nats-io/nats-server/v2/server/ats.Register.func1"),
	)
}

// startServer starts an embedded server on dir, shut down at cleanup.
func startServer(t *testing.T, dir string, dontListen bool) *natsserver.Server {
	t.Helper()
	s, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: dir, DontListen: dontListen})
	if err != nil {
		t.Fatalf("StartServer: %v", err)
	}
	t.Cleanup(s.Shutdown)
	return s
}

func connect(t *testing.T, s *natsserver.Server, opts ...nats.Option) *nats.Conn {
	t.Helper()
	// A generous dial timeout: tests share a small, loaded machine.
	nc, err := s.Connect(append([]nats.Option{nats.Timeout(10 * time.Second)}, opts...)...)
	if err != nil {
		t.Fatalf("Connect: %v", err)
	}
	t.Cleanup(nc.Close)
	return nc
}

func open(t *testing.T, nc *nats.Conn, cfg natslog.Config) *natslog.Log {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	defer cancel()
	l, err := natslog.Open(ctx, nc, cfg)
	if err != nil {
		t.Fatalf("Open: %v", err)
	}
	return l
}

func ctxT(t *testing.T) context.Context {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), 10*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func ev(term uint64, id uint64) events.Event {
	return events.Event{
		Term:   term,
		Writer: "meta-1",
		At:     time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC),
		Data:   events.WorkerRegistered{ID: id, Endpoint: "127.0.0.1:5688", Kind: "compute", Parallelism: 4},
	}
}

func readAll(t *testing.T, l events.Log) []events.Record {
	t.Helper()
	var out []events.Record
	if err := l.Read(ctxT(t), 1, func(r events.Record) error {
		out = append(out, r)
		return nil
	}); err != nil {
		t.Fatalf("Read: %v", err)
	}
	return out
}

func TestConformance(t *testing.T) {
	t.Parallel()
	logtest.Run(t, func(t *testing.T) events.Log {
		s := startServer(t, t.TempDir(), false)
		return open(t, connect(t, s), natslog.Config{})
	})
}

// TestCompactionConformance compacts the stream with a purge up to a seq.
func TestCompactionConformance(t *testing.T) {
	t.Parallel()
	logtest.RunCompaction(t, func(t *testing.T) (events.Log, logtest.Compact) {
		s := startServer(t, t.TempDir(), false)
		nc := connect(t, s)
		// The stream Open makes denies purges: compact one made without.
		l := openPurgeable(t, nc, natslog.Config{})
		return l, purger(t, nc, l)
	})
}

// streamOf is l's stream through the JetStream API on nc, to inspect or
// change it behind l's back.
func streamOf(t *testing.T, nc *nats.Conn, l *natslog.Log) jetstream.Stream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctxT(t), l.Stream())
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// purger compacts l by purging its stream below a seq.
func purger(t *testing.T, nc *nats.Conn, l *natslog.Log) logtest.Compact {
	return func(before uint64) error {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		st, err := js.Stream(ctxT(t), l.Stream())
		if err != nil {
			return err
		}
		return st.Purge(ctxT(t), jetstream.WithPurgeSequence(before))
	}
}

func TestConformanceInProcess(t *testing.T) {
	t.Parallel()
	logtest.Run(t, func(t *testing.T) events.Log {
		s := startServer(t, t.TempDir(), true)
		return open(t, connect(t, s), natslog.Config{Cluster: "inproc"})
	})
}

func TestStreamConfig(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	l := open(t, nc, natslog.Config{Cluster: "east-1"})
	if got, want := l.Stream(), "TERMLOG_EAST-1"; got != want {
		t.Fatalf("Stream() = %q, want %q", got, want)
	}
	if got, want := l.Subject(events.TypeWorkerRegistered), "east-1.ev.worker.registered"; got != want {
		t.Fatalf("Subject() = %q, want %q", got, want)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	st, err := js.Stream(ctxT(t), "TERMLOG_EAST-1")
	if err != nil {
		t.Fatalf("stream: %v", err)
	}
	cfg := st.CachedInfo().Config
	if !slices.Equal(cfg.Subjects, []string{"east-1.ev.>"}) {
		t.Errorf("subjects = %q", cfg.Subjects)
	}
	if cfg.Storage != jetstream.FileStorage {
		t.Errorf("storage = %v, want file", cfg.Storage)
	}
	if cfg.AllowDirect {
		t.Errorf("allow_direct is set")
	}
	if cfg.MaxMsgs > 0 || cfg.MaxBytes > 0 || cfg.MaxAge > 0 || cfg.MaxMsgsPerSubject > 0 {
		t.Errorf("limits set: %+v", cfg)
	}
	if cfg.Duplicates != natslog.DefaultDuplicates || cfg.Replicas != 1 {
		t.Errorf("duplicates %s replicas %d", cfg.Duplicates, cfg.Replicas)
	}
	if !cfg.AllowAtomicPublish {
		t.Errorf("allow_atomic is not set: appends of several events cannot be batches")
	}
	if !cfg.DenyDelete || !cfg.DenyPurge {
		t.Errorf("deny_delete %v, deny_purge %v: the log is not append-only", cfg.DenyDelete, cfg.DenyPurge)
	}
	// The default cluster.
	if got := open(t, nc, natslog.Config{}).Stream(); got != "TERMLOG_TERMLOG" {
		t.Errorf("default stream = %q", got)
	}
	// Events land on their type's subject.
	if _, err := l.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		t.Fatal(err)
	}
	m, err := st.GetMsg(ctxT(t), 1)
	if err != nil {
		t.Fatal(err)
	}
	if m.Subject != "east-1.ev.worker.registered" || m.Header.Get(jetstream.MsgIDHeader) != "meta-1-1-1" {
		t.Errorf("stored subject %q msg id %q", m.Subject, m.Header.Get(jetstream.MsgIDHeader))
	}
}

func TestOpenRejects(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.CreateStream(ctxT(t), jetstream.StreamConfig{
		Name: "TERMLOG_LOSSY", Subjects: []string{"lossy.ev.>"}, MaxAge: time.Hour,
	}); err != nil {
		t.Fatal(err)
	}
	if _, err := natslog.Open(ctxT(t), nc, natslog.Config{Cluster: "lossy"}); err == nil {
		t.Fatal("Open bound a stream whose limits drop events")
	} else {
		refusedAtOnce(t, err, "a stream whose limits drop events")
	}
	if _, err := natslog.Open(ctxT(t), nc, natslog.Config{Cluster: "a.b"}); err == nil {
		t.Fatal("Open accepted a cluster name with a dot")
	}
}

// TestOpenReplicas: replicas a standalone server cannot give, and an
// existing stream with fewer replicas than asked, are refused at once.
func TestOpenReplicas(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	_, err := natslog.Open(ctxT(t), nc, natslog.Config{Cluster: "r3", Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "standalone") {
		t.Fatalf("Open R3 on a standalone server: %v, want an error saying it is standalone", err)
	}
	refusedAtOnce(t, err, "R3 on a standalone server")
	open(t, nc, natslog.Config{Cluster: "r1"})
	_, err = natslog.Open(ctxT(t), nc, natslog.Config{Cluster: "r1", Replicas: 3})
	if err == nil || !strings.Contains(err.Error(), "has 1 replicas, 3 asked") {
		t.Fatalf("Open R3 on an R1 stream: %v, want an error naming both", err)
	}
	refusedAtOnce(t, err, "an R1 stream under replicas 3")
	// Asking for fewer replicas than the stream has is fine.
	open(t, nc, natslog.Config{Cluster: "r1", Replicas: 1})
}

// refusedAtOnce checks that Open's error is the refusal itself, not the
// end of a retry loop: Open retries what may pass (JetStream not ready)
// until its context ends and then reports the attempts and the context's
// error; a configuration that cannot pass must not be retried.
func refusedAtOnce(t *testing.T, err error, what string) {
	t.Helper()
	if errors.Is(err, context.DeadlineExceeded) || errors.Is(err, context.Canceled) || strings.Contains(err.Error(), "attempts") {
		t.Errorf("Open retried %s until its deadline instead of refusing it: %v", what, err)
	}
	t.Logf("Open: %v", err)
}

// TestOpenBind: a reader that may not create the stream waits for it.
func TestOpenBind(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "late", Bind: true}); err == nil || !strings.Contains(err.Error(), "waiting for a meta replica") {
		t.Fatalf("Bind on a missing stream: %v, want an error saying it waits for it", err)
	}
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Stream(ctxT(t), "TERMLOG_LATE"); !errors.Is(err, jetstream.ErrStreamNotFound) {
		t.Fatalf("Bind created the stream: %v", err)
	}
	open(t, nc, natslog.Config{Cluster: "late"})
	open(t, nc, natslog.Config{Cluster: "late", Bind: true})
}

func TestOpenBindsExisting(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	l1 := open(t, connect(t, s), natslog.Config{})
	want := []events.Event{ev(1, 0), ev(1, 1), ev(1, 2)}
	if _, err := l1.Append(ctxT(t), 0, want...); err != nil {
		t.Fatal(err)
	}
	// Another replica with its own connection binds to the same stream.
	l2 := open(t, connect(t, s), natslog.Config{})
	if tail, err := l2.Tail(ctxT(t)); err != nil || tail != 3 {
		t.Fatalf("Tail = %d, %v; want 3", tail, err)
	}
	recs := readAll(t, l2)
	if len(recs) != 3 {
		t.Fatalf("read %d records, want 3", len(recs))
	}
	// And its appends are fenced against the first one's.
	if _, err := l2.Append(ctxT(t), 2, ev(2, 9)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("stale append through the second handle: %v, want ErrFenced", err)
	}
	if seq, err := l2.Append(ctxT(t), 3, ev(2, 3)); err != nil || seq != 4 {
		t.Fatalf("append through the second handle = %d, %v", seq, err)
	}
}

// A stream made before appends were batched is updated to allow atomic
// batches, keeps its events, and takes batched appends.
func TestOpenAllowsBatchesOnOldStream(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	old := jetstream.StreamConfig{Name: "TERMLOG_OLD", Subjects: []string{"old.ev.>"}, Storage: jetstream.FileStorage, Duplicates: natslog.DefaultDuplicates}
	st, err := js.CreateStream(ctxT(t), old)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctxT(t), "old.ev.worker.registered", mustEncode(t, ev(1, 0))); err != nil {
		t.Fatal(err)
	}
	l := open(t, nc, natslog.Config{Cluster: "old"})
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if !info.Config.AllowAtomicPublish || info.State.Msgs != 1 {
		t.Fatalf("after open: allow_atomic %v, %d msgs; want true, 1", info.Config.AllowAtomicPublish, info.State.Msgs)
	}
	if seq, err := l.Append(ctxT(t), 1, ev(1, 1), ev(1, 2), ev(1, 3)); err != nil || seq != 4 {
		t.Fatalf("batched append = %d, %v; want 4, nil", seq, err)
	}
}

func mustEncode(t *testing.T, e events.Event) []byte {
	t.Helper()
	b, err := events.Encode(e)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestCorruptRecord(t *testing.T) {
	t.Parallel()
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	l := open(t, nc, natslog.Config{})
	if _, err := l.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		t.Fatal(err)
	}
	// Another writer, bypassing the codec and the CAS.
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	if ack, err := js.Publish(ctxT(t), "termlog.ev.x", []byte("{not json")); err != nil || ack.Sequence != 2 {
		t.Fatalf("raw publish: %v, %v", ack, err)
	}
	if _, err := l.Append(ctxT(t), 2, ev(1, 1)); err != nil {
		t.Fatal(err)
	}
	recs := readAll(t, l)
	if len(recs) != 3 {
		t.Fatalf("read %d records, want 3", len(recs))
	}
	_, err = recs[1].Decode()
	var de *events.DecodeError
	if !errors.As(err, &de) || de.Seq != 2 || !errors.Is(err, events.ErrMalformed) {
		t.Fatalf("decode of the garbage record: %v, want a *DecodeError at seq 2", err)
	}
	for _, i := range []int{0, 2} {
		e, err := recs[i].Decode()
		if err != nil || e.Seq != uint64(i+1) {
			t.Fatalf("record %d: %+v, %v", i, e, err)
		}
	}
}

func TestRestartKeepsEvents(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	s1, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	nc1, err := s1.Connect()
	if err != nil {
		s1.Shutdown()
		t.Fatal(err)
	}
	l1 := open(t, nc1, natslog.Config{})
	want := []events.Event{ev(1, 0), ev(1, 1), ev(2, 2)}
	_, err = l1.Append(ctxT(t), 0, want...)
	nc1.Close()
	s1.Shutdown()
	if err != nil {
		t.Fatal(err)
	}

	s2 := startServer(t, dir, false)
	l2 := open(t, connect(t, s2), natslog.Config{})
	recs := readAll(t, l2)
	if len(recs) != len(want) {
		t.Fatalf("after restart read %d records, want %d", len(recs), len(want))
	}
	for i, r := range recs {
		e, err := r.Decode()
		if err != nil || e.Term != want[i].Term || e.Data != want[i].Data {
			t.Fatalf("record %d after restart: %+v, %v", i, e, err)
		}
	}
	// The fence survives the restart too.
	if _, err := l2.Append(ctxT(t), 2, ev(3, 3)); !errors.Is(err, events.ErrFenced) {
		t.Fatalf("stale append after restart: %v, want ErrFenced", err)
	}
	// As does the idempotent retry of the last append.
	if seq, err := l2.Append(ctxT(t), 2, want[2]); err != nil || seq != 3 {
		t.Fatalf("retry after restart = %d, %v; want 3, nil", seq, err)
	}
}

func TestAppendServerDown(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		opts []nats.Option
		ctx  func(t *testing.T) (context.Context, context.CancelFunc)
	}{
		// The connection keeps trying to reconnect: the caller's deadline bounds the append.
		{"Reconnecting", nil, func(t *testing.T) (context.Context, context.CancelFunc) {
			return context.WithTimeout(t.Context(), 500*time.Millisecond)
		}},
		// The connection is closed: the append fails at once, even without a deadline.
		{"Closed", []nats.Option{nats.NoReconnect()}, func(t *testing.T) (context.Context, context.CancelFunc) {
			return context.WithCancel(t.Context())
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s := startServer(t, t.TempDir(), false)
			nc := connect(t, s, tc.opts...)
			// The log's own request timeout is an hour: only the caller's
			// context (Reconnecting) or the closed connection (Closed) can
			// end the append.
			l := open(t, nc, natslog.Config{RequestTimeout: time.Hour})
			if _, err := l.Append(ctxT(t), 0, ev(1, 0)); err != nil {
				t.Fatal(err)
			}
			s.Shutdown()
			ctx, cancel := tc.ctx(t)
			defer cancel()
			type result struct {
				seq uint64
				err error
			}
			done := make(chan result, 1)
			go func() {
				seq, err := l.Append(ctx, 1, ev(1, 1))
				done <- result{seq, err}
			}()
			var r result
			select {
			case r = <-done:
			case <-time.After(time.Minute):
				t.Fatal("Append against a shut-down server is still waiting after a minute (on its hour-long request timeout)")
			}
			seq, err := r.seq, r.err
			if tc.name == "Closed" && ctx.Err() != nil {
				t.Fatalf("Append on a closed connection returned only when its context ended: %v", err)
			}
			if err == nil {
				t.Fatalf("Append against a shut-down server succeeded with seq %d", seq)
			}
			if errors.Is(err, events.ErrFenced) {
				t.Fatalf("Append against a shut-down server said fenced: %v", err)
			}
			if seq != 1 {
				t.Errorf("failed Append returned seq %d, want the unchanged 1", seq)
			}
			t.Logf("Append: %v", err)
		})
	}
}

// A Watch keeps delivering across a server restart on the same data dir and
// port: its consumer is lost with the server and made again after the last
// delivered seq, whether it had delivered records before or not.
func TestWatchAcrossRestart(t *testing.T) {
	t.Parallel()
	for _, from := range []uint64{1, 2} {
		t.Run(fmt.Sprintf("From%d", from), func(t *testing.T) {
			t.Parallel()
			testWatchAcrossRestart(t, from)
		})
	}
}

func testWatchAcrossRestart(t *testing.T, from uint64) {
	dir := t.TempDir()
	s1, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	port := s1.NATS().Addr().(*net.TCPAddr).Port
	nc, err := nats.Connect(s1.ClientURL(), nats.Timeout(10*time.Second), nats.MaxReconnects(-1), nats.ReconnectWait(20*time.Millisecond))
	if err != nil {
		s1.Shutdown()
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	l := open(t, nc, natslog.Config{})
	if _, err := l.Append(ctxT(t), 0, ev(1, 0)); err != nil {
		s1.Shutdown()
		t.Fatal(err)
	}

	ctx, cancel := context.WithCancel(t.Context())
	got := make(chan uint64)
	done := make(chan error, 1)
	go func() {
		done <- l.Watch(ctx, from, func(r events.Record) error {
			select {
			case got <- r.Seq:
				return nil
			case <-ctx.Done():
				return ctx.Err()
			}
		})
	}()
	stopWatch := func() {
		cancel()
		if err := <-done; !errors.Is(err, context.Canceled) {
			t.Errorf("Watch returned %v after cancel", err)
		}
	}
	recv := func(want uint64) {
		t.Helper()
		timer := time.NewTimer(20 * time.Second)
		defer timer.Stop()
		select {
		case seq := <-got:
			if seq != want {
				t.Fatalf("Watch delivered seq %d, want %d", seq, want)
			}
		case err := <-done:
			done <- err
			t.Fatalf("Watch returned %v", err)
		case <-timer.C:
			t.Fatalf("Watch did not deliver seq %d", want)
		}
	}
	if from == 1 {
		recv(1)
	} else {
		// Let the idle Watch get its consumer before the server goes.
		waitPulling(t, nc, l.Stream())
	}
	s1.Shutdown()
	s2, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: dir, Port: port})
	if err != nil {
		stopWatch()
		t.Fatal(err)
	}
	t.Cleanup(s2.Shutdown)
	t.Cleanup(stopWatch) // runs before the shutdown
	// The client reconnects; the append may race the reconnect.
	appendRetrying(t, l, 1, ev(1, 1), 10*time.Second)
	recv(2)
}

// appendRetrying appends e after seq prev while the outcome is unknown (a
// server restarting, a stream electing a leader: the CAS and the msg id
// make asking again safe), until it is acked at prev+1 or within has
// passed. A fenced append fails the test at once.
func appendRetrying(t *testing.T, l *natslog.Log, prev uint64, e events.Event, within time.Duration) {
	t.Helper()
	var seq uint64
	var err error
	_ = testkit.Poll(t.Context(), within, 0, func() error {
		actx, acancel := context.WithTimeout(t.Context(), 2*time.Second)
		seq, err = l.Append(actx, prev, e)
		acancel()
		if err == nil && seq != prev+1 || errors.Is(err, events.ErrFenced) {
			return nil // fails at once, below
		}
		return err
	})
	if err != nil || seq != prev+1 {
		t.Fatalf("append after seq %d: %d, %v", prev, seq, err)
	}
}

// waitPulling polls until a consumer of the stream has a pull request
// waiting: its reader got the consumer and is fetching.
func waitPulling(t *testing.T, nc *nats.Conn, stream string) {
	t.Helper()
	waitConsumers(t, nc, stream, "a consumer is pulling", func(cis []*jetstream.ConsumerInfo) bool {
		for _, ci := range cis {
			if ci.NumWaiting > 0 {
				return true
			}
		}
		return false
	})
}

// waitConsumers polls the consumers of stream until ok holds for them, and
// returns them; it fails the test after 10s (want says what was awaited).
func waitConsumers(t *testing.T, nc *nats.Conn, stream, want string, ok func([]*jetstream.ConsumerInfo) bool) []*jetstream.ConsumerInfo {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	var cis []*jetstream.ConsumerInfo
	var last error // of the last listing; nil when it listed but ok did not hold
	// Generous: a loaded machine (the chaos suite runs beside this package
	// in CI) delays consumer creation, and a reader's session restarted
	// under load may leave its old consumer behind (its delete timed out)
	// until it has been inactive for consumerInactive (30 s).
	err = testkit.Poll(t.Context(), 45*time.Second, 10*time.Millisecond, func() error {
		cis, last = listConsumers(t, js, stream)
		if last == nil && !ok(cis) {
			return errors.New(want)
		}
		return last
	})
	if err != nil {
		var seen []string
		for _, ci := range cis {
			leader := "no leader"
			if ci.Cluster != nil && ci.Cluster.Leader != "" {
				leader = "on " + ci.Cluster.Leader
			}
			seen = append(seen, fmt.Sprintf("%s %s (delivered %d, waiting %d)", ci.Name, leader, ci.Delivered.Stream, ci.NumWaiting))
		}
		t.Fatalf("stream %s: waited in vain until %s (last error %v; consumers: %v)", stream, want, last, seen)
	}
	return cis
}

// listConsumers lists the consumers of stream.
func listConsumers(t *testing.T, js jetstream.JetStream, stream string) ([]*jetstream.ConsumerInfo, error) {
	st, err := js.Stream(ctxT(t), stream)
	if err != nil {
		return nil, err
	}
	infos := st.ListConsumers(ctxT(t))
	var cis []*jetstream.ConsumerInfo
	for ci := range infos.Info() { // drained: the lister's goroutine blocks otherwise
		cis = append(cis, ci)
	}
	return cis, infos.Err()
}

// Read and Watch clean up after themselves: no consumer is left on the
// stream and no goroutine outlives the call. Not parallel: it counts
// goroutines.
func TestReadersCleanUp(t *testing.T) {
	s := startServer(t, t.TempDir(), false)
	nc := connect(t, s)
	l := open(t, nc, natslog.Config{})
	if _, err := l.Append(ctxT(t), 0, ev(1, 0), ev(1, 1), ev(1, 2)); err != nil {
		t.Fatal(err)
	}
	st := streamOf(t, nc, l)
	// Warm up: the first request makes the connection's response mux.
	_ = readAll(t, l)
	baseline := goleak.IgnoreCurrent()

	if n := len(readAll(t, l)); n != 3 {
		t.Fatalf("read %d records", n)
	}
	stop := errors.New("stop")
	if err := l.Watch(ctxT(t), 2, func(r events.Record) error {
		if r.Seq == 3 {
			return stop
		}
		return nil
	}); !errors.Is(err, stop) {
		t.Fatalf("Watch: %v", err)
	}
	ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
	defer cancel()
	if err := l.Watch(ctx, 4, func(r events.Record) error {
		return errors.New("unexpected record")
	}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("idle Watch: %v", err)
	}
	info, err := st.Info(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Consumers != 0 {
		t.Errorf("%d consumers left on the stream", info.State.Consumers)
	}
	goleak.VerifyNone(t, baseline)
}

// reportedAtOnce checks that StartServer's error is the server's own
// failure, not its readiness wait running out (which is what waiting for a
// server that will never be ready ends in).
func reportedAtOnce(t *testing.T, err error, what string) {
	t.Helper()
	if s := err.Error(); strings.Contains(s, "not ready for connections after") || strings.Contains(s, "not enabled after") || strings.Contains(s, "not usable") {
		t.Errorf("StartServer on %s waited for readiness instead of reporting the failure: %v", what, err)
	}
	t.Logf("StartServer: %v", err)
}

func TestStartServerErrors(t *testing.T) {
	t.Parallel()
	if _, err := natsserver.StartServer(natsserver.ServerConfig{}); err == nil {
		t.Error("started without a data dir")
	}
	if _, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Host: "0.0.0.0"}); err == nil {
		t.Error("started on 0.0.0.0")
	}
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if s, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: notDir}); err == nil {
		s.Shutdown()
		t.Error("started on a data dir that is a file")
	} else {
		reportedAtOnce(t, err, "a data dir that is a file")
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	var log syncBuffer
	s, err := natsserver.StartServer(natsserver.ServerConfig{
		DataDir: t.TempDir(), Port: ln.Addr().(*net.TCPAddr).Port, Log: func(_, msg string) { fmt.Fprintln(&log, msg) },
	})
	if err == nil {
		s.Shutdown()
		t.Fatal("started on a port in use")
	}
	reportedAtOnce(t, err, "a port in use")
	if !strings.Contains(log.String(), "Starting nats-server") {
		t.Errorf("server log not written: %q", log.String())
	}
}

// Open retries while JetStream is not there yet and binds once it is.
func TestOpenWaitsForJetStream(t *testing.T) {
	t.Parallel()
	ns, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: server.RANDOM_PORT, NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	ns.Start()
	t.Cleanup(func() { ns.Shutdown(); ns.WaitForShutdown() })
	if !ns.ReadyForConnections(5 * time.Second) {
		t.Fatal("server not ready")
	}
	nc, err := nats.Connect(ns.ClientURL(), nats.Timeout(10*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)

	// Without JetStream, Open gives up at its deadline.
	ctx, cancel := context.WithTimeout(t.Context(), 300*time.Millisecond)
	defer cancel()
	if _, err := natslog.Open(ctx, nc, natslog.Config{}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Open without JetStream: %v, want a deadline error", err)
	} else {
		t.Logf("Open: %v", err)
	}

	type result struct {
		l   *natslog.Log
		err error
	}
	done := make(chan result, 1)
	go func() {
		l, err := natslog.Open(ctxT(t), nc, natslog.Config{})
		done <- result{l, err}
	}()
	if err := ns.EnableJetStream(&server.JetStreamConfig{StoreDir: t.TempDir()}); err != nil {
		<-done
		t.Fatal(err)
	}
	r := <-done
	if r.err != nil {
		t.Fatalf("Open once JetStream is up: %v", r.err)
	}
	if seq, err := r.l.Append(ctxT(t), 0, ev(1, 0)); err != nil || seq != 1 {
		t.Fatalf("Append = %d, %v", seq, err)
	}
}

type syncBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.b.String()
}
