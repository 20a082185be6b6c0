package bench

import (
	"context"
	"sync"

	"github.com/termlog/termlog/meta"
)

// termWatch collects the term phases of the bench's meta replicas, from
// their meta.Config.OnTerm hook: the times a failover is measured by.
type termWatch struct {
	mu      sync.Mutex
	evs     []meta.TermEvent
	changed chan struct{}
}

func newTermWatch() *termWatch { return &termWatch{changed: make(chan struct{})} }

// add is the replicas' OnTerm: it records and returns at once.
func (w *termWatch) add(e meta.TermEvent) {
	w.mu.Lock()
	w.evs = append(w.evs, e)
	close(w.changed)
	w.changed = make(chan struct{})
	w.mu.Unlock()
}

// wait returns the first event that matches, waiting for it until ctx ends.
func (w *termWatch) wait(ctx context.Context, match func(meta.TermEvent) bool) (meta.TermEvent, error) {
	for {
		w.mu.Lock()
		ch := w.changed
		for _, e := range w.evs {
			if match(e) {
				w.mu.Unlock()
				return e, nil
			}
		}
		w.mu.Unlock()
		select {
		case <-ctx.Done():
			return meta.TermEvent{}, ctx.Err()
		case <-ch:
		}
	}
}
