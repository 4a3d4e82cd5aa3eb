package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The check tests run from the repository root, so that paths in the
// output read as an operator at the root types them.
func chdirRoot(t *testing.T) {
	t.Helper()
	t.Chdir("../..")
}

func TestCheckExamples(t *testing.T) {
	chdirRoot(t)
	code, out, errOut := runCLI(t, "", "check", "-f", "examples/")
	if code != exitOK {
		t.Fatalf("check -f examples/: exit %d\n%s%s", code, out, errOut)
	}
	if !strings.HasSuffix(out, "7 resources checked: 7 valid\n") {
		t.Errorf("summary:\n%s", out)
	}
	for _, want := range []string{
		"examples/mqtt-inbound.yaml:4  mqtt-sensors-in  valid",
		"sensors/+/temperature  →  sensors.*.temperature",
		"orders.*.created     →  orders.*.created",
		"audit.events.#  →  audit.events.#",
		"hosts weida://127.0.0.1:7001/sensors",
		"OPEN: anyone who can reach 127.0.0.1:7001 may subscribe",
		"dials weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:7002/orders",
		"losses  delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length",
		"user guest (password from env AMQP_PASSWORD)",
		`mount   mqtt "factory/"  ↔  weida "plants.berlin."`,
		"factory/+/press  →  plants.berlin.*.press",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q\n%s", want, out)
		}
	}
	if strings.Contains(out, "invalid/") {
		t.Error("a directory is read recursively")
	}
}

// TestCheckInvalidExamples: each file in examples/invalid makes check exit
// 1 and print every diagnostic its golden file lists (position, field,
// rule). The golden files belong to package resources, which regenerates
// them with -update.
func TestCheckInvalidExamples(t *testing.T) {
	chdirRoot(t)
	files, _ := filepath.Glob("examples/invalid/*.yaml")
	if len(files) < 10 {
		t.Fatalf("%d invalid examples", len(files))
	}
	for _, f := range files {
		t.Run(filepath.Base(f), func(t *testing.T) {
			code, out, _ := runCLI(t, "", "check", "-f", f)
			if code != exitFailure {
				t.Fatalf("exit %d, want 1\n%s", code, out)
			}
			golden, err := os.ReadFile(strings.TrimSuffix(f, ".yaml") + ".golden")
			if err != nil {
				t.Fatal(err)
			}
			n := 0
			for _, line := range strings.Split(string(golden), "\n") {
				if line == "" || strings.HasPrefix(line, "#") {
					continue
				}
				n++
				parts := strings.Fields(line)
				pos, field, rule := parts[0], parts[1], parts[2]
				want := "error   " + pos + "  " + field
				if !strings.Contains(out, want) || !strings.Contains(out, "["+rule+"]") {
					t.Errorf("output lacks %q with [%s]\n%s", want, rule, out)
				}
			}
			if n == 0 || !strings.Contains(out, "INVALID") {
				t.Errorf("no diagnostics:\n%s", out)
			}
		})
	}
}

func TestCheckJSON(t *testing.T) {
	chdirRoot(t)
	code, out, _ := runCLI(t, "", "check", "-f", "examples/mqtt-inbound.yaml", "-f", "examples/invalid/nats-gt-route.yaml", "--output", "json")
	if code != exitFailure {
		t.Fatalf("exit %d", code)
	}
	var doc checkJSON
	if err := json.Unmarshal([]byte(out), &doc); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if doc.Valid || doc.Summary != (summaryJSON{Resources: 2, Valid: 1, Invalid: 1, Errors: 1}) || len(doc.Resources) != 2 {
		t.Fatalf("summary %+v", doc)
	}
	ok, bad := doc.Resources[0], doc.Resources[1]
	if !ok.Valid || ok.Protocol != "mqtt" || ok.Policy != "mqtt-levels/v1" || len(ok.Routes) != 2 ||
		ok.Routes[0] != (routeJSON{"temperature", "sensors/+/temperature", "sensors.*.temperature"}) ||
		ok.Weida == nil || ok.Weida.Role != "listen" || !ok.Weida.Open || ok.Weida.Certificate != "examples/certs/endpoint.crt" {
		t.Errorf("valid resource %+v", ok)
	}
	if bad.Valid || len(bad.Errors) != 1 {
		t.Fatalf("invalid resource %+v", bad)
	}
	e := bad.Errors[0]
	if e.File != "examples/invalid/nats-gt-route.yaml" || e.Line != 19 || e.Column != 15 || e.Field != "spec.routes[0].filter" ||
		e.Rule != "nats-one-or-more" || e.Value != "orders.>" || e.Hint == "" {
		t.Errorf("error %+v", e)
	}
}

