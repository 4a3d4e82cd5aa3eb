package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestReadmeCommands keeps the README's set-up block to its two commands,
// the demo and the test script, and keeps both runnable as written: the
// demo's package is a command and the script is executable.
func TestReadmeCommands(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "## Two commands\n\n```sh\n")
	if start < 0 {
		t.Fatal("README has no \"Two commands\" sh block")
	}
	block := text[start+len("## Two commands\n\n```sh\n"):]
	block = block[:strings.Index(block, "```")]
	var cmds []string
	for _, line := range strings.Split(strings.TrimSpace(block), "\n") {
		cmd, _, _ := strings.Cut(line, "#")
		cmds = append(cmds, strings.TrimSpace(cmd))
	}
	want := []string{"go run ./cmd/connector-demo", "./scripts/test"}
	if strings.Join(cmds, "\n") != strings.Join(want, "\n") {
		t.Fatalf("README's set-up commands are %q, want %q", cmds, want)
	}
	if names := goList(t, "-f", "{{.Name}}", "weida.dev/connector/cmd/connector-demo"); len(names) != 1 || names[0] != "main" {
		t.Errorf("cmd/connector-demo is package %q, want main", names)
	}
	if fi, err := os.Stat("../../scripts/test"); err != nil {
		t.Error(err)
	} else if fi.Mode().Perm()&0o100 == 0 {
		t.Errorf("scripts/test has mode %v, want it executable", fi.Mode())
	}
}

// TestReadmeTour keeps the README's five-minute tour true: its resource is
// refused for the dotted route it shows, and valid once that route is gone.
func TestReadmeTour(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "# tour.yaml\n")
	if start < 0 {
		t.Fatal("README has no tour.yaml block")
	}
	block := text[start:]
	block = block[:strings.Index(block, "```")]
	dir := t.TempDir()
	full := filepath.Join(dir, "tour.yaml")
	if err := os.WriteFile(full, []byte(block), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ := runCLI(t, "", "check", "-f", full)
	if code != exitFailure || !strings.Contains(out, "mqtt-dotted-level") || !strings.Contains(out, "mqtt-levels-escaped/v1") {
		t.Fatalf("tour resource: exit %d, want 1 naming mqtt-dotted-level and the escaped policy:\n%s", code, out)
	}
	var kept []string
	for _, line := range strings.Split(block, "\n") {
		if !strings.Contains(line, "eu.west") {
			kept = append(kept, line)
		}
	}
	trimmed := filepath.Join(dir, "tour2.yaml")
	if err := os.WriteFile(trimmed, []byte(strings.Join(kept, "\n")), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, _ = runCLI(t, "", "check", "-f", trimmed)
	if code != exitOK || !strings.Contains(out, "sensors/+/temperature  →  sensors.*.temperature") {
		t.Fatalf("tour resource without the dotted route: exit %d:\n%s", code, out)
	}
}

// TestReadmeOperating keeps README's "Operating it" section pointing at
// what exists: each place it links to, and each thing an operator is sent
// to look at.
func TestReadmeOperating(t *testing.T) {
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	text := string(readme)
	start := strings.Index(text, "\n## Operating it\n")
	if start < 0 {
		t.Fatal(`README has no "Operating it" section`)
	}
	section := text[start+1:]
	if end := strings.Index(section[3:], "\n## "); end >= 0 {
		section = section[:end+3]
	}
	for _, want := range []string{"/status", "connector schema", "yaml-language-server", "deploy/kubernetes/", "deploy/grafana/", "scripts/compose-test", "--pprof"} {
		if !strings.Contains(section, want) {
			t.Errorf("Operating it does not mention %q", want)
		}
	}
	for rest := section; ; {
		i := strings.Index(rest, "](")
		if i < 0 {
			break
		}
		rest = rest[i+2:]
		target := rest[:strings.Index(rest, ")")]
		if _, err := os.Stat(filepath.Join("../..", target)); err != nil {
			t.Errorf("Operating it links to %s: %v", target, err)
		}
	}
}
