package e2e

import (
	"context"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTRefusedResourceStartsNothing: one refused resource among valid
// ones makes `connector run` exit 1 with every diagnostic (file:line:col,
// field, rule), and nothing starts: not the admin listener, not the valid
// resource's weida endpoint.
func TestMQTTRefusedResourceStartsNothing(t *testing.T) {
	dir := t.TempDir()
	u := unique()
	goodEndpoint := fmt.Sprintf("weida://127.0.0.1:%d/good", freePort(t, "udp"))
	good := mqttResource{
		Name: "good", Direction: policy.Inbound, QoS: 1, Endpoint: goodEndpoint,
		Routes: []mqttRoute{{"", u + "/+"}},
	}
	bad := mqttResource{
		Name: "bad", Direction: policy.Inbound, QoS: 2,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/bad", freePort(t, "udp")),
		Routes:   []mqttRoute{{"", u + "/b.c/+"}, {"", u + "/*"}, {"", u + "/ok/#"}},
	}
	content := mqttYAML(t, good, bad)
	file := writeFile(t, dir, "mixed.yaml", content)

	c := StartConnector(t, nil, "-f", file)
	code, exited := c.Wait(30 * time.Second)
	if !exited {
		t.Fatalf("connector run kept running with a refused resource:\n%s", c.Output())
	}
	if code != 1 {
		t.Errorf("exit code %d, want 1", code)
	}
	out := c.Output()
	for _, want := range []string{
		"refusing to start; nothing was started",
		fmt.Sprintf("%s:%s  spec.broker.mqtt.qos", file, position(t, content, "qos: 2", 1)),
		"[mqtt-qos-2]",
		fmt.Sprintf("%s:%s  spec.routes[0].filter", file, position(t, content, `"`+u+`/b.c/+"`, 1)),
		"[mqtt-dotted-level]",
		fmt.Sprintf("%s:%s  spec.routes[1].filter", file, position(t, content, `"`+u+`/*"`, 1)),
		"[mqtt-star-level]",
		"1 valid, 1 invalid (3 errors)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Nothing was started: the admin port never answered, and the valid
	// resource's endpoint does not exist.
	if resp, err := http.Get("http://" + c.Admin + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the admin listener answered after a refused start")
	}
	if strings.Contains(out, "admin listener up") || strings.Contains(out, "weida listener up") {
		t.Errorf("something started:\n%s", out)
	}
	dctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
	defer cancel()
	if sub, err := weida.Dial(dctx, goodEndpoint, weida.DialConfig{InsecureSkipVerifyForTesting: true}); err == nil {
		sub.Close()
		t.Errorf("the valid resource's weida endpoint answered after a refused start")
	}
}

// position returns "line:column" (1-based) of the n-th occurrence of s in
// content: where the loader points its diagnostics (the value).
func position(t testing.TB, content, s string, n int) string {
	t.Helper()
	off := -1
	for range n {
		i := strings.Index(content[off+1:], s)
		if i < 0 {
			t.Fatalf("%q occurs fewer than %d times", s, n)
		}
		off += 1 + i
	}
	if strings.HasPrefix(s, "qos: ") {
		off += len("qos: ")
	}
	line := strings.Count(content[:off], "\n") + 1
	col := off - strings.LastIndexByte(content[:off], '\n')
	return fmt.Sprintf("%d:%d", line, col)
}
