package replay

import (
	"fmt"
	"io"
	"time"
)

// Progress of long runs: once more than progressEvents entries were read or
// progressAfter passed, a line every progressEvery.
const (
	progressEvents = 100_000
	progressAfter  = 2 * time.Second
	progressEvery  = time.Second
)

// progress reports how far a long run got. A nil *progress reports nothing.
type progress struct {
	w     io.Writer
	now   func() time.Time
	what  string
	start time.Time
	last  time.Time
	shown bool
}

func newProgress(w io.Writer, now func() time.Time, what string) *progress {
	if w == nil || w == io.Discard {
		return nil
	}
	if now == nil {
		now = time.Now
	}
	t := now()
	return &progress{w: w, now: now, what: what, start: t, last: t}
}

func (p *progress) tick(n, seq uint64) {
	if p == nil {
		return
	}
	t := p.now()
	if t.Sub(p.last) < progressEvery || n <= progressEvents && t.Sub(p.start) <= progressAfter {
		return
	}
	p.last, p.shown = t, true
	el := t.Sub(p.start)
	fmt.Fprintf(p.w, "%s: %d events, at seq %d, %s, %.0f events/s\n", p.what, n, seq, el.Round(time.Millisecond), float64(n)/el.Seconds())
}

func (p *progress) done(n, seq uint64) {
	if p == nil || !p.shown {
		return
	}
	fmt.Fprintf(p.w, "%s: done, %d events up to seq %d in %s\n", p.what, n, seq, p.now().Sub(p.start).Round(time.Millisecond))
}
