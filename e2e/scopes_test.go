package e2e

import (
	"context"
	"fmt"
	"maps"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// collectWeidaAs is collectWeida presenting the client certificate in
// certFile and keyFile.
func collectWeidaAs(t *testing.T, url, certFile, keyFile string, filters ...string) *weidaCollector {
	t.Helper()
	c := &weidaCollector{
		t:       t,
		url:     url,
		cfg:     weida.DialConfig{InsecureSkipVerifyForTesting: true, CertFile: certFile, KeyFile: keyFile},
		filters: filters,
		done:    make(chan struct{}),
	}
	sub, err := c.dial(ctx(t, 20*time.Second))
	if err != nil {
		t.Fatalf("weida subscriber on %s: %v", url, err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go c.run(rctx, sub)
	t.Cleanup(c.Close)
	return c
}

// TestMQTTEndpointScopes: with the real binary and Mosquitto, a client
// scoped to <u>.plant.a.# is refused <u>.#, <u>.plant.# and # (counted,
// logged with its fingerprint), an unlisted client is refused, keeps its connection, is replayed only the retained value
// within its scope and receives only live messages within it, while a bare
// client gets everything; a reload that narrows the scope drops the
// subscription on the live connection.
func TestMQTTEndpointScopes(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	retain(t, pub, u+"/plant/a/x", "ax")
	retain(t, pub, u+"/plant/b/y", "by")

	aCert, aKey, aFP := weidaCert(t, t.TempDir())
	bCert, bKey, bFP := weidaCert(t, t.TempDir())
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/plant", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-scoped", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes:    []mqttRoute{{"all", u + "/#"}},
		LastValue: "mode: retained\nmaxTopics: 100",
	}
	withScopes := func(scope string) string {
		y := res.YAML(t)
		listen := "    listen: " + endpoint + "\n"
		if !strings.Contains(y, listen) {
			t.Fatalf("no listen line in\n%s", y)
		}
		return strings.Replace(y, listen, listen+fmt.Sprintf("    allowedClients:\n      - %s\n      - client: %s\n        scopes: [%q]\n", bFP, aFP, scope), 1)
	}
	dir := t.TempDir()
	file := writeFile(t, dir, "scoped.yaml", withScopes(u+".plant.a.#"))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	Eventually(t, 20*time.Second, "the two retained values cached", func() bool {
		st, _ := c.Status("mqtt-scoped")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 2
	})

	// The bare client first, so that the scoped client's probes below
	// do not reach it while its replay is counted.
	b := collectWeidaAs(t, endpoint, bCert, bKey, u+".#")
	got := replayed(t, b, 2, "probe-b", func() { pub.publish(t, 1, u+"/plant/b/probe", "probe-b") })
	if want := map[string]string{u + ".plant.a.x": "ax", u + ".plant.b.y": "by"}; !maps.Equal(got, want) {
		t.Fatalf("the bare client was replayed %v, want %v", got, want)
	}
	// Refused: the test's whole namespace, plant.# within it, and #.
	a := collectWeidaAs(t, endpoint, aCert, aKey, u+".#", u+".plant.#", "#", u+".plant.a.#")
	got = replayed(t, a, 1, "probe-a", func() { pub.publish(t, 1, u+"/plant/a/probe", "probe-a") })
	if want := map[string]string{u + ".plant.a.x": "ax"}; !maps.Equal(got, want) {
		t.Fatalf("the scoped client was replayed %v, want %v", got, want)
	}
	refused := `weida_connector_weida_scope_refusals_total{reason="not-covered",resource="mqtt-scoped"}`
	Eventually(t, 10*time.Second, "the three refusals counted", func() bool { return c.Metric(refused) == 3 })
	if !strings.Contains(c.Output(), "client="+aFP) || !strings.Contains(c.Output(), "filter="+u+".#") {
		t.Errorf("no refusal line naming the client and the filter in the log:\n%s", c.Output())
	}

	// A client allowedClients does not list is refused at the handshake.
	uCert, uKey, _ := weidaCert(t, t.TempDir())
	if sub, err := weida.Dial(ctx(t, 10*time.Second), endpoint, weida.DialConfig{InsecureSkipVerifyForTesting: true, CertFile: uCert, KeyFile: uKey}); err == nil {
		_ = sub.Close()
		t.Fatal("a client allowedClients does not list was admitted")
	}

	// Live: plant.b reaches b, never a.
	pub.publish(t, 1, u+"/plant/b/live", "b-live")
	Eventually(t, 10*time.Second, "b-live at the bare client", func() bool { return b.Has(u+".plant.b.live", "b-live") })
	Eventually(t, 10*time.Second, "probe-a2 at the scoped client", func() bool {
		pub.publish(t, 1, u+"/plant/a/probe", "probe-a2")
		time.Sleep(100 * time.Millisecond)
		return a.hasPayload("probe-a2")
	})
	for _, m := range a.Messages() {
		if !strings.HasPrefix(m.Topic, u+".plant.a.") {
			t.Fatalf("the scoped client received %s", m.Topic)
		}
	}

	// Narrow the scope: a's plant.a.# is dropped on its live connection.
	writeFile(t, dir, "scoped.yaml", withScopes(u+".plant.a.x"))
	c.Signal(syscall.SIGHUP)
	revoked := `weida_connector_weida_scope_refusals_total{reason="revoked",resource="mqtt-scoped"}`
	Eventually(t, 30*time.Second, "the revocation counted", func() bool { return c.Metric(revoked) == 1 })
	c.WaitReady(30 * time.Second)
	a.Reset()
	pub.publish(t, 1, u+"/plant/a/after", "a-after")
	Eventually(t, 10*time.Second, "a-after at the bare client", func() bool { return b.Has(u+".plant.a.after", "a-after") })
	time.Sleep(300 * time.Millisecond) // a's copy, were it sent, would have been on its way with b's
	if a.Len() != 0 {
		t.Fatalf("after the scope narrowed, the scoped client received %v", a.Messages())
	}
	if a.Dials() != 1 {
		t.Errorf("the scoped client dialled %d times: the reload closed its connection", a.Dials())
	}
}
