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
	if code, out, _ := runCLI(t, "", "version", "--help"); code != 0 || !strings.Contains(out, "usage:") {
		t.Fatalf("version --help: code %d, out %q", code, out)
	}
	if code, _, _ := runCLI(t, "", "version", "--nope"); code != exitUsage {
		t.Fatalf("version --nope: code %d", code)
	}
}
