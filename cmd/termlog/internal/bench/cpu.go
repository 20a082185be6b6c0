package bench

import (
	"bytes"
	"compress/gzip"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"runtime/pprof"
	"time"
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

// cpuByLabel sums the CPU time of a pprof CPU profile by the value of one
// label. It reads the profile.proto wire format directly (sample_type,
// sample, string_table), which is all it needs.
func cpuByLabel(gz []byte, key string) (map[string]time.Duration, error) {
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		return nil, err
	}
	raw, err := io.ReadAll(zr)
	if err != nil {
		return nil, err
	}
	type label struct{ key, str int64 }
	type sample struct {
		values []int64
		labels []label
	}
	var (
		types   []int64 // string index of each sample type's name
		samples []sample
		strs    []string
	)
	err = fields(raw, func(num int, wire int, v uint64, b []byte) error {
		switch num {
		case 1: // sample_type: ValueType{type=1, unit=2}
			var typ int64
			if err := fields(b, func(n, _ int, v uint64, _ []byte) error {
				if n == 1 {
					typ = int64(v)
				}
				return nil
			}); err != nil {
				return err
			}
			types = append(types, typ)
		case 2: // sample: location_id=1, value=2, label=3
			var s sample
			if err := fields(b, func(n, w int, v uint64, b []byte) error {
				switch n {
				case 2:
					if w == 2 {
						return packed(b, func(x uint64) { s.values = append(s.values, int64(x)) })
					}
					s.values = append(s.values, int64(v))
				case 3:
					var l label
					if err := fields(b, func(n, _ int, v uint64, _ []byte) error {
						switch n {
						case 1:
							l.key = int64(v)
						case 2:
							l.str = int64(v)
						}
						return nil
					}); err != nil {
						return err
					}
					s.labels = append(s.labels, l)
				}
				return nil
			}); err != nil {
				return err
			}
			samples = append(samples, s)
		case 6: // string_table
			strs = append(strs, string(b))
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("cpu profile: %w", err)
	}
	str := func(i int64) string {
		if i < 0 || int(i) >= len(strs) {
			return ""
		}
		return strs[i]
	}
	idx := len(types) - 1
	for i, t := range types {
		if str(t) == "cpu" {
			idx = i
		}
	}
	if idx < 0 {
		return nil, errors.New("cpu profile: no sample types")
	}
	out := map[string]time.Duration{}
	for _, s := range samples {
		if idx >= len(s.values) {
			continue
		}
		who := ""
		for _, l := range s.labels {
			if str(l.key) == key {
				who = str(l.str)
			}
		}
		out[who] += time.Duration(s.values[idx])
	}
	return out, nil
}

// fields calls fn for every field of a protobuf message: v for varints and
// fixed-size values, b for length-delimited ones.
func fields(b []byte, fn func(num, wire int, v uint64, b []byte) error) error {
	for len(b) > 0 {
		tag, n := uvarint(b)
		if n <= 0 {
			return errors.New("bad tag")
		}
		b = b[n:]
		num, wire := int(tag>>3), int(tag&7)
		var v uint64
		var sub []byte
		switch wire {
		case 0:
			v, n = uvarint(b)
			if n <= 0 {
				return errors.New("bad varint")
			}
			b = b[n:]
		case 1:
			if len(b) < 8 {
				return errors.New("short fixed64")
			}
			b = b[8:]
		case 2:
			l, n := uvarint(b)
			if n <= 0 || uint64(len(b)-n) < l {
				return errors.New("bad length")
			}
			sub = b[n : n+int(l)]
			b = b[n+int(l):]
		case 5:
			if len(b) < 4 {
				return errors.New("short fixed32")
			}
			b = b[4:]
		default:
			return fmt.Errorf("wire type %d", wire)
		}
		if err := fn(num, wire, v, sub); err != nil {
			return err
		}
	}
	return nil
}

func packed(b []byte, fn func(uint64)) error {
	for len(b) > 0 {
		v, n := uvarint(b)
		if n <= 0 {
			return errors.New("bad packed varint")
		}
		fn(v)
		b = b[n:]
	}
	return nil
}

func uvarint(b []byte) (uint64, int) { return binary.Uvarint(b) }
