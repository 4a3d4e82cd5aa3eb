package service_test

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/service"
)

// outboundFile writes one NATS outbound resource named prefix-test-N (N
// unique per call) whose weida side dials a closed port, and returns its
// path: enough for Run to start, serve its admin listener and stop.
func outboundFile(t *testing.T, prefix string) string {
	t.Helper()
	name := fmt.Sprintf("%s-test-%d", prefix, time.Now().UnixNano())
	res := fmt.Sprintf(`apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: %s}
spec:
  protocol: nats
  direction: outbound
  broker: {url: "nats://127.0.0.1:4222"}
  weida: {dial: "weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:9/x"}
  conversion: {losses: [at-most-once, delivery-best-effort, empty-segments, forbidden-chars, ordering, wildcard-names]}
  routes: [{filter: %s.*}]
`, name, name)
	file := t.TempDir() + "/r.yaml"
	if err := os.WriteFile(file, []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// lockedBuffer is a bytes.Buffer several goroutines may log into.
type lockedBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *lockedBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *lockedBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// TestRunLogsEffectiveDrain: with no drain bound configured, the stop log
// names the bound the runtime applies (its default), not the zero value.
func TestRunLogsEffectiveDrain(t *testing.T) {
	file := outboundFile(t, "drain")
	var logs lockedBuffer
	e := env(nil)
	e.Logger = slog.New(slog.NewJSONHandler(&logs, nil))
	ctx, cancel := context.WithCancel(context.Background())
	reload := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, service.Config{Env: e, Paths: []string{file}}, reload) }()
	select {
	case reload <- struct{}{}: // taken once the resources run
	case err := <-done:
		t.Fatalf("Run returned %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Run did not start")
	}
	cancel()
	select {
	case err := <-done:
		if err != nil {
			t.Fatalf("Run = %v", err)
		}
	case <-time.After(15 * time.Second):
		t.Fatal("Run did not stop")
	}
	for line := range strings.Lines(logs.String()) {
		var rec struct{ Msg, Bound string }
		if json.Unmarshal([]byte(line), &rec) != nil || !strings.HasPrefix(rec.Msg, "stopping") {
			continue
		}
		if want := (connectors.Deps{}).DrainBound().String(); rec.Bound != want || want == "0s" {
			t.Errorf("the stop log says the drain bound is %q; the runtime applies %s", rec.Bound, want)
		}
		return
	}
	t.Errorf("no stopping log line in:\n%s", logs.String())
}
