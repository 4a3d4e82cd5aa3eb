package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckShowsFailover: check's summary of an outbound resource with
// failover addresses lists them after the dialled one, in text and JSON.
func TestCheckShowsFailover(t *testing.T) {
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	res := `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: out}
spec:
  protocol: nats
  direction: outbound
  broker: {url: "nats://127.0.0.1:4222"}
  weida:
    dial: weida://` + fp + `@10.0.0.1:7001/orders
    failover:
      - weida://` + fp + `@10.0.0.2:7001/orders
      - weida://` + fp + `@10.0.0.3:7001/orders
  conversion: {losses: [at-most-once, delivery-best-effort, empty-segments, forbidden-chars, ordering, wildcard-names]}
  routes: [{filter: orders.*}]
`
	file := filepath.Join(t.TempDir(), "out.yaml")
	if err := os.WriteFile(file, []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "", "check", "-f", file)
	want := "fails over to weida://" + fp + "@10.0.0.2:7001/orders, weida://" + fp + "@10.0.0.3:7001/orders, in turn"
	if code != exitOK || !strings.Contains(out, "dials weida://"+fp+"@10.0.0.1:7001/orders") || !strings.Contains(out, want) {
		t.Errorf("check: exit %d, output lacks %q\n%s%s", code, want, out, errOut)
	}

	code, out, errOut = runCLI(t, "", "check", "-f", file, "--output", "json")
	var doc struct {
		Resources []struct {
			Weida struct {
				Endpoint string   `json:"endpoint"`
				Failover []string `json:"failover"`
			} `json:"weida"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitOK || len(doc.Resources) != 1 {
		t.Fatalf("check --output json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	w := doc.Resources[0].Weida
	if w.Endpoint != "weida://"+fp+"@10.0.0.1:7001/orders" ||
		!slices.Equal(w.Failover, []string{"weida://" + fp + "@10.0.0.2:7001/orders", "weida://" + fp + "@10.0.0.3:7001/orders"}) {
		t.Errorf("weida = %+v", w)
	}
}
