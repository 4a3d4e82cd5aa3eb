//go:build !linux

package proccpu

import (
	"errors"
	"fmt"
	"time"
)

// readStat fails: only Linux has /proc/<pid>/stat.
func readStat(int) (time.Duration, error) {
	return 0, fmt.Errorf("proccpu: another process's CPU time is read from /proc: %w", errors.ErrUnsupported)
}
