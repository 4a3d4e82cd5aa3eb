// Package archtest holds the tests that keep the packages layered as the
// architecture draws them (README's layout table, docs/DRIVERS.md): each
// package imports only the project packages below it, internal/ holds only
// leaves, and one package names the protocol drivers. cmd/connector's own
// tests keep the embedded brokers out of the production binary.
//
// The tests read the module's sources themselves, with package os, rather
// than asking `go list`: the go command's test cache records every file and
// directory a test opens, so a new package directory or a changed import
// makes a cached `go test ./internal/archtest` run again instead of
// replaying an old pass.
package archtest

import (
	"go/parser"
	"go/token"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

const (
	module = "weida.dev/connector"
	// root is the module's directory, seen from this package's.
	root = "../.."
	// driverList is the package holding the one list of protocol drivers.
	// The driver packages are whatever it imports from connectors/.
	driverList = "cmd/drivers"
)

// allowed lists, for each project package, the project packages it may
// import. A package not listed fails the test, so a new package must take
// its place in the layering deliberately. The protocol drivers are not
// listed: they are read from driverList and may import driverImports.
var allowed = map[string][]string{
	"weida/wire":     {},
	"weida/topic":    {},
	"weida/address":  {},
	"weida":          {"weida/wire", "weida/topic", "weida/address", "internal/safefile", "internal/filestamp"},
	"weida/bench":    {"weida", "weida/wire", "weida/topic", "weida/address", "internal/proccpu"},
	"weida/weidacli": {"internal/cli", "weida", "weida/wire", "weida/topic", "weida/address", "weida/bench"},
	"internal/cli":   {},
	// A leaf every reader of configuration files shares: refuses pipes
	// and devices, caps sizes.
	"internal/safefile": {},
	// A leaf that tells whether files changed (stat stamps): secret files
	// re-read at each attempt, endpoint certificates reloaded on change.
	"internal/filestamp": {},
	// Private broker processes for the tests of drivers and e2e.
	"internal/brokertest": {},
	// A command that splits benchmark CPU profiles by owner (docs/PERFORMANCE.md).
	"internal/profowners": {},
	// A leaf the benchmarks share to read a process's CPU time.
	"internal/proccpu":    {},
	"deploy":              {}, // its tests check the manifests and the dashboard against the binary
	"policy":              {"weida/topic"},
	"resources":           {"policy", "weida/topic", "weida/address", "internal/safefile"},
	"connectors":          {"policy", "weida", "weida/topic", "weida/wire", "weida/address", "internal/filestamp", "internal/safefile"},
	"connectors/conntest": {"connectors", "policy", "weida", "weida/topic", "weida/address", "internal/brokertest", "internal/proccpu"},
	// Leases on etcd or Kubernetes: a leaf the service will use for
	// placement (issue 23); it knows nothing of resources or drivers.
	"service/placement": {},
	// The service knows drivers only through their common interface.
	"service": {"service/admin", "service/placement", "connectors", "resources", "policy", "weida", "weida/topic", "weida/address", "internal/safefile"},
	// The admin listener reads the runtime it reports on, and its token
	// from a file it reads again when it changes.
	"service/admin": {"connectors", "internal/filestamp", "internal/safefile"},
	// The commands wire flags to the service and the driver list.
	"cmd/connector":      {"internal/cli", "internal/safefile", driverList, "service", "service/placement", "resources", "policy", "connectors", "weida", "weida/weidacli"},
	"cmd/internal/demo":  {driverList, "service", "resources", "policy", "connectors", "weida"},
	"cmd/connector-demo": {"internal/cli", "cmd/internal/demo"},
}

// driverImports are what a protocol driver may import: the runtime, the
// shared decoding helpers and the policies, never another driver, the
// service or a command.
var driverImports = []string{"connectors", "resources", "policy", "weida", "weida/topic", "weida/address"}

// testOnly are directories whose Go files are all tests: they may reach
// anything, and have no place in the layering.
var testOnly = []string{"e2e", "internal/archtest"}

// stdOnly are packages that import nothing outside the standard library:
// the wire codec and the topic grammar are what every other layer trusts.
var stdOnly = []string{"weida/wire", "weida/topic", "weida/address", "policy"}

// noIO are packages that must stay pure: conversion logic opens no file
// and no socket.
var noIO = []string{"policy", "weida/topic", "weida/wire"}

// sourcePackage is one directory of the module that holds Go files other
// than tests, with what those files import.
type sourcePackage struct {
	name    string   // the directory relative to the module: "connectors/mqtt"
	imports []string // import paths of every non-test file, sorted, once each
}

// readModule returns the module's packages by their names, read from the
// files under root. It skips what the go command skips: directories named
// testdata or starting with "." or "_".
func readModule(t *testing.T) map[string]*sourcePackage {
	t.Helper()
	pkgs := make(map[string]*sourcePackage)
	err := filepath.WalkDir(root, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if !d.IsDir() {
			return nil
		}
		base := d.Name()
		if p != root && (base == "testdata" || strings.HasPrefix(base, ".") || strings.HasPrefix(base, "_")) {
			return fs.SkipDir
		}
		name, err := filepath.Rel(root, p)
		if err != nil {
			return err
		}
		if name == "." {
			name = "" // the module's root package, as rel names it
		}
		pkg, err := readPackage(p, filepath.ToSlash(name))
		if err != nil {
			return err
		}
		if pkg != nil {
			pkgs[pkg.name] = pkg
		}
		return nil
	})
	if err != nil {
		t.Fatalf("reading the module's sources: %v", err)
	}
	if len(pkgs) < 10 {
		t.Fatalf("found %d packages under %s; that is not this module", len(pkgs), root)
	}
	return pkgs
}

