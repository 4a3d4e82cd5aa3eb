package connectors_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// memSink is an in-memory Sink. fail decides, per attempt of a topic, the
// error a write returns; delay holds every outcome back (WriteAsync answers
// from another goroutine after it).
type memSink struct {
	fail  func(topic string, attempt int) error
	delay time.Duration

	mu       sync.Mutex
	attempts map[string]int
	written  []string
}

func (s *memSink) Start(context.Context) error { return nil }
func (s *memSink) Close(context.Context) error { return nil }

func (s *memSink) Write(ctx context.Context, m *connectors.Message) error {
	if s.delay > 0 {
		select {
		case <-time.After(s.delay):
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	return s.attempt(m)
}

func (s *memSink) attempt(m *connectors.Message) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.attempts == nil {
		s.attempts = map[string]int{}
	}
	s.attempts[m.Topic]++
	if s.fail != nil {
		if err := s.fail(m.Topic, s.attempts[m.Topic]); err != nil {
			return err
		}
	}
	s.written = append(s.written, m.Topic)
	return nil
}

func (s *memSink) writtenTopics() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.written...)
}

// asyncMemSink adds WriteAsync, so that the runtime takes its other path.
type asyncMemSink struct{ *memSink }

// shaped returns s with only Write, or with WriteAsync too.
func (s *memSink) shaped(async bool) connectors.Sink {
	if async {
		return asyncMemSink{s}
	}
	return s
}

func (s asyncMemSink) WriteAsync(m *connectors.Message, done func(error)) {
	go func() {
		time.Sleep(s.delay)
		done(s.attempt(m))
	}()
}

type unroutableErr struct{}

func (unroutableErr) Error() string    { return "no route" }
func (unroutableErr) Unroutable() bool { return true }

// TestOutboundWrites runs the outbound runtime against a Sink with and
// without WriteAsync: what the Sink's errors mean (retry while not
// connected, count unroutable, give up on repeated refusals) must not
// depend on which path the runtime takes.
func TestOutboundWrites(t *testing.T) {
	cases := []struct {
		name        string
		fail        func(topic string, attempt int) error
		wantWritten int
		wantDropped map[string]uint64
	}{
		{name: "all accepted", wantWritten: 20},
		{
			name: "not connected, then accepted",
			fail: func(_ string, attempt int) error {
				if attempt <= 2 {
					return fmt.Errorf("down: %w", connectors.ErrNotConnected)
				}
				return nil
			},
			wantWritten: 20,
		},
		{
			name:        "unroutable",
			fail:        func(string, int) error { return unroutableErr{} },
			wantDropped: map[string]uint64{connectors.ReasonUnroutable: 20},
		},
		{
			name:        "refused every time",
			fail:        func(string, int) error { return errors.New("refused") },
			wantDropped: map[string]uint64{connectors.ReasonPublishFailed: 20},
		},
		{
			name: "rejected for good, counted at once",
			fail: func(_ string, attempt int) error {
				if attempt > 1 {
					return errors.New("written twice")
				}
				return &connectors.RejectedError{Reason: connectors.ReasonPublishDenied, Err: errors.New("not authorised")}
			},
			wantDropped: map[string]uint64{connectors.ReasonPublishDenied: 20},
		},
	}
	for _, tc := range cases {
		for _, async := range []bool{false, true} {
			t.Run(fmt.Sprintf("%s/async=%v", tc.name, async), func(t *testing.T) {
				t.Parallel()
				mem := &memSink{fail: tc.fail}
				env := startOutbound(t, mem.shaped(async), 4)
				for i := range 20 {
					env.publish(t, fmt.Sprintf("out.t%d.data", i))
				}
				c := env.waitSettled(t, 20)
				if got := len(mem.writtenTopics()); got != tc.wantWritten {
					t.Errorf("broker got %d messages, want %d", got, tc.wantWritten)
				}
				if c.Bridged != uint64(tc.wantWritten) {
					t.Errorf("bridged = %d, want %d", c.Bridged, tc.wantWritten)
				}
				if fmt.Sprint(c.Dropped) != fmt.Sprint(tc.wantDropped) {
					t.Errorf("dropped = %v, want %v", c.Dropped, tc.wantDropped)
				}
			})
		}
	}
}

