package natslog

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestServerWatchShouldMove(t *testing.T) {
	w := ServerWatch{Every: 2 * time.Second, After: 10 * time.Second}
	t0 := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		since     time.Duration
		connected bool
		servers   int
		want      bool
	}{
		{10 * time.Second, true, 3, true},
		{9 * time.Second, true, 3, false},  // an election's silence moves no one
		{30 * time.Second, true, 1, false}, // nowhere else to go
		{30 * time.Second, false, 3, false},
	} {
		if got := w.ShouldMove(t0, t0.Add(tc.since), tc.connected, tc.servers); got != tc.want {
			t.Errorf("silent %v, connected %v, %d servers: move %v, want %v", tc.since, tc.connected, tc.servers, got, tc.want)
		}
	}
}

func TestServerWatchAnswered(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want bool
	}{
		{nil, true},
		{&jetstream.APIError{Code: 404, ErrorCode: 10059}, true}, // any answer: JetStream is there
		{&jetstream.APIError{Code: 503, ErrorCode: 10008}, false},
		{fmt.Errorf("x: %w", context.DeadlineExceeded), false},
		{nats.ErrTimeout, false},
		{nats.ErrNoResponders, false},
		{jetstream.ErrJetStreamNotEnabled, false},
	} {
		if got := answered(tc.err); got != tc.want {
			t.Errorf("answered(%v) = %v, want %v", tc.err, got, tc.want)
		}
	}
}
