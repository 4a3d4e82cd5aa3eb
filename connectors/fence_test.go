package connectors_test

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// redeliveringSource is a chanSource whose broker delivers again what it
// leaves unsettled.
type redeliveringSource struct{ *chanSource }

func (redeliveringSource) Redelivers() bool { return true }

// fencedInbound runs an inbound unit on a runtime whose Fence is may,
// keeping the last values lv asks for.
func fencedInbound(t *testing.T, src connectors.Source, may *atomic.Bool, lv connectors.LastValue) (*connectors.Runtime, *atomic.Int32) {
	t.Helper()
	var built atomic.Int32
	u := inboundUnit(t, "in", "127.0.0.1:0", nil)
	u.Spec.LastValue = lv
	u.NewSource = func(connectors.StateFunc) (connectors.Source, error) {
		built.Add(1)
		return src, nil
	}
	u.Fence = may.Load
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	if err := rt.Apply(context.Background(), []connectors.Unit{u}); err != nil {
		t.Fatal(err)
	}
	return rt, &built
}

// TestFenceInbound: once the unit's fence says no, an inbound bridge
// neither delivers a copy to weida nor acknowledges to the broker: the
// message is left with it (settled with ErrFenced), counted as fenced
// only when the broker would not deliver it again, and the attempt ends
// with FailFenced and is not retried.
func TestFenceInbound(t *testing.T) {
	cases := []struct {
		name       string
		topic      string // sent once fenced
		redelivers bool
		dropped    uint64 // counted as fenced
	}{
		{"deliver/at-most-once", "in.b", false, 1},
		{"deliver/redelivered", "in.b", true, 0},
		{"drop-and-ack", "other.b", true, 0}, // no route: it would be dropped and acknowledged
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var may atomic.Bool
			may.Store(true)
			cs := newChanSource()
			var src connectors.Source = cs
			if tc.redelivers {
				src = redeliveringSource{cs}
			}
			rt, built := fencedInbound(t, src, &may, connectors.LastValue{})
			waitFor(t, "the endpoint", func() bool { return statusOf(rt, "in").SubscriberURL != "" })
			sub, err := weida.Dial(context.Background(), statusOf(rt, "in").SubscriberURL, weida.DialConfig{})
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
			if got := receiveTopic(t, sub); got == "" {
				t.Fatal("nothing received before the fence")
			}
			waitFor(t, "in.a settled", func() bool { ok, _ := cs.outcome("in.a"); return ok })
			if _, err := cs.outcome("in.a"); err != nil {
				t.Fatalf("in.a settled with %v before the fence; want an acknowledgement", err)
			}

			may.Store(false)
			env.send(t, tc.topic)
			waitFor(t, tc.topic+" settled", func() bool { ok, _ := cs.outcome(tc.topic); return ok })
			if _, err := cs.outcome(tc.topic); !errors.Is(err, connectors.ErrFenced) {
				t.Errorf("%s settled with %v once fenced; want ErrFenced (left with the broker)", tc.topic, err)
			}
			waitFor(t, "the fenced failure", func() bool {
				f := statusOf(rt, "in").Failure
				return f != nil && f.Reason == connectors.FailFenced
			})
			st := statusOf(rt, "in")
			if !st.Failure.NextRetryTime.IsZero() {
				t.Errorf("a fenced unit is to be retried at %v; want no retry", st.Failure.NextRetryTime)
			}
			if st.Counters.Bridged != 1 {
				t.Errorf("bridged = %d; want 1 (nothing after the fence)", st.Counters.Bridged)
			}
			if got := st.Counters.Dropped[connectors.ReasonFenced]; got != tc.dropped {
				t.Errorf("dropped as fenced = %d; want %d (%+v)", got, tc.dropped, st.Counters.Dropped)
			}
			if n := built.Load(); n != 1 {
				t.Errorf("%d Sources built; want 1", n)
			}
		})
	}
}

// TestFenceBeforeFirstAttempt: a unit whose fence already says no makes
// no attempt at all: no Source is built, so no broker connection (an
// MQTT client ID would take the session from the replica now holding it).
func TestFenceBeforeFirstAttempt(t *testing.T) {
	var may atomic.Bool
	rt, built := fencedInbound(t, newChanSource(), &may, connectors.LastValue{})
	waitFor(t, "the fenced failure", func() bool {
		f := statusOf(rt, "in").Failure
		return f != nil && f.Reason == connectors.FailFenced
	})
	if n := built.Load(); n != 0 {
		t.Errorf("%d Sources built for a fenced unit; want 0", n)
	}
}

