package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
)

// TestAMQPRefusedBindingKeysStartNothing: a binding key with `#` before a
// literal word, and the empty binding key, have no exact weida form; one
// resource holding them makes `connector run` exit 1 with both diagnostics,
// and nothing starts: not the admin listener, and not the valid resource,
// whose durable queue is never declared.
func TestAMQPRefusedBindingKeysStartNothing(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	u := unique()
	goodQueue := "e2e-good-" + u
	good := amqpResource{
		Name: "good", Direction: policy.Inbound, QueueName: goodQueue, Durable: true,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/good", freePort(t, "udp")),
		Routes:   []amqpRoute{{"", "audit.events.#"}},
	}
	bad := amqpResource{
		Name: "bad", Direction: policy.Inbound,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/bad", freePort(t, "udp")),
		Routes:   []amqpRoute{{"", "#.leaf"}, {"", ""}, {"", "orders.#"}},
	}
	content := good.YAML(t) + "---\n" + bad.YAML(t)
	file := writeFile(t, t.TempDir(), "mixed.yaml", content)
	deleteQueueAtEnd(t, rabbitAddr, goodQueue)

	c := StartConnector(t, amqpEnv, "-f", file)
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
		fmt.Sprintf("%s:%s  spec.routes[0].filter", file, position(t, content, `"#.leaf"`, 1)),
		"[" + policy.RuleAMQPHashThenLiteral + "]",
		fmt.Sprintf("%s:%s  spec.routes[1].filter", file, position(t, content, `""`, 1)),
		"[" + policy.RuleAMQPEmptyBindingKey + "]",
		"1 valid, 1 invalid (2 errors)",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	if resp, err := http.Get("http://" + c.Admin + "/healthz"); err == nil {
		resp.Body.Close()
		t.Errorf("the admin listener answered after a refused start")
	}
	client := amqpConnect(t, rabbitAddr)
	if d := client.queueDepth(goodQueue); d != -1 {
		t.Errorf("the valid resource's queue %s was declared (depth %d) by a refused start", goodQueue, d)
	}
}