// readPackage parses the import blocks of dir's non-test Go files, read
// with os.ReadFile so that the test cache records them. It returns nil when
// dir holds no such file. Files of every platform count: a layer is the
// same on all of them.
func readPackage(dir, name string) (*sourcePackage, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var imports []string
	found := false
	fset := token.NewFileSet()
	for _, e := range entries {
		file := e.Name()
		if e.IsDir() || !strings.HasSuffix(file, ".go") || strings.HasSuffix(file, "_test.go") {
			continue
		}
		src, err := os.ReadFile(filepath.Join(dir, file))
		if err != nil {
			return nil, err
		}
		f, err := parser.ParseFile(fset, filepath.Join(dir, file), src, parser.ImportsOnly)
		if err != nil {
			return nil, err
		}
		found = true
		for _, spec := range f.Imports {
			imp, err := strconv.Unquote(spec.Path.Value)
			if err != nil {
				return nil, err
			}
			imports = append(imports, imp)
		}
	}
	if !found {
		return nil, nil
	}
	slices.Sort(imports)
	return &sourcePackage{name: name, imports: slices.Compact(imports)}, nil
}

// rel returns an import path of the module relative to the module, or
// false for any other import path.
func rel(importPath string) (string, bool) {
	if importPath == module {
		return "", true
	}
	return strings.CutPrefix(importPath, module+"/")
}

// driverPackages returns the protocol packages the one driver list
// imports: every connectors/<protocol> package it names.
func driverPackages(t *testing.T, pkgs map[string]*sourcePackage) []string {
	t.Helper()
	list := pkgs[driverList]
	if list == nil {
		t.Fatalf("no package %s: the driver list moved; update driverList", driverList)
	}
	var drivers []string
	for _, imp := range list.imports {
		if name, ok := rel(imp); ok && path.Dir(name) == "connectors" {
			drivers = append(drivers, name)
		}
	}
	if len(drivers) == 0 {
		t.Fatalf("%s imports no protocol package (connectors/<protocol>)", driverList)
	}
	return drivers
}

// layers returns allowed completed with the driver packages: each may
// import driverImports, and the driver list may import the service and
// every driver.
func layers(t *testing.T, pkgs map[string]*sourcePackage) map[string][]string {
	t.Helper()
	drivers := driverPackages(t, pkgs)
	out := make(map[string][]string, len(allowed)+len(drivers)+1)
	for name, deps := range allowed {
		out[name] = deps
	}
	for _, d := range drivers {
		if _, listed := allowed[d]; listed {
			t.Errorf("%s is a driver (%s imports it) and is listed in allowed too; drop it from allowed", d, driverList)
		}
		out[d] = driverImports
	}
	out[driverList] = append([]string{"service"}, drivers...)
	return out
}

