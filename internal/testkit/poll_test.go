package testkit

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

func TestPollReturnsOnceCondHolds(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), time.Minute, time.Millisecond, func() error {
		if calls++; calls < 3 {
			return fmt.Errorf("call %d", calls)
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("Poll: %v after %d calls, want nil after 3", err, calls)
	}
}

func TestPollReturnsTheLastError(t *testing.T) {
	calls := 0
	err := Poll(context.Background(), 20*time.Millisecond, time.Millisecond, func() error {
		calls++
		return fmt.Errorf("call %d", calls)
	})
	if err == nil || err.Error() != fmt.Sprintf("call %d", calls) || calls < 2 {
		t.Fatalf("Poll: %v after %d calls, want the last call's error", err, calls)
	}
}

func TestPollStopsWithCtx(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	errWait := errors.New("waiting")
	calls := 0
	err := Poll(ctx, time.Hour, time.Hour, func() error { // the hour's pause must end with ctx
		calls++
		return errWait
	})
	if !errors.Is(err, errWait) || calls != 1 {
		t.Fatalf("Poll: %v after %d calls, want the cond's error after 1", err, calls)
	}
}

// fatalRecorder is a testing.TB whose Fatalf records instead of failing.
type fatalRecorder struct {
	testing.TB
	msg string
}

func (r *fatalRecorder) Helper() {}
func (r *fatalRecorder) Fatalf(format string, args ...any) {
	r.msg = fmt.Sprintf(format, args...)
}

func TestEventuallyErrNamesTheLastError(t *testing.T) {
	r := &fatalRecorder{TB: t}
	EventuallyErr(r, 10*time.Millisecond, "the door", func() error { return errors.New("still shut") })
	if want := "timed out after 10ms waiting for the door: still shut"; r.msg != want {
		t.Fatalf("message %q, want %q", r.msg, want)
	}
	r = &fatalRecorder{TB: t}
	Eventually(r, 10*time.Millisecond, "the door", func() bool { return false })
	if want := "timed out after 10ms waiting for the door"; r.msg != want {
		t.Fatalf("message %q, want %q", r.msg, want)
	}
	r = &fatalRecorder{TB: t}
	Eventually(r, time.Minute, "the door", func() bool { return true })
	if strings.TrimSpace(r.msg) != "" {
		t.Fatalf("failed although the condition held: %q", r.msg)
	}
}