// TestOutboundStopWaitsForWrites: Run returns only once every write it
// started is settled, so that Close finds no write under way and the
// counters add up.
func TestOutboundStopWaitsForWrites(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			mem := &memSink{delay: 200 * time.Millisecond}
			env := startOutbound(t, mem.shaped(async), 8)
			for i := range 8 {
				env.publish(t, fmt.Sprintf("out.t%d.data", i))
			}
			deadline := time.Now().Add(10 * time.Second)
			for env.bridge.Status().Counters.Received < 8 && time.Now().Before(deadline) {
				time.Sleep(5 * time.Millisecond)
			}
			env.stop()
			c := env.bridge.Status().Counters
			if c.InFlight != 0 || c.Bridged != 8 || len(mem.writtenTopics()) != 8 {
				t.Errorf("after stop: %+v, broker has %d; want all 8 written and none in flight", c, len(mem.writtenTopics()))
			}
		})
	}
}

type outboundEnv struct {
	bridge   *connectors.Bridge
	listener *weida.Listener // the remote endpoint's
	pub      *weida.Publisher
	stop     func()
}

// startOutbound runs an outbound NATS-grammar bridge with route out.*.data
// from an in-process weida publisher to sink.
func startOutbound(t *testing.T, sink connectors.Sink, inFlight int) *outboundEnv {
	t.Helper()
	return startOutboundDrain(t, sink, inFlight, 0)
}

// startOutboundDrain is startOutbound with Deps.Drain set to drain.
func startOutboundDrain(t *testing.T, sink connectors.Sink, inFlight int, drain time.Duration) *outboundEnv {
	t.Helper()
	l, pub, url, p, wf := weidaListenerPath(t, "/out", "out.*.data")
	spec := connectors.Spec{
		Name: "out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{{Name: "r", Foreign: "out.*.data", Weida: wf}}, Endpoint: url, InFlight: inFlight,
	}
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(connectors.StateFunc) (connectors.Sink, error) { return sink, nil },
		connectors.Deps{
			Metrics: connectors.NewMetrics(prometheus.NewRegistry()),
			Backoff: func(int) time.Duration { return time.Millisecond },
			Drain:   drain,
		})
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
	deadline := time.Now().Add(10 * time.Second)
	for pub.Subscribers() == 0 {
		if time.Now().After(deadline) {
			t.Fatal("the bridge did not subscribe")
		}
		time.Sleep(5 * time.Millisecond)
	}
	return &outboundEnv{bridge: b, listener: l, pub: pub, stop: stop}
}

func (e *outboundEnv) publish(t *testing.T, topic string) {
	t.Helper()
	r, err := e.pub.Publish(context.Background(), weida.Message{Topic: topic, Payload: []byte("x")})
	if err != nil || r.Queued != 1 {
		t.Fatalf("Publish %s = %+v, %v", topic, r, err)
	}
}

