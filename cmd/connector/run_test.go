package main

import (
	"strings"
	"testing"
)

// TestRunRetryFlags: the backoff bounds are checked before anything loads.
func TestRunRetryFlags(t *testing.T) {
	for _, args := range [][]string{
		{"--retry-initial", "0s"},
		{"--retry-initial", "2s", "--retry-max", "1s"},
	} {
		code, _, errOut := runCLI(t, "", append([]string{"run", "-f", "missing.yaml"}, args...)...)
		if code != exitUsage || !strings.Contains(errOut, "--retry-initial") {
			t.Errorf("run %v: exit %d, %q; want a usage error naming --retry-initial", args, code, errOut)
		}
	}
}
