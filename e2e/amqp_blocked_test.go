package e2e

import (
	"fmt"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestAMQPBlockedPublishingHeld: when RabbitMQ blocks publishers (a memory
// alarm, raised here by setting the watermark to zero on a private node),
// the outbound connector reports Blocked, holds what weida sends instead of
// dropping it, and publishes all of it once the broker unblocks. The
// resource uses a virtual host whose name needs escaping.
func TestAMQPBlockedPublishingHeld(t *testing.T) {
	rb := brokertest.StartRabbit(t)
	u := unique()
	// A virtual host whose name needs escaping in the URL, to check that
	// the resource's vhost reaches the broker intact. (Not a '/': package
	// resources refuses %2F in the path although its hint suggests it.)
	const vhost, vhostPath = "e2e vh:1", "e2e%20vh:1"
	rb.RabbitCtl("add_vhost", vhost)
	rb.RabbitCtl("set_permissions", "-p", vhost, "guest", ".*", ".*", ".*")
	addr := rb.Addr() + "/" + vhostPath
	client := amqpConnect(t, addr)
	exchange := "e2e-" + u
	client.declareExchange(t, exchange)
	got := amqpCollect(t, addr, exchange, "orders.#")
	wpub, url := weidaPublisher(t, "/orders")
	res := amqpResource{
		Name: "amqp-blocked", Direction: policy.Outbound, Broker: rb.Addr(), VHost: vhostPath, Exchange: exchange,
		Endpoint: url, Routes: []amqpRoute{{"orders", "orders.#"}},
	}
	file := writeFile(t, t.TempDir(), "out.yaml", res.YAML(t))
	c := StartConnector(t, amqpEnv, "-f", file)
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)
	publish := func(topic, payload string) {
		t.Helper()
		if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: topic, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	Eventually(t, 20*time.Second, "the outbound subscription", func() bool {
		publish("orders.probe", "probe")
		time.Sleep(50 * time.Millisecond)
		return got.Len() > 0
	})

	rb.RabbitCtl("set_vm_memory_high_watermark", "0")
	t.Cleanup(func() { rb.RabbitCtl("set_vm_memory_high_watermark", "0.4") })
	// RabbitMQ blocks a connection (and says so) when it next publishes.
	triggers := 0
	Eventually(t, 30*time.Second, "the connector to report the broker blocking it", func() bool {
		publish("orders.trigger", fmt.Sprintf("trigger-%d", triggers))
		triggers++
		time.Sleep(100 * time.Millisecond)
		st, _ := c.Status("amqp-blocked")
		s, reason := condition(st, "BrokerConnected")
		return s == "True" && reason == "Blocked"
	})
	base, _ := c.Status("amqp-blocked")
	before := got.Len()
	const n = 20
	for i := range n {
		publish(fmt.Sprintf("orders.%d", i), fmt.Sprintf("held-%d", i))
	}
	Eventually(t, 20*time.Second, "the connector to take every message from weida", func() bool {
		st, _ := c.Status("amqp-blocked")
		return st.Counters.Received-base.Counters.Received == n
	})
	st, _ := c.Status("amqp-blocked")
	if b, d := st.Counters.Bridged-base.Counters.Bridged, settled(st)-settled(base); b != 0 || d != 0 {
		t.Fatalf("while blocked: %d bridged, %d settled; want 0 (held)", b, d)
	}
	if got.Len() != before {
		t.Fatalf("the consumer received %d messages while publishing was blocked", got.Len()-before)
	}

	rb.RabbitCtl("set_vm_memory_high_watermark", "0.4")
	Eventually(t, 60*time.Second, "every held message at the AMQP consumer", func() bool {
		have := map[string]bool{}
		for _, d := range got.Messages() {
			have[string(d.Body)] = true
		}
		for i := range n {
			if !have[fmt.Sprintf("held-%d", i)] {
				return false
			}
		}
		for i := range triggers {
			if !have[fmt.Sprintf("trigger-%d", i)] {
				return false
			}
		}
		return true
	})
	st, _ = c.Status("amqp-blocked")
	if s, reason := condition(st, "BrokerConnected"); s != "True" || reason != "Connected" {
		t.Errorf("BrokerConnected = %s (%s) after unblocking", s, reason)
	}
	if len(st.Counters.Dropped) != 0 {
		t.Errorf("dropped while blocked: %v", st.Counters.Dropped)
	}
}
