package conntest

import (
	"context"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// testInboundRoundTrip: a broker message on a selected topic reaches the
// weida subscriber with its topic converted and its payload unchanged; one
// on an unselected topic does not.
func testInboundRoundTrip(t *testing.T, h Harness) {
	filter, selected, other, _ := h.Topics()
	env, sub, _ := inbound(t, h, filter, "m-"+Unique())
	p := h.Policy()
	ctx := ctxFor(t, 20*time.Second)
	if err := h.Publish(ctx, &connectors.Message{Topic: other, Payload: []byte("not for us")}); err != nil {
		t.Fatal(err)
	}
	if err := h.Publish(ctx, &connectors.Message{Topic: selected, Payload: []byte("hello \x00 bytes")}); err != nil {
		t.Fatal(err)
	}
	m, ok := receiveWeida(t, sub, 10*time.Second)
	if !ok {
		t.Fatalf("no weida copy; status %+v", env.bridge.Status())
	}
	want, _ := p.TopicToWeida(selected)
	if m.Topic != want || string(m.Payload) != "hello \x00 bytes" {
		t.Fatalf("got topic %q payload %q, want %q %q", m.Topic, m.Payload, want, "hello \x00 bytes")
	}
	if m2, ok := receiveWeida(t, sub, 300*time.Millisecond); ok {
		t.Fatalf("unexpected second copy %q", m2.Topic)
	}
	// The copy can reach weida before the bridge has counted the broker's
	// acknowledgement (it counts it once the driver's ack returned), so
	// the counters get a moment to catch up.
	st := env.bridge.Status().Counters
	for deadline := time.Now().Add(10 * time.Second); st.Acknowledged < 1 && time.Now().Before(deadline); {
		time.Sleep(20 * time.Millisecond)
		st = env.bridge.Status().Counters
	}
	if st.Bridged != 1 || st.Acknowledged < 1 {
		t.Fatalf("counters %+v, want bridged 1 and acknowledged ≥ 1", st)
	}
}

// testInboundUnconvertible: a selected topic with no exact weida form is
// dropped and counted, never delivered under another name.
func testInboundUnconvertible(t *testing.T, h Harness) {
	filter, selected, _, bad := h.Topics()
	if bad == "" {
		t.Skip("every topic the harness filter selects converts")
	}
	env, sub, _ := inbound(t, h, filter, "m-"+Unique())
	ctx := ctxFor(t, 20*time.Second)
	if err := h.Publish(ctx, &connectors.Message{Topic: bad, Payload: []byte("x")}); err != nil {
		t.Fatal(err)
	}
	if err := h.Publish(ctx, &connectors.Message{Topic: selected, Payload: []byte("y")}); err != nil {
		t.Fatal(err)
	}
	m, ok := receiveWeida(t, sub, 10*time.Second)
	if !ok || string(m.Payload) != "y" {
		t.Fatalf("want only the convertible message, got %q ok=%v", m.Payload, ok)
	}
	_, err := h.Policy().TopicToWeida(bad)
	rule := err.(*policy.Refusal).Rule
	deadline := time.Now().Add(5 * time.Second)
	for dropped(env.bridge, rule) != 1 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if got := dropped(env.bridge, rule); got != 1 {
		t.Fatalf("dropped[%s] = %d, want 1; counters %+v", rule, got, env.bridge.Status().Counters)
	}
}

// testOutboundRoundTrip: a weida message on a topic the route may produce
// reaches the broker converted; one outside the route is dropped, counted.
func testOutboundRoundTrip(t *testing.T, h Harness) {
	filter, selected, other, _ := h.Topics()
	p := h.Policy()
	msgs, stop, err := h.Subscribe(ctxFor(t, 10*time.Second), filter)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	env, pub := outbound(t, h, filter, "m-"+Unique())
	wSel, _ := p.TopicToWeida(selected)
	wOther, _ := p.TopicToWeida(other)
	ctx := ctxFor(t, 20*time.Second)
	if _, err := pub.Publish(ctx, weida.Message{Topic: wOther, Payload: []byte("no")}); err != nil {
		t.Fatal(err)
	}
	if _, err := pub.Publish(ctx, weida.Message{Topic: wSel, Payload: []byte("yes")}); err != nil {
		t.Fatal(err)
	}
	m, ok := receiveBroker(msgs, 10*time.Second)
	if !ok {
		t.Fatalf("nothing reached the broker; status %+v", env.bridge.Status())
	}
	if m.Topic != selected || string(m.Payload) != "yes" {
		t.Fatalf("got %q %q, want %q %q", m.Topic, m.Payload, selected, "yes")
	}
	// The weida filter selects only what the route selects, so "other"
	// never even reaches the connector.
	if m2, ok := receiveBroker(msgs, 300*time.Millisecond); ok {
		t.Fatalf("unexpected broker message %q", m2.Topic)
	}
}

// testMetadata: content type and trace context travel both ways.
func testMetadata(t *testing.T, h Harness) {
	if !h.Capabilities().Metadata {
		t.Skip("driver carries no metadata")
	}
	filter, selected, _, _ := h.Topics()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	const ts = "vendor=opaque"
	_, sub, _ := inbound(t, h, filter, "m-"+Unique())
	ctx := ctxFor(t, 20*time.Second)
	if err := h.Publish(ctx, &connectors.Message{Topic: selected, Payload: []byte("m"), ContentType: "application/json", Traceparent: tp, Tracestate: ts}); err != nil {
		t.Fatal(err)
	}
	m, ok := receiveWeida(t, sub, 10*time.Second)
	if !ok {
		t.Fatal("no weida copy")
	}
	if m.ContentType != "application/json" || m.Traceparent != tp || m.Tracestate != ts {
		t.Fatalf("inbound metadata lost: %+v", m)
	}

	msgs, stop, err := h.Subscribe(ctx, filter)
	if err != nil {
		t.Fatal(err)
	}
	defer stop()
	_, pub := outbound(t, h, filter, "m-"+Unique())
	w, _ := h.Policy().TopicToWeida(selected)
	if _, err := pub.Publish(ctx, weida.Message{Topic: w, Payload: []byte("m"), ContentType: "text/plain", Traceparent: tp, Tracestate: ts}); err != nil {
		t.Fatal(err)
	}
	bm, ok := receiveBroker(msgs, 10*time.Second)
	if !ok {
		t.Fatal("nothing reached the broker")
	}
	if bm.ContentType != "text/plain" || bm.Traceparent != tp || bm.Tracestate != ts {
		t.Fatalf("outbound metadata lost: %+v", bm)
	}
}

// testLoopMarker: what an outbound bridge publishes is recognised by an
// inbound bridge with the same marker and not bridged back.
func testLoopMarker(t *testing.T, h Harness) {
	filter, selected, _, _ := h.Topics()
	marker := "m-" + Unique()
	in, sub, _ := inbound(t, h, filter, marker)
	_, pub := outbound(t, h, filter, marker)
	w, _ := h.Policy().TopicToWeida(selected)
	if _, err := pub.Publish(ctxFor(t, 10*time.Second), weida.Message{Topic: w, Payload: []byte("echo?")}); err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for dropped(in.bridge, connectors.ReasonLoop) == 0 && time.Now().Before(deadline) {
		time.Sleep(10 * time.Millisecond)
	}
	if dropped(in.bridge, connectors.ReasonLoop) != 1 {
		t.Fatalf("inbound did not drop the looped message: %+v", in.bridge.Status().Counters)
	}
	if m, ok := receiveWeida(t, sub, 300*time.Millisecond); ok {
		t.Fatalf("looped message was bridged: %q", m.Topic)
	}
}

// testRedelivery: a message read but not acknowledged when the Source
// closes comes back to the next Source of the same resource, marked
// Redelivered.
func testRedelivery(t *testing.T, h Harness) {
	if !h.Capabilities().Redelivery {
		t.Skip("driver does not redeliver")
	}
	filter, selected, _, _ := h.Topics()
	name := "redeliver-" + Unique()
	ctx := ctxFor(t, 30*time.Second)
	src := startSource(t, ctx, h, name, filter)
	if err := h.Publish(ctx, &connectors.Message{Topic: selected, Payload: []byte("again")}); err != nil {
		t.Fatal(err)
	}
	m, ack, err := src.Read(ctx)
	if err != nil || string(m.Payload) != "again" {
		t.Fatalf("first read: %v %v", m, err)
	}
	if m.Redelivered {
		t.Error("the first delivery is marked Redelivered")
	}
	ack(context.Canceled) // not settled: the connector is stopping
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	src2 := startSource(t, ctx, h, name, filter)
	defer src2.Close(context.Background())
	rctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	m2, ack2, err := src2.Read(rctx)
	if err != nil {
		t.Fatalf("not redelivered: %v", err)
	}
	ack2(nil)
	if string(m2.Payload) != "again" {
		t.Fatalf("redelivered %q", m2.Payload)
	}
	// The broker says so (MQTT DUP, AMQP redelivered, a JetStream
	// delivery count of 2), and the Source passes it on: a drop of it
	// is then counted as redelivery-dropped, not as a loss.
	if !m2.Redelivered {
		t.Error("the redelivered message is not marked Redelivered")
	}
}

// testCloseTwice: Close is idempotent and Read after Close fails with
// ErrClosed.
func testCloseTwice(t *testing.T, h Harness) {
	filter, _, _, _ := h.Topics()
	ctx := ctxFor(t, 20*time.Second)
	src := startSource(t, ctx, h, "close-"+Unique(), filter)
	if err := src.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := src.Close(ctx); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if _, _, err := src.Read(ctx); err != connectors.ErrClosed {
		t.Fatalf("Read after Close = %v, want ErrClosed", err)
	}
	sink, err := h.NewSink("close-"+Unique(), "", func(connectors.ConnState) {})
	if err != nil {
		t.Fatal(err)
	}
	if err := sink.Start(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(ctx); err != nil {
		t.Fatal(err)
	}
	if err := sink.Close(ctx); err != nil {
		t.Fatalf("second sink Close: %v", err)
	}
}

// startSource starts a Source on filter and waits until it reports itself
// up: Start may return before the broker has granted the subscription.
func startSource(t *testing.T, ctx context.Context, h Harness, name, filter string) connectors.Source {
	t.Helper()
	up := make(chan struct{}, 1)
	src, err := h.NewSource(name, "", func(s connectors.ConnState) {
		if s.Up {
			select {
			case up <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	if err := src.Start(ctx, []string{filter}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-up:
	case <-ctx.Done():
		t.Fatal("source never reported itself up")
	}
	return src
}
