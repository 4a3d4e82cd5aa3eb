package connectors_test

import (
	"context"
	"os"
	"runtime"
	"runtime/pprof"
	"sync"
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
// attempt are stopped when the attempt returns, and let go of the attempt.
// Left running, each keeps the attempt's contexts, and what they hold, for
// the whole drain bound after the bridge stopped: here an hour, found out
// by a value of the run's context that the garbage collector cannot
// reclaim.
//
// Stopped, a timer may still stay in the runtime's timer heap, with its
// func, until the runtime cleans the heap up: lazily, and the more live
// timers the heap holds, the later, at the latest when the timer was due
// (see drainBounds). The test crowds the heaps with live timers, as the
// rest of a full run of the package does, so that it sees this when run
// alone too. The same holds for the timers of context.WithTimeout: the
// attempt's start and Sink close timeouts, derived from the run's context,
// may keep it until they were due even though they were cancelled. So the
// test waits until those are over, then a little for a starved process,
// before it concludes that something else holds the context; both are
// seconds, the drain bound an hour.
func TestOutboundStopsDrainTimers(t *testing.T) {
	// Due before the drain bound, so that the stopped drain timers are
	// not at the top of the heap, whence the runtime drops them at once.
	crowdTimers(t, 400, 30*time.Minute)
	const (
		// memSink starts at once: a short start timeout is over soon.
		startTimeout = time.Second
		// The timeout of the Sink's Close as the attempt returns.
		closeTimeout = 5 * time.Second
		// What a process starved of CPU may take to drop a timer that
		// was due, and to collect.
		grace = 5 * time.Second
	)
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
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry()), Drain: time.Hour, StartTimeout: startTimeout})
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
	// The attempt's own timeouts, all armed by now, may hold the context
	// until they are over; past them, only a drain timer would.
	deadline := time.Now().Add(max(startTimeout, closeTimeout) + grace)
	for watch.Value() != nil {
		if time.Now().After(deadline) {
			// A goroutine of the attempt still alive holds them; with
			// none, a timer does, which the dump cannot show.
			_ = pprof.Lookup("goroutine").WriteTo(os.Stderr, 2)
			t.Fatal("the stopped attempt's contexts are still referenced: a drain timer was left running, or a stopped one holds them")
		}
		runtime.GC()
		time.Sleep(10 * time.Millisecond)
	}
	runtime.KeepAlive(b)
}

// crowdTimers arms n timers, due after d, that do nothing, from goroutines
// that may run on any P, and stops them when the test ends.
func crowdTimers(t *testing.T, n int, d time.Duration) {
	const goroutines = 20
	timers := make([]*time.Timer, n)
	var wg sync.WaitGroup
	for g := range goroutines {
		wg.Go(func() {
			for i := g; i < n; i += goroutines {
				timers[i] = time.AfterFunc(d, func() {})
				runtime.Gosched()
			}
		})
	}
	wg.Wait()
	t.Cleanup(func() {
		for _, tm := range timers {
			tm.Stop()
		}
	})
}
