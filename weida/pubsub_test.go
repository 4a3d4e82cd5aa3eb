package weida

import (
	"bytes"
	"errors"
	"fmt"
	"maps"
	"slices"
	"testing"
)

// TestFilterAcceptance runs the acceptance pairs of issue 2 end to end: one
// subscriber connection per filter, every topic published once, and each
// subscriber must receive exactly the topics its filter selects.
func TestFilterAcceptance(t *testing.T) {
	topics := []string{
		"sensors.a.temp", "sensors.a.b.temp", "a", "a.b", "ab",
		"sensors.temp", "sensors.temperature", "px.*", "px.eur", "px", "",
	}
	cases := []struct {
		filter string
		want   []string
	}{
		{"sensors.*.temp", []string{"sensors.a.temp"}},
		{"a.#", []string{"a", "a.b"}},
		{"", topics},
		{"sensors.temp", []string{"sensors.temp"}},
		{"px.*", []string{"px.*", "px.eur"}}, // a literal '*' in a topic is delivered through '*'
		{"px.#", []string{"px.*", "px.eur", "px"}},
		{"*", []string{"a", "ab", "px", ""}},
	}
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	subs := make([]*Subscriber, len(cases))
	for i, c := range cases {
		subs[i] = dial(t, l, "/md", DialConfig{})
		subscribe(t, l, subs[i], int64(i+1), c.filter)
	}
	wantCopies := 0
	for _, c := range cases {
		wantCopies += len(c.want)
	}
	gotMatched := 0
	for i, topic := range topics {
		r := publish(t, p, topic, []byte(fmt.Sprint(i)))
		if r.Queued != r.Matched || r.Dropped != 0 {
			t.Fatalf("Publish(%q) = %+v, want every match queued", topic, r)
		}
		gotMatched += r.Matched
	}
	if gotMatched != wantCopies {
		t.Fatalf("publishes matched %d copies in total, want %d", gotMatched, wantCopies)
	}
	for i, c := range cases {
		got := map[string]bool{}
		for range c.want {
			m := receive(t, subs[i])
			if got[m.Topic] {
				t.Errorf("filter %q: topic %q delivered twice", c.filter, m.Topic)
			}
			got[m.Topic] = true
			if m.Endpoint != "/md" {
				t.Errorf("filter %q: endpoint %q", c.filter, m.Endpoint)
			}
			if want := fmt.Sprint(slices.Index(topics, m.Topic)); string(m.Payload) != want {
				t.Errorf("filter %q: topic %q carried payload %q, want %q", c.filter, m.Topic, m.Payload, want)
			}
		}
		want := map[string]bool{}
		for _, w := range c.want {
			want[w] = true
		}
		if !maps.Equal(got, want) {
			t.Errorf("filter %q received %v, want %v", c.filter, slices.Sorted(maps.Keys(got)), c.want)
		}
	}
	// Every matched copy was received above, so nothing else is in flight.
	if st := l.Stats(); st.CopiesQueued != uint64(wantCopies) || st.Dropped.Total() != 0 {
		t.Errorf("stats %+v, want %d copies queued and none dropped", st, wantCopies)
	}
}

// TestOneCopyPerConnection: overlapping filters on one connection yield one
// copy, and the copy carries every header field.
func TestOneCopyPerConnection(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	s := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, s, 5, "a.#", "a.*", "", "a.b", "*.b")
	msg := Message{Topic: "a.b", ContentType: "text/plain", Traceparent: "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
		Tracestate: "congo=t61rcWkgMzE", Payload: []byte("hello")}
	r, err := p.Publish(testCtx(t), msg)
	if err != nil || r != (Result{Matched: 1, Queued: 1}) {
		t.Fatalf("Publish = %+v, %v; want one matched and queued copy", r, err)
	}
	if r := publish(t, p, "z", nil); r != (Result{Matched: 1, Queued: 1}) {
		t.Fatalf("Publish(z) = %+v", r)
	}
	var got []Message
	got = append(got, receive(t, s), receive(t, s))
	slices.SortFunc(got, func(a, b Message) int { return len(b.Topic) - len(a.Topic) })
	want := msg
	want.Endpoint = "/md"
	if g := got[0]; g.Topic != want.Topic || g.ContentType != want.ContentType || g.Traceparent != want.Traceparent ||
		g.Tracestate != want.Tracestate || g.Endpoint != want.Endpoint || !bytes.Equal(g.Payload, want.Payload) {
		t.Errorf("received %+v, want %+v", g, want)
	}
	if got[1].Topic != "z" || len(got[1].Payload) != 0 {
		t.Errorf("received %+v, want the empty z copy", got[1])
	}
	if st := l.Stats(); st.CopiesQueued != 2 {
		t.Errorf("CopiesQueued = %d, want 2", st.CopiesQueued)
	}
}

