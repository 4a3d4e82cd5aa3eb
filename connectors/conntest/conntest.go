// Package conntest is the conformance suite every broker driver of the
// bridge runtime runs against its real broker. A driver writes a small
// [Harness]; [Run] then drives the driver through the runtime exactly as
// `connector run` does: real weida endpoints over loopback QUIC on one side,
// the real broker on the other.
package conntest

import (
	"context"
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// Harness adapts one driver and its broker to the suite.
type Harness interface {
	// Policy is the driver's default conversion policy (the first of its
	// Policies); the suite converts with it.
	Policy() policy.Policy
	// NewSource returns an inbound Source for a resource named name.
	// marker is the loop marker value the Source must recognise.
	NewSource(name, marker string, report connectors.StateFunc) (connectors.Source, error)
	// NewSink returns an outbound Sink marking what it publishes with
	// marker.
	NewSink(name, marker string, report connectors.StateFunc) (connectors.Sink, error)
	// Publish sends m to the broker directly, bypassing the connector.
	Publish(ctx context.Context, m *connectors.Message) error
	// Subscribe subscribes directly on the broker and returns the messages
	// that arrive, until stop is called.
	Subscribe(ctx context.Context, filter string) (msgs <-chan *connectors.Message, stop func(), err error)
	// Topics returns, in the foreign grammar and unique to this call, a
	// filter with one single-level wildcard, a topic it selects, a topic it
	// does not select, and a topic it selects whose form the default
	// policy cannot convert (empty when every selected topic converts).
	Topics() (filter, selected, other, unconvertible string)
	// Capabilities tells which optional behaviours the driver has.
	Capabilities() Capabilities

	// PrivateBroker returns a broker of the driver's kind of the test's
	// own (see package brokertest), running or not, or nil when the
	// harness cannot point its driver at one (the subtests that kill or
	// start a broker are then skipped). The suite starts, kills and
	// restarts it and leaves it in any state: a harness may return the
	// same broker to every subtest of one test, as a RabbitMQ node takes
	// seconds to start.
	PrivateBroker(t *testing.T) *brokertest.Broker
	// At returns a harness like this one whose Sources, Sinks, Publish
	// and Subscribe use the broker at addr (host:port) instead. The
	// broker there may not be running (yet), or may not be a broker at
	// all: building a Source or Sink must not need it.
	At(t *testing.T, addr string) Harness
	// Refusing returns a harness whose Sources and Sinks present
	// credentials their broker refuses (a wrong password, or none where
	// the broker wants one), or nil when the harness cannot produce one
	// cheaply; Capabilities.CredentialsRefused says which.
	Refusing(t *testing.T) Harness
}

// Capabilities are a driver's optional behaviours.
type Capabilities struct {
	// Metadata: content type and W3C trace context travel both ways.
	Metadata bool
	// Redelivery: a message read but not acknowledged before the Source
	// closes is delivered again to the next Source of the same resource.
	Redelivery bool
	// CredentialsRefused: Refusing returns a harness, and the driver
	// names the broker's refusal of its credentials CredentialsRefused.
	CredentialsRefused bool
	// RetriesInStart: while the broker is unreachable, Start keeps
	// trying within one attempt (until its ctx ends), reporting each
	// failed try's reason through the StateFunc, instead of ending the
	// attempt with a Failure. The unit then shows the reason in its
	// BrokerConnected condition rather than in Status.Failure.
	RetriesInStart bool
	// RedeliverAfter is how long the broker waits before it delivers
	// again a message a closed Source left unacknowledged (a JetStream
	// consumer's AckWait); zero means at once, on the next Source.
	RedeliverAfter time.Duration
}

// Run runs the suite. newHarness is called once per subtest.
func Run(t *testing.T, newHarness func(t *testing.T) Harness) {
	tests := []struct {
		name string
		fn   func(t *testing.T, h Harness)
	}{
		{"InboundRoundTrip", testInboundRoundTrip},
		{"InboundUnconvertibleCounted", testInboundUnconvertible},
		{"OutboundRoundTrip", testOutboundRoundTrip},
		{"Metadata", testMetadata},
		{"LoopMarker", testLoopMarker},
		{"Redelivery", testRedelivery},
		{"CloseTwice", testCloseTwice},
		{"StartWhileUnreachable", testStartWhileUnreachable},
		{"BrokerKilledAndRestarted", testBrokerKilledAndRestarted},
		{"Classification", testClassification},
		{"Cancellation", testCancellation},
		{"NoGoroutineLeak", testNoGoroutineLeak},
		{"AckAfterHandoff", testAckAfterHandoff},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) { tc.fn(t, newHarness(t)) })
	}
}

