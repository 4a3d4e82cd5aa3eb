package main

import (
	"encoding/json"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// TestCheckShowsClientIdentities: check's summary of an inbound endpoint
// admitting clients by CA-issued identity counts them apart from
// fingerprints and names them with the CA file, in text and JSON.
func TestCheckShowsClientIdentities(t *testing.T) {
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	res := `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: in}
spec:
  protocol: mqtt
  direction: inbound
  broker: {url: "mqtt://127.0.0.1:1883", mqtt: {qos: 1}}
  weida:
    listen: weida://127.0.0.1:7001/sensors
    clientCAFile: client-ca.pem
    allowedClients:
      - ` + fp + `
      - {san: "uri:spiffe://plant-a/dash", scopes: [plant.a.#]}
      - {commonName: ops}
  conversion: {losses: [delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]}
  routes: [{filter: sensors/+/temperature}]
`
	dir := t.TempDir()
	file := filepath.Join(dir, "in.yaml")
	if err := os.WriteFile(file, []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	code, out, errOut := runCLI(t, "", "check", "-f", file)
	for _, want := range []string{
		"only 1 client fingerprint and 2 CA-issued identities may subscribe, 1 of them within their scopes only",
		"client CA " + filepath.Join(dir, "client-ca.pem") + " proves uri:spiffe://plant-a/dash, cn:ops",
	} {
		if code != exitOK || !strings.Contains(out, want) {
			t.Errorf("check: exit %d, output lacks %q\n%s%s", code, want, out, errOut)
		}
	}

	code, out, errOut = runCLI(t, "", "check", "-f", file, "--output", "json")
	var doc struct {
		Resources []struct {
			Weida struct {
				AllowedClients []string            `json:"allowedClients"`
				ClientCAFile   string              `json:"clientCAFile"`
				Scopes         map[string][]string `json:"scopes"`
			} `json:"weida"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(out), &doc); err != nil || code != exitOK || len(doc.Resources) != 1 {
		t.Fatalf("check --output json: exit %d, %v\n%s%s", code, err, out, errOut)
	}
	w := doc.Resources[0].Weida
	if !slices.Equal(w.AllowedClients, []string{fp, "uri:spiffe://plant-a/dash", "cn:ops"}) ||
		!strings.HasSuffix(w.ClientCAFile, "client-ca.pem") || len(w.Scopes["uri:spiffe://plant-a/dash"]) != 1 {
		t.Errorf("weida = %+v", w)
	}
}