// TestSlowSubscriber: a subscriber that does not read loses copies, counted
// as BufferFull, while Publish keeps returning and a second subscriber
// receives everything. The publisher never waits: if it did, the lockstep
// below would deadlock on the slow connection.
func TestSlowSubscriber(t *testing.T) {
	const n = 300
	payload := bytes.Repeat([]byte("x"), 256)
	l := listen(t, ListenConfig{Limits: Limits{SubscriberBufferBytes: 4096}})
	p := publisher(t, l, "/md")
	// The slow one absorbs little before QUIC pushes back: one waiting
	// copy, a handful of streams.
	slow := dial(t, l, "/md", DialConfig{Limits: Limits{MaxConcurrentUniStreams: 4}})
	fast := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, slow, 1, "m.#")
	subscribe(t, l, fast, 2, "m.#")
	dropped := 0
	for i := range n {
		r := publish(t, p, "m.x", payload)
		if r.Matched != 2 || r.Queued+r.Dropped != 2 {
			t.Fatalf("publish %d: %+v", i, r)
		}
		dropped += r.Dropped
		// Lockstep with the fast subscriber: its queue never holds more
		// than this one copy, so every drop is the slow one's.
		if m := receive(t, fast); m.Topic != "m.x" {
			t.Fatalf("fast received %+v", m)
		}
	}
	if dropped == 0 {
		t.Fatalf("the slow subscriber lost nothing; the test did not fill its buffer: %+v", l.Stats())
	}
	st := l.Stats()
	if st.Dropped.BufferFull != uint64(dropped) || st.Dropped.Total() != uint64(dropped) {
		t.Errorf("Dropped = %+v, want %d, all BufferFull", st.Dropped, dropped)
	}
	// The slow subscriber now reads what was queued for it: exactly the
	// copies that were not dropped.
	for range n - dropped {
		receive(t, slow)
	}
	waitFor(t, "all copies written", func() bool { return l.Stats().CopiesWritten == uint64(2*n-dropped) })
	if got := slow.Stats().Received; got != uint64(n-dropped) {
		t.Errorf("slow received %d, want %d", got, n-dropped)
	}
}

func TestSubscriptionBeforePublisher(t *testing.T) {
	l := listen(t, ListenConfig{})
	s := dial(t, l, "/later", DialConfig{})
	subscribe(t, l, s, 1, "#")
	p := publisher(t, l, "/later")
	if p.Subscribers() != 1 {
		t.Fatalf("Subscribers = %d, want the early subscription", p.Subscribers())
	}
	publish(t, p, "t", []byte("1"))
	if m := receive(t, s); string(m.Payload) != "1" {
		t.Fatalf("received %+v", m)
	}
	// Closing the publisher keeps the subscription for the next one.
	if err := p.Close(); err != nil {
		t.Fatal(err)
	}
	if _, err := p.Publish(testCtx(t), Message{Topic: "t"}); !errors.Is(err, ErrClosed) {
		t.Fatalf("Publish after Close: %v", err)
	}
	p2 := publisher(t, l, "/later")
	publish(t, p2, "t", []byte("2"))
	if m := receive(t, s); string(m.Payload) != "2" {
		t.Fatalf("received %+v", m)
	}
}

func TestUnsubscribe(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	s := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, s, 2, "a", "b")
	if err := s.Unsubscribe(testCtx(t), "a"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "unsubscribe", func() bool { return l.Stats().Subscriptions == 1 })
	if r := publish(t, p, "a", nil); r.Matched != 0 {
		t.Fatalf("publish a after unsubscribe: %+v", r)
	}
	if r := publish(t, p, "b", nil); r.Matched != 1 {
		t.Fatalf("publish b: %+v", r)
	}
	if m := receive(t, s); m.Topic != "b" {
		t.Fatalf("received %+v", m)
	}
	// Unknown filters are a local no-op.
	if err := s.Unsubscribe(testCtx(t), "never"); err != nil {
		t.Fatal(err)
	}
	// The subscriptions die with the connection.
	_ = s.Close()
	waitFor(t, "subscriptions dropped", func() bool { return l.Stats().Subscriptions == 0 && p.Subscribers() == 0 })
}

func TestPublishErrors(t *testing.T) {
	l := listen(t, ListenConfig{Limits: Limits{SubscriberBufferBytes: 1000}})
	p := publisher(t, l, "/md")
	if _, err := l.Publisher("/md"); !errors.Is(err, ErrPathTaken) {
		t.Errorf("second Publisher: %v", err)
	}
	if _, err := l.Publisher("md"); err == nil {
		t.Error("Publisher accepted a path without '/'")
	}
	cases := []struct {
		name string
		m    Message
		want error
	}{
		{"payload over budget", Message{Topic: "t", Payload: make([]byte, 1000)}, ErrPayloadTooLarge},
		{"topic too long", Message{Topic: string(make([]byte, 257))}, ErrInvalidMessage},
		{"topic not UTF-8", Message{Topic: "\xff"}, ErrInvalidMessage},
		{"content type too long", Message{Topic: "t", ContentType: string(bytes.Repeat([]byte("c"), 257))}, ErrInvalidMessage},
		{"traceparent too long", Message{Topic: "t", Traceparent: string(bytes.Repeat([]byte("c"), 129))}, ErrInvalidMessage},
		{"tracestate too long", Message{Topic: "t", Tracestate: string(bytes.Repeat([]byte("c"), 513))}, ErrInvalidMessage},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			if _, err := p.Publish(testCtx(t), c.m); !errors.Is(err, c.want) {
				t.Errorf("Publish = %v, want %v", err, c.want)
			}
		})
	}
	if st := l.Stats(); st.Published != 0 {
		t.Errorf("failed publishes were counted: %d", st.Published)
	}
}

