// Package archtest holds the test that keeps the packages layered as the
// architecture draws them (README's layout table, docs/DRIVERS.md): each
// package imports only the project packages below it. cmd/connector's own
// tests keep the driver list in one place and the embedded brokers out of
// the production binary.
package archtest

import (
	"bytes"
	"encoding/json"
	"os/exec"
	"slices"
	"strings"
	"testing"
)

const module = "weida.dev/connector"

// allowed lists, for each project package, the project packages it may
// import. A package not listed fails the test, so a new package must take
// its place in the layering deliberately.
var allowed = map[string][]string{
	"weida/wire":     {},
	"weida/topic":    {},
	"weida/address":  {},
	"weida":          {"weida/wire", "weida/topic", "weida/address", "internal/safefile"},
	"weida/bench":    {"weida", "weida/wire", "weida/topic", "weida/address"},
	"weida/weidacli": {"internal/cli", "weida", "weida/wire", "weida/topic", "weida/address", "weida/bench"},
	"internal/cli":   {},
	// A leaf every reader of configuration files shares: refuses pipes
	// and devices, caps sizes.
	"internal/safefile": {},
	// Private broker processes for the tests of drivers and e2e.
	"internal/brokertest": {},
	// A command that splits benchmark CPU profiles by owner (docs/PERFORMANCE.md).
	"internal/profowners": {},
	"deploy":              {}, // its tests check the manifests and the dashboard against the binary
	"policy":              {"weida/topic"},
	"resources":           {"policy", "weida/topic", "weida/address", "internal/safefile"},
	"connectors":          {"policy", "weida", "weida/topic", "weida/wire", "weida/address"},
	// A driver sees the runtime, the shared decoding helpers and the
	// policies, never another driver, the service or a command.
	"connectors/mqtt":     driverImports,
	"connectors/nats":     driverImports,
	"connectors/amqp":     driverImports,
	"connectors/conntest": {"connectors", "policy", "weida", "weida/topic", "weida/address", "internal/brokertest"},
	// Leases on etcd or Kubernetes: a leaf the service will use for
	// placement (issue 23); it knows nothing of resources or drivers.
	"service/placement": {},
	// The service knows drivers only through their common interface.
	"service": {"connectors", "resources", "policy", "weida", "weida/topic", "weida/address", "internal/safefile"},
	// The one list of drivers: the only package that names the protocol
	// packages (cmd/connector's TestOneDriverList keeps it so).
	"internal/drivers": {"service", "connectors/mqtt", "connectors/nats", "connectors/amqp"},
	// The commands wire flags to the service and the driver list.
	"cmd/connector":      {"internal/cli", "internal/safefile", "internal/drivers", "service", "resources", "policy", "connectors", "weida", "weida/weidacli"},
	"internal/demo":      {"internal/drivers", "service", "resources", "policy", "connectors", "weida"},
	"cmd/connector-demo": {"internal/cli", "internal/demo"},
}

var driverImports = []string{"connectors", "resources", "policy", "weida", "weida/topic", "weida/address"}

// stdOnly are packages that import nothing outside the standard library:
// the wire codec and the topic grammar are what every other layer trusts.
var stdOnly = []string{"weida/wire", "weida/topic", "weida/address", "policy"}

// noIO are packages that must stay pure: conversion logic opens no file
// and no socket.
var noIO = []string{"policy", "weida/topic", "weida/wire"}

type pkg struct {
	ImportPath string
	Dir        string
	GoFiles    []string
	Imports    []string
}

func list(t *testing.T, args ...string) []pkg {
	t.Helper()
	cmd := exec.Command("go", append([]string{"list", "-json"}, args...)...)
	cmd.Dir = "../.."
	var out, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []pkg
	dec := json.NewDecoder(&out)
	for dec.More() {
		var p pkg
		if err := dec.Decode(&p); err != nil {
			t.Fatal(err)
		}
		pkgs = append(pkgs, p)
	}
	return pkgs
}

func rel(path string) (string, bool) {
	if path == module {
		return "", true
	}
	r, ok := strings.CutPrefix(path, module+"/")
	return r, ok
}

func TestLayering(t *testing.T) {
	for _, p := range list(t, "./...") {
		name, _ := rel(p.ImportPath)
		if name == "e2e" || name == "internal/archtest" {
			continue // tests only: they may reach anything
		}
		ok, listed := allowed[name]
		if !listed {
			t.Errorf("package %s has no place in the layering: add it to allowed in %s with the packages it may import", name, "internal/archtest")
			continue
		}
		for _, imp := range p.Imports {
			dep, internal := rel(imp)
			if !internal {
				std := !strings.Contains(strings.Split(imp, "/")[0], ".")
				if !std && slices.Contains(stdOnly, name) {
					t.Errorf("%s imports %s; it may import only the standard library", name, imp)
				}
				if slices.Contains(noIO, name) && (imp == "os" || imp == "net" || strings.HasPrefix(imp, "net/") || strings.HasPrefix(imp, "os/")) {
					t.Errorf("%s imports %s; it must stay free of I/O", name, imp)
				}
				continue
			}
			if !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s, which the layering does not allow (allowed: %v)", name, dep, ok)
			}
		}
	}
}
