package e2e

import (
	"context"
	"fmt"
	"maps"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// retain publishes a retained MQTT message (an empty payload deletes the
// topic's retained value) and clears it when the test ends.
func retain(t *testing.T, c *mqttClient, topic, payload string) {
	t.Helper()
	if _, err := c.Publish(ctx(t, 10*time.Second), &paho.Publish{Topic: topic, QoS: 1, Retain: true, Payload: []byte(payload)}); err != nil {
		t.Fatalf("publishing retained %s: %v", topic, err)
	}
	if payload != "" {
		t.Cleanup(func() {
			_, _ = c.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: 1, Retain: true})
		})
	}
}

// replayed waits until the collector holds want messages, then has probe
// send one more (not cached) message its filters select and waits for it:
// anything replayed beyond want would have been queued before the probe.
// It returns what arrived before the probe, topic to payload.
func replayed(t *testing.T, c *weidaCollector, want int, probePayload string, probe func()) map[string]string {
	t.Helper()
	Eventually(t, 20*time.Second, fmt.Sprintf("%d replayed values", want), func() bool { return c.Len() >= want })
	// When nothing is to be replayed, the SUBSCRIBE may not have been
	// read yet (weida has no acknowledgement): probe until it arrives.
	Eventually(t, 20*time.Second, "the live probe", func() bool {
		probe()
		time.Sleep(100 * time.Millisecond)
		return c.hasPayload(probePayload)
	})
	got := map[string]string{}
	for _, m := range c.Messages() {
		if string(m.Payload) == probePayload {
			continue
		}
		if _, dup := got[m.Topic]; dup {
			t.Errorf("%s arrived twice", m.Topic)
		}
		got[m.Topic] = string(m.Payload)
	}
	return got
}

// TestMQTTLastValueReplay: retained values published before the connector
// starts reach a weida subscriber that comes later (exactly those its filter
// matches, then live ones); an empty retained message removes a topic from
// later replays; a filter matching nothing cached replays nothing.
func TestMQTTLastValueReplay(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	retain(t, pub, u+"/state/kitchen", "21.5")
	retain(t, pub, u+"/state/hall", "19.0")
	retain(t, pub, u+"/other/door", "open")

	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/state", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-lv", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes:    []mqttRoute{{"all", u + "/#"}},
		LastValue: "mode: retained\nmaxTopics: 100",
	}
	file := writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	Eventually(t, 20*time.Second, "the three retained values cached", func() bool {
		st, _ := c.Status("mqtt-lv")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 3
	})

	sub := collectWeida(t, endpoint, weida.Limits{}, u+".state.*")
	got := replayed(t, sub, 2, "probe-1", func() { pub.publish(t, 1, u+"/state/probe", "probe-1") })
	if want := map[string]string{u + ".state.kitchen": "21.5", u + ".state.hall": "19.0"}; !maps.Equal(got, want) {
		t.Fatalf("replayed %v, want %v", got, want)
	}
	// Then live updates.
	retain(t, pub, u+"/state/kitchen", "22.0")
	Eventually(t, 20*time.Second, "a live update", func() bool { return sub.Has(u+".state.kitchen", "22.0") })

	// An empty retained message deletes the value: later subscribers do
	// not get it.
	retain(t, pub, u+"/state/hall", "")
	Eventually(t, 20*time.Second, "the deletion applied", func() bool {
		st, _ := c.Status("mqtt-lv")
		return st.Counters.LastValue.Entries == 2
	})
	late := collectWeida(t, endpoint, weida.Limits{}, u+".state.*")
	got = replayed(t, late, 1, "probe-2", func() { pub.publish(t, 1, u+"/state/probe", "probe-2") })
	if want := map[string]string{u + ".state.kitchen": "22.0"}; !maps.Equal(got, want) {
		t.Fatalf("after the deletion, replayed %v, want %v", got, want)
	}

	// A filter that matches nothing cached gets nothing but live traffic.
	before, _ := c.Status("mqtt-lv")
	none := collectWeida(t, endpoint, weida.Limits{}, u+".nothing.#")
	got = replayed(t, none, 0, "probe-3", func() { pub.publish(t, 1, u+"/nothing/probe", "probe-3") })
	if len(got) != 0 {
		t.Fatalf("a filter matching nothing cached got %v", got)
	}
	after, _ := c.Status("mqtt-lv")
	if before.Counters.LastValue.Replayed != after.Counters.LastValue.Replayed || after.Counters.LastValue.Replayed != 3 {
		t.Fatalf("replayed counter %d then %d, want 3 throughout", before.Counters.LastValue.Replayed, after.Counters.LastValue.Replayed)
	}
	if v := c.Metric(`weida_connector_last_value_replayed_total{resource="mqtt-lv"}`); v != 3 {
		t.Fatalf("last_value_replayed_total = %v, want 3", v)
	}
	if v := c.Metric(`weida_connector_last_value_entries{resource="mqtt-lv"}`); v != 2 {
		t.Fatalf("last_value_entries = %v, want 2", v)
	}
}

