package cli

import (
	"bytes"
	"strings"
	"testing"
)

// TestParseFlags: --help prints the usage once, to stdout; a bad flag
// prints the error and the usage once, to stderr; good flags are parsed.
func TestParseFlags(t *testing.T) {
	var list StringList
	for _, tc := range []struct {
		args             []string
		code             int
		done             bool
		stdoutN, stderrN int // usages printed
		stderrHas        string
	}{
		{[]string{"--help"}, ExitOK, true, 1, 0, ""},
		{[]string{"--nope"}, ExitUsage, true, 0, 1, "nope"},
		{[]string{"-x", "a", "-x", "b"}, ExitOK, false, 0, 0, ""},
	} {
		var stdout, stderr bytes.Buffer
		list = nil
		fs := NewFlagSet("t", "t [flags]", &stderr)
		fs.Var(&list, "x", "repeatable")
		code, done := ParseFlags(fs, tc.args, &stdout)
		if code != tc.code || done != tc.done ||
			strings.Count(stdout.String(), "usage: t [flags]") != tc.stdoutN ||
			strings.Count(stderr.String(), "usage: t [flags]") != tc.stderrN ||
			!strings.Contains(stderr.String(), tc.stderrHas) {
			t.Errorf("%q: code %d, done %v, stdout %q, stderr %q", tc.args, code, done, &stdout, &stderr)
		}
	}
	if list.String() != "a,b" {
		t.Errorf("StringList = %q, want a,b", list.String())
	}
}
