package replay_test

import (
	"bytes"
	"context"
	"io"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/events/eventgen"
	"github.com/termlog/termlog/replay"
)

// BenchmarkCheck runs replay --check (invariants after every event) over a
// generated log of 20k events (200 shards, 12 stores, up to 500 workers).
func BenchmarkCheck(b *testing.B) {
	mix, err := eventgen.Mix(20000, 500)
	if err != nil {
		b.Fatal(err)
	}
	var in bytes.Buffer
	for i, ev := range mix.Events {
		ev.Seq = uint64(i + 1)
		if err := events.WriteJSONL(&in, ev); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportAllocs()
	for b.Loop() {
		if err := replay.Run(context.Background(), replay.JSONL(bytes.NewReader(in.Bytes())), replay.Options{Mode: replay.ModeCheck}, io.Discard); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(len(mix.Events))*float64(b.N)/b.Elapsed().Seconds(), "events/s")
}
