//go:build !(linux || darwin || freebsd || netbsd || openbsd || dragonfly)

package bench

import "time"

// processCPU is not measured on this platform: samples report 0 CPU time.
func processCPU() time.Duration { return 0 }
