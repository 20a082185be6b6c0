package bench

import (
	"bytes"
	"encoding/json"
	"math"
	"reflect"
	"testing"
)

// A report with figures not measured (NaN: a percentile of no samples, a
// ratio to nothing) is still written as JSON (the 100,000-worker R3 point
// failed the whole --json output so); every float field of a scale point
// is covered, those added later too, and the report itself is unchanged.
func TestWriteJSONWithFiguresNotMeasured(t *testing.T) {
	var p ScalePoint
	v := reflect.ValueOf(&p).Elem()
	for i := range v.NumField() {
		if v.Field(i).Kind() == reflect.Float64 {
			v.Field(i).SetFloat(math.NaN())
		}
	}
	rep := &Report{Scale: []ScalePoint{p}, Figures: []Figure{{Name: "x", Value: math.NaN(), Baseline: math.Inf(1), Ratio: math.NaN(), Extra: map[string]float64{"y": math.NaN()}}}}
	var b bytes.Buffer
	if err := rep.WriteJSON(&b); err != nil {
		t.Fatalf("WriteJSON: %v", err)
	}
	var back Report
	if err := json.Unmarshal(b.Bytes(), &back); err != nil {
		t.Fatal(err)
	}
	if back.Scale[0].HeartbeatP99 != 0 || back.Figures[0].Value != 0 {
		t.Fatalf("not measured written as %v, %v; want 0", back.Scale[0].HeartbeatP99, back.Figures[0].Value)
	}
	if !math.IsNaN(rep.Scale[0].HeartbeatP99) || !math.IsNaN(rep.Figures[0].Extra["y"]) {
		t.Fatal("WriteJSON changed the report it wrote")
	}
}
