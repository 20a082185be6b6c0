package meta

import (
	"context"
	"sync"
	"time"

	"github.com/termlog/termlog/internal/clock"
)

// MemLeaseStore is an in-memory lease with the KV lease's semantics (a
// revision that strictly increases, a TTL measured on the given clock). It
// is for leader-logic unit tests; each replica takes its own handle.
type MemLeaseStore struct {
	clock clock.Clock
	ttl   time.Duration

	mu      sync.Mutex
	holder  string
	rev     uint64
	expires time.Time
}

// NewMemLeaseStore returns a free lease.
func NewMemLeaseStore(clk clock.Clock, ttl time.Duration) *MemLeaseStore {
	return &MemLeaseStore{clock: clk, ttl: ttl}
}

// Handle returns one replica's view of the lease.
func (s *MemLeaseStore) Handle() Lease { return &memLease{s: s} }

type memLease struct {
	s   *MemLeaseStore
	rev uint64
}

func (l *memLease) Acquire(_ context.Context, holder string) (uint64, error) {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if s.holder != "" && now.Before(s.expires) {
		return 0, ErrLeaseHeld
	}
	s.rev++
	s.holder, s.expires = holder, now.Add(s.ttl)
	l.rev = s.rev
	return s.rev, nil
}

func (l *memLease) Renew(context.Context) error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.clock.Now()
	if l.rev == 0 || l.rev != s.rev || !now.Before(s.expires) {
		l.rev = 0
		return ErrLeaseLost
	}
	s.rev++
	l.rev = s.rev
	s.expires = now.Add(s.ttl)
	return nil
}

func (l *memLease) Release(context.Context) error {
	s := l.s
	s.mu.Lock()
	defer s.mu.Unlock()
	if l.rev != 0 && l.rev == s.rev {
		s.holder = ""
	}
	l.rev = 0
	return nil
}
