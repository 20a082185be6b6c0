package projections_test

import (
	"encoding/json"
	"sync"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/projections"
)

// The benchmarks fold eventgen's realistic stream (the one termlog bench
// folds): a handful of stores and shards, then mostly worker registrations,
// activations and expiries over 10k endpoints, some shard observations and
// replica replacements, and a new term now and then. Every event applies.
var benchOnce = sync.OnceValues(func() (*eventgen.Stream, error) { return eventgen.Mix(100_000, 10_000) })

func benchStream(b *testing.B) *eventgen.Stream {
	b.Helper()
	w, err := benchOnce()
	if err != nil {
		b.Fatal(err)
	}
	return w
}

// TestBenchWorkload keeps the benchmark honest: every event of its stream
// applies and the invariants hold.
func TestBenchWorkload(t *testing.T) {
	w, err := eventgen.Mix(20_000, 10_000)
	if err != nil {
		t.Fatal(err)
	}
	s := projections.New()
	for _, ev := range w.Events {
		s.Apply(ev)
	}
	if err := s.CheckInvariants(); err != nil {
		t.Fatal(err)
	}
	c := s.Counters
	if c.Applied != uint64(len(w.Events)) {
		t.Fatalf("workload does not apply cleanly: %+v\n%v", c, s.Anomalies)
	}
	if len(s.Workers) < 1000 || len(s.Shards) != 200 {
		t.Fatalf("workload too small: %d workers, %d shards", len(s.Workers), len(s.Shards))
	}
}

func reportEventsPerSecond(b *testing.B) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkApply folds pre-decoded events; a fresh state every 100k events.
func BenchmarkApply(b *testing.B) {
	w := benchStream(b)
	b.ReportAllocs()
	b.ResetTimer()
	s := projections.New()
	for i := range b.N {
		j := i % len(w.Events)
		if j == 0 && i > 0 {
			s = projections.New()
		}
		s.Apply(w.Events[j])
	}
	reportEventsPerSecond(b)
}

// BenchmarkDecodeApply folds the same events from their stored bodies.
func BenchmarkDecodeApply(b *testing.B) {
	w := benchStream(b)
	b.ReportAllocs()
	b.ResetTimer()
	s := projections.New()
	for i := range b.N {
		j := i % len(w.Bodies)
		if j == 0 && i > 0 {
			s = projections.New()
		}
		s.DecodeApply(uint64(j+1), w.Bodies[j])
	}
	reportEventsPerSecond(b)
}

// BenchmarkDecode is events.Decode alone on the same bodies.
func BenchmarkDecode(b *testing.B) {
	w := benchStream(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		j := i % len(w.Bodies)
		if _, err := events.Decode(uint64(j+1), w.Bodies[j]); err != nil {
			b.Fatal(err)
		}
	}
	reportEventsPerSecond(b)
}

// BenchmarkJSONUnmarshal is the floor: encoding/json into events.Envelope,
// which leaves the data undecoded.
func BenchmarkJSONUnmarshal(b *testing.B) {
	w := benchStream(b)
	b.ReportAllocs()
	b.ResetTimer()
	for i := range b.N {
		var env events.Envelope
		if err := json.Unmarshal(w.Bodies[i%len(w.Bodies)], &env); err != nil {
			b.Fatal(err)
		}
	}
	reportEventsPerSecond(b)
}
