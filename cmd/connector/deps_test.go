package main

import (
	"os/exec"
	"strings"
	"testing"
)

// goList runs the go command's list with args and returns its output lines.
// The test below asks the go command, not a hand-kept list, so that it
// sees what the linker would. internal/archtest's TestOneDriverList keeps
// the driver list in one place, reading the sources so the test cache
// cannot hide a new package.
func goList(t *testing.T, args ...string) []string {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list"}, args...)...)
	out, err := cmd.Output()
	if err != nil {
		var stderr string
		if ee, ok := err.(*exec.ExitError); ok {
			stderr = string(ee.Stderr)
		}
		t.Fatalf("go list %s: %v\n%s", strings.Join(args, " "), err, stderr)
	}
	return strings.Split(strings.TrimSpace(string(out)), "\n")
}

// TestNoEmbeddedBrokers: the production binary links no broker. The
// embedded ones belong to cmd/connector-demo alone (issue #11).
func TestNoEmbeddedBrokers(t *testing.T) {
	deps := goList(t, "-deps", "weida.dev/connector/cmd/connector")
	if len(deps) < 10 {
		t.Fatalf("go list -deps printed %d packages; that is not a dependency list", len(deps))
	}
	for _, dep := range deps {
		for _, banned := range []string{"github.com/nats-io/nats-server", "github.com/mochi-mqtt"} {
			if strings.HasPrefix(dep, banned) {
				t.Errorf("cmd/connector depends on %s", dep)
			}
		}
	}
}
