package e2e

import (
	"bytes"
	"context"
	"fmt"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTSlowWeidaSubscriber: a weida subscriber that does not read gets
// its copies dropped, counted in /status and /metrics, once its 64 KiB
// budget (limits.bufferBytes) is full, while a subscriber that reads gets
// every message. The accounting is exact: what the slow one finally reads
// plus what was dropped for it is every message.
func TestMQTTSlowWeidaSubscriber(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/slow", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-slow", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		Routes:          []mqttRoute{{"all", u + "/#"}},
		MaxMessageBytes: "16KiB", BufferBytes: "64KiB",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "slow.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)

	fast := collectWeida(t, endpoint, weida.Limits{}, u+".#")
	// The slow subscriber reads nothing until the end, and its QUIC
	// windows are small, so its copies pile up in the connector's queue.
	slow, err := weida.Dial(ctx(t, 10*time.Second), endpoint, weida.DialConfig{
		InsecureSkipVerifyForTesting: true,
		Limits: weida.Limits{
			MaxConcurrentUniStreams: 2,
			StreamReceiveWindow:     16 << 10,
			ConnectionReceiveWindow: 32 << 10,
		},
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { slow.Close() })
	if err := slow.Subscribe(ctx(t, 10*time.Second), u+".#"); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, "two weida subscribers", func() bool {
		st, _ := c.Status("mqtt-slow")
		return st.Counters.Subscribers == 2
	})
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)

	const n = 150
	payload := bytes.Repeat([]byte("x"), 8<<10)
	for i := range n {
		copy(payload, fmt.Sprintf("%04d", i))
		pub.publish(t, 1, u+"/data", string(payload))
		// Paced by the fast subscriber, at most a few messages ahead of
		// what it has read, so that its 64 KiB never fill however busy
		// the machine is (a fixed pause did not hold under the fault
		// suite's load); the slow one fills whatever the pace.
		ahead := time.Now().Add(10 * time.Second)
		for fast.Len() < i-3 && time.Now().Before(ahead) {
			time.Sleep(time.Millisecond)
		}
	}
	Eventually(t, 30*time.Second, "every message bridged", func() bool {
		st, _ := c.Status("mqtt-slow")
		return st.Counters.Bridged == n
	})
	Eventually(t, 30*time.Second, fmt.Sprintf("%d messages at the fast subscriber", n), func() bool { return fast.Len() >= n })
	seen := make(map[string]bool)
	for _, m := range fast.Messages() {
		seen[string(m.Payload[:4])] = true
	}
	if len(seen) != n {
		t.Errorf("fast subscriber got %d distinct messages, want %d", len(seen), n)
	}

	st, _ := c.Status("mqtt-slow")
	if st.Counters.Dropped["subscriber-buffer-full"] == 0 {
		t.Fatalf("no subscriber-buffer-full drops counted:\n%s", c.StatusJSON())
	}
	dropped := c.Metric(`weida_connector_weida_copies_total{outcome="dropped",resource="mqtt-slow"}`)
	queued := c.Metric(`weida_connector_weida_copies_total{outcome="queued",resource="mqtt-slow"}`)
	if dropped <= 0 || queued+dropped != 2*n {
		t.Errorf("copies queued %v + dropped %v, want %d in all with some dropped", queued, dropped, 2*n)
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="subscriber-buffer-full",resource="mqtt-slow",route="all"}`); v != dropped {
		t.Errorf("messages_dropped_total{reason=subscriber-buffer-full} = %v, want the %v dropped copies", v, dropped)
	}

	// Now the slow subscriber reads what was queued for it.
	got := 0
	for float64(got)+dropped < n {
		rctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		_, err := slow.Receive(rctx)
		cancel()
		if err != nil {
			t.Fatalf("slow subscriber after %d copies (%v dropped): %v", got, dropped, err)
		}
		got++
	}
	t.Logf("%d messages: fast subscriber got all; slow subscriber got %d, %v dropped", n, got, dropped)
}
