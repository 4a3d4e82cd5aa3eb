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

// TestRunLogLevel: a bad --log-level reads like the other flag errors and
// names the choices; the documented levels are accepted in any case.
func TestRunLogLevel(t *testing.T) {
	code, _, errOut := runCLI(t, "", "run", "-f", "missing.yaml", "--log-level", "x")
	if want := "connector run: --log-level must be debug, info, warn or error, not \"x\"\n"; code != exitUsage || errOut != want {
		t.Errorf("exit %d, %q; want 2, %q", code, errOut, want)
	}
	for _, s := range []string{"debug", "INFO", "Warn", "error"} {
		if _, ok := parseLevel(s); !ok {
			t.Errorf("parseLevel(%q) refused", s)
		}
	}
	if _, ok := parseLevel("info+2"); ok {
		t.Error("parseLevel accepts an offset the flag does not document")
	}
}

// TestRunPprofFlag: --pprof is a flag of run, listed in its help, and
// off unless given.
func TestRunPprofFlag(t *testing.T) {
	code, out, errOut := runCLI(t, "", "run", "--help")
	if code != exitOK || !strings.Contains(out+errOut, "-pprof") {
		t.Errorf("run --help: exit %d, no -pprof in %q", code, out+errOut)
	}
	code, _, errOut = runCLI(t, "", "run", "--pprof", "-f", "missing.yaml")
	if code != exitFailure || strings.Contains(errOut, "flag provided but not defined") {
		t.Errorf("run --pprof -f missing.yaml: exit %d, %q; want the missing file refused, not the flag", code, errOut)
	}
}