func TestLayering(t *testing.T) {
	pkgs := readModule(t)
	layer := layers(t, pkgs)
	for name, p := range pkgs {
		if slices.Contains(testOnly, name) {
			continue
		}
		ok, listed := layer[name]
		if !listed {
			t.Errorf("package %s has no place in the layering: add it to allowed in internal/archtest with the packages it may import", name)
			continue
		}
		for _, imp := range p.imports {
			dep, inModule := rel(imp)
			if !inModule {
				checkOutside(t, name, imp)
				continue
			}
			if !slices.Contains(ok, dep) {
				t.Errorf("%s imports %s, which the layering does not allow (allowed: %v)", name, dep, ok)
			}
		}
	}
	for name := range layer {
		if pkgs[name] == nil {
			t.Errorf("allowed lists %s, which has no Go files any more; drop it", name)
		}
	}
}

// checkOutside checks an import from outside the module against the
// packages that may import only the standard library or must do no I/O.
func checkOutside(t *testing.T, name, imp string) {
	t.Helper()
	std := !strings.Contains(strings.Split(imp, "/")[0], ".")
	if !std && slices.Contains(stdOnly, name) {
		t.Errorf("%s imports %s; it may import only the standard library", name, imp)
	}
	if slices.Contains(noIO, name) && (imp == "os" || imp == "net" || strings.HasPrefix(imp, "net/") || strings.HasPrefix(imp, "os/")) {
		t.Errorf("%s imports %s; it must stay free of I/O", name, imp)
	}
}

// TestNoUpwardImports: the layering is a ranking, so no import can point
// up. An allowed import that closes a cycle would let a package import one
// above it; the walk below finds any.
func TestNoUpwardImports(t *testing.T) {
	layer := layers(t, readModule(t))
	const (
		unseen = iota
		onPath
		done
	)
	state := make(map[string]int, len(layer))
	var walk func(name string, trail []string)
	walk = func(name string, trail []string) {
		switch state[name] {
		case onPath:
			i := slices.Index(trail, name)
			t.Errorf("the layering has a cycle, so one of these imports points up: %s", strings.Join(append(trail[i:], name), " -> "))
			return
		case done:
			return
		}
		state[name] = onPath
		for _, dep := range layer[name] {
			walk(dep, append(trail, name))
		}
		state[name] = done
	}
	names := make([]string, 0, len(layer))
	for name := range layer {
		names = append(names, name)
	}
	slices.Sort(names)
	for _, name := range names {
		walk(name, nil)
	}
}

// TestInternalHoldsLeaves: a package under internal/ imports no project
// package outside internal/. Wiring that imports what it wires belongs
// under cmd/ (the driver list, the demo), above everything else.
func TestInternalHoldsLeaves(t *testing.T) {
	for name, p := range readModule(t) {
		if !strings.HasPrefix(name, "internal/") || slices.Contains(testOnly, name) {
			continue
		}
		for _, imp := range p.imports {
			if dep, inModule := rel(imp); inModule && !strings.HasPrefix(dep, "internal/") {
				t.Errorf("%s imports %s: internal/ holds leaves only; move the package under cmd/ or give it a layer of its own", name, dep)
			}
		}
	}
}

// TestOneDriverList: the driver list is the only package of the module
// that imports a protocol package (connectors/<protocol>), so that the
// commands, the service and the demo all take protocols from its one list.
// Tests may import protocol packages directly; only what links counts.
func TestOneDriverList(t *testing.T) {
	pkgs := readModule(t)
	drivers := driverPackages(t, pkgs)
	for name, p := range pkgs {
		if name == driverList || slices.Contains(drivers, name) {
			continue
		}
		for _, imp := range p.imports {
			if dep, _ := rel(imp); slices.Contains(drivers, dep) {
				t.Errorf("%s imports %s; take the driver from %s.All instead", name, dep, driverList)
			}
		}
	}
}
