package e2e

// Scale figures (issue 16, docs/PERFORMANCE.md "Scale"): one resource with
// many routes, and one endpoint with many weida subscribers.

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/bench"
)

// heapNow is the live heap and the goroutine stacks after a collection.
func heapNow() uint64 {
	var m runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m)
	return m.HeapAlloc + m.StackInuse
}

// builtRig builds a rig and reports the time it took (connecting,
// subscribing every route, until one message came through), and the memory
// (heap and stacks) and goroutines it added.
func builtRig(t *testing.T, build func() *benchRig) (rig *benchRig, took time.Duration, heap int64, goroutines int) {
	h0, g0 := heapNow(), runtime.NumGoroutine()
	start := time.Now()
	rig = build()
	took = time.Since(start)
	return rig, took, int64(heapNow()) - int64(h0), runtime.NumGoroutine() - g0
}

// TestRouteScale measures a NATS resource with WEIDA_SCALE_ROUTES routes
// (10,000) against one with a single route, inbound and outbound: the time
// to build and start it, the heap and goroutines it adds, and the CPU per
// message in paired rounds. The message's route is the last of the list.
// Outbound runs only when WEIDA_SCALE_OUT_ROUTES names a count, capped at
// weida's default MaxSubscriptions (256): each route's weida filter is one
// subscription on the dialled connection, and the publisher refuses more.
// It runs only with WEIDA_BENCH=1.
func TestRouteScale(t *testing.T) {
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 to run the scale measurement")
	}
	routes := envInt(t, "WEIDA_SCALE_ROUTES", 10000)
	rounds := envInt(t, "WEIDA_BENCH_ROUNDS", 3)
	sample := envDuration(t, "WEIDA_BENCH_SAMPLE", 2*time.Second)
	srv := brokertest.StartNATS(t)
	dirs := map[string]int{"in": routes}
	if n := envInt(t, "WEIDA_SCALE_OUT_ROUTES", 1); n > 1 {
		dirs["out"] = min(n, weida.DefaultMaxSubscriptions)
	}
	for _, dir := range []string{"in", "out"} {
		routes, ok := dirs[dir]
		if !ok {
			continue
		}
		build := func(n int) func() *benchRig {
			if dir == "in" {
				return func() *benchRig { return inboundRig(t, srv.Addr(), n) }
			}
			return func() *benchRig { return outboundRig(t, srv.Addr(), false, n, "bench") }
		}
		one, took1, heap1, g1 := builtRig(t, build(1))
		many, tookN, heapN, gN := builtRig(t, build(routes))
		t.Logf("%s, 1 route: built in %v, heap and stacks +%.1f MiB, goroutines +%d", dir, took1.Round(time.Millisecond), float64(heap1)/(1<<20), g1)
		t.Logf("%s, %d routes: built in %v, heap and stacks +%.1f MiB (%.0f B per route beyond the first), goroutines +%d",
			dir, routes, tookN.Round(time.Millisecond), float64(heapN)/(1<<20), float64(heapN-heap1)/float64(routes-1), gN)
		rigs := []*benchRig{one, many}
		n := make([]int, 2)
		for i, r := range rigs {
			n[i] = max(1000, int(runRig(t, r, 5000)*sample.Seconds()))
		}
		var cpu [2][]float64
		var rate [2][]float64
		for round := range rounds {
			for k := range 2 {
				i := (k + round) % 2
				runtime.GC()
				b0 := cpuTime(t, srv.Pid())
				r, c := runRigCPU(t, rigs[i], n[i])
				broker := cpuTime(t, srv.Pid()) - b0
				cpu[i] = append(cpu[i], float64(c)+float64(broker)/float64(n[i]))
				rate[i] = append(rate[i], r)
				t.Logf("%s round %d, %d routes: %.0f msg/s, CPU/msg %.2f µs (both processes)", dir, round+1, []int{1, routes}[i], r, cpu[i][round]/1e3)
			}
		}
		var ratio []float64
		for r := range rounds {
			ratio = append(ratio, cpu[1][r]/cpu[0][r])
		}
		fmt.Printf("route scale, %s: 1 route %.0f msg/s %.2f µs/msg; %d routes %.0f msg/s %.2f µs/msg; CPU ratio %.2fx (%.2f–%.2f); built in %v vs %v; heap and stacks +%.1f MiB vs +%.1f MiB\n",
			dir, median(rate[0]), median(cpu[0])/1e3, routes, median(rate[1]), median(cpu[1])/1e3,
			median(ratio), slices.Min(ratio), slices.Max(ratio), took1.Round(time.Millisecond), tookN.Round(time.Millisecond),
			float64(heap1)/(1<<20), float64(heapN)/(1<<20))
		many.close()
		one.close()
	}
}

