package natslog_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/natslog"
	"github.com/termlog/termlog/natsserver"
)

// The append and read paths of the JetStream log next to raw JetStream on
// the same embedded server (TCP on 127.0.0.1, file storage):
//
//	go test -run '^$' -bench . -benchtime 5000x ./events/natslog/
//
// BenchmarkAppendFenced is what a leader does per decision; the raw publish
// benchmarks are its floor. BenchmarkReadFold is what status and a catching
// up replica do; BenchmarkReadOrderedConsumer is its floor.

type benchLog struct {
	log *natslog.Log
	js  jetstream.JetStream
	nc  *nats.Conn
}

func newBenchLog(b *testing.B) *benchLog {
	b.Helper()
	srv, err := natsserver.StartServer(natsserver.ServerConfig{DataDir: b.TempDir()})
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(srv.Shutdown)
	nc, err := srv.Connect()
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(nc.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "bench"})
	if err != nil {
		b.Fatal(err)
	}
	js, err := jetstream.New(nc, jetstream.WithPublishAsyncMaxPending(4096))
	if err != nil {
		b.Fatal(err)
	}
	return &benchLog{log: l, js: js, nc: nc}
}

func benchEvents(n int) ([]events.Event, [][]byte) {
	evs := make([]events.Event, n)
	bodies := make([][]byte, n)
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	for i := range n {
		evs[i] = events.Event{Term: 1, Writer: "meta-1", At: at.Add(time.Duration(i) * time.Millisecond), Data: events.WorkerRegistered{
			ID: uint64(i + 1), Incarnation: fmt.Sprintf("inc-%d", i), Endpoint: fmt.Sprintf("10.1.%d.%d:5688", i/256%256, i%256), Kind: "compute", Parallelism: 4}}
		b, err := events.Encode(evs[i])
		if err != nil {
			panic(err)
		}
		bodies[i] = b
	}
	return evs, bodies
}

