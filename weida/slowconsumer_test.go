package weida

import (
	"errors"
	"strings"
	"testing"
	"time"
)

// TestSlowConsumerClosed: a subscriber that stops reading fills its
// stream credit and then its buffer; once a copy is refused for it while
// its writer has waited SlowConsumerAfter on one copy, the listener closes
// it with LIMIT_EXCEEDED, logs and counts it, while a subscriber that
// reads stays connected and receives every copy.
func TestSlowConsumerClosed(t *testing.T) {
	var logs logBuffer
	l := listen(t, ListenConfig{Logger: logs.logger(), Limits: Limits{
		SubscriberBufferBytes: 16 << 10,
		SlowConsumerAfter:     200 * time.Millisecond,
	}})
	p := publisher(t, l, "/md")
	slow := dial(t, l, "/md", DialConfig{Limits: Limits{MaxConcurrentUniStreams: 4}})
	reader := dial(t, l, "/md", DialConfig{})
	subscribe(t, l, slow, 1, "#")
	subscribe(t, l, reader, 2, "#")
	payload := make([]byte, 256)
	sent := 0
	ctx := testCtx(t)
	for slow.Err() == nil {
		// Lockstep with the reader: its queue never holds more than this
		// copy, so it is never over its bound.
		r := publish(t, p, "m", payload)
		if r.Matched == 1 {
			break // the slow one is gone already
		}
		sent++
		if m := receive(t, reader); m.Topic != "m" {
			t.Fatalf("reader received %+v", m)
		}
		if ctx.Err() != nil {
			t.Fatalf("the slow subscriber was never closed: %+v", l.Stats())
		}
		time.Sleep(time.Millisecond)
	}
	select {
	case <-slow.Done():
	case <-ctx.Done():
		t.Fatal("the slow subscriber's connection did not end")
	}
	var ce *CloseError
	if !errors.As(slow.Err(), &ce) || ce.Code != LimitExceeded || !ce.Remote {
		t.Fatalf("slow subscriber ended with %v, want a remote LIMIT_EXCEEDED", slow.Err())
	}
	waitFor(t, "the slow connection forgotten", func() bool { return l.Stats().Connections == 1 })
	st := l.Stats()
	if st.SlowConsumersClosed != 1 {
		t.Errorf("SlowConsumersClosed = %d, want 1", st.SlowConsumersClosed)
	}
	if st.Dropped.BufferFull == 0 {
		t.Errorf("no BufferFull drop: the policy closed a subscriber that was not over its bound: %+v", st)
	}
	if !strings.Contains(logs.String(), "closing slow consumer") {
		t.Errorf("the close was not logged:\n%s", logs.String())
	}
	if reader.Err() != nil {
		t.Fatalf("the reading subscriber was closed: %v", reader.Err())
	}
	if r := publish(t, p, "m", payload); r.Queued != 1 {
		t.Fatalf("publish after the slow one left: %+v", r)
	}
	receive(t, reader)
	if got := reader.Stats().Received; got != uint64(sent+1) {
		t.Errorf("reader received %d, want %d", got, sent+1)
	}
}
