package e2e

import (
	"fmt"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTSessionLostReported: an inbound resource with a persistent
// session (clean start false, a session expiry) whose session another
// client destroys while the connector is away (it connects with the
// connector's client ID and clean start, then leaves with session expiry
// 0) reports on reconnecting that the broker had no session: a Warn log
// line, the BrokerConnected condition's reason SessionLost with a message
// saying what may have been lost, and weida_connector_sessions_lost_total,
// which was 0 before. The resource's first connection, which finds no
// session either, is not a loss.
//
// The connector is stopped with SIGSTOP while the other client takes the
// session, so that it cannot reconnect in between and take the other
// client's session over (which the broker would report as present).
func TestMQTTSessionLostReported(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	clientID := "sesslost-" + u
	res := mqttResource{
		Name: "sesslost", Direction: policy.Inbound, QoS: 1, ClientID: clientID, SessionExpiry: "5m",
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/sesslost", freePort(t, "udp")),
		Routes:   []mqttRoute{{"r", u + "/+"}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "r.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	metric := `weida_connector_sessions_lost_total{resource="sesslost"}`
	if v := c.Metric(metric); v != 0 {
		t.Fatalf("%s = %v after the first connection, want 0 (present from the start, and the first connection is no loss)", metric, v)
	}
	st, _ := c.Status("sesslost")
	sub := collectWeida(t, st.SubscriberURL, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/probe", "probe-"+u) })

	c.Signal(syscall.SIGSTOP)
	stopped := true
	t.Cleanup(func() {
		if stopped {
			c.Signal(syscall.SIGCONT)
		}
	})
	// The intruder takes the session with clean start, which destroys it,
	// and leaves with expiry 0, so the broker keeps none.
	intruder, err := mqttDialSession(ctx(t, 10*time.Second), mosquittoAddr, clientID, 0, nil)
	if err != nil {
		t.Fatalf("connecting with the connector's client ID: %v", err)
	}
	intruder.close()
	// Published while the connector has no session: lost at the broker.
	pub.publish(t, 1, u+"/gone", "while the session was gone")
	c.Signal(syscall.SIGCONT)
	stopped = false

	Eventually(t, 30*time.Second, metric+" to count the lost session", func() bool { return c.Metric(metric) == 1 })
	st, _ = c.Status("sesslost")
	var msg string
	for _, cond := range st.Conditions {
		if cond.Type == "BrokerConnected" {
			if cond.Status != "True" || cond.Reason != "SessionLost" {
				t.Errorf("BrokerConnected is %s/%s after the lost session; want True/SessionLost", cond.Status, cond.Reason)
			}
			msg = cond.Message
		}
	}
	if !strings.Contains(msg, "no session") || !strings.Contains(msg, "while it was disconnected") {
		t.Errorf("the BrokerConnected message does not say what may be lost: %q", msg)
	}
	Eventually(t, 10*time.Second, "the warning in the log", func() bool {
		return strings.Contains(c.Output(), "the broker did not resume the connector's session")
	})
	// The resource bridges again on its new session.
	sub.Sync(20*time.Second, "after-"+u, func() { pub.publish(t, 1, u+"/after", "after-"+u) })
	if sub.Has(u+"/gone", "while the session was gone") {
		t.Log("the message published while the session was gone arrived after all")
	}
}
