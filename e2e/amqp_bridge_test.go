package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestAMQPInboundWildcards bridges RabbitMQ to weida through `connector run`
// with the routes `audit.events.#` and `orders.*.new.#` on a durable queue,
// and checks every converted topic, payload and metadata at a weida
// subscriber; a routing key that is not UTF-8 is dropped and counted.
func TestAMQPInboundWildcards(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	u := unique()
	client := amqpConnect(t, rabbitAddr)
	exchange := "e2e-" + u
	client.declareExchange(t, exchange)
	queue := "e2e-in-" + u
	deleteQueueAtEnd(t, rabbitAddr, queue)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/audit", freePort(t, "udp"))
	res := amqpResource{
		Name: "amqp-in", Direction: policy.Inbound, Exchange: exchange,
		QueueName: queue, Durable: true, Endpoint: endpoint,
		Routes: []amqpRoute{{"audit", "audit.events.#"}, {"new-orders", "orders.*.new.#"}},
	}
	file := writeFile(t, t.TempDir(), "in.yaml", res.YAML(t))
	c := StartConnector(t, amqpEnv, "-f", file)
	c.WaitReady(30 * time.Second)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, "probe-"+u, func() { client.mustPublish(t, exchange, "audit.events", "probe-"+u) })
	c.Quiesce("amqp-in")
	base, _ := c.Status("amqp-in")
	// Sync may have needed more than one probe to see the route work.
	auditBase := c.Metric(`weida_connector_messages_bridged_total{resource="amqp-in",route="audit"}`)

	cases := []struct {
		key, weida string // weida "" = not delivered
		payload    string
	}{
		{"audit.events", "audit.events", "# takes zero words"},
		{"audit.events.users.signup", "audit.events.users.signup", "# takes two words"},
		{"audit.events.", "audit.events.", "an empty word is a word"},
		{"audit.eventsx", "", "no word boundary"},
		{"audit", "", "above the binding"},
		{"orders.eu.new", "orders.eu.new", "* takes one word, # none"},
		{"orders.eu.new.priority.high", "orders.eu.new.priority.high", "# takes two words"},
		{"orders..new", "orders..new", "* takes an empty word"},
		{"orders.new", "", "* needs a word"},
		{"orders.eu.us.new", "", "* is one word"},
		{"orders.eu.new.café", "orders.eu.new.café", "\x00\x01\xff\xfe binary payload"},
		{"orders.eu.new.\xff", "", "not UTF-8: dropped, counted"},
	}
	for _, tc := range cases {
		client.mustPublish(t, exchange, tc.key, tc.payload)
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	if err := client.publish(ctx(t, 10*time.Second), exchange, "audit.events.meta", amqp.Publishing{
		ContentType: "application/json",
		Headers:     amqp.Table{"traceparent": tp, "tracestate": "vendor=x", "other": "not carried"},
		Priority:    5, Expiration: "60000", ReplyTo: "replies", CorrelationId: "c1",
		Body: []byte(`{"a":1}`),
	}); err != nil {
		t.Fatal(err)
	}

	received := uint64(1) // the metadata message
	for _, tc := range cases {
		for _, r := range res.Routes {
			if policy.AMQPGrammar().Match(r.Filter, tc.key) {
				received++
				break
			}
		}
	}
	Eventually(t, 20*time.Second, "the connector to settle every message", func() bool {
		st, _ := c.Status("amqp-in")
		return st.Counters.Received-base.Counters.Received == received &&
			st.Counters.Acknowledged-base.Counters.Acknowledged == received
	})
	var want []string
	for _, tc := range cases {
		if tc.weida != "" {
			want = append(want, tc.weida+" "+tc.payload)
		}
	}
	want = append(want, "audit.events.meta "+`{"a":1}`)
	Eventually(t, 10*time.Second, "every bridged message at the weida subscriber", func() bool { return sub.Len() >= len(want) })
	var got []string
	var meta weida.Message
	for _, m := range sub.Messages() {
		got = append(got, m.Topic+" "+string(m.Payload))
		if m.Topic == "audit.events.meta" {
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

	st, _ := c.Status("amqp-in")
	if n := st.Counters.Bridged - base.Counters.Bridged; n != uint64(len(want)) {
		t.Errorf("status bridged = %d, want %d", n, len(want))
	}
	if n := st.Counters.Dropped[policy.RuleInvalidUTF8]; n != 1 {
		t.Errorf("status dropped[invalid-utf8] = %d, want 1; status:\n%s", n, c.StatusJSON())
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="invalid-utf8",resource="amqp-in",route="new-orders"}`); v != 1 {
		t.Errorf("metric messages_dropped_total{reason=invalid-utf8} = %v, want 1", v)
	}
	if v := c.Metric(`weida_connector_messages_bridged_total{resource="amqp-in",route="audit"}`); v != auditBase+4 {
		t.Errorf("metric messages_bridged_total{route=audit} = %v, want %v (the probes, three cases, metadata)", v, auditBase+4)
	}
	if d := client.queueDepth(queue); d != 0 {
		t.Errorf("queue %s holds %d messages after every one was settled", queue, d)
	}
}

// TestAMQPEmptyRoutingKeyDropped: RabbitMQ routes the empty routing key to a
// `#` binding, but weida's `*` would select it as one empty segment where
// RabbitMQ's `*` does not: the connector drops it and counts it, so a weida
// `*` subscriber never sees it. The queue is a server-named exclusive one.
func TestAMQPEmptyRoutingKeyDropped(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	u := unique()
	client := amqpConnect(t, rabbitAddr)
	exchange := "e2e-" + u
	client.declareExchange(t, exchange)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/all", freePort(t, "udp"))
	res := amqpResource{
		Name: "amqp-all", Direction: policy.Inbound, Exchange: exchange, Endpoint: endpoint,
		Routes: []amqpRoute{{"all", "#"}},
	}
	file := writeFile(t, t.TempDir(), "all.yaml", res.YAML(t))
	c := StartConnector(t, amqpEnv, "-f", file)
	c.WaitReady(30 * time.Second)

	star := collectWeida(t, endpoint, weida.Limits{}, "*")
	hash := collectWeida(t, endpoint, weida.Limits{}, "#")
	probe := func() { client.mustPublish(t, exchange, "probe", "probe-"+u) }
	star.Sync(20*time.Second, "probe-"+u, probe)
	hash.Sync(20*time.Second, "probe-"+u, probe)

	client.mustPublish(t, exchange, "", "empty routing key")
	client.mustPublish(t, exchange, "one", "one word")
	Eventually(t, 20*time.Second, "the empty routing key dropped and counted", func() bool {
		st, _ := c.Status("amqp-all")
		return st.Counters.Dropped[policy.RuleAMQPEmptyRoutingKey] == 1
	})
	Eventually(t, 10*time.Second, "the one-word key at both subscribers", func() bool {
		return star.Has("one", "one word") && hash.Has("one", "one word")
	})
	for name, col := range map[string]*weidaCollector{"*": star, "#": hash} {
		for _, m := range col.Messages() {
			if string(m.Payload) == "empty routing key" {
				t.Errorf("the %s subscriber received the empty routing key as %q", name, m.Topic)
			}
		}
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="amqp-empty-routing-key",resource="amqp-all",route="all"}`); v != 1 {
		t.Errorf("metric messages_dropped_total{reason=amqp-empty-routing-key} = %v, want 1", v)
	}
	if !strings.Contains(c.StatusJSON(), `server-named exclusive queue \"amq.gen-`) {
		t.Errorf("status does not name the server-named queue:\n%s", c.StatusJSON())
	}
}

// TestAMQPOutboundConfirms bridges a weida publisher to a RabbitMQ topic
// exchange through `connector run`: routed messages arrive with their
// routing key, payload, metadata and loop marker; a message no queue is
// bound for comes back (mandatory) and is counted as unroutable; weida
// topics with no routing-key form are dropped and counted.
func TestAMQPOutboundConfirms(t *testing.T) {
	requireTCP(t, "RabbitMQ", rabbitAddr)
	u := unique()
	client := amqpConnect(t, rabbitAddr)
	exchange := "e2e-" + u
	client.declareExchange(t, exchange)
	got := amqpCollect(t, rabbitAddr, exchange, "orders.#")
	wpub, url := weidaPublisher(t, "/orders")
	res := amqpResource{
		Name: "amqp-out", Direction: policy.Outbound, Exchange: exchange, Endpoint: url,
		Routes: []amqpRoute{{"created", "orders.*.created"}, {"audit", "audit.#"}, {"single", "*"}},
	}
	file := writeFile(t, t.TempDir(), "out.yaml", res.YAML(t))
	marker := "e2e-marker-" + u
	c := StartConnector(t, amqpEnv, "--instance", marker, "-f", file)
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, wpub, 1, 20*time.Second)

	publish := func(m weida.Message) {
		t.Helper()
		if _, err := wpub.Publish(ctx(t, 5*time.Second), m); err != nil {
			t.Fatal(err)
		}
	}
	// Every subscription must be in force at the publisher before counting.
	Eventually(t, 20*time.Second, "the outbound subscriptions", func() bool {
		publish(weida.Message{Topic: "orders.probe.created", Payload: []byte("probe")})
		time.Sleep(50 * time.Millisecond)
		return got.Len() > 0
	})
	Eventually(t, 10*time.Second, "the probes to settle", func() bool {
		st, _ := c.Status("amqp-out")
		return settled(st) == st.Counters.Received
	})
	base, _ := c.Status("amqp-out")
	before := got.Len()

	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	publish(weida.Message{Topic: "orders.eu.created", Payload: []byte("eu"), ContentType: "text/plain", Traceparent: tp, Tracestate: "v=1"})
	publish(weida.Message{Topic: "orders..created", Payload: []byte("empty word")})
	publish(weida.Message{Topic: "audit.login", Payload: []byte("no queue bound")})
	publish(weida.Message{Topic: "audit." + strings.Repeat("x", 250), Payload: []byte("256 bytes")})
	publish(weida.Message{Topic: "", Payload: []byte("empty topic")})

	Eventually(t, 20*time.Second, "every outbound message settled", func() bool {
		st, _ := c.Status("amqp-out")
		return st.Counters.Received-base.Counters.Received == 5 && settled(st) == st.Counters.Received
	})
	Eventually(t, 10*time.Second, "the routed messages at the AMQP consumer", func() bool { return got.Len() >= before+2 })
	ds := got.Messages()[before:]
	if len(ds) != 2 {
		t.Fatalf("AMQP consumer got %d messages, want 2", len(ds))
	}
	byKey := map[string]amqp.Delivery{}
	for _, d := range ds {
		byKey[d.RoutingKey] = d
	}
	eu, ok := byKey["orders.eu.created"]
	if !ok || string(eu.Body) != "eu" {
		t.Fatalf("orders.eu.created missing or wrong: %+v", byKey)
	}
	if eu.ContentType != "text/plain" || eu.Headers["traceparent"] != tp || eu.Headers["tracestate"] != "v=1" {
		t.Errorf("metadata: content type %q, headers %v", eu.ContentType, eu.Headers)
	}
	if eu.Headers["x-weida-connector"] != marker {
		t.Errorf("loop marker header = %v, want %q", eu.Headers["x-weida-connector"], marker)
	}
	if eu.DeliveryMode != amqp.Persistent {
		t.Errorf("delivery mode %d, want persistent", eu.DeliveryMode)
	}
	if d, ok := byKey["orders..created"]; !ok || string(d.Body) != "empty word" {
		t.Errorf("orders..created missing: %+v", byKey)
	}

	st, _ := c.Status("amqp-out")
	for reason, want := range map[string]uint64{
		"unroutable":                   1,
		policy.RuleAMQPTooLong:         1,
		policy.RuleAMQPEmptyRoutingKey: 1,
	} {
		if n := st.Counters.Dropped[reason] - base.Counters.Dropped[reason]; n != want {
			t.Errorf("status dropped[%s] = %d, want %d; status:\n%s", reason, n, want, c.StatusJSON())
		}
	}
	if n := st.Counters.Bridged - base.Counters.Bridged; n != 2 {
		t.Errorf("status bridged = %d, want 2", n)
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="unroutable",resource="amqp-out",route="audit"}`); v != 1 {
		t.Errorf("metric messages_dropped_total{reason=unroutable,route=audit} = %v, want 1", v)
	}
}
