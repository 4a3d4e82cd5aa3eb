package e2e

import (
	"fmt"
	"net"
	"os"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTReload: SIGHUP applies a rewritten file live (a route added, a
// route removed), and a rewritten file that does not check leaves the
// running set as it was.
func TestMQTTReload(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/reload", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-reload", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		ClientID: "reload-" + u, // the same session before and after the reload
		Routes:   []mqttRoute{{"a", u + "/a/+"}},
	}
	dir := t.TempDir()
	file := writeFile(t, dir, "reload.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-a", func() { pub.publish(t, 1, u+"/a/probe", "probe-a") })
	pub.publish(t, 1, u+"/a/1", "before")
	pub.publish(t, 1, u+"/b/1", "before")
	Eventually(t, 10*time.Second, "route a bridging", func() bool { return sub.Has(u+".a.1", "before") })

	// Replace route a by route b.
	res.Routes = []mqttRoute{{"b", u + "/b/#"}}
	writeFile(t, dir, "reload.yaml", res.YAML(t))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "the reload applied", func() bool { return strings.Contains(c.Output(), "reload applied") })
	c.WaitReady(30 * time.Second)
	sub.Sync(20*time.Second, "probe-b", func() { pub.publish(t, 1, u+"/b/probe", "probe-b") })
	c.Quiesce("mqtt-reload")
	base, _ := c.Status("mqtt-reload")
	pub.publish(t, 1, u+"/a/2", "after")
	pub.publish(t, 1, u+"/b/2/deep", "after")
	Eventually(t, 10*time.Second, "route b bridging", func() bool { return sub.Has(u+".b.2.deep", "after") })
	// The resumed session still held route a's subscription; the new
	// Source withdrew it once connected, so the broker no longer sends
	// route a's messages at all (not even to be counted as no-route).
	Eventually(t, 10*time.Second, "every message settled", func() bool {
		st, _ := c.Status("mqtt-reload")
		return st.Counters.Received == st.Counters.Bridged+dropTotal(st.Counters.Dropped)
	})
	st, _ := c.Status("mqtt-reload")
	if sub.Has(u+".a.2", "after") {
		t.Errorf("the removed route still bridges")
	}
	if n := st.Counters.Dropped["no-route"] - base.Counters.Dropped["no-route"]; n != 0 || st.Counters.Received-base.Counters.Received != 1 {
		t.Errorf("after the reload: received %d, no-route drops %d; want only route b's message:\n%s",
			st.Counters.Received-base.Counters.Received, n, c.StatusJSON())
	}
	if !strings.Contains(c.Output(), "withdrew the subscriptions of routes a reload removed") {
		t.Errorf("the withdrawal is not logged:\n%s", c.Output())
	}
	// The endpoint itself was not restarted: its subscribers stayed
	// connected, and its generated certificate (the fingerprint they
	// pinned) did not change.
	if sub.Dials() != 1 || strings.Count(c.Output(), "weida listener up") != 1 {
		t.Errorf("the reload restarted the weida endpoint: subscriber dialled %d times; log:\n%s", sub.Dials(), c.Output())
	}

	// A file that does not check: the reload is refused, route b runs on.
	bad := res
	bad.Routes = []mqttRoute{{"b", u + "/b/#"}, {"c", u + "/c.d/+"}}
	writeFile(t, dir, "reload.yaml", bad.YAML(t))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "the reload refused", func() bool { return strings.Contains(c.Output(), "reload refused") })
	if !strings.Contains(c.Output(), "mqtt-dotted-level") {
		t.Errorf("the refused reload does not say why:\n%s", c.Output())
	}
	pub.publish(t, 1, u+"/b/3", "still")
	Eventually(t, 10*time.Second, "route b still bridging", func() bool { return sub.Has(u+".b.3", "still") })
	if st, ok := c.Status("mqtt-reload"); !ok || !st.ready() {
		t.Errorf("the resource is not running and ready after a refused reload:\n%s", c.StatusJSON())
	}

	// Removing the file's only resource is refused too (nothing to run);
	// the process keeps running what it has.
	if err := os.WriteFile(file, []byte("# empty\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "the second reload refused", func() bool { return strings.Count(c.Output(), "reload refused") == 2 })
	pub.publish(t, 1, u+"/b/4", "still")
	Eventually(t, 10*time.Second, "route b still bridging", func() bool { return sub.Has(u+".b.4", "still") })
}

// TestMQTTReloadRetiresRemovedResource: a reload that removes an inbound
// MQTT resource withdraws its subscriptions before disconnecting, so the
// session the broker keeps for its client ID (until sessionExpiry) collects
// nothing for a bridge that is gone.
func TestMQTTReloadRetiresRemovedResource(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	keep := mqttResource{
		Name: "mqtt-keep", Direction: policy.Inbound, QoS: 1, ClientID: "keep-" + u,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/keep", freePort(t, "udp")),
		Routes:   []mqttRoute{{"k", u + "/keep/+"}},
	}
	gone := mqttResource{
		Name: "mqtt-gone", Direction: policy.Inbound, QoS: 1, ClientID: "gone-" + u,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/gone", freePort(t, "udp")),
		Routes:   []mqttRoute{{"g", u + "/gone/+"}},
	}
	dir := t.TempDir()
	file := writeFile(t, dir, "two.yaml", keep.YAML(t)+"---\n"+gone.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)

	writeFile(t, dir, "two.yaml", keep.YAML(t))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "the reload applied", func() bool { return strings.Contains(c.Output(), "reload applied") })
	if !strings.Contains(c.Output(), "withdrew the subscriptions of a removed resource") {
		t.Fatalf("the removed resource's subscriptions were not withdrawn:\n%s", c.Output())
	}
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	pub.publish(t, 1, u+"/gone/1", "after removal")

	// Resume the removed resource's session: it still exists (the
	// connector left it to expire), but holds no subscription, so the
	// broker kept nothing for it.
	got := make(chan string, 4)
	conn, err := net.Dial("tcp", mosquittoAddr)
	if err != nil {
		t.Fatal(err)
	}
	cli := paho.NewClient(paho.ClientConfig{ClientID: gone.ClientID, Conn: conn,
		OnPublishReceived: []func(paho.PublishReceived) (bool, error){func(pr paho.PublishReceived) (bool, error) {
			got <- pr.Packet.Topic
			return true, nil
		}}})
	expiry := uint32(0)
	ca, err := cli.Connect(ctx(t, 10*time.Second), &paho.Connect{ClientID: gone.ClientID, KeepAlive: 30,
		Properties: &paho.ConnectProperties{SessionExpiryInterval: &expiry}})
	if err != nil {
		t.Fatal(err)
	}
	defer cli.Disconnect(&paho.Disconnect{})
	if !ca.SessionPresent {
		t.Fatalf("the removed resource's session is gone; the test cannot tell whether its subscriptions were withdrawn")
	}
	select {
	case topic := <-got:
		t.Errorf("the broker kept %q for the removed resource's session", topic)
	case <-time.After(time.Second):
	}
}