// TestPayloadTooLargeForSubscriber: a copy over the subscriber's
// MaxPayloadBytes is refused with STOP_SENDING(REJECTED) and the
// connection goes on.
func TestPayloadTooLargeForSubscriber(t *testing.T) {
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/md")
	s := dial(t, l, "/md", DialConfig{Limits: Limits{MaxPayloadBytes: 1000}})
	subscribe(t, l, s, 1, "")
	publish(t, p, "big", make([]byte, 5000))
	// Copies arrive in any order: receive small ones until Receive has met
	// (and discarded) the big one.
	for i := 0; s.Stats().DroppedTooBig == 0; i++ {
		if i == 100 {
			t.Fatal("the big copy was never refused")
		}
		publish(t, p, "small", make([]byte, 1000))
		if m := receive(t, s); m.Topic != "small" || len(m.Payload) != 1000 {
			t.Fatalf("received %q with %d bytes", m.Topic, len(m.Payload))
		}
	}
}

func TestSubscriberLocalChecks(t *testing.T) {
	l := listen(t, ListenConfig{})
	s := dial(t, l, "/md", DialConfig{Limits: Limits{MaxSubscriptions: 2}})
	if err := s.Subscribe(testCtx(t), "a*b"); err == nil {
		t.Error("Subscribe accepted an illegal filter")
	}
	subscribe(t, l, s, 2, "a", "b")
	if err := s.Subscribe(testCtx(t), "a"); err != nil {
		t.Errorf("re-subscribe: %v", err)
	}
	if err := s.Subscribe(testCtx(t), "c"); !errors.Is(err, ErrTooManySubscriptions) {
		t.Errorf("third subscribe: %v", err)
	}
	if s.Err() != nil {
		t.Errorf("Err = %v on a live connection", s.Err())
	}
	_ = s.Close()
	if _, err := s.Receive(testCtx(t)); !errors.Is(err, ErrClosed) {
		t.Errorf("Receive after Close: %v", err)
	}
	if err := s.Subscribe(testCtx(t), "d"); err == nil {
		t.Error("Subscribe after Close succeeded")
	}
	if !errors.Is(s.Err(), ErrClosed) {
		t.Errorf("Err after Close = %v", s.Err())
	}
}

// TestListenerCloseEndsSubscribers: subscribers learn SHUTDOWN.
func TestListenerCloseEndsSubscribers(t *testing.T) {
	l := listen(t, ListenConfig{})
	s := dial(t, l, "/md", DialConfig{})
	_ = l.Close()
	<-s.Done()
	var ce *CloseError
	if _, err := s.Receive(testCtx(t)); !errors.As(err, &ce) || ce.Code != Shutdown || !ce.Remote {
		t.Fatalf("Receive after listener Close: %v, want a remote SHUTDOWN", err)
	}
	if _, err := l.Publisher("/x"); !errors.Is(err, ErrClosed) {
		t.Errorf("Publisher after Close: %v", err)
	}
}

// TestShutdownDrains: copies queued before Shutdown are written.
func TestShutdownDrains(t *testing.T) {
	l, err := Listen(testCtx(t), "127.0.0.1:0", ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	p := publisher(t, l, "/md")
	s := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, s, 1, "")
	for range 50 {
		publish(t, p, "t", make([]byte, 100))
	}
	if err := l.Shutdown(testCtx(t)); err != nil {
		t.Fatalf("Shutdown: %v", err)
	}
	if st := l.Stats(); st.CopiesWritten != 50 {
		t.Errorf("CopiesWritten = %d after Shutdown, want 50", st.CopiesWritten)
	}
	if _, err := p.Publish(testCtx(t), Message{Topic: "t"}); !errors.Is(err, ErrClosed) {
		t.Errorf("Publish after Shutdown: %v", err)
	}
}

func TestMaxConnections(t *testing.T) {
	l := listen(t, ListenConfig{Limits: Limits{MaxConnections: 1}})
	dial(t, l, "/md", DialConfig{})
	_, err := Dial(testCtx(t), pinnedURL(l, "/md"), DialConfig{})
	var ce *CloseError
	if !errors.As(err, &ce) || ce.Code != LimitExceeded {
		t.Fatalf("second Dial: %v, want LIMIT_EXCEEDED", err)
	}
	if st := l.Stats(); st.ConnectionsRefused != 1 {
		t.Errorf("ConnectionsRefused = %d", st.ConnectionsRefused)
	}
}
