package main

import (
	"testing"
)

// TestRegistryHasBuildInfoAndRuntime: every role's /metrics (and up's)
// carries termlog_build_info and the Go and process collectors next to the
// role's own metrics.
func TestRegistryHasBuildInfoAndRuntime(t *testing.T) {
	reg, err := registry()
	if err != nil {
		t.Fatal(err)
	}
	fams, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]bool{}
	for _, f := range fams {
		got[f.GetName()] = true
		if f.GetName() == "termlog_build_info" {
			m := f.GetMetric()[0]
			labels := map[string]string{}
			for _, l := range m.GetLabel() {
				labels[l.GetName()] = l.GetValue()
			}
			if m.GetGauge().GetValue() != 1 || labels["goversion"] == "" || labels["version"] == "" {
				t.Errorf("termlog_build_info %v = %v", labels, m.GetGauge().GetValue())
			}
		}
	}
	for _, want := range []string{"termlog_build_info", "go_goroutines", "go_memstats_alloc_bytes", "process_cpu_seconds_total", "process_resident_memory_bytes"} {
		if !got[want] {
			t.Errorf("no %s", want)
		}
	}
}
