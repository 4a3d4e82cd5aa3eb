package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

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
