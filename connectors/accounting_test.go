package connectors_test

import (
	"context"
	"errors"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// chanSource is a Source that delivers what the test sends on msgs and
// records how each message was settled.
type chanSource struct {
	msgs chan *connectors.Message

	mu      sync.Mutex
	settled map[string][]error // by topic, in order
}

func newChanSource() *chanSource {
	return &chanSource{msgs: make(chan *connectors.Message), settled: map[string][]error{}}
}

func (s *chanSource) Start(context.Context, []string) error { return nil }
func (s *chanSource) Close(context.Context) error           { return nil }

func (s *chanSource) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case m := <-s.msgs:
		return m, func(err error) {
			s.mu.Lock()
			s.settled[m.Topic] = append(s.settled[m.Topic], err)
			s.mu.Unlock()
		}, nil
	case <-ctx.Done():
		return nil, nil, ctx.Err()
	}
}

// outcome returns how topic was settled: ok when it was, and the error.
func (s *chanSource) outcome(topic string) (settled bool, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.settled[topic]
	if len(e) == 0 {
		return false, nil
	}
	if len(e) > 1 {
		return true, errors.New("settled more than once")
	}
	return true, e[0]
}

type inboundEnv struct {
	url    string
	src    *chanSource
	bridge *connectors.Bridge
	m      *connectors.Metrics
	stop   func()
}

// startInbound runs an inbound NATS-grammar bridge with route in.* onto a
// real weida publisher path, holding or not.
func startInbound(t *testing.T, hold bool) *inboundEnv {
	t.Helper()
	pub, url, p, wf := weidaPath(t, "/in", "in.*")
	spec := connectors.Spec{
		Name: "in", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p,
		Routes: []connectors.Route{{Name: "r", Foreign: "in.*", Weida: wf}}, Endpoint: url, Hold: hold,
	}
	src := newChanSource()
	m := connectors.NewMetrics(prometheus.NewRegistry())
	b := connectors.NewInbound(spec, func(connectors.StateFunc) (connectors.Source, error) { return src, nil }, pub,
		connectors.Deps{Metrics: m})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	var once sync.Once
	stop := func() {
		once.Do(func() {
			cancel()
			if err := <-done; err != nil {
				t.Errorf("Run: %v", err)
			}
		})
	}
	t.Cleanup(stop)
	return &inboundEnv{url: url, src: src, bridge: b, m: m, stop: stop}
}

func (e *inboundEnv) send(t *testing.T, topic string) {
	t.Helper()
	select {
	case e.src.msgs <- &connectors.Message{Topic: topic, Payload: []byte(topic)}:
	case <-time.After(10 * time.Second):
		t.Fatalf("the bridge did not read %s", topic)
	}
}

// subscriber dials the bridge's endpoint and subscribes to every topic.
func (e *inboundEnv) subscriber(t *testing.T) *weida.Subscriber {
	t.Helper()
	s, err := weida.Dial(context.Background(), e.url, weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Subscribe(context.Background(), "#"); err != nil {
		t.Fatal(err)
	}
	return s
}

func receiveTopic(t *testing.T, s *weida.Subscriber) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	m, err := s.Receive(ctx)
	if err != nil {
		t.Fatal(err)
	}
	return m.Topic
}

// TestNoSubscriberDrop: under drop, a message nobody subscribes to is
// acknowledged and counted as a no-subscriber drop, not as bridged.
func TestNoSubscriberDrop(t *testing.T) {
	e := startInbound(t, false)
	e.send(t, "in.a")
	waitFor(t, "in.a settled", func() bool { ok, _ := e.src.outcome("in.a"); return ok })
	if _, err := e.src.outcome("in.a"); err != nil {
		t.Errorf("in.a settled with %v, want acknowledged", err)
	}
	c := e.bridge.Status().Counters
	if c.Bridged != 0 || c.Dropped[connectors.ReasonNoSubscriber] != 1 || c.Acknowledged != 1 {
		t.Errorf("counters = %+v, want 0 bridged, 1 no-subscriber drop, 1 acknowledged", c)
	}
	if got := testutil.ToFloat64(e.m.Dropped.WithLabelValues("in", "r", connectors.ReasonNoSubscriber)); got != 1 {
		t.Errorf("messages_dropped_total{no-subscriber} = %v, want 1", got)
	}

	s := e.subscriber(t)
	waitFor(t, "the subscription", func() bool { return e.bridge.Status().Counters.Subscribers == 1 })
	e.send(t, "in.b")
	if got := receiveTopic(t, s); got != "in.b" {
		t.Errorf("received %q, want in.b", got)
	}
	waitFor(t, "in.b settled", func() bool { ok, _ := e.src.outcome("in.b"); return ok })
	c = e.bridge.Status().Counters
	if c.Bridged != 1 || c.Dropped[connectors.ReasonNoSubscriber] != 1 {
		t.Errorf("counters = %+v, want 1 bridged and the one drop", c)
	}
}

