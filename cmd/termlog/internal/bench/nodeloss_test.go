package bench

import (
	"strings"
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

// doneWhen judges each loss by the Done-when lines, with the
// numbers that decided it.
func TestNodeLossDoneWhen(t *testing.T) {
	s := func(raw, app, status time.Duration, changed bool, failed int) nlSample {
		return nlSample{raw: raw, appends: app, status: status, statusSteady: 300 * time.Millisecond, termChanged: changed, statusFailed: failed}
	}
	verdicts := func(cs []nlClause) (out []string) {
		for _, c := range cs {
			v := "MET"
			if !c.met {
				v = "MISSED"
			}
			out = append(out, c.what+": "+v+" ("+c.numbers+")")
		}
		return out
	}
	for _, tc := range []struct {
		target   string
		graceful bool
		ss       []nlSample
		want     []string
	}{
		{"stream", true, []nlSample{s(100*time.Millisecond, 400*time.Millisecond, time.Second, false, 0), s(0, 1200*time.Millisecond, 800*time.Millisecond, false, 0)},
			[]string{"no term change: MET (changed in 0 of 2)", "append blackout <= 1 s: MISSED (longest 1.2s)",
				"status answers within 1 s throughout (item 4): MET (longest beyond a steady run 700ms, 0 runs exited 2)"}},
		{"lease", false, []nlSample{s(5*time.Second, 5500*time.Millisecond, 900*time.Millisecond, true, 0), s(4*time.Second, 6*time.Second, 1500*time.Millisecond, true, 0)},
			[]string{"termlog's append blackout <= raw + 1 s: MISSED (worst loss termlog 6s vs raw 4s, +2.00 s)",
				"status answers within 1 s throughout: MISSED (longest beyond a steady run 1.2s, 0 runs exited 2)"}},
		{"follower", false, []nlSample{s(50*time.Millisecond, 60*time.Millisecond, 400*time.Millisecond, false, 1)},
			[]string{"no term change: MET (changed in 0 of 1)", "status answers within 1 s throughout (item 4): MISSED (longest beyond a steady run 100ms, 1 runs exited 2)"}},
	} {
		got := verdicts(doneWhen(tc.target, tc.graceful, tc.ss))
		if strings.Join(got, "\n") != strings.Join(tc.want, "\n") {
			t.Errorf("%s graceful=%v:\n got %q\nwant %q", tc.target, tc.graceful, got, tc.want)
		}
	}
}
