package clock

import (
	"context"
	"testing"
	"time"

	"github.com/termlog/termlog/internal/testkit"
)

// TestSleep: Sleep returns true once d passed on its clock, false as soon
// as ctx is done.
func TestSleep(t *testing.T) {
	m := NewManual(time.Date(2026, 12, 2, 3, 0, 0, 0, time.UTC))
	done := make(chan bool, 1)
	go func() { done <- Sleep(context.Background(), m, time.Second) }()
	testkit.Eventually(t, 10*time.Second, "the sleeper waiting on the clock", func() bool { return m.Waiters() > 0 })
	m.Advance(time.Second)
	if !<-done {
		t.Fatal("Sleep returned false after its duration passed")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, m, time.Hour) {
		t.Fatal("Sleep returned true with ctx done")
	}
}
