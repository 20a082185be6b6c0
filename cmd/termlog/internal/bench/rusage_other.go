//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package bench

import "time"

// processCPU is not available on this platform.
func processCPU() (time.Duration, bool) { return 0, false }
