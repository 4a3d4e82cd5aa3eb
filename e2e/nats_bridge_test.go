package e2e

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestNATSInbound bridges nats-server to weida through `connector run`:
// the route orders.*.created bridges orders.eu.created and not
// orders.eu.fr.created; metadata travels; a subject too long for weida is
// dropped and counted.
func TestNATSInbound(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/orders", freePort(t, "udp"))
	res := natsResource{Name: "nats-in", Direction: policy.Inbound, Endpoint: endpoint,
		Routes: []string{u + ".orders.*.created"}}
	file := writeFile(t, t.TempDir(), "in.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	nc := natsConn(t, natsAddr)
	publish := func(subject, payload string, h natsgo.Header) {
		t.Helper()
		if err := nc.PublishMsg(&natsgo.Msg{Subject: subject, Data: []byte(payload), Header: h}); err != nil {
			t.Fatal(err)
		}
	}
	sub.Sync(20*time.Second, "probe-"+u, func() { publish(u+".orders.probe.created", "probe-"+u, nil) })
	c.Quiesce("nats-in")
	base, _ := c.Status("nats-in")

	long := u + ".orders." + strings.Repeat("x", 260) + ".created"
	cases := []struct {
		subject string
		bridged bool
		payload string
	}{
		{u + ".orders.eu.created", true, "eu"},
		{u + ".orders.eu.fr.created", false, "* is exactly one token"},
		{u + ".orders.eu.cancelled", false, "other event"},
		{u + ".orders.created", false, "* needs a token"},
		{u + ".orders.café.created", true, "non-ASCII token"},
		{u + ".orders.$x.created", true, "$ token"},
		{u + ".orders.#.created", true, "literal # token"},
		{u + ".orders.*b.created", true, "literal *b token"},
		{u + ".orders.bin.created", true, "\x00\x01\xff binary"},
		{long, false, "too long for weida: dropped, counted"},
	}
	for _, tc := range cases {
		publish(tc.subject, tc.payload, nil)
	}
	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	publish(u+".orders.meta.created", `{"a":1}`, natsgo.Header{
		"Content-Type": {"application/json"}, "traceparent": {tp}, "tracestate": {"vendor=x"}, "X-Other": {"lost"},
	})
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	received := uint64(1) // the metadata message
	for _, tc := range cases {
		if policy.NATSGrammar().Match(res.Routes[0], tc.subject) {
			received++
		}
	}
	Eventually(t, 20*time.Second, "the connector to settle every message", func() bool {
		st, _ := c.Status("nats-in")
		return st.Counters.Received-base.Counters.Received == received &&
			st.Counters.Acknowledged-base.Counters.Acknowledged == received
	})
	var want []string
	for _, tc := range cases {
		if tc.bridged {
			want = append(want, tc.subject)
		}
	}
	want = append(want, u+".orders.meta.created")
	Eventually(t, 10*time.Second, "every bridged message at the weida subscriber", func() bool { return sub.Len() >= len(want) })
	time.Sleep(200 * time.Millisecond) // let a wrongly bridged message show up, too
	var got []string
	for _, m := range sub.Messages() {
		got = append(got, m.Topic)
		if m.Topic == u+".orders.meta.created" {
			if m.ContentType != "application/json" || m.Traceparent != tp || m.Tracestate != "vendor=x" {
				t.Errorf("metadata lost: %+v", m)
			}
			continue
		}
		for _, tc := range cases {
			if tc.subject == m.Topic && tc.payload != string(m.Payload) {
				t.Errorf("%s: payload %q, want %q", m.Topic, m.Payload, tc.payload)
			}
		}
	}
	slices.Sort(got)
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Errorf("weida topics:\n got %q\nwant %q", got, want)
	}
	st, _ := c.Status("nats-in")
	if d := st.Counters.Dropped[policy.RuleTopicTooLong] - base.Counters.Dropped[policy.RuleTopicTooLong]; d != 1 {
		t.Errorf("dropped[%s] = %d, want 1; %+v", policy.RuleTopicTooLong, d, st.Counters)
	}
	if v := c.Metric(`weida_connector_messages_dropped_total{reason="` + policy.RuleTopicTooLong + `",resource="nats-in"`); v < 1 {
		t.Errorf("metric for the too-long drop = %v", v)
	}
}