// TestSubscriberScale measures one weida endpoint with WEIDA_SCALE_SUBSCRIBERS
// (1,000) subscribers against one with a single subscriber, with the
// weida/bench rigs `connector weida bench` runs: copies per second and CPU
// per copy in paired rounds, and the heap each subscriber costs the process
// (both ends are in it: the listener's side of each connection and the
// subscriber's). It runs only with WEIDA_BENCH=1.
func TestSubscriberScale(t *testing.T) {
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 to run the scale measurement")
	}
	subs := envInt(t, "WEIDA_SCALE_SUBSCRIBERS", 1000)
	rounds := envInt(t, "WEIDA_BENCH_ROUNDS", 3)
	sample := envDuration(t, "WEIDA_BENCH_SAMPLE", 2*time.Second)
	build := func(n int) (*bench.Weida, time.Duration, int64) {
		h0 := heapNow()
		start := time.Now()
		w, err := bench.NewWeida(ctx(t, 5*time.Minute), n, bench.Options{})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { w.Close() })
		return w, time.Since(start), int64(heapNow()) - int64(h0)
	}
	one, took1, heap1 := build(1)
	many, tookN, heapN := build(subs)
	t.Logf("1 subscriber: set up in %v, heap +%.1f MiB; %d subscribers: set up in %v, heap +%.1f MiB (%.0f KiB per subscriber)",
		took1.Round(time.Millisecond), float64(heap1)/(1<<20), subs, tookN.Round(time.Millisecond), float64(heapN)/(1<<20),
		float64(heapN)/float64(subs)/1024)
	rigs := []*bench.Weida{one, many}
	for _, r := range rigs { // warm-up
		if _, err := r.Run(ctx(t, 5*time.Minute), bench.Load{Duration: sample / 4}); err != nil {
			t.Fatal(err)
		}
	}
	var cpu, copies [2][]float64
	for round := range rounds {
		for k := range 2 {
			i := (k + round) % 2
			runtime.GC()
			s, err := rigs[i].Run(ctx(t, 5*time.Minute), bench.Load{Duration: sample})
			if err != nil {
				t.Fatal(err)
			}
			cpu[i] = append(cpu[i], float64(s.CPUPerCopy()))
			copies[i] = append(copies[i], s.CopiesPerSecond())
			t.Logf("round %d, %d subscribers: %.0f msgs/s, %.0f copies/s, CPU/copy %v, allocs/copy %.1f",
				round+1, rigs[i].Receivers(), s.MessagesPerSecond(), s.CopiesPerSecond(), s.CPUPerCopy(), s.AllocsPerCopy())
		}
	}
	var ratio []float64
	for r := range rounds {
		ratio = append(ratio, cpu[1][r]/cpu[0][r])
	}
	fmt.Printf("subscriber scale: 1 subscriber %.0f copies/s %.2f µs/copy; %d subscribers %.0f copies/s %.2f µs/copy; CPU per copy ratio %.2fx (%.2f–%.2f); heap %.0f KiB per subscriber; set up in %v\n",
		median(copies[0]), median(cpu[0])/1e3, subs, median(copies[1]), median(cpu[1])/1e3,
		median(ratio), slices.Min(ratio), slices.Max(ratio), float64(heapN)/float64(subs)/1024, tookN.Round(time.Millisecond))
}