func benchReportRate(b *testing.B, n int) {
	b.ReportMetric(float64(n)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkAppendFenced appends one event at a time with the CAS and a
// Msg-Id, as the leader does today.
func BenchmarkAppendFenced(b *testing.B) {
	bl := newBenchLog(b)
	evs, _ := benchEvents(b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := bl.log.Append(ctx, uint64(i), evs[i]); err != nil {
			b.Fatal(err)
		}
	}
	benchReportRate(b, b.N)
}

func benchRawStream(b *testing.B, bl *benchLog) {
	b.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := bl.js.CreateStream(ctx, jetstream.StreamConfig{Name: "RAW", Subjects: []string{"raw.>"}, Storage: jetstream.FileStorage,
		Duplicates: natslog.DefaultDuplicates}); err != nil {
		b.Fatal(err)
	}
}

// BenchmarkPublishSync is the floor of a one-at-a-time append: a plain
// JetStream publish of the same body, no headers.
func BenchmarkPublishSync(b *testing.B) {
	bl := newBenchLog(b)
	benchRawStream(b, bl)
	_, bodies := benchEvents(b.N)
	ctx := context.Background()
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		if _, err := bl.js.Publish(ctx, "raw.ev", bodies[i]); err != nil {
			b.Fatal(err)
		}
	}
	benchReportRate(b, b.N)
}

// BenchmarkPublishAsync is the stream's throughput: async publishes with
// up to 2048 acks pending.
func BenchmarkPublishAsync(b *testing.B) {
	bl := newBenchLog(b)
	benchRawStream(b, bl)
	_, bodies := benchEvents(b.N)
	b.ReportAllocs()
	b.ResetTimer()
	pending := make(chan jetstream.PubAckFuture, 2048)
	for i := range b.N {
		if len(pending) == cap(pending) {
			if err := benchWaitAck(<-pending); err != nil {
				b.Fatal(err)
			}
		}
		f, err := bl.js.PublishAsync("raw.ev", bodies[i])
		if err != nil {
			b.Fatal(err)
		}
		pending <- f
	}
	for len(pending) > 0 {
		if err := benchWaitAck(<-pending); err != nil {
			b.Fatal(err)
		}
	}
	benchReportRate(b, b.N)
}

func benchWaitAck(f jetstream.PubAckFuture) error {
	select {
	case <-f.Ok():
		return nil
	case err := <-f.Err():
		return err
	case <-time.After(10 * time.Second):
		return fmt.Errorf("no ack in 10s")
	}
}

// fillLog stores n events in the termlog stream with async publishes.
func benchFill(b *testing.B, bl *benchLog, n int) {
	b.Helper()
	evs, bodies := benchEvents(n)
	pending := make(chan jetstream.PubAckFuture, 2048)
	for i := range n {
		if len(pending) == cap(pending) {
			if err := benchWaitAck(<-pending); err != nil {
				b.Fatal(err)
			}
		}
		f, err := bl.js.PublishAsync(bl.log.Subject(evs[i].Type()), bodies[i])
		if err != nil {
			b.Fatal(err)
		}
		pending <- f
	}
	for len(pending) > 0 {
		if err := benchWaitAck(<-pending); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkRead reads b.N events with Log.Read (ordered sessions on an
// ephemeral consumer), without folding them.
func BenchmarkRead(b *testing.B) {
	bl := newBenchLog(b)
	benchFill(b, bl, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	n := 0
	if err := bl.log.Read(context.Background(), 1, func(events.Record) error { n++; return nil }); err != nil {
		b.Fatal(err)
	}
	if n != b.N {
		b.Fatalf("read %d of %d", n, b.N)
	}
	benchReportRate(b, b.N)
}

// BenchmarkReadDecode is Read plus events.Decode of each record: the part
// of a replay that is not the fold itself.
func BenchmarkReadDecode(b *testing.B) {
	bl := newBenchLog(b)
	benchFill(b, bl, b.N)
	b.ReportAllocs()
	b.ResetTimer()
	if err := bl.log.Read(context.Background(), 1, func(rec events.Record) error {
		_, err := rec.Decode()
		return err
	}); err != nil {
		b.Fatal(err)
	}
	benchReportRate(b, b.N)
}

// BenchmarkReadOrderedConsumer is the floor of Read: a plain ordered
// consumer with default options reading the same messages.
func BenchmarkReadOrderedConsumer(b *testing.B) {
	bl := newBenchLog(b)
	benchFill(b, bl, b.N)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.ReportAllocs()
	b.ResetTimer()
	cons, err := bl.js.OrderedConsumer(ctx, bl.log.Stream(), jetstream.OrderedConsumerConfig{})
	if err != nil {
		b.Fatal(err)
	}
	it, err := cons.Messages()
	if err != nil {
		b.Fatal(err)
	}
	defer it.Stop()
	for range b.N {
		if _, err := it.Next(jetstream.NextContext(ctx)); err != nil {
			b.Fatal(err)
		}
	}
	benchReportRate(b, b.N)
}

// BenchmarkAppendSync is the cost of syncing before every acknowledgement
// (natsserver.SyncAlways, the default) next to nats-server's interval sync, on
// one server (R1) and on a 3-node cluster (R3), one event at a time and in
// appends of 100 (a pipeline on R1, an atomic batch on R3):
//
//	go test -run '^$' -bench AppendSync -benchtime 2000x ./events/natslog/
func BenchmarkAppendSync(b *testing.B) {
	for _, p := range []natsserver.SyncPolicy{natsserver.SyncAlways, natsserver.SyncInterval} {
		for _, replicas := range []int{1, 3} {
			for _, group := range []int{1, 100} {
				b.Run(fmt.Sprintf("sync=%s/R%d/group=%d", p, replicas, group), func(b *testing.B) {
					var nc *nats.Conn
					var err error
					if replicas == 1 {
						srv, serr := natsserver.StartServer(natsserver.ServerConfig{DataDir: b.TempDir(), Sync: p})
						if serr != nil {
							b.Fatal(serr)
						}
						b.Cleanup(srv.Shutdown)
						nc, err = srv.Connect()
					} else {
						_, cfgs := start3Restartable(b, natsserver.ServerConfig{Sync: p})
						nc, err = nats.Connect(fmt.Sprintf("nats://127.0.0.1:%d,nats://127.0.0.1:%d,nats://127.0.0.1:%d", cfgs[0].Port, cfgs[1].Port, cfgs[2].Port))
					}
					if err != nil {
						b.Fatal(err)
					}
					b.Cleanup(nc.Close)
					ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
					defer cancel()
					l, err := natslog.Open(ctx, nc, natslog.Config{Cluster: "bench", Replicas: replicas})
					if err != nil {
						b.Fatal(err)
					}
					n := b.N * group
					evs, _ := benchEvents(n)
					b.ResetTimer()
					for i := 0; i < n; i += group {
						if _, err := l.Append(context.Background(), uint64(i), evs[i:i+group]...); err != nil {
							b.Fatal(err)
						}
					}
					benchReportRate(b, n)
				})
			}
		}
	}
}

// BenchmarkTail compares the two ways of reading a stream's last seq on a
// stream of 20,000 events: Tail (the stream leader's last message, what
// reads fold up to) and stream info alone (what Tail was before: a
// leaderless member may answer it from its own copy).
func BenchmarkTail(b *testing.B) {
	bl := newBenchLog(b)
	const n = 20_000
	benchFill(b, bl, n)
	ctx := context.Background()
	b.Run("leader-last-msg", func(b *testing.B) {
		for b.Loop() {
			if seq, err := bl.log.Tail(ctx); err != nil || seq != n {
				b.Fatalf("tail %d, %v", seq, err)
			}
		}
	})
	b.Run("stream-info", func(b *testing.B) {
		s, err := bl.js.Stream(ctx, bl.log.Stream())
		if err != nil {
			b.Fatal(err)
		}
		for b.Loop() {
			info, err := s.Info(ctx)
			if err != nil || info.State.LastSeq != n {
				b.Fatalf("info %v, %v", info, err)
			}
		}
	})
}
