package bench

import (
	"testing"
	"time"
)

// The nodeloss blackouts: the longest gap between successes within the
// window, its edges included; status's wait counts from the first failed
// run of a streak to the next answer.
func TestNodeLossWindows(t *testing.T) {
	at := func(ms int) time.Time { return time.Unix(0, 0).Add(time.Duration(ms) * time.Millisecond) }
	var o opLog
	for _, ms := range []int{0, 100, 200, 3200, 3300} {
		o.ok(at(ms))
	}
	if g := o.gap(at(50), at(3400)); g != 3*time.Second {
		t.Fatalf("gap %s, want 3s (200ms -> 3.2s)", g)
	}
	if g := o.gap(at(3250), at(5000)); g != 1700*time.Millisecond {
		t.Fatalf("gap %s, want 1.7s (the last success to the window's end)", g)
	}
	var s statusLog
	s.add(statusRun{start: at(0), end: at(500), code: 0})
	s.add(statusRun{start: at(600), end: at(5600), code: 2, msg: "did not answer"})
	s.add(statusRun{start: at(5700), end: at(6400), code: 1})
	s.add(statusRun{start: at(6500), end: at(7000), code: 0})
	w, failed, msg := s.wait(at(550), at(8000))
	if w != 5800*time.Millisecond || failed != 1 || msg != "did not answer" {
		t.Fatalf("wait %s, %d failed (%q): want 5.8s (600ms -> 6.4s), 1", w, failed, msg)
	}
	if w, _, _ := s.wait(at(6450), at(8000)); w != 500*time.Millisecond {
		t.Fatalf("wait %s after the election, want 500ms (a run's own time)", w)
	}
	if m := s.median(at(0), at(8000)); m != 500*time.Millisecond {
		t.Fatalf("median %s, want 500ms", m)
	}
}
