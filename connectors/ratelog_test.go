package connectors_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestRateLogger: one line per key per interval, the next one carrying how
// many were suppressed; keys are independent.
func TestRateLogger(t *testing.T) {
	var buf bytes.Buffer
	log := slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{
		ReplaceAttr: func(_ []string, a slog.Attr) slog.Attr {
			if a.Key == slog.TimeKey {
				return slog.Attr{}
			}
			return a
		},
	}))
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	rl := connectors.NewRateLogger(log, 10*time.Second, func() time.Time { return now })
	for range 5 {
		rl.Log(slog.LevelWarn, "a", "drop a")
	}
	rl.Log(slog.LevelWarn, "b", "drop b")
	now = now.Add(10 * time.Second)
	rl.Log(slog.LevelWarn, "a", "drop a")
	rl.Log(slog.LevelWarn, "a", "drop a")
	rl.Log(slog.LevelDebug, "c", "not enabled")

	lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
	want := []string{
		`level=WARN msg="drop a"`,
		`level=WARN msg="drop b"`,
		`level=WARN msg="drop a" suppressed_since_last=4`,
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Errorf("log:\n%s\nwant:\n%s", buf.String(), strings.Join(want, "\n"))
	}
}
