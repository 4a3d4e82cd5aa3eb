package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTBrokerRestartLosesNothing publishes at QoS 1 while the broker is
// stopped (SIGTERM, twice mid-stream) and killed (SIGKILL, once) and
// started again: the connector reconnects on its own, resumes its
// persistent session, and a weida subscriber receives every message (at
// least once: duplicates are QoS 1's right).
func TestMQTTBrokerRestartLosesNothing(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/restart", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-restart", Direction: policy.Inbound, QoS: 1, Broker: broker.Addr(),
		Endpoint: endpoint, SessionExpiry: "300s",
		Routes: []mqttRoute{{"all", u + "/#"}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "restart.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := &resilientPublisher{t: t, addr: broker.Addr(), id: "pub-" + u}
	sub.Sync(20*time.Second, "probe", func() { pub.publish(u+"/probe", "probe") })

	distinct := func() map[string]int {
		seen := make(map[string]int)
		for _, m := range sub.Messages() {
			seen[string(m.Payload)]++
		}
		return seen
	}
	const n = 400
	for i := range n {
		switch i {
		case n / 4, 3 * n / 4:
			// Mid-stream: messages may be in flight to the connector,
			// unacknowledged; the broker saves them with the session.
			broker.Stop()
			broker.Start()
		case n / 2:
			// A crash loses what Mosquitto had not saved, which is the
			// broker's durability, not the connector's: kill it once
			// what it acknowledged so far has crossed, and check that
			// the connector comes back and loses nothing after.
			Eventually(t, 30*time.Second, "the first half at the weida subscriber", func() bool { return len(distinct()) >= i })
			broker.Restart()
		}
		pub.publish(fmt.Sprintf("%s/m/%d", u, i%7), fmt.Sprintf("m-%03d", i))
		// A short pause keeps the stream going across the restarts
		// instead of finishing between two of them.
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("publisher reconnected %d times", pub.reconnects)

	Eventually(t, 60*time.Second, fmt.Sprintf("all %d messages at the weida subscriber", n), func() bool {
		seen := distinct()
		for i := range n {
			if seen[fmt.Sprintf("m-%03d", i)] == 0 {
				return false
			}
		}
		return true
	})
	dups := 0
	for p, k := range distinct() {
		if k > 1 {
			dups += k - 1
		}
		if len(p) > 0 && p[0] != 'm' && p != "probe" {
			t.Errorf("unexpected payload %q", p)
		}
	}
	t.Logf("%d messages, %d duplicates (QoS 1 redelivery), weida subscriber dialled %d times", n, dups, sub.Dials())

	st, _ := c.Status("mqtt-restart")
	if st.Counters.Reconnects == 0 {
		t.Errorf("status reconnects = 0 after two broker restarts:\n%s", c.StatusJSON())
	}
	if v := c.Metric(`weida_connector_reconnects_total{resource="mqtt-restart",side="broker"}`); v < 1 {
		t.Errorf("metric reconnects_total{side=broker} = %v, want > 0", v)
	}
	Eventually(t, 20*time.Second, "the connector ready again", func() bool {
		st, _ := c.Status("mqtt-restart")
		return st.ready()
	})
}

// resilientPublisher publishes at QoS 1 and, when the broker goes away,
// connects again and republishes until the broker acknowledges: once
// publish returns, the broker has taken responsibility for the message.
type resilientPublisher struct {
	t          testing.TB
	addr, id   string
	c          *mqttClient
	reconnects int
}

func (p *resilientPublisher) publish(topic, payload string) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p.c == nil {
			c, err := mqttDial(ctx(p.t, 5*time.Second), p.addr, p.id, func(mqttMsg) {})
			if err == nil {
				p.c = c
				p.t.Cleanup(c.close)
			}
		}
		if p.c != nil {
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := p.c.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
			cancel()
			if err == nil && (resp == nil || resp.ReasonCode < 0x80) {
				return
			}
			p.c.close()
			p.c = nil
			p.reconnects++
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("could not publish %q within 30 s", topic)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
