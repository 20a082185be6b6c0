package logstore

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/internal/testkit"
	"github.com/termlog/termlog/meta/client"
	"github.com/termlog/termlog/view"
)

// laggingLog is a log whose readers lag: Watch hands on records up to the
// gate only, and the gate opens to the tail when someone asks for the tail
// (as a slow reader catches up when it is made to).
type laggingLog struct {
	*events.MemLog
	mu   sync.Mutex
	gate uint64
	open chan struct{} // closed when the gate moves
}

func (l *laggingLog) Tail(ctx context.Context) (uint64, error) {
	tail, err := l.MemLog.Tail(ctx)
	if err == nil {
		l.mu.Lock()
		if tail > l.gate {
			l.gate = tail
			close(l.open)
			l.open = make(chan struct{})
		}
		l.mu.Unlock()
	}
	return tail, err
}

func (l *laggingLog) Watch(ctx context.Context, from uint64, fn func(events.Record) error) error {
	return l.MemLog.Watch(ctx, from, func(rec events.Record) error {
		for {
			l.mu.Lock()
			gate, open := l.gate, l.open
			l.mu.Unlock()
			if rec.Seq <= gate {
				return fn(rec)
			}
			select {
			case <-ctx.Done():
				return ctx.Err()
			case <-open:
			}
		}
	})
}

// TestStoreFenceCatchesUpWithTheStream: a store whose projection lags the
// stream (it has folded term 1's intent, not term 2's term.started) gets the
// deposed leader's step. The fence brings the projection to the stream's
// tail first and refuses it; judged on the lagging view it would run
// (CheckExec finds the intent pending under a term it thinks current).
func TestStoreFenceCatchesUpWithTheStream(t *testing.T) {
	mem := events.NewMemLog()
	ctx := context.Background()
	app := func(term uint64, writer string, ps ...events.Payload) uint64 {
		t.Helper()
		tail, _ := mem.Tail(ctx)
		var evs []events.Event
		for _, p := range ps {
			evs = append(evs, events.Event{Term: term, Writer: writer, At: time.Unix(0, 0), Data: p})
		}
		seq, err := mem.Append(ctx, tail, evs...)
		if err != nil {
			t.Fatal(err)
		}
		return seq
	}
	app(1, "meta-1", append([]events.Payload{events.TermStarted{Term: 1, Leader: "meta-1"}}, with(created(),
		events.OperatorStarted{Op: "op-1-6", Shard: 1, Remove: 3})...)...)
	intent := app(1, "meta-1", events.ShardReplicaRemoving{Shard: 1, Replica: 3, Store: "s3", CCID: 3, Op: "op-1-6"})
	log := &laggingLog{MemLog: mem, gate: intent, open: make(chan struct{})}
	app(2, "meta-2", events.TermStarted{Term: 2, Leader: "meta-2"})

	proj := view.NewProjector(log, testkit.Logger(t), nil)
	pctx, cancel := context.WithCancel(ctx)
	done := make(chan struct{})
	go func() { defer close(done); _ = proj.Run(pctx) }()
	defer func() { cancel(); <-done }()
	if _, err := proj.WaitSeq(ctxTimeout(t, 5*time.Second), intent); err != nil {
		t.Fatal(err)
	}
	if v := proj.View(); v.Term != 1 {
		t.Fatalf("the store's projection should lag at term 1: at seq %d term %d", v.Seq, v.Term)
	}

	s := &Store{proj: proj}
	req := client.ExecRequest{Op: client.ExecRemove, Shard: 1, Replica: 3, CCID: 3, Term: 1, Operator: "op-1-6", Intent: intent}
	verdict, why := s.fence(ctxTimeout(t, 10*time.Second), req)
	if verdict != client.ExecRefuse || !strings.Contains(why, "term 1 is over") {
		t.Fatalf("the deposed leader's step on a lagging store: %v (%s), want refused: term 1 is over", verdict, why)
	}
}