// Unique returns a short random token for topic names, so that runs and
// subtests never see each other's messages.
func Unique() string { return fmt.Sprintf("ct%08x", rand.Uint32()) }

func ctxFor(t *testing.T, d time.Duration) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return ctx
}

// bridgeEnv is one bridge under test with its weida side.
type bridgeEnv struct {
	metrics *connectors.Metrics
	bridge  *connectors.Bridge
	stop    func()
}

func route(t *testing.T, p policy.Policy, filter string) connectors.Route {
	t.Helper()
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatalf("policy %s refuses the harness filter %q: %v", p.Name(), filter, err)
	}
	return connectors.Route{Name: "r", Foreign: filter, Weida: wf}
}

func startBridge(t *testing.T, b *connectors.Bridge) func() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	stopped := false
	stop := func() {
		if stopped {
			return
		}
		stopped = true
		cancel()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("bridge Run: %v", err)
			}
		case <-time.After(15 * time.Second):
			t.Errorf("bridge did not stop within 15 s")
		}
	}
	t.Cleanup(stop)
	return stop
}

// waitReady waits until the bridge's Ready condition is True.
func waitReady(t *testing.T, b *connectors.Bridge) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for time.Now().Before(deadline) {
		if b.Status().Ready() {
			return
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Fatalf("bridge not ready: %+v", b.Status().Conditions)
}

// inbound starts an inbound bridge for filter and a weida subscriber on its
// endpoint subscribed to wfilter.
func inbound(t *testing.T, h Harness, filter, marker string) (*bridgeEnv, *weida.Subscriber, *weida.Publisher) {
	t.Helper()
	p := h.Policy()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pub, err := l.Publisher("/conntest")
	if err != nil {
		t.Fatal(err)
	}
	name := "in-" + Unique()
	spec := connectors.Spec{
		Name: name, Protocol: h.Policy().Protocol(), Direction: policy.Inbound, Policy: p,
		Routes:   []connectors.Route{route(t, p, filter)},
		Endpoint: "weida://" + l.Addr().String() + "/conntest",
	}
	m := connectors.NewMetrics(prometheus.NewRegistry())
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return h.NewSource(name, marker, report)
	}, pub, connectors.Deps{Metrics: m})
	env := &bridgeEnv{metrics: m, bridge: b}
	env.stop = startBridge(t, b)
	waitReady(t, b)

	sub, err := weida.Dial(ctxFor(t, 10*time.Second), "weida://"+l.Fingerprint()+"@"+l.Addr().String()+"/conntest", weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	if err := sub.Subscribe(ctxFor(t, 10*time.Second), ""); err != nil {
		t.Fatal(err)
	}
	// SUBSCRIBE travels on its own stream: wait until the publisher holds it.
	deadline := time.Now().Add(10 * time.Second)
	for pub.Subscribers() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return env, sub, pub
}

// outbound starts a weida publisher and an outbound bridge dialling it.
func outbound(t *testing.T, h Harness, filter, marker string) (*bridgeEnv, *weida.Publisher) {
	t.Helper()
	p := h.Policy()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pub, err := l.Publisher("/conntest-out")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/conntest-out"
	name := "out-" + Unique()
	spec := connectors.Spec{
		Name: name, Protocol: h.Policy().Protocol(), Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{route(t, p, filter)}, Endpoint: url, InFlight: 8,
	}
	m := connectors.NewMetrics(prometheus.NewRegistry())
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) { return h.NewSink(name, marker, report) },
		connectors.Deps{Metrics: m})
	env := &bridgeEnv{metrics: m, bridge: b}
	env.stop = startBridge(t, b)
	waitReady(t, b)
	deadline := time.Now().Add(10 * time.Second)
	for pub.Subscribers() == 0 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	return env, pub
}

func receiveWeida(t *testing.T, sub *weida.Subscriber, d time.Duration) (weida.Message, bool) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), d)
	defer cancel()
	m, err := sub.Receive(ctx)
	if err != nil {
		return weida.Message{}, false
	}
	return m, true
}

func receiveBroker(msgs <-chan *connectors.Message, d time.Duration) (*connectors.Message, bool) {
	select {
	case m := <-msgs:
		return m, true
	case <-time.After(d):
		return nil, false
	}
}

func dropped(b *connectors.Bridge, reason string) uint64 { return b.Status().Counters.Dropped[reason] }
