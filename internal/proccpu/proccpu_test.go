package proccpu

import (
	"errors"
	"io/fs"
	"math"
	"os"
	"runtime"
	"testing"
	"time"
)

func TestParseStat(t *testing.T) {
	// The fields after the command name, from the state on: utime is 150
	// ticks, stime 50.
	const rest = " S 1 1 1 0 -1 4194304 100 0 0 0 150 50 0 0 20 0 1 0 29270 3133440"
	for _, tc := range []struct {
		name, stat string
		want       time.Duration // ignored when the stat is refused
		refused    bool
	}{
		{name: "plain name", stat: "42 (mosquitto)" + rest, want: 2 * time.Second},
		{name: "name with spaces", stat: "42 (beam.smp worker)" + rest, want: 2 * time.Second},
		// Counting from the first ')' would read 12 and 13 as the times.
		{name: "name with parentheses and numbers", stat: "42 (x) 1 2 3 4 5 6 7 8 9 10 11 12 13 14)" + rest, want: 2 * time.Second},
		{name: "no CPU used yet", stat: "42 (idle) S 1 1 1 0 -1 0 0 0 0 0 0 0", want: 0},
		{name: "empty", stat: "", refused: true},
		{name: "no parentheses", stat: "42 mosquitto" + rest, refused: true},
		{name: "cut short", stat: "42 (mosquitto) S 1 1 1 0 -1 4194304 100 0 0 0 150", refused: true},
		{name: "utime not a number", stat: "42 (m) S 1 1 1 0 -1 0 0 0 0 0 x 50", refused: true},
		{name: "stime negative", stat: "42 (m) S 1 1 1 0 -1 0 0 0 0 0 150 -50", refused: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseStat([]byte(tc.stat))
			switch {
			case tc.refused && err == nil:
				t.Fatalf("parseStat(%q) = %v, want an error", tc.stat, got)
			case !tc.refused && err != nil:
				t.Fatalf("parseStat(%q): %v", tc.stat, err)
			case !tc.refused && got != tc.want:
				t.Fatalf("parseStat(%q) = %v, want %v", tc.stat, got, tc.want)
			}
		})
	}
}

// TestSelfNeverDecreases: CPU time only accumulates, and a process that
// has burnt some has a measure of it where getrusage exists.
func TestSelfNeverDecreases(t *testing.T) {
	prev := Self()
	var sum uint64
	for range 20 {
		for i := range uint64(1_000_000) {
			sum = sum*31 + i
		}
		now := Self()
		if now < prev {
			t.Fatalf("Self() went from %v down to %v", prev, now)
		}
		prev = now
	}
	runtime.KeepAlive(sum)
	if runtime.GOOS == "linux" && prev <= 0 {
		t.Errorf("Self() = %v after a busy loop; want more than 0", prev)
	}
}

// TestOfThisProcess: /proc and getrusage describe the same process alike,
// /proc's figure being cut to whole ticks in each of its two times.
func TestOfThisProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("Of reads /proc, which only Linux has")
	}
	before := Self()
	got, err := Of(os.Getpid())
	after := Self()
	if err != nil {
		t.Fatal(err)
	}
	const tick = time.Second / userHZ
	if got < before-2*tick || got > after {
		t.Errorf("Of(own pid) = %v; Self() read %v before and %v after", got, before, after)
	}
}

func TestOfRefuses(t *testing.T) {
	noProcess := fs.ErrNotExist
	if runtime.GOOS != "linux" {
		noProcess = errors.ErrUnsupported
	}
	for _, tc := range []struct {
		name string
		pid  int
		want error // what errors.Is must find in the error
	}{
		{name: "pid 0 (a stopped broker's)", pid: 0, want: errNoPid},
		{name: "negative pid", pid: -1, want: errNoPid},
		{name: "most negative pid", pid: math.MinInt, want: errNoPid},
		// Linux keeps pids below 2^22 (PID_MAX_LIMIT).
		{name: "no such process", pid: math.MaxInt32, want: noProcess},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Of(tc.pid)
			if !errors.Is(err, tc.want) {
				t.Fatalf("Of(%d) = %v, %v; want an error wrapping %q", tc.pid, got, err, tc.want)
			}
		})
	}
}
