package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// berlin is the mount the MQTT tests use: the Berlin plant's factory/
// subtree at weida's plants.berlin.
var berlin = policy.Mount{Foreign: "factory/", Weida: "plants.berlin."}

// TestMQTTMountInbound: through `connector run`, an inbound resource
// mounting factory/ at plants.berlin. bridges factory/hall-2/press to
// plants.berlin.hall-2.press, factory itself to plants.berlin, and nothing
// from office/. A private Mosquitto lets the test use these very names.
func TestMQTTMountInbound(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/plants", freePort(t, "udp"))
	res := mqttResource{
		Name: "berlin-in", Direction: policy.Inbound, Broker: broker.Addr(), QoS: 1, Endpoint: endpoint,
		Mount:  berlin,
		Routes: []mqttRoute{{"factory", "factory/#"}},
	}
	file := writeFile(t, t.TempDir(), "in.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := mqttConnect(t, broker.Addr(), "pub")
	sub.Sync(20*time.Second, "probe", func() { pub.publish(t, 1, "factory/probe", "probe") })
	c.Quiesce("berlin-in")
	sub.Reset()
	base, _ := c.Status("berlin-in")

	cases := []struct{ mqtt, weida, payload string }{
		{"factory/hall-2/press", "plants.berlin.hall-2.press", "press"},
		{"factory", "plants.berlin", "the parent"},
		{"factory/", "plants.berlin.", "one empty level"},
		{"office/x", "", "outside the mount: not subscribed"},
		{"factoryx/y", "", "a sibling, not a child"},
	}
	for _, tc := range cases {
		pub.publish(t, 1, tc.mqtt, tc.payload)
	}
	// The last message is inside: once it arrived, the earlier ones have
	// been read from the broker (Mosquitto keeps a publisher's order); the
	// wait below covers weida delivering them in another order.
	pub.publish(t, 1, "factory/last", "last")
	Eventually(t, 20*time.Second, "the last message", func() bool { return sub.Has("plants.berlin.last", "last") })

	var want []string
	for _, tc := range cases {
		if tc.weida != "" {
			want = append(want, tc.weida+" "+tc.payload)
		}
	}
	want = append(want, "plants.berlin.last last")
	Eventually(t, 10*time.Second, "every bridged message", func() bool { return sub.Len() >= len(want) })
	var got []string
	for _, m := range sub.Messages() {
		if string(m.Payload) != "probe" {
			got = append(got, m.Topic+" "+string(m.Payload))
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("weida subscriber got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	// Probes sent before the weida subscription was in place are counted
	// as no-subscriber drops; nothing after them may be dropped.
	if st, _ := c.Status("berlin-in"); dropTotal(st.Counters.Dropped) != dropTotal(base.Counters.Dropped) {
		t.Errorf("drops %v, %v before the test messages: routes inside the mount never select a topic outside it",
			st.Counters.Dropped, base.Counters.Dropped)
	}
}

// TestMQTTMountOutbound: the reverse. A weida publisher's
// plants.berlin.hall-2.press reaches MQTT factory/hall-2/press, and
// plants.paris.x, outside the mount, is not even subscribed.
func TestMQTTMountOutbound(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	wpub, url := weidaPublisher(t, "/plants")
	res := mqttResource{
		Name: "berlin-out", Direction: policy.Outbound, Broker: broker.Addr(), QoS: 1, Endpoint: url,
		Mount:  berlin,
		Routes: []mqttRoute{{"factory", "factory/#"}},
	}
	file := writeFile(t, t.TempDir(), "out.yaml", res.YAML(t))
	msub := mqttConnect(t, broker.Addr(), "sub")
	msub.subscribe(t, 1, "#")

	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)
	publish := func(topic, payload string) {
		t.Helper()
		if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: topic, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	Eventually(t, 20*time.Second, "the outbound subscription", func() bool {
		publish("plants.berlin.probe", "probe")
		time.Sleep(50 * time.Millisecond)
		return msub.Has("factory/probe", "probe")
	})
	Eventually(t, 10*time.Second, "probes settled", func() bool {
		st, _ := c.Status("berlin-out")
		return st.Counters.Received == st.Counters.Bridged+dropTotal(st.Counters.Dropped)
	})
	msub.Reset()

	cases := []struct{ weida, mqtt, payload string }{
		{"plants.berlin.hall-2.press", "factory/hall-2/press", "press"},
		{"plants.berlin", "factory", "the parent"},
		{"plants.paris.x", "", "outside the mount: not subscribed"},
		{"plants.berliner.x", "", "a sibling, not a child"},
	}
	for _, tc := range cases {
		publish(tc.weida, tc.payload)
	}
	publish("plants.berlin.last", "last")
	Eventually(t, 20*time.Second, "the last message", func() bool { return msub.Has("factory/last", "last") })
	Eventually(t, 10*time.Second, "every message settled", func() bool {
		st, _ := c.Status("berlin-out")
		return st.Counters.Received == st.Counters.Bridged+dropTotal(st.Counters.Dropped)
	})
	// weida orders no copies against each other, so the last one having
	// arrived proves nothing of the others: the connector's subscriber may
	// still hold one it has not read yet.
	Eventually(t, 10*time.Second, "the parent and the child", func() bool {
		return msub.Has("factory", "the parent") && msub.Has("factory/hall-2/press", "press")
	})
	var got []string
	for _, m := range msub.Messages() {
		got = append(got, m.Topic+" "+string(m.Payload))
	}
	want := []string{"factory the parent", "factory/hall-2/press press", "factory/last last"}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("MQTT subscriber got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if st, _ := c.Status("berlin-out"); dropTotal(st.Counters.Dropped) != 0 {
		t.Errorf("drops %v: the weida subscription selects only topics inside the mount", st.Counters.Dropped)
	}
}

// TestNATSTailInbound: under nats-tokens-tail/v1 the route orders.>
// (subscribed as orders.*.# at no weida cost) bridges orders.eu and
// orders.eu.fr.created, and not orders, which '>' does not select.
func TestNATSTailInbound(t *testing.T) {
	srv := brokertest.StartNATS(t)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/orders", freePort(t, "udp"))
	res := natsResource{Name: "orders-in", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		Policy: policy.NATSTail(), Routes: []string{"orders.>"}}
	file := writeFile(t, t.TempDir(), "in.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	nc := natsConn(t, srv.Addr())
	publish := func(subject, payload string) {
		t.Helper()
		if err := nc.PublishMsg(&natsgo.Msg{Subject: subject, Data: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	sub.Sync(20*time.Second, "probe", func() { publish("orders.probe", "probe") })
	c.Quiesce("orders-in")
	base, _ := c.Status("orders-in")

	publish("orders.eu", "one token")
	publish("orders", "zero tokens: not selected")
	publish("orders.eu.fr.created", "three tokens")
	publish("ordersx.eu", "another subject")
	publish("orders.last", "last")
	Eventually(t, 20*time.Second, "the last message", func() bool { return sub.Has("orders.last", "last") })
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, "the connector to settle", func() bool {
		st, _ := c.Status("orders-in")
		return st.Counters.Acknowledged-base.Counters.Acknowledged == st.Counters.Received-base.Counters.Received &&
			st.Counters.Received-base.Counters.Received >= 3
	})
	// Copies arrive in no particular order (weida orders none): the last
	// one is no barrier for the others.
	Eventually(t, 10*time.Second, "the one- and three-token subjects", func() bool {
		return sub.Has("orders.eu", "one token") && sub.Has("orders.eu.fr.created", "three tokens")
	})
	var got []string
	for _, m := range sub.Messages() {
		if s := string(m.Payload); s != "probe" && s != "last" {
			got = append(got, m.Topic+" "+s)
		}
	}
	slices.Sort(got)
	if want := []string{"orders.eu one token", "orders.eu.fr.created three tokens"}; !slices.Equal(got, want) {
		t.Errorf("weida subscriber got %q, want %q", got, want)
	}
	// Probes sent before the weida subscription was in place are counted
	// as no-subscriber drops; nothing after them may be dropped.
	if st, _ := c.Status("orders-in"); dropTotal(st.Counters.Dropped) != dropTotal(base.Counters.Dropped) {
		t.Errorf("drops %v, %v before the test messages", st.Counters.Dropped, base.Counters.Dropped)
	}
}
