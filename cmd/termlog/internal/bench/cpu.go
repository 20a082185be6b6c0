package bench

import (
	"bytes"
	"errors"
	"fmt"
	"runtime/pprof"
	"time"

	"github.com/google/pprof/profile"
)

// labelKey is the pprof label that names who a goroutine works for: a
// replica id, "workers", "responder". Goroutines inherit it from the one
// that started them, so a replica's NATS connection (opened inside
// pprof.Do) and everything its Run starts carry the replica's name; the
// embedded server's goroutines carry none.
const labelKey = "bench"

// cpuUsage is the CPU spent during one window.
type cpuUsage struct {
	wall    time.Duration
	process time.Duration            // getrusage user+system, all threads
	byLabel map[string]time.Duration // sampled CPU by labelKey value ("" unlabelled)
	sampled time.Duration            // sum of byLabel
	err     error                    // why byLabel is empty
	profile []byte                   // the CPU profile of the window
}

// share is d as a fraction of one core over the window.
func (u cpuUsage) share(d time.Duration) float64 { return d.Seconds() / u.wall.Seconds() }

// measureCPU profiles the process while wait runs.
func measureCPU(wait func()) cpuUsage {
	var buf bytes.Buffer
	perr := pprof.StartCPUProfile(&buf)
	p0, _ := processCPU()
	start := time.Now()
	wait()
	u := cpuUsage{wall: time.Since(start)}
	p1, ok := processCPU()
	if ok {
		u.process = p1 - p0
	}
	if perr != nil {
		u.err = fmt.Errorf("cpu profile: %w", perr)
		return u
	}
	pprof.StopCPUProfile()
	u.profile = buf.Bytes()
	u.byLabel, u.err = cpuByLabel(u.profile, labelKey)
	for _, d := range u.byLabel {
		u.sampled += d
	}
	return u
}

// cpuByLabel sums the CPU time of a pprof CPU profile (gzipped
// profile.proto, as runtime/pprof writes it) by the value of one label.
func cpuByLabel(gz []byte, key string) (map[string]time.Duration, error) {
	p, err := profile.Parse(bytes.NewReader(gz))
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	idx := len(p.SampleType) - 1
	for i, t := range p.SampleType {
		if t.Type == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, errors.New("cpu profile: no sample types")
	}
	out := map[string]time.Duration{}
	for _, s := range p.Sample {
		if idx >= len(s.Value) {
			continue
		}
		who := ""
		if vs := s.Label[key]; len(vs) > 0 {
			who = vs[0]
		}
		out[who] += time.Duration(s.Value[idx])
	}
	return out, nil
}
