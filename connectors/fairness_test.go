package connectors_test

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/connectors"
	"weida.dev/connector/weida"
)

// TestResubscribeFloodCountedApart: a weida client that subscribes and
// unsubscribes in a loop on an endpoint with a large last-value cache,
// never reading, has the copies it crowds out of its own buffer counted
// under subscriber-own-replay. A subscriber that reads gets every live
// message, and subscriber-buffer-full, for the resource and the
// listener, stays at zero (issue 25: 76.7 M of them hid every real drop).
func TestResubscribeFloodCountedApart(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{Limits: weida.Limits{
		SubscriberBufferBytes: 256 << 10,
		ReplayBurst:           1000, // this test is about the drops, not the replay limit
	}})
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	_, src, m := lvBridge(t, l, "/flood", connectors.LastValue{Mode: connectors.LastValueAll})
	payload := []byte(strings.Repeat("v", 200))
	for i := range 3000 {
		src.send(t, &connectors.Message{Topic: fmt.Sprintf("cache/%d", i), Payload: payload})
	}
	url := fmt.Sprintf("weida://%s@%s/flood", l.Fingerprint(), l.Addr())

	victim, err := weida.Dial(ctx, url, weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	defer victim.Close()
	if err := victim.Subscribe(ctx, "live.#"); err != nil {
		t.Fatal(err)
	}
	// The flood never calls Receive: its copies stay unread, and a small
	// stream credit makes the listener's writer stop at once.
	flood, err := weida.Dial(ctx, url, weida.DialConfig{Limits: weida.Limits{MaxConcurrentUniStreams: 8}})
	if err != nil {
		t.Fatal(err)
	}
	defer flood.Close()
	for range 20 {
		if err := flood.Subscribe(ctx, "#"); err != nil {
			t.Fatal(err)
		}
		if err := flood.Unsubscribe(ctx, "#"); err != nil {
			t.Fatal(err)
		}
	}
	if err := flood.Subscribe(ctx, "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "both subscriptions", func() bool { return l.Stats().Subscriptions == 2 })

	for i := range 20 {
		src.send(t, &connectors.Message{Topic: "live/x", Payload: fmt.Appendf(nil, "%d", i)})
		got, err := victim.Receive(ctx)
		if err != nil || string(got.Payload) != fmt.Sprint(i) {
			t.Fatalf("victim: %q, %v; want %d", got.Payload, err, i)
		}
	}
	st := l.Stats()
	if st.Dropped.BufferFull != 0 || st.Dropped.OwnReplay == 0 {
		t.Errorf("listener drops %+v: want no BufferFull and some OwnReplay", st.Dropped)
	}
	full := testutil.ToFloat64(m.Dropped.WithLabelValues("lv", "all", connectors.ReasonSubscriberBuf))
	own := testutil.ToFloat64(m.Dropped.WithLabelValues("lv", "all", connectors.ReasonOwnReplay))
	if full != 0 || own == 0 {
		t.Errorf("messages_dropped_total: subscriber-buffer-full %v, subscriber-own-replay %v; want 0 and > 0", full, own)
	}
	if d := testutil.ToFloat64(m.CopiesQueued.WithLabelValues("lv", "dropped")); d != 0 {
		t.Errorf("weida_copies_total{outcome=dropped} = %v, want 0: the flood's own drops are not the traffic's", d)
	}
}
