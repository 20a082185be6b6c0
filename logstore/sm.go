package logstore

import (
	"bufio"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"strconv"
	"strings"
	"sync"
	"time"

	sm "github.com/lni/dragonboat/v4/statemachine"
)

// Queries understood by the log state machine's Lookup (and so by Read).
// The strings "count" and "get N" are accepted too.
type (
	// CountQuery asks for the number of entries; the answer is a uint64.
	CountQuery struct{}
	// GetQuery asks for the entry at a 1-based index; the answer is a []byte.
	GetQuery struct{ Index uint64 }
	// appliedQuery asks for the Raft index of the last entry applied since
	// the replica started (0: none since; see Host.Applied).
	appliedQuery struct{}
)

// ErrNoEntry is returned by a GetQuery outside the log.
var ErrNoEntry = errors.New("logstore: no such entry")

// logSM is the replicated state of one shard: an append-only list of
// entries. Update appends and returns the entry's 1-based index.
type logSM struct {
	shard, replica uint64

	mu      sync.RWMutex
	entries [][]byte
	applied uint64 // Raft index of the last entry Update applied
}

var _ sm.IStateMachine = (*logSM)(nil)

func newLogSM(shard, replica uint64) sm.IStateMachine {
	return &logSM{shard: shard, replica: replica}
}

// Update implements sm.IStateMachine.
func (s *logSM) Update(e sm.Entry) (sm.Result, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.entries = append(s.entries, append([]byte(nil), e.Cmd...))
	s.applied = e.Index
	return sm.Result{Value: uint64(len(s.entries))}, nil
}

// Lookup implements sm.IStateMachine.
func (s *logSM) Lookup(q any) (any, error) {
	if _, ok := q.(appliedQuery); ok {
		s.mu.RLock()
		defer s.mu.RUnlock()
		return s.applied, nil
	}
	q, err := parseQuery(q)
	if err != nil {
		return nil, err
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	switch q := q.(type) {
	case CountQuery:
		return uint64(len(s.entries)), nil
	case GetQuery:
		if q.Index == 0 || q.Index > uint64(len(s.entries)) {
			return nil, fmt.Errorf("%w: index %d of %d", ErrNoEntry, q.Index, len(s.entries))
		}
		return append([]byte(nil), s.entries[q.Index-1]...), nil
	}
	return nil, fmt.Errorf("logstore: unknown query %T", q)
}

func parseQuery(q any) (any, error) {
	switch v := q.(type) {
	case CountQuery, GetQuery:
		return v, nil
	case *GetQuery:
		return *v, nil
	case string:
		f := strings.Fields(v)
		switch {
		case len(f) == 1 && f[0] == "count":
			return CountQuery{}, nil
		case len(f) == 2 && f[0] == "get":
			n, err := strconv.ParseUint(f[1], 10, 64)
			if err != nil {
				return nil, fmt.Errorf("logstore: query %q: %w", v, err)
			}
			return GetQuery{Index: n}, nil
		}
		return nil, fmt.Errorf("logstore: unknown query %q (want \"count\" or \"get N\")", v)
	}
	return nil, fmt.Errorf("logstore: unknown query %T", q)
}

// SaveSnapshot implements sm.IStateMachine: a count then length-prefixed
// entries, all big-endian uint64.
func (s *logSM) SaveSnapshot(w io.Writer, _ sm.ISnapshotFileCollection, done <-chan struct{}) error {
	s.mu.RLock()
	defer s.mu.RUnlock()
	bw := bufio.NewWriter(w)
	var hdr [8]byte
	binary.BigEndian.PutUint64(hdr[:], uint64(len(s.entries)))
	if _, err := bw.Write(hdr[:]); err != nil {
		return err
	}
	for i, e := range s.entries {
		if i%1024 == 0 {
			select {
			case <-done:
				return sm.ErrSnapshotStopped
			default:
			}
		}
		binary.BigEndian.PutUint64(hdr[:], uint64(len(e)))
		if _, err := bw.Write(hdr[:]); err != nil {
			return err
		}
		if _, err := bw.Write(e); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// maxEntrySize bounds an entry read from a snapshot (a corrupt length must
// not allocate the machine away).
const maxEntrySize = 64 << 20

// RecoverFromSnapshot implements sm.IStateMachine.
func (s *logSM) RecoverFromSnapshot(r io.Reader, _ []sm.SnapshotFile, done <-chan struct{}) error {
	br := bufio.NewReader(r)
	var hdr [8]byte
	if _, err := io.ReadFull(br, hdr[:]); err != nil {
		return fmt.Errorf("logstore: snapshot header: %w", err)
	}
	n := binary.BigEndian.Uint64(hdr[:])
	entries := make([][]byte, 0, min(n, 1<<16))
	for i := uint64(0); i < n; i++ {
		if i%1024 == 0 {
			select {
			case <-done:
				return sm.ErrSnapshotStopped
			default:
			}
		}
		if _, err := io.ReadFull(br, hdr[:]); err != nil {
			return fmt.Errorf("logstore: snapshot entry %d: %w", i+1, err)
		}
		l := binary.BigEndian.Uint64(hdr[:])
		if l > maxEntrySize {
			return fmt.Errorf("logstore: snapshot entry %d has length %d", i+1, l)
		}
		e := make([]byte, l)
		if _, err := io.ReadFull(br, e); err != nil {
			return fmt.Errorf("logstore: snapshot entry %d: %w", i+1, err)
		}
		entries = append(entries, e)
	}
	s.mu.Lock()
	s.entries = entries
	s.mu.Unlock()
	return nil
}

// Close implements sm.IStateMachine.
func (s *logSM) Close() error { return nil }

// defaultRequestTimeout bounds a request whose context has no deadline
// (dragonboat's Sync* calls require one).
const defaultRequestTimeout = 10 * time.Second

func withDeadline(ctx context.Context) (context.Context, context.CancelFunc) {
	if _, ok := ctx.Deadline(); ok {
		return context.WithCancel(ctx)
	}
	return context.WithTimeout(ctx, defaultRequestTimeout)
}

// Propose appends data to the shard's log through the local replica and
// returns its 1-based index. It uses a no-op session and does not retry: a
// proposal that timed out may still be appended, and retrying it may append
// it twice.
func (h *Host) Propose(ctx context.Context, shard uint64, data []byte) (uint64, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	nh, release := h.acquire()
	res, err := nh.SyncPropose(ctx, nh.GetNoOPSession(shard), data)
	release()
	if err != nil {
		return 0, fmt.Errorf("logstore: propose to shard %d: %w", shard, err)
	}
	return res.Value, nil
}

// Read runs a linearizable query (CountQuery, GetQuery, "count", "get N")
// on the shard through the local replica. Like Membership it retries
// attempts that find the shard not ready or that time out, until ctx ends
// (10s without a deadline).
func (h *Host) Read(ctx context.Context, shard uint64, query any) (any, error) {
	ctx, cancel := withDeadline(ctx)
	defer cancel()
	wait := 20 * time.Millisecond
	for {
		actx, acancel := context.WithTimeout(ctx, h.attemptTimeout())
		nh, release := h.acquire()
		v, err := nh.SyncRead(actx, shard, query)
		release()
		acancel()
		if err == nil {
			return v, nil
		}
		if (!retryable(err) && !outcomeUnknown(err)) || ctx.Err() != nil || !h.sleepCtx(ctx, &wait) {
			return nil, fmt.Errorf("logstore: read shard %d: %w", shard, err)
		}
	}
}
