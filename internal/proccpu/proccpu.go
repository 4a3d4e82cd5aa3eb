// Package proccpu reads how much CPU time a process has used: this
// process's, for the benchmarks that report CPU per message, and another
// process's (a broker, a connector replica) for those that also charge
// the other end of the path.
//
// It is a leaf: it imports only the standard library.
package proccpu

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"time"
)

// userHZ is the unit of the CPU times in /proc/<pid>/stat. The kernel
// reports them in USER_HZ ticks, which it keeps at 100 per second for
// user space on every architecture Go runs on, whatever its own tick rate.
const userHZ = 100

// errNoPid refuses a pid that names no single process. 0 is what a
// stopped broker reports as its pid; taken for some other process, it
// would turn a broken measurement into a plausible one.
var errNoPid = errors.New("proccpu: a process id must be positive")

// Of returns the CPU time (user and system, every thread; not its
// children's) process pid has used. It reads /proc/<pid>/stat, so it works
// on Linux only (elsewhere it fails with [errors.ErrUnsupported]) and
// counts in the kernel's ticks of 10 ms. It refuses a pid <= 0 and fails
// when no process pid exists. It is safe to call concurrently.
func Of(pid int) (time.Duration, error) {
	if pid <= 0 {
		return 0, fmt.Errorf("%w, not %d", errNoPid, pid)
	}
	return readStat(pid)
}

// parseStat returns utime + stime from the contents of a /proc/<pid>/stat
// file. The command name (the second field) is in parentheses and may hold
// spaces and parentheses itself, so the fields are counted from the last
// ')': the state is the first after it, utime the 12th and stime the 13th.
func parseStat(stat []byte) (time.Duration, error) {
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, errors.New("proccpu: stat has no command name in parentheses")
	}
	f := bytes.Fields(stat[end+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("proccpu: stat has %d fields after the command name, want at least 13", len(f))
	}
	var ticks int64
	for _, field := range f[11:13] {
		v, err := strconv.ParseInt(string(field), 10, 64)
		if err != nil || v < 0 {
			return 0, fmt.Errorf("proccpu: stat CPU time %q is not a tick count", field)
		}
		ticks += v
	}
	return time.Duration(ticks) * time.Second / userHZ, nil
}
