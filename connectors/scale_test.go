package connectors_test

import (
	"os"
	"runtime"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
)

// scaleResourcesEnv names the variable that sets how many resources
// TestStopWithinDrainAtScale runs; unset, it runs defaultScaleResources.
// Issue 12 measured 10,000 resources taking 20.6 s to stop against a 10 s
// drain bound: WEIDA_SCALE_RESOURCES=10000 reruns that size.
const (
	scaleResourcesEnv     = "WEIDA_SCALE_RESOURCES"
	defaultScaleResources = 1000
	scaleListeners        = 4
)

// TestStopWithinDrainAtScale runs many small inbound resources sharing a
// few real weida listeners, as a large resource set does, and checks that
// Runtime.Stop meets the drain bound. The Sources deliver nothing: what is
// measured is the runtime's own cost of starting and stopping units, which
// grows with their number whatever the broker. It logs the figures that
// docs/PERFORMANCE.md ("Scale") records.
func TestStopWithinDrainAtScale(t *testing.T) {
	n := defaultScaleResources
	if v := os.Getenv(scaleResourcesEnv); v != "" {
		var err error
		if n, err = strconv.Atoi(v); err != nil || n < 1 {
			t.Fatalf("%s=%q: want a positive number", scaleResourcesEnv, v)
		}
	}
	if testing.Short() && n > defaultScaleResources {
		t.Skip("large scale run skipped in -short mode")
	}
	const drain = 2 * time.Second
	// Stop may take the drain bound, and then only what closing the
	// listeners and goroutines costs; a slow race-instrumented run on a
	// busy machine gets the margin.
	const margin = 3 * time.Second

	listens := make([]string, scaleListeners)
	for i := range listens {
		listens[i] = "127.0.0.1:" + strconv.Itoa(brokertest.FreePort(t, "udp"))
	}
	f := &sources{}
	units := make([]connectors.Unit, n)
	for i := range units {
		units[i] = inboundUnit(t, "scale-"+strconv.Itoa(i), listens[i%len(listens)], f)
	}

	m := connectors.NewMetrics(prometheus.NewRegistry())
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m, Drain: drain})
	t.Cleanup(rt.Stop)

	goroutinesBefore := runtime.NumGoroutine()
	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)

	start := time.Now()
	if err := rt.Apply(t.Context(), units); err != nil {
		t.Fatal(err)
	}
	applied := time.Since(start)
	deadline := time.Now().Add(60 * time.Second)
	for !rt.Ready() {
		if time.Now().After(deadline) {
			t.Fatalf("%d resources not ready after a minute", n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	ready := time.Since(start)

	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	goroutines := runtime.NumGoroutine() - goroutinesBefore

	start = time.Now()
	rt.Stop()
	stopped := time.Since(start)

	t.Logf("%d resources on %d listeners: Apply %v, all ready %v, heap +%.1f MiB, goroutines +%d, Stop %v (drain bound %v)",
		n, len(listens), applied.Round(time.Millisecond), ready.Round(time.Millisecond),
		float64(int64(after.HeapAlloc)-int64(before.HeapAlloc))/(1<<20), goroutines,
		stopped.Round(time.Millisecond), drain)
	if stopped > drain+margin {
		t.Errorf("Stop of %d resources took %v, over the drain bound %v (+%v margin)", n, stopped, drain, margin)
	}
	if len(rt.Statuses()) != 0 {
		t.Errorf("after Stop, %d resources still listed", len(rt.Statuses()))
	}
	if c := testutil.CollectAndCount(m.Up); c != 0 {
		t.Errorf("after Stop, %d up series left", c)
	}
}

// TestRemoveForgetsOnlyRemoved: a reload removing some resources removes
// their series, in one pass, and leaves those of the resources that stay.
func TestRemoveForgetsOnlyRemoved(t *testing.T) {
	f := &sources{}
	rt, m := newRuntime(t, func(int) time.Duration { return time.Millisecond })
	var units []connectors.Unit
	for _, name := range []string{"stay", "go-1", "go-2"} {
		units = append(units, inboundUnit(t, name, "127.0.0.1:0", f))
	}
	if err := rt.Apply(t.Context(), units); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the units to be ready", rt.Ready)
	if err := rt.Apply(t.Context(), units[:1]); err != nil {
		t.Fatal(err)
	}
	if got := testutil.ToFloat64(m.Up.WithLabelValues("stay", "broker")); got != 1 {
		t.Errorf("up{resource=stay,side=broker} = %v after removing the others, want 1", got)
	}
	if c := testutil.CollectAndCount(m.Up); c != 2 {
		t.Errorf("%d up series after the reload, want the 2 of the resource that stays", c)
	}
}