// TestNATSOutbound bridges a weida publisher to nats-server through
// `connector run`: topics the route may produce arrive converted, with
// metadata and the loop marker; topics NATS cannot carry are dropped and
// counted under their rule.
func TestNATSOutbound(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	pub, url := weidaPublisher(t, "/orders")
	res := natsResource{Name: "nats-out", Direction: policy.Outbound, Endpoint: url,
		Routes: []string{u + ".orders.*.created"}}
	file := writeFile(t, t.TempDir(), "out.yaml", res.YAML(t))
	nc := natsConn(t, natsAddr)
	got := collectNATS(t, nc, u+".>")
	c := StartConnector(t, nil, "-f", file, "--instance", "e2e-"+u)
	c.WaitReady(30 * time.Second)
	waitSubscribers(t, pub, 1, 20*time.Second)

	// The SUBSCRIBE may not be in force yet: probe until one arrives.
	Eventually(t, 20*time.Second, "the probe on nats-server", func() bool {
		if _, err := pub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: u + ".orders.probe.created", Payload: []byte("probe")}); err != nil {
			t.Fatal(err)
		}
		time.Sleep(50 * time.Millisecond)
		return got.Len() > 0
	})
	base, _ := c.Status("nats-out")
	n0 := got.Len()

	tp := "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	cases := []struct {
		topic string
		rule  string // "" = delivered
	}{
		{u + ".orders.eu.created", ""},
		{u + ".orders.café.created", ""},
		{u + ".orders..created", policy.RuleNATSEmptyToken},
		{u + ".orders.a b.created", policy.RuleNATSWhitespace},
		{u + ".orders.*.created", policy.RuleNATSWildcardTok},
		{u + ".orders.>.created", policy.RuleNATSWildcardTok},
	}
	for _, tc := range cases {
		m := weida.Message{Topic: tc.topic, Payload: []byte("p:" + tc.topic), ContentType: "text/plain", Traceparent: tp, Tracestate: "v=1"}
		if _, err := pub.Publish(ctx(t, 5*time.Second), m); err != nil {
			t.Fatal(err)
		}
	}
	Eventually(t, 20*time.Second, "every message settled", func() bool {
		st, _ := c.Status("nats-out")
		return st.Counters.Received-base.Counters.Received == uint64(len(cases))
	})
	Eventually(t, 10*time.Second, "the deliverable messages on nats-server", func() bool { return got.Len()-n0 >= 2 })
	time.Sleep(200 * time.Millisecond)
	msgs := got.Messages()[n0:]
	var subjects []string
	for _, m := range msgs {
		subjects = append(subjects, m.Subject)
		if string(m.Data) != "p:"+m.Subject {
			t.Errorf("%s: payload %q", m.Subject, m.Data)
		}
		if m.Header.Get("Content-Type") != "text/plain" || m.Header.Get("traceparent") != tp || m.Header.Get("tracestate") != "v=1" {
			t.Errorf("%s: metadata lost: %v", m.Subject, m.Header)
		}
		if m.Header.Get("x-weida-connector") != "e2e-"+u {
			t.Errorf("%s: loop marker %q, want %q", m.Subject, m.Header.Get("x-weida-connector"), "e2e-"+u)
		}
	}
	slices.Sort(subjects)
	if want := []string{u + ".orders.café.created", u + ".orders.eu.created"}; !slices.Equal(subjects, want) {
		t.Errorf("nats-server got %q, want %q", subjects, want)
	}
	st, _ := c.Status("nats-out")
	for rule, n := range map[string]uint64{policy.RuleNATSEmptyToken: 1, policy.RuleNATSWhitespace: 1, policy.RuleNATSWildcardTok: 2} {
		if d := st.Counters.Dropped[rule] - base.Counters.Dropped[rule]; d != n {
			t.Errorf("dropped[%s] = %d, want %d; %+v", rule, d, n, st.Counters)
		}
	}
	if d := st.Counters.Bridged - base.Counters.Bridged; d != 2 {
		t.Errorf("bridged %d, want 2", d)
	}
}

// TestNATSRefusedGreaterThan: a resource with the route orders.> makes
// `connector run` exit non-zero with the one-or-more diagnostic, and start
// nothing.
func TestNATSRefusedGreaterThan(t *testing.T) {
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/orders", freePort(t, "udp"))
	res := natsResource{Name: "nats-gt", Direction: policy.Inbound, Endpoint: endpoint,
		Routes: []string{u + ".orders.*.created", "orders.>"}}
	content := res.YAML(t)
	file := writeFile(t, t.TempDir(), "gt.yaml", content)
	c := StartConnector(t, nil, "-f", file)
	code, exited := c.Wait(30 * time.Second)
	if !exited {
		t.Fatalf("connector run kept running with a refused resource:\n%s", c.Output())
	}
	if code == 0 {
		t.Errorf("exit code 0, want non-zero")
	}
	out := c.Output()
	for _, want := range []string{
		"refusing to start; nothing was started",
		fmt.Sprintf("%s:%s  spec.routes[1].filter", file, position(t, content, `"orders.>"`, 1)),
		"[" + policy.RuleNATSOneOrMore + "]",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Nothing started: no weida endpoint answers.
	dctx := ctx(t, 2*time.Second)
	if sub, err := weida.Dial(dctx, endpoint, weida.DialConfig{InsecureSkipVerifyForTesting: true}); err == nil {
		sub.Close()
		t.Errorf("the weida endpoint %s answers although nothing should have started", endpoint)
	}
}
