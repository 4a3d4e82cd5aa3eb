//go:build unix

package proccpu

import (
	"syscall"
	"time"
)

// Self returns the CPU time (user and system, every thread) this process
// has used, or 0 when getrusage fails. It is safe to call concurrently.
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}
