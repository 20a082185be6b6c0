package bench

import (
	"math"
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
	// What failed inside the longest gap, each error once, relative to t0.
	o.fails = []opFail{{at(150), "before the gap"}, {at(700), "no responders"}, {at(1200), "no responders"}, {at(2700), "timeout"}}
	if w := o.gapWhy(at(50), at(3400), at(100)); w != "+100ms..+3100ms (+600ms no responders; +2600ms timeout)" {
		t.Fatalf("gapWhy %q", w)
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
		{"lease", false, []nlSample{s(5*time.Second, 5500*time.Millisecond, 900*time.Millisecond, true, 0),
			elected(s(4*time.Second, 6*time.Second, 1500*time.Millisecond, true, 0), 6100*time.Millisecond, 8300*time.Millisecond, 4400*time.Millisecond, "lease")},
			[]string{"termlog's append blackout <= raw + 1 s: MISSED (worst loss termlog 6s vs raw 4s, +2.00 s; stream elected 6.1s, lease >8.3s (unseen), raw 4.4s)",
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

func elected(s nlSample, stream, lease, raw time.Duration, unseen ...string) nlSample {
	s.elStream, s.elLease, s.elRaw, s.elUnseen = stream, lease, raw, unseen
	return s
}

// termlog_own: per loss, the append blackout beyond the later of the event
// stream's and the lease bucket's elections (the raw stream's not
// counting); the figure is the worst loss, judged against 1 s.
func TestNodeLossOwn(t *testing.T) {
	ms := func(n int) time.Duration { return time.Duration(n) * time.Millisecond }
	s := func(app, stream, lease, raw time.Duration) nlSample {
		return elected(nlSample{appends: app, raw: raw}, stream, lease, raw)
	}
	for _, tc := range []struct {
		ss            []nlSample
		value, median float64
		met           bool
	}{
		// The lease elected last: 8.5 - 8.3; the stream last: 7.9 - 6.0.
		{[]nlSample{s(ms(8500), ms(6100), ms(8300), ms(4400)), s(ms(7900), ms(6000), ms(5000), ms(9000)), s(ms(5000), ms(4800), ms(4900), ms(4000))}, 1.9, 0.2, false},
		{[]nlSample{s(ms(8500), ms(6100), ms(8300), ms(4400)), s(ms(6900), ms(6000), ms(5000), ms(1000))}, 0.9, 0.9, true},
	} {
		f := nlOwnFigure("nodeloss.kill_lease_leader", "SIGKILL", "the node leading the lease bucket", tc.ss)
		f.finish()
		if f.Name != "nodeloss.kill_lease_leader.termlog_own" || math.Abs(f.Value-tc.value) > 1e-9 || math.Abs(f.Extra["own_median_s"]-tc.median) > 1e-9 || f.Met == nil || *f.Met != tc.met {
			t.Errorf("%s = %v (median %v, met %v), want %v (median %v, met %v): %s", f.Name, f.Value, f.Extra["own_median_s"], f.Met != nil && *f.Met, tc.value, tc.median, tc.met, f.What)
		}
	}
}