// TestFenceWithholdsReplay: the endpoint of a fenced unit stays open
// until placement stops the unit, and a SUBSCRIBE reaching it then is
// replayed no last value (the lease's holder has them, perhaps newer):
// each one matched is counted as withheld instead.
func TestFenceWithholdsReplay(t *testing.T) {
	var may atomic.Bool
	may.Store(true)
	cs := newChanSource()
	rt, _ := fencedInbound(t, cs, &may, connectors.LastValue{Mode: connectors.LastValueAll})
	waitFor(t, "the endpoint", func() bool { return statusOf(rt, "in").SubscriberURL != "" })
	env := &inboundEnv{url: statusOf(rt, "in").SubscriberURL, src: cs}
	live := env.subscriber(t)
	waitFor(t, "the subscription", func() bool { return statusOf(rt, "in").Counters.Subscribers == 1 })
	env.send(t, "in.a")
	if got := receiveTopic(t, live); got != "in.a" {
		t.Fatalf("received %q; want in.a", got)
	}
	if got := receiveTopic(t, env.subscriber(t)); got != "in.a" {
		t.Fatalf("replayed %q before the fence; want in.a", got)
	}

	may.Store(false)
	env.subscriber(t)
	waitFor(t, "the withheld replay", func() bool {
		lv := statusOf(rt, "in").Counters.LastValue
		return lv != nil && lv.Withheld == 1
	})
	if lv := statusOf(rt, "in").Counters.LastValue; lv.Replayed != 1 {
		t.Errorf("replayed = %d; want 1 (none once fenced)", lv.Replayed)
	}
}

// TestFenceOutbound: once the fence says no, an outbound bridge publishes
// nothing more to the broker, neither a message it receives nor the retry
// of one under way; each is counted as fenced, and the attempt ends
// without a retry.
func TestFenceOutbound(t *testing.T) {
	for _, async := range []bool{false, true} {
		t.Run(fmt.Sprintf("async=%v", async), func(t *testing.T) {
			var may atomic.Bool
			may.Store(true)
			mem := &memSink{fail: func(topic string, attempt int) error {
				if topic == "out.retry.data" && attempt == 1 {
					// The fence closes while the write is under way:
					// its retry must not happen.
					may.Store(false)
					return errors.New("transient")
				}
				return nil
			}}
			pub, url, p, wf := weidaPath(t, "/out", "out.*.data")
			rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
			err := rt.Apply(context.Background(), []connectors.Unit{fencedOutbound(url, p, wf, may.Load,
				func(report connectors.StateFunc) (connectors.Sink, error) {
					report(connectors.ConnState{Up: true, Reason: "Connected"})
					return mem.shaped(async), nil
				})})
			if err != nil {
				t.Fatal(err)
			}
			waitFor(t, "the bridge to subscribe", func() bool { return pub.Subscribers() > 0 && rt.Ready() })
			publish := func(topic string) {
				if r, err := pub.Publish(context.Background(), weida.Message{Topic: topic, Payload: []byte("x")}); err != nil || r.Queued != 1 {
					t.Fatalf("Publish %s = %+v, %v", topic, r, err)
				}
			}
			publish("out.a.data")
			waitFor(t, "out.a.data written", func() bool { return slicesContain(mem.writtenTopics(), "out.a.data") })
			publish("out.retry.data")
			waitFor(t, "the retry counted as fenced", func() bool {
				return statusOf(rt, "out").Counters.Dropped[connectors.ReasonFenced] == 1
			})
			waitFor(t, "the fenced failure", func() bool {
				f := statusOf(rt, "out").Failure
				return f != nil && f.Reason == connectors.FailFenced
			})
			st := statusOf(rt, "out")
			if got := mem.writtenTopics(); len(got) != 1 {
				t.Errorf("written %v; want only out.a.data", got)
			}
			if !st.Failure.NextRetryTime.IsZero() {
				t.Errorf("a fenced unit is to be retried at %v; want no retry", st.Failure.NextRetryTime)
			}
			if st.Counters.Bridged != 1 || st.Counters.InFlight != 0 {
				t.Errorf("counters %+v; want 1 bridged, none in flight", st.Counters)
			}
		})
	}
}

// TestFenceOutboundReceived: a message received once the fence says no is
// not handed to the Sink at all.
func TestFenceOutboundReceived(t *testing.T) {
	var may atomic.Bool
	may.Store(true)
	mem := &memSink{}
	pub, url, p, wf := weidaPath(t, "/out", "out.*.data")
	rt, _ := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	err := rt.Apply(context.Background(), []connectors.Unit{fencedOutbound(url, p, wf, may.Load,
		func(connectors.StateFunc) (connectors.Sink, error) { return mem, nil })})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the bridge to subscribe", func() bool { return pub.Subscribers() > 0 })
	may.Store(false)
	if r, err := pub.Publish(context.Background(), weida.Message{Topic: "out.b.data", Payload: []byte("x")}); err != nil || r.Queued != 1 {
		t.Fatalf("Publish = %+v, %v", r, err)
	}
	waitFor(t, "the message counted as fenced", func() bool {
		return statusOf(rt, "out").Counters.Dropped[connectors.ReasonFenced] == 1
	})
	if got := mem.writtenTopics(); len(got) != 0 {
		t.Errorf("written %v once fenced; want nothing", got)
	}
	waitFor(t, "the fenced failure", func() bool {
		f := statusOf(rt, "out").Failure
		return f != nil && f.Reason == connectors.FailFenced
	})
}

// fencedOutbound is the outbound unit the fence tests run: one route from
// the weida path at url to out.*.data, its Sink from newSink, fenced by
// fence.
func fencedOutbound(url string, p policy.Policy, wf string, fence func() bool, newSink connectors.SinkFactory) connectors.Unit {
	return connectors.Unit{
		Spec: connectors.Spec{
			Name: "out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
			Routes: []connectors.Route{{Name: "r", Foreign: "out.*.data", Weida: wf}}, Endpoint: url,
		},
		Revision: "1",
		Dial:     func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		NewSink:  newSink,
		Fence:    fence,
	}
}
