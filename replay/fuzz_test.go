package replay_test

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/replay"
)

// FuzzJSONL: no bytes given as a JSONL file make replay, export or import
// panic, in any mode.
func FuzzJSONL(f *testing.F) {
	for _, name := range []string{"handoff.jsonl", "shards.jsonl", "corrupt.jsonl"} {
		b, err := os.ReadFile(filepath.Join("testdata", "logs", name))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("\n\n{}\n[]\nnull\n{\"seq\":1,\"raw\":\"x\"}\n{\"seq\":2,\"raw_base64\":\"!!\"}\n"))
	f.Add([]byte(`{"seq":1,"v":1,"term":1,"type":"shard.created","data":{"shard":1,"replicas":{"1":"s1"}}}`))
	ctx := context.Background()
	f.Fuzz(func(t *testing.T, data []byte) {
		subjects := []replay.Subject{}
		for _, s := range []string{"worker:1", "store:s1", "shard:1", "endpoint:a:1"} {
			sub, err := replay.ParseSubject(s)
			if err != nil {
				t.Fatal(err)
			}
			subjects = append(subjects, sub)
		}
		opts := []replay.Options{
			{}, {JSON: true}, {Mode: replay.ModeState}, {Mode: replay.ModeRejected}, {Mode: replay.ModeCheck},
			{Mode: replay.ModeDiff, DiffFrom: 1, DiffTo: 3}, {Mode: replay.ModeState, UntilSeq: 2, JSON: true},
			{Filter: replay.Filter{Worker: 1, Type: "worker."}},
		}
		for _, s := range subjects {
			opts = append(opts, replay.Options{Mode: replay.ModeHistory, Subject: s})
		}
		for _, o := range opts {
			for _, skip := range []bool{false, true} {
				o.SkipCorrupt = skip
				var out, diag bytes.Buffer
				o.Diag = &diag
				_ = replay.Run(ctx, replay.JSONL(bytes.NewReader(data)), o, &out)
			}
		}
		var exp bytes.Buffer
		_, _ = replay.Export(ctx, replay.JSONL(bytes.NewReader(data)), &exp, replay.TransferOptions{})
		mem := events.NewMemLog()
		defer mem.Close()
		if _, err := replay.Import(ctx, bytes.NewReader(data), rawMemLog{mem}, replay.TransferOptions{}); err == nil {
			// What was imported exports to what was read.
			var again bytes.Buffer
			if _, err := replay.Export(ctx, replay.Stream(mem), &again, replay.TransferOptions{}); err != nil {
				t.Fatalf("export of an import: %v", err)
			}
			if !bytes.Equal(again.Bytes(), exp.Bytes()) {
				t.Fatalf("export of the import differs from the export of the file:\n%s\n---\n%s", again.Bytes(), exp.Bytes())
			}
		}
	})
}
