package main

import (
	"bytes"
	"context"
	"strings"
	"testing"

	"weida.dev/connector/internal/cli"
)

// TestUsage covers what the command adds to cmd/internal/demo (whose test runs
// the demo itself): --help, bad flags and stray arguments start nothing.
func TestUsage(t *testing.T) {
	for _, tc := range []struct {
		args       []string
		code       int
		out, inErr string
	}{
		{[]string{"--help"}, cli.ExitOK, "usage: connector-demo", ""},
		{[]string{"--no-such-flag"}, cli.ExitUsage, "", "no-such-flag"},
		{[]string{"now"}, cli.ExitUsage, "", `unexpected argument "now"`},
	} {
		var out, errb bytes.Buffer
		code := run(context.Background(), tc.args, &out, &errb)
		if code != tc.code || !strings.Contains(out.String(), tc.out) || !strings.Contains(errb.String(), tc.inErr) {
			t.Errorf("%v: exit %d, stdout %q, stderr %q; want exit %d, stdout containing %q, stderr containing %q",
				tc.args, code, out.String(), errb.String(), tc.code, tc.out, tc.inErr)
		}
		if tc.code == cli.ExitOK && errb.Len() != 0 {
			t.Errorf("%v: stderr %q, want nothing", tc.args, errb.String())
		}
	}
}
