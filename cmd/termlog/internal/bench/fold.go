package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"runtime"
	"sort"
	"time"

	"github.com/termlog/termlog/events"
	"github.com/termlog/termlog/projections"
)

// workloadEndpoints is the number of distinct worker endpoints in the
// workload: about 10,000 workers are active at any time.
const workloadEndpoints = 10_000

// Each fold measurement repeats its pass, interleaved with the others so
// that drift of the machine (other load, frequency) hits all alike, until
// it has run foldMin in total and at least foldPasses times, or foldLong in
// total (long passes: a million events), at most foldMax times; it reports
// the median pass.
const (
	foldMin    = time.Second
	foldLong   = 6 * time.Second
	foldPasses = 3
	foldMax    = 50
)

// rates runs the passes interleaved and returns each one's median rate in
// events per second.
func rates(ctx context.Context, n int, passes ...func() error) ([]float64, error) {
	runtime.GC()
	per := make([][]float64, len(passes))
	total := make([]time.Duration, len(passes))
	for round := 0; round < foldMax; round++ {
		more := false
		for i, pass := range passes {
			if round >= foldPasses && total[i] >= foldMin || total[i] >= foldLong {
				continue
			}
			if err := ctx.Err(); err != nil {
				return nil, err
			}
			more = true
			start := time.Now()
			if err := pass(); err != nil {
				return nil, err
			}
			d := time.Since(start)
			total[i] += d
			per[i] = append(per[i], float64(n)/d.Seconds())
		}
		if !more {
			break
		}
	}
	out := make([]float64, len(passes))
	for i, rs := range per {
		sort.Float64s(rs)
		out[i] = rs[len(rs)/2]
	}
	return out, nil
}

func (r *run) workload() (*workload, error) {
	if r.wl == nil {
		r.progress("generating a workload of %d events over %d endpoints", r.cfg.Events, workloadEndpoints)
		w, err := makeWorkload(r.cfg.Events, workloadEndpoints)
		if err != nil {
			return nil, err
		}
		r.wl = w
	}
	return r.wl, nil
}

func (r *run) fold(ctx context.Context) error {
	w, err := r.workload()
	if err != nil {
		return err
	}
	n := len(w.events)
	var applied, decoded *projections.State
	plain := func() error {
		for _, b := range w.bodies {
			// The floor of decoding: encoding/json into the envelope, the
			// data left undecoded (as in projections' BenchmarkJSONUnmarshal).
			var env events.Envelope
			if err := json.Unmarshal(b, &env); err != nil {
				return err
			}
		}
		return nil
	}
	apply := func() error {
		s := projections.New()
		for _, ev := range w.events {
			s.Apply(ev)
		}
		applied = s
		return nil
	}
	decodeApply := func() error {
		s := projections.New()
		for i, b := range w.bodies {
			s.DecodeApply(uint64(i+1), b)
		}
		decoded = s
		return nil
	}
	var rs []float64
	r.profile("fold", func() { rs, err = rates(ctx, n, plain, apply, decodeApply) })
	if err != nil {
		return err
	}
	if c := applied.Counters; c.Applied != uint64(n) {
		return fmt.Errorf("workload does not apply cleanly: %+v", c)
	}
	if c := decoded.Counters; c.Applied != uint64(n) {
		return fmt.Errorf("workload does not decode and apply cleanly: %+v", c)
	}
	last := decoded
	base := fmt.Sprintf("encoding/json into the envelope, data left raw, same %d bodies (avg %d B)", n, w.bytes/n)
	r.add(Figure{
		Name: "fold.apply", What: "projections.State.Apply of decoded events, fresh state per pass (median pass)",
		Unit: "events/s", Value: rs[1], Baseline: rs[0], BaselineWhat: base, Higher: true,
		Target: &Target{Of: "value", Op: ">=", Limit: 1_000_000, Text: ">= 1,000,000 events/s"},
	})
	r.add(Figure{
		Name: "fold.decode_apply", What: "projections.State.DecodeApply of the stored bodies (decode + fold)",
		Unit: "events/s", Value: rs[2], Baseline: rs[0], BaselineWhat: base, Higher: true,
		Target: &Target{Of: "ratio", Op: "<=", Limit: 1.5, Text: "<= 1.5x plain decoding"},
		Extra:  map[string]float64{"workers_at_end": float64(len(last.Workers))},
	})
	return nil
}
