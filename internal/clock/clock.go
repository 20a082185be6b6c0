// Package clock is the time source passed into termlog components, with a
// manual clock for tests. Nothing in termlog reads time.Now directly outside
// of Real.
package clock

import (
	"context"
	"sort"
	"sync"
	"time"
)

// Clock tells the time and waits.
type Clock interface {
	Now() time.Time
	// After is like time.After.
	After(d time.Duration) <-chan time.Time
}

// Real is the wall clock.
type Real struct{}

// Now implements Clock.
func (Real) Now() time.Time { return time.Now() }

// After implements Clock.
func (Real) After(d time.Duration) <-chan time.Time {
	// time.After is collected once it fires or becomes unreachable (Go 1.23+).
	return time.After(d)
}

// Sleep waits d on c, or until ctx is done; it reports whether d passed.
func Sleep(ctx context.Context, c Clock, d time.Duration) bool {
	select {
	case <-ctx.Done():
		return false
	case <-c.After(d):
		return true
	}
}

// Manual is a clock that moves only when told. The zero value starts at the
// zero time; use NewManual for a readable start.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	waiters []waiter
}

type waiter struct {
	at time.Time
	ch chan time.Time
}

// NewManual returns a manual clock set to t.
func NewManual(t time.Time) *Manual { return &Manual{now: t} }

// Now implements Clock.
func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

// After implements Clock.
func (m *Manual) After(d time.Duration) <-chan time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	ch := make(chan time.Time, 1)
	at := m.now.Add(d)
	if d <= 0 {
		ch <- m.now
		return ch
	}
	m.waiters = append(m.waiters, waiter{at: at, ch: ch})
	return ch
}

// Waiters is the number of pending After calls (tests poll it to know that a
// component is waiting on the clock).
func (m *Manual) Waiters() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.waiters)
}

// Advance moves the clock forward and fires every timer that is due.
func (m *Manual) Advance(d time.Duration) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.now = m.now.Add(d)
	sort.Slice(m.waiters, func(i, j int) bool { return m.waiters[i].at.Before(m.waiters[j].at) })
	kept := m.waiters[:0]
	for _, w := range m.waiters {
		if !w.at.After(m.now) {
			w.ch <- m.now
			continue
		}
		kept = append(kept, w)
	}
	m.waiters = kept
}
