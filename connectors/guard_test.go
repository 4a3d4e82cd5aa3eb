package connectors_test

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// lyingPolicy is a policy with a defect: it converts the topics in lies to
// the converted form of another topic. The exactness guard exists for
// exactly this: a conversion bug must drop messages, never deliver them
// where no route says.
type lyingPolicy struct {
	policy.Policy
	lies map[string]string // topic (either form) → the topic whose conversion it gets
}

func (p lyingPolicy) TopicToWeida(t string) (string, error) {
	if other, ok := p.lies[t]; ok {
		t = other
	}
	return p.Policy.TopicToWeida(t)
}

func (p lyingPolicy) TopicFromWeida(t string) (string, error) {
	if other, ok := p.lies[t]; ok {
		return other, nil
	}
	return p.Policy.TopicFromWeida(t)
}

// guardRoutes returns the routes of the guard tests: the NATS filters
// given, then, when indexed, enough fillers that no topic of the tests
// selects for the bridge to find routes through its index.
func guardRoutes(t *testing.T, p policy.Policy, indexed bool, filters ...string) []connectors.Route {
	t.Helper()
	if indexed {
		for i := range 20 {
			filters = append(filters, fmt.Sprintf("filler%d.*", i))
		}
	}
	var routes []connectors.Route
	for _, f := range filters {
		wf, err := p.ConvertFilter(f)
		if err != nil {
			t.Fatal(err)
		}
		routes = append(routes, connectors.Route{Name: f, Foreign: f, Weida: wf})
	}
	return routes
}

func waitCounters(t *testing.T, b *connectors.Bridge, done func(connectors.Counters) bool) connectors.Counters {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := b.Status().Counters
		if done(c) {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("counters never settled: %+v", c)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestInboundGuardIndependentOfIndex: with enough routes for the route
// index, a message whose converted topic the index places under a route
// whose foreign filter does not select the message's topic is dropped and
// counted as guard-mismatch. Before, the index was the only check, and the
// message was published.
func TestInboundGuardIndependentOfIndex(t *testing.T) {
	pub, url, nats, _ := weidaPath(t, "/in", "in.a")
	p := lyingPolicy{Policy: nats, lies: map[string]string{"in.b": "in.a"}}
	spec := connectors.Spec{
		Name: "in", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p,
		Routes: guardRoutes(t, p, true, "in.a"), Endpoint: url,
	}
	src := newChanSource()
	b := connectors.NewInbound(spec, func(connectors.StateFunc) (connectors.Source, error) { return src, nil }, pub,
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	env := &inboundEnv{src: src}
	s := (&inboundEnv{url: url}).subscriber(t)
	waitCounters(t, b, func(connectors.Counters) bool { return pub.Subscribers() > 0 })
	env.send(t, "in.b")
	env.send(t, "in.a")
	if got := receiveTopic(t, s); got != "in.a" {
		t.Errorf("the subscriber got %q first; want only in.a", got)
	}
	c := waitCounters(t, b, func(c connectors.Counters) bool { return c.Received == 2 && c.InFlight == 0 })
	if c.Dropped[connectors.ReasonGuardMismatch] != 1 || c.Bridged != 1 {
		t.Errorf("counters %+v; want in.b dropped as %s and in.a bridged", c, connectors.ReasonGuardMismatch)
	}
}

// TestOutboundGuard: an outbound message whose conversion escapes the
// route that selected it is dropped and counted as guard-mismatch, whether
// the route was found through the index (the foreign side is re-checked)
// or by the scan (the weida side is). Before, outbound had no guard, and
// the Sink wrote such messages.
func TestOutboundGuard(t *testing.T) {
	for _, indexed := range []bool{false, true} {
		t.Run(fmt.Sprintf("indexed=%v", indexed), func(t *testing.T) {
			l, pub, url, nats, _ := weidaListenerPath(t, "/out", "out.a")
			_ = l
			var lies map[string]string
			var routes []connectors.Route
			if indexed {
				// The index finds out.a by its weida filter; the lie
				// turns it into a topic out.a's foreign filter does not
				// select.
				routes = guardRoutes(t, nats, true, "out.a")
				lies = map[string]string{routes[0].Weida: "out.z"}
			} else {
				// The scan finds out.b by its foreign filter; the weida
				// topic is under out.a only.
				routes = guardRoutes(t, nats, false, "out.a", "out.b")
				lies = map[string]string{routes[0].Weida: "out.b"}
			}
			p := lyingPolicy{Policy: nats, lies: lies}
			spec := connectors.Spec{
				Name: "out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
				Routes: routes, Endpoint: url,
			}
			mem := &memSink{}
			b := connectors.NewOutbound(spec,
				func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
				func(connectors.StateFunc) (connectors.Sink, error) { return mem, nil },
				connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry()), Backoff: func(int) time.Duration { return time.Millisecond }})
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() { done <- b.Run(ctx) }()
			defer func() { cancel(); <-done }()
			waitCounters(t, b, func(connectors.Counters) bool { return pub.Subscribers() > 0 })
			if _, err := pub.Publish(context.Background(), weida.Message{Topic: routes[0].Weida, Payload: []byte("x")}); err != nil {
				t.Fatal(err)
			}
			c := waitCounters(t, b, func(c connectors.Counters) bool { return c.Received == 1 && c.InFlight == 0 })
			if w := mem.writtenTopics(); len(w) != 0 || c.Dropped[connectors.ReasonGuardMismatch] != 1 {
				t.Errorf("written %q, counters %+v; want nothing written and one %s drop", w, c, connectors.ReasonGuardMismatch)
			}
		})
	}
}
