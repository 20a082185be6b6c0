// Package failpoint provides named hooks that tests (or an environment
// variable, for whole-process runs) can pause or make fail. A nil *Set is
// valid and does nothing, so production code calls Hit unconditionally.
package failpoint

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
)

// EnvVar names the environment variable read by FromEnv, for example
// TERMLOG_FAILPOINTS="expiry-after-collect=pause;before-term-started=error".
const EnvVar = "TERMLOG_FAILPOINTS"

// ErrInjected is returned by Hit on a failpoint set to "error".
var ErrInjected = errors.New("failpoint: injected error")

type point struct {
	mode    string        // "", "pause" or "error"
	release chan struct{} // closed by Resume
	waiting int           // goroutines paused here
	hits    int
}

// Set is a collection of failpoints, owned by one replica or test.
type Set struct {
	mu      sync.Mutex
	points  map[string]*point
	changed chan struct{}
}

// New returns an empty set.
func New() *Set { return &Set{points: map[string]*point{}, changed: make(chan struct{})} }

// Parse builds a set from "name=mode;name=mode" with mode pause or error.
func Parse(spec string) (*Set, error) {
	s := New()
	for _, part := range strings.Split(spec, ";") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, mode, ok := strings.Cut(part, "=")
		if !ok {
			return nil, fmt.Errorf("failpoint %q: want name=pause, name=freeze or name=error", part)
		}
		switch mode {
		case "pause":
			s.Pause(name)
		case "freeze":
			s.Freeze(name)
		case "error":
			s.Fail(name)
		default:
			return nil, fmt.Errorf("failpoint %q: unknown mode %q (pause, freeze, error)", name, mode)
		}
	}
	return s, nil
}

func (s *Set) get(name string) *point {
	p, ok := s.points[name]
	if !ok {
		p = &point{release: make(chan struct{})}
		s.points[name] = p
	}
	return p
}

func (s *Set) notifyLocked() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// Pause makes every later Hit(name) block until Resume(name).
func (s *Set) Pause(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.get(name)
	if p.mode != "pause" {
		p.mode = "pause"
		p.release = make(chan struct{})
	}
}

// Freeze makes every later Hit(name) block until Resume(name), ignoring
// cancellation: the goroutine behaves like a process stopped by a pause (GC,
// VM freeze) that then carries on with what it had decided.
func (s *Set) Freeze(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.get(name)
	if p.mode != "pause" && p.mode != "freeze" {
		p.release = make(chan struct{})
	}
	p.mode = "freeze"
}

// Fail makes every later Hit(name) return ErrInjected.
func (s *Set) Fail(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.get(name).mode = "error"
}

// Resume clears the failpoint and releases everything paused on it.
func (s *Set) Resume(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	p := s.get(name)
	if p.mode == "pause" || p.mode == "freeze" {
		close(p.release)
	}
	p.mode = ""
}

// Hits counts how often name was reached.
func (s *Set) Hits(name string) int {
	if s == nil {
		return 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.get(name).hits
}

// WaitPaused blocks until a goroutine is paused at name, or ctx is done.
func (s *Set) WaitPaused(ctx context.Context, name string) error {
	for {
		s.mu.Lock()
		n := s.get(name).waiting
		ch := s.changed
		s.mu.Unlock()
		if n > 0 {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for failpoint %s: %w", name, ctx.Err())
		case <-ch:
		}
	}
}

// Hit is called by code at the named point. It returns nil at once unless
// the point is paused (it blocks until Resume or ctx is done, returning
// ctx.Err() in the latter case) or set to fail (ErrInjected).
func (s *Set) Hit(ctx context.Context, name string) error {
	if s == nil {
		return nil
	}
	s.mu.Lock()
	p := s.get(name)
	p.hits++
	switch p.mode {
	case "error":
		s.notifyLocked()
		s.mu.Unlock()
		return fmt.Errorf("%s: %w", name, ErrInjected)
	case "pause", "freeze":
		p.waiting++
		release := p.release
		done := ctx.Done()
		if p.mode == "freeze" {
			done = nil
		}
		s.notifyLocked()
		s.mu.Unlock()
		var err error
		select {
		case <-release:
		case <-done:
			err = ctx.Err()
		}
		s.mu.Lock()
		p.waiting--
		s.notifyLocked()
		s.mu.Unlock()
		return err
	}
	s.notifyLocked()
	s.mu.Unlock()
	return nil
}
