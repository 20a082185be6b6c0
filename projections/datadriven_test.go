package projections_test

import (
	"testing"

	"github.com/termlog/termlog/projections/projtest"
	"github.com/termlog/termlog/projections/projtest/script"
)

// base is the time of seq 0 in scripts; event seq n happens at base+n seconds.
var base = script.Base()

// TestData runs the scripts at the top of testdata/ with the public test kit
// (package projtest documents the commands and the event lines); its
// sub-directories hold the fuzz corpus and rapid's fail files. Rewrite the
// expected outputs with
//
//	go test ./projections -run TestData -rewrite
//
// and read every changed line.
func TestData(t *testing.T) { projtest.RunDir(t, "testdata") }