// TestRedeliveryDropped: a message the broker marks as delivered again that
// the bridge drops is counted under redelivery-dropped, not under the
// reason it was dropped for: an earlier delivery may have been bridged, and
// counting it as no-subscriber would count a delivered message as lost.
func TestRedeliveryDropped(t *testing.T) {
	e := startInbound(t, false)
	select {
	case e.src.msgs <- &connectors.Message{Topic: "in.again", Payload: []byte("in.again"), Redelivered: true}:
	case <-time.After(10 * time.Second):
		t.Fatal("the bridge did not read in.again")
	}
	waitFor(t, "in.again settled", func() bool { ok, _ := e.src.outcome("in.again"); return ok })
	if _, err := e.src.outcome("in.again"); err != nil {
		t.Errorf("in.again settled with %v, want acknowledged", err)
	}
	c := e.bridge.Status().Counters
	if c.Dropped[connectors.ReasonRedeliveryDropped] != 1 || c.Dropped[connectors.ReasonNoSubscriber] != 0 {
		t.Errorf("counters = %+v, want 1 redelivery-dropped and no no-subscriber drop", c)
	}
	if got := testutil.ToFloat64(e.m.Dropped.WithLabelValues("in", "r", connectors.ReasonRedeliveryDropped)); got != 1 {
		t.Errorf("messages_dropped_total{redelivery-dropped} = %v, want 1", got)
	}
	// A first delivery dropped the same way keeps its reason.
	e.send(t, "in.first")
	waitFor(t, "in.first settled", func() bool { ok, _ := e.src.outcome("in.first"); return ok })
	if c := e.bridge.Status().Counters; c.Dropped[connectors.ReasonNoSubscriber] != 1 {
		t.Errorf("counters = %+v, want 1 no-subscriber drop for the first delivery", c)
	}
}

// TestHoldUntilSubscriber: under hold, a message nobody subscribes to is
// neither acknowledged nor dropped; it is published and acknowledged once a
// subscriber comes.
func TestHoldUntilSubscriber(t *testing.T) {
	e := startInbound(t, true)
	e.send(t, "in.a")
	waitFor(t, "the hold", func() bool { return !e.bridge.Status().Counters.HoldingSince.IsZero() })
	time.Sleep(100 * time.Millisecond)
	if ok, _ := e.src.outcome("in.a"); ok {
		t.Fatal("in.a settled while nobody subscribed")
	}
	c := e.bridge.Status().Counters
	if c.Held != 1 || c.Bridged != 0 || len(c.Dropped) != 0 || c.Acknowledged != 0 || c.InFlight != 1 {
		t.Errorf("counters while holding = %+v", c)
	}
	if got := testutil.ToFloat64(e.m.Holding.WithLabelValues("in")); got != 1 {
		t.Errorf("holding = %v, want 1", got)
	}

	s := e.subscriber(t)
	if got := receiveTopic(t, s); got != "in.a" {
		t.Errorf("received %q, want in.a", got)
	}
	waitFor(t, "in.a settled", func() bool { ok, _ := e.src.outcome("in.a"); return ok })
	if _, err := e.src.outcome("in.a"); err != nil {
		t.Errorf("in.a settled with %v, want acknowledged", err)
	}
	c = e.bridge.Status().Counters
	if c.Bridged != 1 || len(c.Dropped) != 0 || c.Acknowledged != 1 || !c.HoldingSince.IsZero() {
		t.Errorf("counters after the subscriber came = %+v", c)
	}
	if got := testutil.ToFloat64(e.m.Holding.WithLabelValues("in")); got != 0 {
		t.Errorf("holding = %v, want 0", got)
	}

	// The subscriber leaves: the next message waits again.
	s.Close()
	waitFor(t, "the subscriber gone", func() bool { return e.bridge.Status().Counters.Subscribers == 0 })
	e.send(t, "in.b")
	waitFor(t, "the second hold", func() bool { return e.bridge.Status().Counters.Held == 2 })
	// Stopping while holding leaves the message to the broker.
	e.stop()
	ok, err := e.src.outcome("in.b")
	if !ok || err == nil {
		t.Errorf("in.b after a stop while holding: settled %v with %v, want settled with an error (not acknowledged)", ok, err)
	}
	if c := e.bridge.Status().Counters; c.Acknowledged != 1 || len(c.Dropped) != 0 {
		t.Errorf("counters after the stop = %+v, want nothing more acknowledged or dropped", c)
	}
}

