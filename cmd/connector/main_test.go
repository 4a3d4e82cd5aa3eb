package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestVersionAndUsage(t *testing.T) {
	if code, out, _ := runCLI(t, "", "version"); code != 0 || !strings.HasPrefix(out, "connector ") {
		t.Fatalf("version: code %d, out %q", code, out)
	}
	if code, _, errOut := runCLI(t, ""); code != exitUsage || !strings.Contains(errOut, "usage:") {
		t.Fatalf("no args: code %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "", "bogus"); code != exitUsage || !strings.Contains(errOut, "unknown command") {
		t.Fatalf("bogus: code %d, stderr %q", code, errOut)
	}
	if code, _, errOut := runCLI(t, "", "rnu"); code != exitUsage || !strings.HasPrefix(errOut, "connector: unknown command \"rnu\"; did you mean run?\n") {
		t.Errorf("a misspelt command: exit %d, %q; want a did you mean", code, errOut)
	}
	if _, _, errOut := runCLI(t, "", "bogus"); strings.Contains(errOut, "did you mean") {
		t.Errorf("a command like none suggests one: %q", errOut)
	}
	if code, out, _ := runCLI(t, "", "version", "--help"); code != 0 || !strings.Contains(out, "usage:") {
		t.Fatalf("version --help: code %d, out %q", code, out)
	}
	if code, _, _ := runCLI(t, "", "version", "--nope"); code != exitUsage {
		t.Fatalf("version --nope: code %d", code)
	}
}

// TestHelpOnce: --help prints the usage once, to stdout, and nothing to
// stderr; a bad flag prints the error and the usage to stderr.
func TestHelpOnce(t *testing.T) {
	for _, cmd := range []string{"run", "check", "explain", "weida", "version", "health"} {
		code, out, errOut := runCLI(t, "", cmd, "--help")
		if code != 0 || strings.Count(out, "usage:") != 1 || errOut != "" {
			t.Errorf("%s --help: code %d, %d usages on stdout, stderr %q", cmd, code, strings.Count(out, "usage:"), errOut)
		}
		code, _, errOut = runCLI(t, "", cmd, "--no-such-flag")
		if code != exitUsage || !strings.Contains(errOut, "no-such-flag") || strings.Count(errOut, "usage:") != 1 {
			t.Errorf("%s --no-such-flag: code %d, stderr %q", cmd, code, errOut)
		}
	}
}

// TestDemoMoved: the demo is its own command now; the old invocation says
// where it went, in one line, and fails as a usage error so that no script
// mistakes it for a demo that ran. The help does not offer it.
func TestDemoMoved(t *testing.T) {
	code, out, errOut := runCLI(t, "", "demo")
	if code != exitUsage || out != "" || strings.Count(errOut, "\n") != 1 || !strings.Contains(errOut, "go run ./cmd/connector-demo") {
		t.Errorf("demo: exit %d, stdout %q, stderr %q; want exit %d and one line naming go run ./cmd/connector-demo", code, out, errOut, exitUsage)
	}
	if _, out, _ := runCLI(t, "", "help"); strings.Contains(out, "demo") {
		t.Errorf("help still lists the demo:\n%s", out)
	}
}