// TestMQTTLastValueBounded: a cache smaller than the number of retained
// topics stays at its bound and counts every eviction.
func TestMQTTLastValueBounded(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	const topics = 30
	for i := range topics {
		retain(t, pub, fmt.Sprintf("%s/t/%d", u, i), fmt.Sprint(i))
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/bounded", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-lv-bounded", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes:    []mqttRoute{{"all", u + "/#"}},
		LastValue: "mode: retained\nmaxTopics: 10",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	Eventually(t, 20*time.Second, "every retained value read", func() bool {
		st, _ := c.Status("mqtt-lv-bounded")
		return st.Counters.Received >= topics
	})
	st, _ := c.Status("mqtt-lv-bounded")
	if lv := st.Counters.LastValue; lv.Entries != 10 || lv.Evicted["max-topics"] != topics-10 {
		t.Fatalf("cache %+v: want 10 entries and %d evictions", lv, topics-10)
	}
	sub := collectWeida(t, endpoint, weida.Limits{}, u+".#")
	if got := replayed(t, sub, 10, "probe", func() { pub.publish(t, 1, u+"/probe", "probe") }); len(got) != 10 {
		t.Fatalf("replayed %d values from a cache of 10", len(got))
	}
}

// TestNATSLastValueJetStream: a late weida subscriber receives the last
// message per subject of the bound stream's history. The durable consumer
// exists beforehand and delivers only new messages, so the history can
// reach the cache only through the seeding at start.
func TestNATSLastValueJetStream(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	nc := natsConn(t, natsAddr)
	js := createStream(t, nc, "LV"+u, u+".>")
	for _, p := range [][2]string{{"a", "1"}, {"b", "1"}, {"a", "2"}, {"c", "1"}, {"a", "3"}, {"b", "2"}} {
		if _, err := js.Publish(ctx(t, 5*time.Second), u+"."+p[0], []byte(p[1])); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := js.CreateConsumer(ctx(t, 5*time.Second), "LV"+u, jetstream.ConsumerConfig{
		Durable: "lv", AckPolicy: jetstream.AckExplicitPolicy, DeliverPolicy: jetstream.DeliverNewPolicy, FilterSubject: u + ".>",
	}); err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/js", freePort(t, "udp"))
	res := natsResource{
		Name: "nats-lv", Direction: policy.Inbound, Endpoint: endpoint,
		Stream: "LV" + u, Durable: "lv", Routes: []string{u + ".*"},
		LastValue: "mode: retained",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	Eventually(t, 20*time.Second, "the last values seeded", func() bool {
		st, _ := c.Status("nats-lv")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 3
	})
	if st, _ := c.Status("nats-lv"); st.Counters.Received != 0 {
		t.Fatalf("the durable consumer delivered %d old messages; the test needs it to deliver new ones only", st.Counters.Received)
	}
	sub := collectWeida(t, endpoint, weida.Limits{}, u+".#")
	got := replayed(t, sub, 3, "probe", func() {
		if _, err := js.Publish(ctx(t, 5*time.Second), u+".probe", []byte("probe")); err != nil {
			t.Fatal(err)
		}
	})
	if want := map[string]string{u + ".a": "3", u + ".b": "2", u + ".c": "1"}; !maps.Equal(got, want) {
		t.Fatalf("replayed %v, want the last message per subject %v", got, want)
	}
}

// TestMQTTOutboundRetain: a message published through an outbound resource
// with retain: true reaches an MQTT subscriber that subscribes afterwards.
func TestMQTTOutboundRetain(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	wpub, url := weidaPublisher(t, "/out")
	res := mqttResource{
		Name: "mqtt-retain", Direction: policy.Outbound, QoS: 1, Endpoint: url, Retain: true,
		Routes: []mqttRoute{{"state", u + "/state/#"}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "out.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)
	cleaner := mqttConnect(t, mosquittoAddr, "clean-"+u)
	t.Cleanup(func() {
		_, _ = cleaner.Publish(context.Background(), &paho.Publish{Topic: u + "/state/boiler", QoS: 1, Retain: true})
	})
	// A weida SUBSCRIBE has no acknowledgement: publish until bridged.
	Eventually(t, 20*time.Second, "the value bridged", func() bool {
		if _, err := wpub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: u + ".state.boiler", Payload: []byte("on")}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		st, _ := c.Status("mqtt-retain")
		return st.Counters.Bridged > 0
	})
	// A late subscriber, as an operator would run one: mosquitto_sub
	// prints the retained value it gets on subscribing, then exits.
	sub, err := exec.LookPath("mosquitto_sub")
	if err != nil {
		t.Fatalf("mosquitto_sub is not installed (scripts/brokers installs mosquitto-clients): %v", err)
	}
	host, port := brokertest.SplitAddr(t, mosquittoAddr)
	out, err := exec.Command(sub, "-h", host, "-p", strconv.Itoa(port), "-V", "mqttv5",
		"-t", u+"/state/#", "-C", "1", "-W", "10", "-v").CombinedOutput()
	if err != nil {
		t.Fatalf("mosquitto_sub: %v\n%s", err, out)
	}
	if got, want := strings.TrimSpace(string(out)), u+"/state/boiler on"; got != want {
		t.Fatalf("a late mosquitto_sub printed %q, want %q", got, want)
	}
}

// TestMQTTLastValueTooLarge: a retained update larger than
// limits.maxMessageBytes is dropped, and takes the older cached value with
// it: Mosquitto holds the large value now, and a late subscriber must not
// be replayed the small one it replaced.
func TestMQTTLastValueTooLarge(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/large", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-lv-large", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes:          []mqttRoute{{"all", u + "/#"}},
		MaxMessageBytes: "1KiB",
		LastValue:       "mode: retained",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	retain(t, pub, u+"/state/big", "small")
	retain(t, pub, u+"/state/kept", "kept")
	Eventually(t, 20*time.Second, "both values cached", func() bool {
		st, _ := c.Status("mqtt-lv-large")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 2
	})
	retain(t, pub, u+"/state/big", strings.Repeat("x", 2000))
	Eventually(t, 20*time.Second, "the large update dropped and the old value removed", func() bool {
		st, _ := c.Status("mqtt-lv-large")
		return st.Counters.Dropped["too-large"] == 1 && st.Counters.LastValue.Entries == 1
	})
	st, _ := c.Status("mqtt-lv-large")
	if n := st.Counters.LastValue.Evicted["too-large"]; n != 1 {
		t.Fatalf("evicted %v, want one too-large", st.Counters.LastValue.Evicted)
	}
	if v := c.Metric(`weida_connector_last_value_evictions_total{reason="too-large",resource="mqtt-lv-large"}`); v != 1 {
		t.Fatalf("last_value_evictions_total{too-large} = %v, want 1", v)
	}
	sub := collectWeida(t, endpoint, weida.Limits{}, u+".state.*")
	got := replayed(t, sub, 1, "probe", func() { pub.publish(t, 1, u+"/state/probe", "probe") })
	if want := map[string]string{u + ".state.kept": "kept"}; !maps.Equal(got, want) {
		t.Fatalf("after the too-large update, replayed %v, want %v (never the old small value)", got, want)
	}
}

// TestMQTTLastValueExpiry: a retained value with MQTT Message Expiry 1 s is
// replayed while it lives and not after Mosquitto has dropped it; a value
// without expiry stays.
func TestMQTTLastValueExpiry(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/expiry", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-lv-expiry", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint, CleanStart: true,
		Routes:    []mqttRoute{{"all", u + "/#"}},
		LastValue: "mode: retained",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	retain(t, pub, u+"/state/lasting", "lasting")
	one := uint32(1)
	published := time.Now()
	if _, err := pub.Publish(ctx(t, 10*time.Second), &paho.Publish{Topic: u + "/state/brief", QoS: 1, Retain: true, Payload: []byte("brief"),
		Properties: &paho.PublishProperties{MessageExpiry: &one}}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_, _ = pub.Publish(context.Background(), &paho.Publish{Topic: u + "/state/brief", QoS: 1, Retain: true})
	})
	Eventually(t, 20*time.Second, "both values cached", func() bool {
		st, _ := c.Status("mqtt-lv-expiry")
		return st.Counters.Received >= 2
	})
	// Past the expiry, with room for a loaded machine.
	time.Sleep(time.Until(published.Add(3 * time.Second)))
	st, _ := c.Status("mqtt-lv-expiry")
	if lv := st.Counters.LastValue; lv.Entries != 1 || lv.Evicted["expired"] != 1 {
		t.Fatalf("after the expiry the cache holds %+v, want 1 entry and 1 expired", lv)
	}
	sub := collectWeida(t, endpoint, weida.Limits{}, u+".state.*")
	got := replayed(t, sub, 1, "probe", func() { pub.publish(t, 1, u+"/state/probe", "probe") })
	if want := map[string]string{u + ".state.lasting": "lasting"}; !maps.Equal(got, want) {
		t.Fatalf("after the expiry, replayed %v, want %v", got, want)
	}
	// Mosquitto agrees: a late MQTT subscriber gets the lasting value only.
	late := mqttConnect(t, mosquittoAddr, "late-"+u)
	late.subscribe(t, 1, u+"/state/#")
	Eventually(t, 10*time.Second, "the lasting value at a late MQTT subscriber", func() bool { return late.Has(u+"/state/lasting", "lasting") })
	if late.Has(u+"/state/brief", "brief") {
		t.Fatal("Mosquitto still delivered the expired value; the test's premise does not hold")
	}
}

// TestMQTTLastValueBrokerOutage: while the connector's private Mosquitto
// is stopped, a late weida subscriber is replayed the cached value marked
// stale (seen by the weida API and by `connector weida sub`, the built
// binary), and a resource with whenSourceDown: withhold replays nothing
// and counts it. Once the broker is back, replays are no longer stale.
func TestMQTTLastValueBrokerOutage(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	u := unique()
	pub := mqttConnect(t, broker.Addr(), "pub-"+u)
	retain(t, pub, u+"/state/boiler", "on")
	marked := fmt.Sprintf("weida://127.0.0.1:%d/marked", freePort(t, "udp"))
	withheld := fmt.Sprintf("weida://127.0.0.1:%d/withheld", freePort(t, "udp"))
	file := writeFile(t, t.TempDir(), "lv.yaml", mqttYAML(t,
		mqttResource{
			Name: "lv-mark", Direction: policy.Inbound, QoS: 1, Broker: broker.Addr(), Endpoint: marked, CleanStart: true,
			Routes: []mqttRoute{{"all", u + "/#"}}, LastValue: "mode: retained",
		},
		mqttResource{
			Name: "lv-withhold", Direction: policy.Inbound, QoS: 1, Broker: broker.Addr(), Endpoint: withheld, CleanStart: true,
			Routes: []mqttRoute{{"all", u + "/#"}}, LastValue: "mode: retained\nwhenSourceDown: withhold",
		}))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	for _, name := range []string{"lv-mark", "lv-withhold"} {
		Eventually(t, 20*time.Second, name+" cached the value", func() bool {
			st, _ := c.Status(name)
			return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 1 && !st.Counters.LastValue.Stale
		})
	}
	// While the broker is up, a replay is marked replayed, not stale.
	fresh := collectWeida(t, marked, weida.Limits{}, u+".state.*")
	Eventually(t, 20*time.Second, "the replay while the broker is up", func() bool { return fresh.Len() >= 1 })
	if r := fresh.Messages()[0].Replay; !r.Replayed || r.Stale || !r.HasAge {
		t.Fatalf("a replay while the broker is up has marks %+v, want replayed with an age, not stale", r)
	}
	// A peer that is not ours reads the same marks: key 65 true, key 66
	// an age, no key 67; and no key 68, which MQTT has no number for.
	hostPort := strings.TrimPrefix(strings.TrimSuffix(marked, "/marked"), "weida://")
	keys, payload := independentCopy(t, hostPort, "/marked", u+".state.*")
	if string(payload) != "on" || !cborTrue(t, keys[65]) || keys[66] == nil || keys[67] != nil || keys[68] != nil {
		t.Fatalf("independent peer: a replay while the broker is up has keys %v, payload %q", keys, payload)
	}
	cborUint(t, keys[66])

	broker.Stop()
	for _, name := range []string{"lv-mark", "lv-withhold"} {
		Eventually(t, 30*time.Second, name+" seeing the broker down", func() bool {
			st, _ := c.Status(name)
			return st.Counters.LastValue.Stale
		})
	}
	sub := collectWeida(t, marked, weida.Limits{}, u+".state.*")
	Eventually(t, 20*time.Second, "the replay during the outage", func() bool { return sub.Len() >= 1 })
	m := sub.Messages()[0]
	if string(m.Payload) != "on" || !m.Replay.Replayed || !m.Replay.Stale || !m.Replay.HasAge {
		t.Fatalf("during the outage replayed %q with marks %+v, want \"on\" replayed and stale", m.Payload, m.Replay)
	}
	keys, payload = independentCopy(t, hostPort, "/marked", u+".state.*")
	if string(payload) != "on" || !cborTrue(t, keys[65]) || keys[66] == nil || !cborTrue(t, keys[67]) {
		t.Fatalf("independent peer: a replay during the outage has keys %v, payload %q", keys, payload)
	}
	out := weidaSubCLI(t, c, "lv-mark", u+".state.*")
	for _, want := range []string{u + ".state.boiler\ton", "\treplayed=true", "\tage=", "\tstale=true"} {
		if !strings.Contains(out, want) {
			t.Fatalf("connector weida sub printed %q, want %q in it", out, want)
		}
	}

	hidden := collectWeida(t, withheld, weida.Limits{}, u+".state.*")
	Eventually(t, 20*time.Second, "the replay withheld and counted", func() bool {
		st, _ := c.Status("lv-withhold")
		return st.Counters.LastValue.Withheld == 1
	})
	if v := c.Metric(`weida_connector_last_value_withheld_total{resource="lv-withhold"}`); v != 1 {
		t.Fatalf("last_value_withheld_total = %v, want 1", v)
	}
	// The count is taken where the copy would have been queued: nothing
	// can be on its way.
	time.Sleep(500 * time.Millisecond)
	if n := hidden.Len(); n != 0 {
		t.Fatalf("whenSourceDown: withhold replayed %d copies during the outage", n)
	}

	broker.Start()
	Eventually(t, 60*time.Second, "the broker connection back", func() bool {
		st, _ := c.Status("lv-mark")
		return !st.Counters.LastValue.Stale
	})
	out = weidaSubCLI(t, c, "lv-mark", u+".state.*")
	if !strings.Contains(out, "\treplayed=true") || strings.Contains(out, "stale=") {
		t.Fatalf("after the outage connector weida sub printed %q, want replayed and not stale", out)
	}
}

// weidaSubCLI runs the built `connector weida sub` against resource's
// endpoint (pinned by the fingerprint /status gives) until it has printed
// one message, and returns what it printed.
func weidaSubCLI(t *testing.T, c *Connector, resource, filter string) string {
	t.Helper()
	st, _ := c.Status(resource)
	if st.SubscriberURL == "" {
		t.Fatalf("%s has no subscriber URL in /status", resource)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, connectorBin, "weida", "sub", st.SubscriberURL, "--filter", filter, "--count", "1").CombinedOutput()
	if err != nil {
		t.Fatalf("connector weida sub: %v\n%s", err, out)
	}
	return string(out)
}

// TestNATSLastValueMaxAge: the JetStream stream's MaxAge ends cached
// values as the server ends the messages, whether the cache was seeded with
// them at start or took them live.
func TestNATSLastValueMaxAge(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	nc := natsConn(t, natsAddr)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	const maxAge = 2 * time.Second
	name := "LVAGE" + u
	if _, err := js.CreateStream(ctx(t, 10*time.Second), jetstream.StreamConfig{Name: name, Subjects: []string{u + ".>"}, MaxAge: maxAge}); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = js.DeleteStream(context.Background(), name) })
	if _, err := js.Publish(ctx(t, 5*time.Second), u+".seeded", []byte("1")); err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/age", freePort(t, "udp"))
	res := natsResource{
		Name: "nats-lv-age", Direction: policy.Inbound, Endpoint: endpoint,
		Stream: name, Durable: "lv", Routes: []string{u + ".*"},
		LastValue: "mode: retained",
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "lv.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	last := time.Now()
	if _, err := js.Publish(ctx(t, 5*time.Second), u+".live", []byte("2")); err != nil {
		t.Fatal(err)
	}
	Eventually(t, 20*time.Second, "both values cached", func() bool {
		st, _ := c.Status("nats-lv-age")
		return st.Counters.LastValue != nil && st.Counters.LastValue.Entries == 2
	})
	time.Sleep(time.Until(last.Add(maxAge + 2*time.Second)))
	st, _ := c.Status("nats-lv-age")
	if lv := st.Counters.LastValue; lv.Entries != 0 || lv.Evicted["expired"] != 2 {
		t.Fatalf("past the stream's MaxAge the cache holds %+v, want nothing and 2 expired", lv)
	}
	sub := collectWeida(t, endpoint, weida.Limits{}, u+".#")
	got := replayed(t, sub, 0, "probe", func() {
		if _, err := js.Publish(ctx(t, 5*time.Second), u+".probe", []byte("probe")); err != nil {
			t.Fatal(err)
		}
	})
	if len(got) != 0 {
		t.Fatalf("past the stream's MaxAge, replayed %v", got)
	}
}
