package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTInboundWildcards bridges Mosquitto to weida through `connector
// run` with a `+` and a `#` route, and checks every converted topic and
// payload at a weida subscriber; a topic with a dotted level is dropped and
// counted in /status and /metrics.
func TestMQTTInboundWildcards(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/sensors", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-in", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		Routes: []mqttRoute{{"temp", u + "/sensors/+/temp"}, {"factory", u + "/factory/#"}},
	}
	file := writeFile(t, t.TempDir(), "in.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/factory", "probe-"+u) })
	c.Quiesce("mqtt-in")
	base, _ := c.Status("mqtt-in")

	cases := []struct {
		mqtt, weida string // weida "" = not delivered
		payload     string
	}{
		{u + "/sensors/kitchen/temp", u + ".sensors.kitchen.temp", "21.5"},
		{u + "/sensors//temp", u + ".sensors..temp", "empty level"},
		{u + "/sensors/kitchen/humidity", "", "no route selects it"},
		{u + "/sensors/kitchen/temp/x", "", "+ is one level"},
		{u + "/factory", u + ".factory", "# includes the parent"},
		{u + "/factory/", u + ".factory.", "trailing empty level"},
		{u + "/factory/line1/robot/3", u + ".factory.line1.robot.3", "deep"},
		{u + "/factory/café/*", u + ".factory.café.*", "non-ASCII and a literal star"},
		{u + "/factory/bin", u + ".factory.bin", "\x00\x01\xff\xfe binary"},
		{u + "/factory/b.c/x", "", "dotted level: dropped, counted"},
	}
	for _, tc := range cases {
		pub.publish(t, 1, tc.mqtt, tc.payload)
	}
	// Metadata travels: content type and W3C trace context.
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	props := &paho.PublishProperties{ContentType: "application/json"}
	props.User.Add("traceparent", tp)
	props.User.Add("tracestate", "vendor=x")
	if _, err := pub.Publish(ctx(t, 10*time.Second), &paho.Publish{Topic: u + "/factory/meta", QoS: 1, Payload: []byte(`{"a":1}`), Properties: props}); err != nil {
		t.Fatal(err)
	}

	// The broker delivers the routed topics only; the connector reports
	// every one it got, bridged or dropped.
	received := uint64(1) // the metadata message
	for _, tc := range cases {
		for _, r := range res.Routes {
			if policy.MQTTGrammar().Match(r.Filter, tc.mqtt) {
				received++
				break
			}
		}
	}
	Eventually(t, 20*time.Second, "the connector to settle every message", func() bool {
		st, _ := c.Status("mqtt-in")
		return st.Counters.Received-base.Counters.Received == received &&
			st.Counters.Acknowledged-base.Counters.Acknowledged == received
	})
	var want []string
	for _, tc := range cases {
		if tc.weida != "" {
			want = append(want, tc.weida+" "+tc.payload)
		}
	}
	want = append(want, u+".factory.meta "+`{"a":1}`)
	Eventually(t, 10*time.Second, "every bridged message at the weida subscriber", func() bool { return sub.Len() >= len(want) })
	var got []string
	var meta weida.Message
	for _, m := range sub.Messages() {
		got = append(got, m.Topic+" "+string(m.Payload))
		if m.Topic == u+".factory.meta" {
			meta = m
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("weida subscriber got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if meta.ContentType != "application/json" || meta.Traceparent != tp || meta.Tracestate != "vendor=x" {
		t.Errorf("metadata: content type %q, traceparent %q, tracestate %q", meta.ContentType, meta.Traceparent, meta.Tracestate)
	}

	st, _ := c.Status("mqtt-in")
	if n := st.Counters.Bridged - base.Counters.Bridged; n != uint64(len(want)) {
		t.Errorf("status bridged = %d, want %d", n, len(want))
	}
	if n := st.Counters.Dropped["mqtt-dotted-level"]; n != 1 {
		t.Errorf("status dropped[mqtt-dotted-level] = %d, want 1; status:\n%s", n, c.StatusJSON())
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="mqtt-dotted-level",resource="mqtt-in",route="factory"}`); v != 1 {
		t.Errorf("metric messages_dropped_total{reason=mqtt-dotted-level} = %v, want 1", v)
	}
	if v := c.Metric(`weida_connector_messages_bridged_total{resource="mqtt-in",route="temp"}`); v != 2 {
		t.Errorf("metric messages_bridged_total{route=temp} = %v, want 2", v)
	}
	if !strings.Contains(c.Output(), "mqtt-dotted-level") {
		t.Errorf("the drop was not logged:\n%s", c.Output())
	}
}

// TestMQTTOutboundWildcards bridges a weida publisher to Mosquitto through
// `connector run` with a `+` and a `#` route, and checks the converted
// topics, payloads and metadata at an MQTT subscriber; a weida topic with
// no MQTT form is dropped and counted.
func TestMQTTOutboundWildcards(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	wpub, url := weidaPublisher(t, "/orders")
	res := mqttResource{
		Name: "mqtt-out", Direction: policy.Outbound, QoS: 1, Endpoint: url,
		Routes: []mqttRoute{{"created", u + "/orders/+/created"}, {"audit", u + "/audit/#"}},
	}
	file := writeFile(t, t.TempDir(), "out.yaml", res.YAML(t))
	msub := mqttConnect(t, mosquittoAddr, "sub-"+u)
	msub.subscribe(t, 1, u+"/#")

	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)
	// Both filters must be in force at the publisher: probe each.
	publish := func(topic, payload string) {
		t.Helper()
		if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: topic, Payload: []byte(payload)}); err != nil {
			t.Fatal(err)
		}
	}
	Eventually(t, 20*time.Second, "both outbound subscriptions", func() bool {
		publish(u+".orders.probe.created", "probe")
		publish(u+".audit", "probe")
		time.Sleep(50 * time.Millisecond)
		return msub.Has(u+"/orders/probe/created", "probe") && msub.Has(u+"/audit", "probe")
	})
	Eventually(t, 10*time.Second, "probes settled", func() bool {
		st, _ := c.Status("mqtt-out")
		return st.Counters.Received == st.Counters.Bridged+dropTotal(st.Counters.Dropped)
	})
	msub.Reset()
	base, _ := c.Status("mqtt-out")

	cases := []struct {
		weida, mqtt string // mqtt "" = not published
		payload     string
	}{
		{u + ".orders.42.created", u + "/orders/42/created", "order 42"},
		{u + ".orders..created", u + "/orders//created", "empty segment"},
		{u + ".audit", u + "/audit", "# includes the parent"},
		{u + ".audit.x.y.z", u + "/audit/x/y/z", "deep"},
		{u + ".audit.*", u + "/audit/*", "a star is literal in an MQTT name"},
		{u + ".audit.ünï", u + "/audit/ünï", "non-ASCII"},
		{u + ".audit.a/b", "", "slash in a segment: dropped, counted"},
		{u + ".audit.a+", "", "wildcard character in a name: dropped, counted"},
	}
	for _, tc := range cases {
		publish(tc.weida, tc.payload)
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: u + ".audit.meta", ContentType: "text/plain", Traceparent: tp, Tracestate: "k=v", Payload: []byte("meta")}); err != nil {
		t.Fatal(err)
	}
	const received = 9
	Eventually(t, 20*time.Second, "the connector to settle every message", func() bool {
		st, _ := c.Status("mqtt-out")
		return st.Counters.Received-base.Counters.Received == received &&
			st.Counters.Bridged-base.Counters.Bridged+dropTotal(st.Counters.Dropped)-dropTotal(base.Counters.Dropped) == received
	})
	var want []string
	for _, tc := range cases {
		if tc.mqtt != "" {
			want = append(want, tc.mqtt+" "+tc.payload)
		}
	}
	want = append(want, u+"/audit/meta meta")
	Eventually(t, 10*time.Second, "every bridged message at the MQTT subscriber", func() bool { return msub.Len() >= len(want) })
	var got []string
	var meta mqttMsg
	for _, m := range msub.Messages() {
		got = append(got, m.Topic+" "+string(m.Payload))
		if m.Topic == u+"/audit/meta" {
			meta = m
		}
		if m.QoS != 1 {
			t.Errorf("%s arrived at QoS %d, want 1", m.Topic, m.QoS)
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("MQTT subscriber got\n  %s\nwant\n  %s", strings.Join(got, "\n  "), strings.Join(want, "\n  "))
	}
	if meta.Props == nil || meta.Props.ContentType != "text/plain" ||
		meta.Props.User.Get("traceparent") != tp || meta.Props.User.Get("tracestate") != "k=v" {
		t.Errorf("metadata at the MQTT subscriber: %+v", meta.Props)
	}
	st, _ := c.Status("mqtt-out")
	for _, reason := range []string{"mqtt-slash-segment", "mqtt-wildcard-name"} {
		if n := st.Counters.Dropped[reason] - base.Counters.Dropped[reason]; n != 1 {
			t.Errorf("status dropped[%s] = %d, want 1; status:\n%s", reason, n, c.StatusJSON())
		}
		if v := c.Metric(`weida_connector_messages_dropped_total{reason="` + reason + `",resource="mqtt-out",route=""}`); v != 1 {
			t.Errorf("metric messages_dropped_total{reason=%s} = %v, want 1", reason, v)
		}
	}
}

func dropTotal(m map[string]uint64) uint64 {
	var n uint64
	for _, v := range m {
		n += v
	}
	return n
}
