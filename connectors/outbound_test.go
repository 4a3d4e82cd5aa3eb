package connectors_test

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
	bridge *connectors.Bridge
	pub    *weida.Publisher
	stop   func()
}

// startOutbound runs an outbound NATS-grammar bridge with route out.*.data
// from an in-process weida publisher to sink.
func startOutbound(t *testing.T, sink connectors.Sink, inFlight int) *outboundEnv {
	t.Helper()
	pub, url, p, wf := weidaPath(t, "/out", "out.*.data")
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
	return &outboundEnv{bridge: b, pub: pub, stop: stop}
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
func TestOutboundCountsUnreadCopies(t *testing.T) {
	const sent = 10
	mem := &memSink{delay: 300 * time.Millisecond}
	env := startOutbound(t, mem, 1)
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
	return pub, "weida://" + l.Fingerprint() + "@" + l.Addr().String() + path, p, wf
}