// TestReloadKeepsCounters: a reload that changes a resource under the same
// name keeps its /status counters and metric series; removing it forgets
// them.
func TestReloadKeepsCounters(t *testing.T) {
	f := &sources{}
	rt, m := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	u := inboundUnit(t, "keep", "127.0.0.1:0", f)
	if err := rt.Apply(context.Background(), []connectors.Unit{u}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	f.last().report(connectors.ConnState{Reason: "ConnectionLost"})
	f.last().report(connectors.ConnState{Up: true, Reason: "Connected"})

	changed := u
	changed.Revision = "rev2"
	changed.Spec.Routes = append(changed.Spec.Routes, connectors.Route{Name: "s", Foreign: "other.*", Weida: "other.*"})
	if err := rt.Apply(context.Background(), []connectors.Unit{changed}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the changed unit to be ready", func() bool { return f.count() == 2 && rt.Ready() })
	if got := statusOf(rt, "keep").Counters.Reconnects; got != 1 {
		t.Errorf("reconnects = %d after a reload changing the resource, want 1 kept", got)
	}
	if got := testutil.ToFloat64(m.Reconnects.WithLabelValues("keep", "broker")); got != 1 {
		t.Errorf("reconnects_total = %v after the reload, want the series kept", got)
	}

	if err := rt.Apply(context.Background(), nil); err != nil {
		t.Fatal(err)
	}
	if n := testutil.CollectAndCount(m.Reconnects); n != 0 {
		t.Errorf("%d reconnects series left after removing the resource", n)
	}
}

// TestOutboundGap: losing the weida subscription and getting it back is
// counted as a gap, with its length.
func TestOutboundGap(t *testing.T) {
	dir := t.TempDir()
	// The state directory keys the identity by the address: take a port
	// first, so that both listeners name the same one.
	probe, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	addr := probe.Addr().String()
	probe.Close()
	l, err := weida.Listen(context.Background(), addr, weida.ListenConfig{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	pub, err := l.Publisher("/out")
	if err != nil {
		t.Fatal(err)
	}
	p := policy.NATSTokensV1()
	wf, err := p.ConvertFilter("out.*")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + addr + "/out"
	m := connectors.NewMetrics(prometheus.NewRegistry())
	b := connectors.NewOutbound(connectors.Spec{
		Name: "gap", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{{Name: "r", Foreign: "out.*", Weida: wf}}, Endpoint: url,
	},
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(connectors.StateFunc) (connectors.Sink, error) { return &memSink{}, nil },
		connectors.Deps{Metrics: m, Backoff: func(int) time.Duration { return 10 * time.Millisecond }})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	defer func() { cancel(); <-done }()
	waitFor(t, "the subscription", func() bool { return pub.Subscribers() == 1 })
	if c := b.Status().Counters; c.WeidaGaps != 0 || c.LastWeidaGap != nil {
		t.Errorf("a gap before any loss: %+v", c)
	}

	// The endpoint goes away and comes back on the same address, with the
	// same identity.
	l.Close()
	waitFor(t, "the gap to open", func() bool { g := b.Status().Counters.LastWeidaGap; return g != nil && g.Open })
	time.Sleep(50 * time.Millisecond)
	l2, err := weida.Listen(context.Background(), addr, weida.ListenConfig{StateDir: dir})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l2.Close() })
	pub2, err := l2.Publisher("/out")
	if err != nil {
		t.Fatal(err)
	}
	deadline := time.Now().Add(10 * time.Second)
	for pub2.Subscribers() != 1 {
		if time.Now().After(deadline) {
			t.Fatalf("no subscription again: %+v", b.Status())
		}
		time.Sleep(5 * time.Millisecond)
	}
	waitFor(t, "the gap to close", func() bool { return b.Status().Counters.WeidaGaps == 1 })
	c := b.Status().Counters
	if g := c.LastWeidaGap; g == nil || g.Open || g.Seconds < 0.05 || c.WeidaGapSeconds != g.Seconds {
		t.Errorf("gap = %+v, total %v s; want one closed gap of at least 50 ms", g, c.WeidaGapSeconds)
	}
	if got := testutil.ToFloat64(m.WeidaGaps.WithLabelValues("gap")); got != 1 {
		t.Errorf("weida_gaps_total = %v, want 1", got)
	}
	if got := testutil.ToFloat64(m.WeidaGapSeconds.WithLabelValues("gap")); got != c.WeidaGapSeconds {
		t.Errorf("weida_gap_seconds_total = %v, want %v", got, c.WeidaGapSeconds)
	}
}

// TestUnconfirmedCopiesCounted: a weida subscriber that vanishes (its
// packets stop) while messages are bridged to it. Every copy published to
// it after it vanished is accounted for once the endpoint notices: as
// unconfirmed if it was written to the dead connection, as
// connection-closed if it was still queued; the unconfirmed ones are shown
// in /status and in the metric.
func TestUnconfirmedCopiesCounted(t *testing.T) {
	e := startInbound(t, false)
	// The URL pins the endpoint's key, so it may name the relay's address.
	at := strings.Index(e.url, "@") + 1
	slash := at + strings.Index(e.url[at:], "/")
	relay := brokertest.NewUDPRelay(t, e.url[at:slash])
	s, err := weida.Dial(context.Background(), e.url[:at]+relay.Addr()+e.url[slash:], weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	if err := s.Subscribe(context.Background(), "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription", func() bool { return e.bridge.Status().Counters.Subscribers == 1 })
	e.send(t, "in.before")
	if got := receiveTopic(t, s); got != "in.before" {
		t.Fatalf("received %q", got)
	}

	relay.Cut()
	const after = 5
	for i := range after {
		e.send(t, "in.after"+strconv.Itoa(i))
	}
	waitFor(t, "the last message settled", func() bool { ok, _ := e.src.outcome("in.after4"); return ok })
	// The endpoint notices within its idle timeout (2 s); the wait's
	// deadline only stops a hung test.
	deadline := time.Now().Add(20 * time.Second)
	for e.bridge.Status().Counters.Subscribers != 0 {
		if time.Now().After(deadline) {
			t.Fatal("the vanished subscriber was never noticed")
		}
		time.Sleep(10 * time.Millisecond)
	}
	waitFor(t, "the copies accounted for", func() bool {
		c := e.bridge.Status().Counters
		return c.Unconfirmed+c.Dropped[connectors.ReasonConnectionClosed] >= after
	})
	c := e.bridge.Status().Counters
	if c.Unconfirmed == 0 {
		t.Errorf("no copy counted unconfirmed: %+v", c)
	}
	if got := testutil.ToFloat64(e.m.CopiesUnconfirmed.WithLabelValues("in")); got != float64(c.Unconfirmed) {
		t.Errorf("copies_unconfirmed_total = %v, /status says %d", got, c.Unconfirmed)
	}
	if c.Bridged != after+1 {
		t.Errorf("bridged %d, want %d: a copy was queued for each", c.Bridged, after+1)
	}
	t.Logf("counters: %+v", c)
}
