package connectors_test

import (
	"context"
	"errors"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/weida"
)

// TestAwaitReceipt: under Spec.AwaitReceipt, a bridged message is
// acknowledged to the broker only once its weida subscriber's QUIC stack
// acknowledged the copy, not when the copy is queued, written or even
// read; and the fence is asked at that moment: a unit fenced while the
// receipt was pending leaves the message with the broker.
func TestAwaitReceipt(t *testing.T) {
	for _, fence := range []bool{false, true} {
		name := map[bool]string{false: "received", true: "fenced-meanwhile"}[fence]
		t.Run(name, func(t *testing.T) {
			var may atomic.Bool
			may.Store(true)
			cs := newChanSource()
			u := inboundUnit(t, "in", "127.0.0.1:0", nil)
			u.Spec.AwaitReceipt = true
			u.NewSource = func(connectors.StateFunc) (connectors.Source, error) { return redeliveringSource{cs}, nil }
			u.Fence = may.Load
			rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
			if err := rt.Apply(context.Background(), []connectors.Unit{u}); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the endpoint", func() bool { return statusOf(rt, "in").SubscriberURL != "" })
			url := statusOf(rt, "in").SubscriberURL // weida://fp@host:port/in
			at, slash := strings.Index(url, "@"), strings.LastIndex(url, "/")
			relay := brokertest.NewUDPRelay(t, url[at+1:slash])
			sub, err := weida.Dial(context.Background(), url[:at+1]+relay.Addr()+url[slash:], weida.DialConfig{})
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { sub.Close() })
			if err := sub.Subscribe(context.Background(), "#"); err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the subscription", func() bool { return statusOf(rt, "in").Counters.Subscribers == 1 })
			env := &inboundEnv{src: cs}

			env.send(t, "in.a")
			receiveTopic(t, sub)
			waitFor(t, "in.a settled", func() bool { ok, _ := cs.outcome("in.a"); return ok })
			if _, err := cs.outcome("in.a"); err != nil {
				t.Fatalf("in.a settled with %v; want an acknowledgement", err)
			}

			relay.Mute(true)
			env.send(t, "in.b")
			if got := receiveTopic(t, sub); got != "in.b" {
				t.Fatalf("received %q", got)
			}
			time.Sleep(300 * time.Millisecond) // many round trips and ACK delays on loopback
			if ok, err := cs.outcome("in.b"); ok {
				t.Fatalf("in.b settled (%v) before the subscriber's acknowledgement reached the endpoint", err)
			}
			if n := statusOf(rt, "in").Counters.AwaitingReceipt; n != 1 {
				t.Errorf("awaiting receipt = %d; want 1", n)
			}
			if fence {
				may.Store(false)
			}
			relay.Mute(false)
			waitFor(t, "in.b settled", func() bool { ok, _ := cs.outcome("in.b"); return ok })
			_, err = cs.outcome("in.b")
			switch {
			case fence && !errors.Is(err, connectors.ErrFenced):
				t.Errorf("in.b settled with %v once fenced; want ErrFenced (left with the broker)", err)
			case !fence && err != nil:
				t.Errorf("in.b settled with %v; want an acknowledgement", err)
			}
			waitFor(t, "nothing awaiting", func() bool { return statusOf(rt, "in").Counters.AwaitingReceipt == 0 })
		})
	}
}

// TestReloadToReceivedClosesUntracked: a reload that turns a resource
// from queued to received keeps its listener, and with it the
// subscribers connected under queued, whose acknowledgements nothing
// records. They are closed with SHUTDOWN; once they dial again their
// copies settle the broker only when their QUIC stack acknowledged them.
func TestReloadToReceivedClosesUntracked(t *testing.T) {
	queued := inboundUnit(t, "in", "127.0.0.1:0", nil)
	cs := newChanSource()
	queued.NewSource = func(connectors.StateFunc) (connectors.Source, error) { return redeliveringSource{cs}, nil }
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	if err := rt.Apply(context.Background(), []connectors.Unit{queued}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the endpoint", func() bool { return statusOf(rt, "in").SubscriberURL != "" })
	url := statusOf(rt, "in").SubscriberURL
	before, err := weida.Dial(context.Background(), url, weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { before.Close() })
	if err := before.Subscribe(context.Background(), "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription", func() bool { return statusOf(rt, "in").Counters.Subscribers == 1 })

	received := queued
	received.Revision = "rev2"
	received.Spec.AwaitReceipt = true
	if err := rt.Apply(context.Background(), []connectors.Unit{received}); err != nil {
		t.Fatal(err)
	}
	select {
	case <-before.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("a subscriber connected under queued is still connected under received")
	}
	var ce *weida.CloseError
	if !errors.As(before.Err(), &ce) || ce.Code != weida.Shutdown {
		t.Fatalf("the subscriber ended with %v; want SHUTDOWN", before.Err())
	}
	if got := statusOf(rt, "in").SubscriberURL; got != url {
		t.Fatalf("the reload moved the endpoint: %s, was %s", got, url)
	}

	at, slash := strings.Index(url, "@"), strings.LastIndex(url, "/")
	relay := brokertest.NewUDPRelay(t, url[at+1:slash])
	after, err := weida.Dial(context.Background(), url[:at+1]+relay.Addr()+url[slash:], weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { after.Close() })
	if err := after.Subscribe(context.Background(), "#"); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the subscription again", func() bool { return statusOf(rt, "in").Counters.Subscribers == 1 })
	env := &inboundEnv{src: cs}
	relay.Mute(true)
	env.send(t, "in.a")
	if got := receiveTopic(t, after); got != "in.a" {
		t.Fatalf("received %q", got)
	}
	time.Sleep(300 * time.Millisecond) // many round trips and ACK delays on loopback
	if ok, err := cs.outcome("in.a"); ok {
		t.Fatalf("in.a settled (%v) before the subscriber's acknowledgement reached the endpoint", err)
	}
	relay.Mute(false)
	waitFor(t, "in.a settled", func() bool { ok, _ := cs.outcome("in.a"); return ok })
	if _, err := cs.outcome("in.a"); err != nil {
		t.Errorf("in.a settled with %v; want an acknowledgement", err)
	}
}
