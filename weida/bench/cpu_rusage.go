//go:build linux || darwin || freebsd || netbsd || openbsd || dragonfly

package bench

import (
	"syscall"
	"time"
)

// processCPU returns the user and system CPU time this process has used,
// or 0 when the system does not say.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
