package proccpu

import (
	"fmt"
	"os"
	"strconv"
	"time"
)

// readStat returns the CPU time in /proc/<pid>/stat.
func readStat(pid int) (time.Duration, error) {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return 0, fmt.Errorf("proccpu: %w", err)
	}
	return parseStat(stat)
}
