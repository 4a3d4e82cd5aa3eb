package e2e

import (
	"fmt"
	"io"
	"maps"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestNATSLastValuePersist: a core NATS resource (its broker keeps
// nothing) with lastValue {mode: all, persist: true} keeps its cache in
// --state-dir: stopped and started again, the connector replays to a late
// subscriber what was bridged before the stop, though nothing was
// published since. A first start without the file, and a start with the
// file damaged, begin with an empty cache and bridge as usual; the damage
// is counted in /metrics and logged.
func TestNATSLastValuePersist(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	nc := natsConn(t, natsAddr)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/persist", freePort(t, "udp"))
	res := natsResource{
		Name: "nats-persist", Direction: policy.Inbound, Endpoint: endpoint,
		Routes: []string{u + ".*"}, LastValue: "mode: all\npersist: true",
	}
	file := writeFile(t, t.TempDir(), "p.yaml", res.YAML(t))
	state := t.TempDir()
	cacheFile := filepath.Join(state, "lastvalue", "nats-persist.cbor")
	publish := func(subject, payload string) {
		t.Helper()
		if err := nc.Publish(u+"."+subject, []byte(payload)); err != nil {
			t.Fatal(err)
		}
		if err := nc.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	start := func() *Connector {
		c := StartConnector(t, nil, "-f", file, "--state-dir", state)
		c.WaitReady(30 * time.Second)
		return c
	}
	// late subscribes and returns what was replayed, the probe (cached
	// too, once sent) left out.
	late := func(want map[string]string) {
		t.Helper()
		sub := collectWeida(t, endpoint, weida.Limits{}, u+".#")
		defer sub.Close()
		got := replayed(t, sub, len(want), "probe", func() { publish("probe", "probe") })
		delete(got, u+".probe")
		if !maps.Equal(got, want) {
			t.Fatalf("replayed %v, want %v", got, want)
		}
	}

	// Without the file: an empty cache.
	c := start()
	late(map[string]string{})
	publish("a", "1")
	publish("b", "1")
	publish("a", "2")
	Eventually(t, 20*time.Second, "three bridged", func() bool {
		st, _ := c.Status("nats-persist")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 3 // a, b, probe
	})
	if code := c.Stop(); code != 0 {
		t.Fatalf("the connector stopped with %d:\n%s", code, c.Output())
	}
	if _, err := os.Stat(cacheFile); err != nil {
		t.Fatalf("no cache file after the stop: %v", err)
	}

	// With the file: the values come back, nothing published since.
	c = start()
	late(map[string]string{u + ".a": "2", u + ".b": "1"})
	if code := c.Stop(); code != 0 {
		t.Fatalf("the connector stopped with %d:\n%s", code, c.Output())
	}

	// A damaged file: counted, logged, an empty cache, bridging goes on.
	if err := os.WriteFile(cacheFile, []byte("\xa1\x00garbage"), 0o600); err != nil {
		t.Fatal(err)
	}
	c = start()
	late(map[string]string{})
	if m := metricsText(t, c); !strings.Contains(m, `weida_connector_last_value_restore_failures_total{reason="malformed",resource="nats-persist"} 1`) {
		t.Errorf("the damaged file is not counted:\n%s", grepLines(m, "restore_failures"))
	}
	if out := c.Output(); !strings.Contains(out, "the saved last-value cache cannot be used") {
		t.Errorf("the damaged file is not logged:\n%s", out)
	}
	publish("c", "1")
	Eventually(t, 20*time.Second, "bridging after a damaged file", func() bool {
		st, _ := c.Status("nats-persist")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 2 // probe, c
	})
}

func metricsText(t *testing.T, c *Connector) string {
	t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		t.Fatalf("reading /metrics: %v", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func grepLines(s, sub string) string {
	var out []string
	for l := range strings.SplitSeq(s, "\n") {
		if strings.Contains(l, sub) {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
