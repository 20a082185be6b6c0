package natslog_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// A deposed leader's grouped append is one atomic batch with a stale
// expected last seq (a new leader's term.started took the seq after it):
// the server refuses the whole batch and nothing of it lands, on a single
// server (R1) and on a 3-node cluster (R3). The old leader's Log stored the
// event before the batch itself, so its own chain check passes: only the
// server's CAS on the batch's first message can refuse it.
func TestBatchStaleExpectedSeqRefusedWhole(t *testing.T) {
	t.Parallel()
	for _, replicas := range []int{1, 3} {
		t.Run(fmt.Sprintf("R%d", replicas), func(t *testing.T) {
			t.Parallel()
			var url string
			if replicas == 1 {
				srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir()})
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(srv.Shutdown)
				url = srv.ClientURL()
			} else {
				_, urls := start3(t, natsserver.ServerConfig{})
				url = urls[0] + "," + urls[1] + "," + urls[2]
			}
			connect := func() *nats.Conn {
				nc, err := nats.Connect(url)
				if err != nil {
					t.Fatal(err)
				}
				t.Cleanup(nc.Close)
				return nc
			}
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			cfg := natslog.Config{Cluster: "batch", Replicas: replicas}
			oldNC := connect()
			old, err := natslog.Open(ctx, oldNC, cfg)
			if err != nil {
				t.Fatal(err)
			}
			neu, err := natslog.Open(ctx, connect(), cfg)
			if err != nil {
				t.Fatal(err)
			}
			at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
			mk := func(term uint64, writer string, d events.Payload) events.Event {
				return events.Event{Term: term, Writer: writer, At: at, Data: d}
			}
			mine := []events.Event{mk(1, "meta-1", events.TermStarted{Term: 1, Leader: "meta-1", Lease: 1})}
			for i := range 2 {
				mine = append(mine, mk(1, "meta-1", events.WorkerRegistered{ID: uint64(i + 1), Incarnation: fmt.Sprint(i), Endpoint: fmt.Sprintf("10.0.0.%d:1", i), Kind: "compute"}))
			}
			if last, err := old.Append(ctx, 0, mine...); err != nil || last != 3 {
				t.Fatalf("old leader's first group = %d, %v; want 3, nil", last, err)
			}
			won := mk(2, "meta-2", events.TermStarted{Term: 2, Leader: "meta-2", Lease: 9})
			if last, err := neu.Append(ctx, 3, won); err != nil || last != 4 {
				t.Fatalf("new leader's term.started = %d, %v; want 4, nil", last, err)
			}
			var stale []events.Event
			for i := range 50 {
				stale = append(stale, mk(1, "meta-1", events.WorkerRegistered{ID: uint64(i + 3), Incarnation: fmt.Sprint("s", i), Endpoint: fmt.Sprintf("10.0.1.%d:1", i), Kind: "compute"}))
			}
			prev := events.MsgID(mine[2], 3)
			last, err := old.AppendAsync(ctx, 3, prev, stale...).Wait(ctx)
			if !errors.Is(err, events.ErrFenced) || last != 3 {
				t.Fatalf("deposed leader's batch of %d at expected seq 3 = %d, %v; want 3 and an error wrapping ErrFenced", len(stale), last, err)
			}
			if last, err := old.Append(ctx, 3, stale...); !errors.Is(err, events.ErrFenced) || last != 3 {
				t.Fatalf("its retry = %d, %v; want 3 and an error wrapping ErrFenced", last, err)
			}
			// Nothing of it landed: the stream holds the four events, the
			// new leader's last.
			js, err := jetstream.New(oldNC)
			if err != nil {
				t.Fatal(err)
			}
			st, err := js.Stream(ctx, natslog.StreamName("batch"))
			if err != nil {
				t.Fatal(err)
			}
			info, err := st.Info(ctx)
			if err != nil {
				t.Fatal(err)
			}
			if info.State.Msgs != 4 || info.State.LastSeq != 4 {
				t.Fatalf("stream holds %d messages up to seq %d, want 4 up to 4", info.State.Msgs, info.State.LastSeq)
			}
			var got []string
			if err := neu.Read(ctx, 1, func(r events.Record) error {
				ev, err := r.Decode()
				if err != nil {
					return err
				}
				got = append(got, fmt.Sprintf("%d:%s@%d/%s", r.Seq, ev.Type(), ev.Term, ev.Writer))
				return nil
			}); err != nil {
				t.Fatal(err)
			}
			if want := "[1:term.started@1/meta-1 2:worker.registered@1/meta-1 3:worker.registered@1/meta-1 4:term.started@2/meta-2]"; fmt.Sprint(got) != want {
				t.Fatalf("log %v, want %s", got, want)
			}
			// The new leader's own batch, decided on the log as it is, lands.
			if last, err := neu.Append(ctx, 4, mk(2, "meta-2", events.WorkerRegistered{ID: 3, Incarnation: "n", Endpoint: "10.0.2.1:1", Kind: "compute"}), mk(2, "meta-2", events.WorkerActivated{ID: 3, Epoch: 5})); err != nil || last != 6 {
				t.Fatalf("new leader's batch = %d, %v; want 6, nil", last, err)
			}
		})
	}
}

