package meta

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/clock"
	"github.com/termlog/termlog/meta/client"
)

// The leader's RPC handling on the in-memory log, with W workers already
// registered and running, so the cost per request shows how it grows with
// the cluster:
//
//	go test -run '^$' -bench 'RPC|Expiry' ./meta/

var benchSizes = []int{0, 1000, 10_000}

// benchLeaderWith starts a leader of term 2 over a log in which an earlier
// leader registered and activated workers workers; it has folded the log
// and appended its term.started.
func benchLeaderWith(b *testing.B, workers int) *leaderSession {
	b.Helper()
	log := events.NewMemLog()
	at := time.Date(2026, 11, 30, 3, 0, 0, 0, time.UTC)
	add := func(p events.Payload) {
		body, err := events.Encode(events.Event{Term: 1, Writer: "meta-0", At: at, Data: p})
		if err != nil {
			b.Fatal(err)
		}
		log.AppendRaw(body)
	}
	add(events.TermStarted{Term: 1, Leader: "meta-0"})
	for i := range workers {
		add(events.WorkerRegistered{ID: uint64(i + 1), Incarnation: benchIncarnation(i), Endpoint: benchEndpoint(i), Kind: "compute", Parallelism: 4})
	}
	for i := range workers {
		add(events.WorkerActivated{ID: uint64(i + 1), Epoch: uint64(i + 2)})
	}
	clk := clock.Real{}
	// A lease of an hour, not renewed: a run of the default lease (3 s)
	// finds it stale after 2 s and appends nothing.
	r, err := New(Config{ID: "meta-1", Log: log, Lease: NewMemLeaseStore(clk, time.Hour).Handle(), Clock: clk,
		LeaseTTL: time.Hour, WorkerTimeout: time.Hour, Logger: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	l := r.newLeaderSession(ctx, 2, func(string) {})
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = r.proj.Run(ctx) }()
	go func() { defer wg.Done(); l.runLoop(ctx) }()
	b.Cleanup(func() { cancel(); wg.Wait() })
	if err := l.startTerm(ctx); err != nil {
		b.Fatal(err)
	}
	if n := len(r.proj.View().Workers); n != workers {
		b.Fatalf("%d workers projected, want %d", n, workers)
	}
	return l
}

func benchIncarnation(i int) string { return fmt.Sprintf("inc-%d", i) }

func benchEndpoint(i int) string {
	return fmt.Sprintf("10.%d.%d.%d:5688", 1+i/65536, i/256%256, i%256)
}

// benchRef is the body of an activate/heartbeat/deregister request for
// worker i (id i+1, registered at seq i+2), in whatever form client.WorkerRef
// has.
func benchRef(b *testing.B, i int) []byte {
	b.Helper()
	full := fmt.Sprintf(`{"id":%d,"epoch":%d,"incarnation":%q}`, i+1, i+2, benchIncarnation(i))
	var ref client.WorkerRef
	if err := json.Unmarshal([]byte(full), &ref); err != nil {
		b.Fatal(err)
	}
	out, err := json.Marshal(ref)
	if err != nil {
		b.Fatal(err)
	}
	return out
}

// BenchmarkRegisterRPC handles one register request at a time: decide on the
// view, one fenced append, wait for the projection, reply.
func BenchmarkRegisterRPC(b *testing.B) {
	for _, w := range benchSizes {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			l := newRPCServer(benchLeaderWith(b, w))
			reqs := make([][]byte, b.N)
			for i := range b.N {
				reqs[i], _ = json.Marshal(client.RegisterRequest{Incarnation: benchIncarnation(w + i), Endpoint: benchEndpoint(w + i), Kind: "compute", Parallelism: 4})
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if rep := l.handle(ctx, client.RPCRegister, reqs[i]); rep.Error != nil {
					b.Fatal(rep.Error)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "registrations/s")
		})
	}
}

// BenchmarkHeartbeatRPC handles heartbeats of the registered workers in turn
// (no append: a deadline in memory).
func BenchmarkHeartbeatRPC(b *testing.B) {
	for _, w := range benchSizes[1:] {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			l := newRPCServer(benchLeaderWith(b, w))
			reqs := make([][]byte, w)
			for i := range w {
				reqs[i] = benchRef(b, i)
			}
			ctx := context.Background()
			b.ReportAllocs()
			b.ResetTimer()
			for i := range b.N {
				if rep := l.handle(ctx, client.RPCHeartbeat, reqs[i%w]); rep.Error != nil {
					b.Fatal(rep.Error)
				}
			}
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "heartbeats/s")
		})
	}
}

// BenchmarkExpiryScan is one expiry tick's decision over every worker
// (nothing expires).
func BenchmarkExpiryScan(b *testing.B) {
	for _, w := range benchSizes[1:] {
		b.Run(fmt.Sprintf("workers=%d", w), func(b *testing.B) {
			l := benchLeaderWith(b, w)
			v := l.r.proj.View()
			b.ReportAllocs()
			b.ResetTimer()
			for range b.N {
				if out := l.duties.workers.collectExpired(v, connState(l.r.cfg.NC), l.r.cfg.Clock.Now()); len(out) != 0 {
					b.Fatalf("%d expired", len(out))
				}
			}
		})
	}
}