// waitSettled waits until n messages were received and none is in flight.
func (e *outboundEnv) waitSettled(t *testing.T, n uint64) connectors.Counters {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := e.bridge.Status().Counters
		var dropped uint64
		for _, d := range c.Dropped {
			dropped += d
		}
		if c.Received == n && c.InFlight == 0 && c.Bridged+dropped == n {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("not settled: %+v", c)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// TestOutboundCountsUnreadCopies: copies that reached the bridge's weida
// connection but were never read, because the broker side held the receive
// loop back when the resource stopped, are counted as connection-closed
// drops: the endpoint counted them as written, so without this count they
// would be lost without a trace.
//
// The drain bound is shorter than one write, so that the stop cannot
// receive and write them all before it runs out.
func TestOutboundCountsUnreadCopies(t *testing.T) {
	const sent = 10
	mem := &memSink{delay: 300 * time.Millisecond}
	env := startOutboundDrain(t, mem, 1, 200*time.Millisecond)
	for i := range sent {
		env.publish(t, fmt.Sprintf("out.t%d.data", i))
	}
	// One write under way, one message waiting for room, the rest
	// unread at the subscriber. The loopback delivers them in well under
	// the time the first write takes.
	deadline := time.Now().Add(10 * time.Second)
	for env.bridge.Status().Counters.Received < 2 && time.Now().Before(deadline) {
		time.Sleep(5 * time.Millisecond)
	}
	time.Sleep(100 * time.Millisecond)
	env.stop()
	c := env.bridge.Status().Counters
	var dropped uint64
	for _, d := range c.Dropped {
		dropped += d
	}
	if c.Bridged+dropped != sent || c.Dropped[connectors.ReasonConnectionClosed] == 0 {
		t.Errorf("after stop: %+v; want all %d bridged or dropped, some as %s", c, sent, connectors.ReasonConnectionClosed)
	}
}

// weidaPath hosts path on a fresh loopback weida listener and returns its
// publisher, the pinned URL to dial it with, and the weida form of the
// NATS-grammar route filter foreign under nats-tokens/v1.
func weidaPath(t *testing.T, path, foreign string) (pub *weida.Publisher, url string, p policy.Policy, wf string) {
	t.Helper()
	_, pub, url, p, wf = weidaListenerPath(t, path, foreign)
	return pub, url, p, wf
}

// weidaListenerPath is weidaPath that returns the listener too.
func weidaListenerPath(t *testing.T, path, foreign string) (l *weida.Listener, pub *weida.Publisher, url string, p policy.Policy, wf string) {
	t.Helper()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	if pub, err = l.Publisher(path); err != nil {
		t.Fatal(err)
	}
	p = policy.NATSTokensV1()
	if wf, err = p.ConvertFilter(foreign); err != nil {
		t.Fatal(err)
	}
	return l, pub, "weida://" + l.Fingerprint() + "@" + l.Addr().String() + path, p, wf
}

// TestOutboundStopLosesNothing: an outbound resource stopped while its
// remote weida publisher publishes steadily accounts for every copy the
// publisher queued for it: written to the broker, or dropped under a
// reason, by the bridge or by the endpoint. A stop that closed the weida
// connection at once would lose the copies between the two QUIC stacks,
// counted by neither side.
func TestOutboundStopLosesNothing(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			mem := &memSink{}
			env := startOutbound(t, mem.shaped(async), 8)
			var queued atomic.Int64
			halt := make(chan struct{})
			var publishing sync.WaitGroup
			publishing.Go(func() {
				payload := make([]byte, 256)
				for i := 0; ; i++ {
					select {
					case <-halt:
						return
					default:
					}
					r, err := env.pub.Publish(context.Background(), weida.Message{Topic: fmt.Sprintf("out.m%d.data", i), Payload: payload})
					if err != nil {
						t.Errorf("Publish: %v", err)
						return
					}
					queued.Add(int64(r.Queued))
					time.Sleep(50 * time.Microsecond)
				}
			})
			waitUntil(t, "messages to flow", func() bool { return env.bridge.Status().Counters.Bridged >= 500 })

			env.stop()
			// The endpoint counts the copies it still held for the
			// connection once it knows the connection closed.
			waitUntil(t, "the endpoint to drop the connection", func() bool { return env.listener.Stats().Connections == 0 })
			close(halt)
			publishing.Wait()

			c := env.bridge.Status().Counters
			var dropped uint64
			for _, d := range c.Dropped {
				dropped += d
			}
			written := mem.writtenTopics()
			endpointDropped := env.listener.Stats().Dropped.ConnectionClosed
			accounted := int64(len(written)) + int64(dropped) + int64(endpointDropped)
			t.Logf("queued %d: written %d, dropped by the bridge %v, by the endpoint as connection-closed %d; unaccounted %d",
				queued.Load(), len(written), c.Dropped, endpointDropped, queued.Load()-accounted)
			if accounted != queued.Load() {
				t.Errorf("the endpoint queued %d copies for the bridge; %d are written or counted: %d lost without a count",
					queued.Load(), accounted, queued.Load()-accounted)
			}
			if c.Bridged != uint64(len(written)) {
				t.Errorf("bridged = %d, the broker has %d", c.Bridged, len(written))
			}
			seen := make(map[string]bool, len(written))
			for _, topic := range written {
				if seen[topic] {
					t.Errorf("%s written twice", topic)
				}
				seen[topic] = true
			}
		})
	}
}
