package main

import (
	"os/exec"
	"slices"
	"strings"
	"testing"
)

// goList runs the go command's list with args and returns its output lines.
// Both tests below ask the go command, not a hand-kept list, so that they
// see what the linker would.
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

// TestOneDriverList: cmd/internal/drivers is the only package of the module
// that imports a protocol package (connectors/<protocol>), so that the
// commands, the service and the demo all take protocols from its one list.
// Tests may import protocol packages directly; only what links counts.
func TestOneDriverList(t *testing.T) {
	const list = "weida.dev/connector/cmd/internal/drivers"
	var protocols []string
	for _, imp := range goList(t, "-f", `{{join .Imports "\n"}}`, list) {
		if strings.HasPrefix(imp, "weida.dev/connector/connectors/") {
			protocols = append(protocols, imp)
		}
	}
	if len(protocols) == 0 {
		t.Fatalf("%s imports no protocol package", list)
	}
	for _, line := range goList(t, "-f", `{{.ImportPath}}{{range .Imports}} {{.}}{{end}}`, "weida.dev/connector/...") {
		fields := strings.Fields(line)
		pkg, imports := fields[0], fields[1:]
		if pkg == list || slices.Contains(protocols, pkg) {
			continue
		}
		for _, imp := range imports {
			if slices.Contains(protocols, imp) {
				t.Errorf("%s imports %s; take the driver from %s.All instead", pkg, imp, list)
			}
		}
	}
}
