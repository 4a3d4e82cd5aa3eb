package connectors_test

import (
	"context"
	"runtime"
	"testing"
	"time"
	"weak"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

type ctxKey struct{}

// TestOutboundStopsDrainTimers: the drain bound's timers of an outbound
// attempt are stopped when the attempt returns. Left running, each keeps
// the attempt's contexts, and what they hold, for the whole drain bound
// after the bridge stopped: here an hour, found out by a value of the run's
// context that the garbage collector cannot reclaim.
func TestOutboundStopsDrainTimers(t *testing.T) {
	_, pub, url, p, wf := weidaListenerPath(t, "/out", "out.*")
	spec := connectors.Spec{
		Name: "out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{{Name: "r", Foreign: "out.*", Weida: wf}}, Endpoint: url,
	}
	b := connectors.NewOutbound(spec,
		// Dialled without the run's context, so that only the attempt
		// holds it.
		func(context.Context) (*weida.Subscriber, error) {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			return weida.Dial(ctx, url, weida.DialConfig{})
		},
		func(connectors.StateFunc) (connectors.Sink, error) { return &memSink{}, nil },
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry()), Drain: time.Hour})
	held := new([1 << 16]byte)
	watch := weak.Make(held)
	ctx, cancel := context.WithCancel(context.WithValue(context.Background(), ctxKey{}, held))
	held = nil
	done := make(chan error, 1)
	go func() { done <- b.Run(ctx) }()
	waitCounters(t, b, func(connectors.Counters) bool { return pub.Subscribers() > 0 })
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	ctx = nil
	deadline := time.Now().Add(5 * time.Second)
	for watch.Value() != nil {
		if time.Now().After(deadline) {
			t.Fatal("the stopped attempt's contexts are still referenced: a drain timer was left running")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(b)
}
