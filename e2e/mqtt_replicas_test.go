package e2e

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTReplicasShareAGroup: two connector processes run the same file, a
// resource with a shared subscription whose clientID names ${REPLICA}. Each
// gets its own MQTT session, so they split the messages between them
// instead of taking one session from each other.
func TestMQTTReplicasShareAGroup(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	res := mqttResource{
		Name: "mqtt-replicated", Direction: policy.Inbound, QoS: 1, SharedGroup: "g-" + u,
		ClientID: "replica-" + u + "-${REPLICA}",
		Routes:   []mqttRoute{{"r", u + "/+"}},
	}
	var subs []*weidaCollector
	var conns []*Connector
	for _, replica := range []string{"a", "b"} {
		// Each replica listens on its own port, as two hosts would.
		res.Endpoint = fmt.Sprintf("weida://127.0.0.1:%d/replicated", freePort(t, "udp"))
		c := StartConnector(t, []string{"REPLICA=" + replica}, "-f", writeFile(t, t.TempDir(), "r.yaml", res.YAML(t)))
		c.WaitReady(30 * time.Second)
		conns = append(conns, c)
		subs = append(subs, collectWeida(t, res.Endpoint, weida.Limits{}, "#"))
	}
	// A weida SUBSCRIBE has no acknowledgement: wait until each replica's
	// endpoint counts its subscriber.
	for i, c := range conns {
		Eventually(t, 10*time.Second, fmt.Sprintf("replica %d's weida subscriber", i), func() bool {
			st, ok := c.Status("mqtt-replicated")
			return ok && st.Counters.Subscribers == 1
		})
	}
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	const n = 40
	for i := range n {
		pub.publish(t, 1, fmt.Sprintf("%s/m%d", u, i), "x")
	}
	seen := map[string]int{}
	Eventually(t, 20*time.Second, "every message bridged by one replica", func() bool {
		clear(seen)
		for _, s := range subs {
			for _, m := range s.Messages() {
				seen[m.Topic]++
			}
		}
		return len(seen) >= n
	})
	for topic, k := range seen {
		if k != 1 {
			t.Errorf("%s bridged %d times", topic, k)
		}
	}
	for i, s := range subs {
		if s.Len() == 0 {
			t.Errorf("replica %d bridged nothing: the group did not split the messages", i)
		}
	}
	for i, c := range conns {
		if k := strings.Count(c.Output(), "broker connected"); k != 1 {
			t.Errorf("replica %d connected %d times; the replicas took the session from each other:\n%s", i, k, c.Output())
		}
	}
	t.Logf("messages per replica: %d and %d", subs[0].Len(), subs[1].Len())
}