// An idle leader's single event is still in flight (pipelined on one
// server) when the next group, a batch chained to it, is sent: the batch
// waits for that event's ack instead of finding its seq empty and calling
// itself fenced. Every round stores both.
func TestBatchChainedToSingleInFlight(t *testing.T) {
	t.Parallel()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: t.TempDir(), Sync: natsserver.SyncAlways})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "chain"})
	if err != nil {
		t.Fatal(err)
	}
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	ev := func(i int) events.Event {
		return events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.WorkerRegistered{ID: uint64(i), Incarnation: fmt.Sprint(i), Endpoint: fmt.Sprintf("10.0.%d.%d:1", i/256, i%256), Kind: "compute"}}
	}
	if _, err := l.Append(ctx, 0, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 1, Leader: "meta-1", Lease: 1}}); err != nil {
		t.Fatal(err)
	}
	last := uint64(1)
	for round := range 20 {
		single := ev(int(last) + 1)
		p1 := l.AppendAsync(ctx, last, "", single)
		group := []events.Event{ev(int(last) + 2), ev(int(last) + 3), ev(int(last) + 4)}
		p2 := l.AppendAsync(ctx, last+1, events.MsgID(single, last+1), group...)
		if got, err := p2.Wait(ctx); err != nil || got != last+4 {
			t.Fatalf("round %d: batch chained to the single event in flight = %d, %v; want %d, nil", round, got, err, last+4)
		}
		if got, err := p1.Wait(ctx); err != nil || got != last+1 {
			t.Fatalf("round %d: the single event = %d, %v; want %d, nil", round, got, err, last+1)
		}
		last += 4
	}
}

// A deposed leader's single event, sent asynchronously on one server with
// no previous id to chain to (prevID ""), is fenced by its expected last
// seq alone: a new leader's term.started took that seq meanwhile, so the
// server refuses the event and nothing of it lands. Without the CAS the
// event would be stored after the new leader's (its msg id is the old
// leader's own, so no dedupe catches it), and only its ack would tell.
func TestAsyncSingleStaleExpectedSeqRefused(t *testing.T) {
	t.Parallel()
	srv := startServer(t, t.TempDir(), false)
	cfg := natslog.Config{Cluster: "single"}
	oldNC := connect(t, srv)
	old := open(t, oldNC, cfg)
	neu := open(t, connect(t, srv), cfg)
	ctx := ctxT(t)
	at := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	if last, err := old.Append(ctx, 0, events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.TermStarted{Term: 1, Leader: "meta-1", Lease: 1}}); err != nil || last != 1 {
		t.Fatalf("old leader's term.started = %d, %v; want 1, nil", last, err)
	}
	if last, err := neu.Append(ctx, 1, events.Event{Term: 2, Writer: "meta-2", At: at, Data: events.TermStarted{Term: 2, Leader: "meta-2", Lease: 9}}); err != nil || last != 2 {
		t.Fatalf("new leader's term.started = %d, %v; want 2, nil", last, err)
	}
	stale := events.Event{Term: 1, Writer: "meta-1", At: at, Data: events.WorkerRegistered{ID: 1, Incarnation: "a", Endpoint: "10.0.0.1:1", Kind: "compute"}}
	if last, err := old.AppendAsync(ctx, 1, "", stale).Wait(ctx); !errors.Is(err, events.ErrFenced) || last != 1 {
		t.Fatalf("deposed leader's single event at expected seq 1 = %d, %v; want 1 and an error wrapping ErrFenced", last, err)
	}
	info, err := streamOf(t, oldNC, old).Info(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if info.State.Msgs != 2 || info.State.LastSeq != 2 {
		t.Fatalf("stream holds %d messages up to seq %d, want 2 up to 2: the fenced event landed", info.State.Msgs, info.State.LastSeq)
	}
}