func TestCheckUsage(t *testing.T) {
	chdirRoot(t)
	tests := []struct {
		args []string
		code int
		want string
	}{
		{[]string{"check"}, exitUsage, "no resources named"},
		{[]string{"check", "examples/"}, exitUsage, "unexpected argument"},
		{[]string{"check", "-f", "examples/", "--output", "yaml"}, exitUsage, "--output must be"},
		{[]string{"check", "--nope"}, exitUsage, "flag provided but not defined"},
		{[]string{"check", "--help"}, exitOK, "usage: connector check"},
		{[]string{"check", "-f", "does/not/exist.yaml"}, exitFailure, "cannot be read"},
		{[]string{"check", "-f", "examples/certs"}, exitFailure, "no-resources"},
	}
	for _, tt := range tests {
		code, out, errOut := runCLI(t, "", tt.args...)
		if code != tt.code || !strings.Contains(out+errOut, tt.want) {
			t.Errorf("%v: exit %d, want %d with %q\n%s%s", tt.args, code, tt.code, tt.want, out, errOut)
		}
	}
}

// TestCheckShowsNoSecret: check reads no secret, and a secret written into
// a file is not repeated.
func TestCheckShowsNoSecret(t *testing.T) {
	chdirRoot(t)
	const canary = "c4n4ry-check-secret"
	t.Setenv("AMQP_PASSWORD", canary)
	dir := t.TempDir()
	secretFile := filepath.Join(dir, "password")
	if err := os.WriteFile(secretFile, []byte(canary), 0o600); err != nil {
		t.Fatal(err)
	}
	base, err := os.ReadFile("examples/amqp-outbound.yaml")
	if err != nil {
		t.Fatal(err)
	}
	literal := strings.Replace(string(base), "password: {env: AMQP_PASSWORD}", "password: "+canary, 1)
	fromFile := strings.Replace(strings.Replace(string(base), "password: {env: AMQP_PASSWORD}", "password: {file: "+secretFile+"}", 1), "amqp-factory-out", "from-file", 1)
	if err := os.WriteFile(filepath.Join(dir, "literal.yaml"), []byte(literal), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "file.yaml"), []byte(fromFile), 0o600); err != nil {
		t.Fatal(err)
	}
	for _, args := range [][]string{
		{"check", "-f", "examples/"},
		{"check", "-f", "examples/", "--output", "json"},
		{"check", "-f", filepath.Join(dir, "literal.yaml")},
		{"check", "-f", filepath.Join(dir, "literal.yaml"), "--output", "json"},
		{"check", "-f", filepath.Join(dir, "file.yaml")},
	} {
		_, out, errOut := runCLI(t, "", args...)
		if strings.Contains(out+errOut, canary) {
			t.Errorf("%v printed the secret:\n%s%s", args, out, errOut)
		}
	}
}

// TestCheckShowsPersistedLastValue: check says where a persisted
// last-value cache is kept.
func TestCheckShowsPersistedLastValue(t *testing.T) {
	chdirRoot(t)
	b, err := os.ReadFile("examples/nats-inbound.yaml")
	if err != nil {
		t.Fatal(err)
	}
	doc := strings.Replace(string(b), "  routes:\n", "  lastValue:\n    mode: all\n    persist: true\n  routes:\n", 1)
	doc = strings.ReplaceAll(doc, "certs/endpoint.", "examples/certs/endpoint.")
	file := filepath.Join(t.TempDir(), "p.yaml")
	if err := os.WriteFile(file, []byte(doc), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "", "check", "-f", file)
	if code != exitOK {
		t.Fatalf("check: exit %d\n%s%s", code, out, errOut)
	}
	if want := "keeps the last values in the state directory across restarts (lastvalue/nats-orders-in.cbor)"; !strings.Contains(out, want) {
		t.Errorf("output lacks %q\n%s", want, out)
	}
}
