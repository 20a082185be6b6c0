package meta

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
)

// TestCampaignWait pins when a follower tries for the lease again.
func TestCampaignWait(t *testing.T) {
	ttl := 3 * time.Second
	now := time.Date(2026, 12, 2, 6, 0, 0, 0, time.UTC)
	held := func(renewedAgo time.Duration) error {
		if renewedAgo < 0 {
			return &LeaseHeldError{}
		}
		return &LeaseHeldError{Holder: "meta-1", Renewed: now.Add(-renewedAgo)}
	}
	for _, c := range []struct {
		name       string
		renewedAgo time.Duration // -1: unknown
		err        error
		want       time.Duration
	}{
		{name: "just renewed: the slow cadence", renewedAgo: 0, want: 500 * time.Millisecond},
		{name: "renewed 1 s ago: still slow", renewedAgo: time.Second, want: 500 * time.Millisecond},
		{name: "lapses in 300 ms: try right then", renewedAgo: 2700 * time.Millisecond, want: 300 * time.Millisecond},
		{name: "lapses in 10 ms: not sooner than the fast pause", renewedAgo: 2990 * time.Millisecond, want: 50 * time.Millisecond},
		{name: "due: fast until the server drops it", renewedAgo: 3200 * time.Millisecond, want: 50 * time.Millisecond},
		{name: "renewal unknown: slow", renewedAgo: -1, want: 500 * time.Millisecond},
		{name: "no responders (bucket electing): fast", err: fmt.Errorf("acquire lease: %w", nats.ErrNoResponders), want: 50 * time.Millisecond},
		{name: "attempt timed out: fast", err: fmt.Errorf("acquire lease: %w", context.DeadlineExceeded), want: 50 * time.Millisecond},
		{name: "another failure: slow", err: errors.New("permissions violation"), want: 500 * time.Millisecond},
	} {
		t.Run(c.name, func(t *testing.T) {
			err := c.err
			if err == nil {
				err = held(c.renewedAgo)
			}
			if got := CampaignWait(ttl, err, now); got != c.want {
				t.Fatalf("CampaignWait(%v, renewed %v ago) = %v, want %v", err, c.renewedAgo, got, c.want)
			}
		})
	}
}
