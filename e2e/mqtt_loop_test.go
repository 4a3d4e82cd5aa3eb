package e2e

import (
	"fmt"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTLoopPrevention runs an inbound and an outbound resource on the
// same broker and topics in one `connector run` (one --instance): the
// outbound dials the endpoint the inbound hosts. A message published once
// to the broker crosses to weida once and back to the broker once, marked;
// the inbound recognises the mark and drops (and counts) it instead of
// bridging it again, so nothing echoes.
func TestMQTTLoopPrevention(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	dir := t.TempDir()
	cert, key, fp := weidaCert(t, dir)
	port := freePort(t, "udp")
	in := mqttResource{
		Name: "loop-in", Direction: policy.Inbound, QoS: 1, CleanStart: true,
		Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/loop", port), CertFile: cert, KeyFile: key,
		Routes: []mqttRoute{{"loop", u + "/loop/#"}},
	}
	out := mqttResource{
		Name: "loop-out", Direction: policy.Outbound, QoS: 1,
		Endpoint: fmt.Sprintf("weida://%s@127.0.0.1:%d/loop", fp, port),
		Routes:   []mqttRoute{{"loop", u + "/loop/#"}},
	}
	file := writeFile(t, dir, "loop.yaml", mqttYAML(t, in, out))
	c := StartConnector(t, nil, "--instance", "e2e-"+u, "-f", file)
	c.WaitReady(30 * time.Second)

	obs := collectWeida(t, in.Endpoint, weida.Limits{}, "#")
	msub := mqttConnect(t, mosquittoAddr, "sub-"+u)
	msub.subscribe(t, 1, u+"/#")
	// The observer and the outbound bridge each hold one subscription.
	Eventually(t, 20*time.Second, "two weida subscribers on the inbound endpoint", func() bool {
		st, _ := c.Status("loop-in")
		return st.Counters.Subscribers == 2
	})
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)

	type counts struct{ inRecv, inBridged, inLoop, outRecv, outBridged uint64 }
	read := func() counts {
		i, _ := c.Status("loop-in")
		o, _ := c.Status("loop-out")
		return counts{i.Counters.Received, i.Counters.Bridged, i.Counters.Dropped["loop"], o.Counters.Received, o.Counters.Bridged}
	}
	for k := 1; k <= 2; k++ {
		pub.publish(t, 1, fmt.Sprintf("%s/loop/%d", u, k), fmt.Sprintf("once-%d", k))
		// Every message ends as a loop drop; the next one is the barrier
		// that shows nothing kept circulating.
		Eventually(t, 20*time.Second, fmt.Sprintf("message %d to come back marked and be dropped", k), func() bool { return read().inLoop == uint64(k) })
		n := uint64(k)
		if got, want := read(), (counts{2 * n, n, n, n, n}); got != want {
			t.Fatalf("after %d messages: %+v, want %+v\n%s", k, got, want, c.StatusJSON())
		}
	}
	Eventually(t, 10*time.Second, "the MQTT observer to see each message twice", func() bool { return msub.Len() >= 4 })
	if n := obs.Len(); n != 2 {
		t.Errorf("the weida observer got %d messages, want 2 (each once): %v", n, obs.Messages())
	}
	if n := msub.Len(); n != 4 {
		t.Errorf("the MQTT observer got %d messages, want 4 (each published once and bridged back once)", n)
	}
	marked := 0
	for _, m := range msub.Messages() {
		if m.Props == nil || m.Props.User.Get("x-weida-connector") == "" {
			continue
		}
		marked++
		if v := m.Props.User.Get("x-weida-connector"); v != "e2e-"+u {
			t.Errorf("loop marker %q, want the --instance value %q", v, "e2e-"+u)
		}
	}
	if marked != 2 {
		t.Errorf("%d messages at the MQTT observer carry the loop marker, want 2 (those the outbound published)", marked)
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="loop",resource="loop-in",route=""}`); v != 2 {
		t.Errorf("metric messages_dropped_total{reason=loop} = %v, want 2", v)
	}
}
