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
	requireBench(t, "to run the scale measurement")
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
// subscriber's). Raw quic-go with one connection and with as many
// connections as subscribers runs in the same rounds, so that the fan-out
// ratio can be split into what the transport itself pays for spreading
// copies over connections and what weida adds; on Linux each sample also
// counts the UDP send calls and datagrams of the machine (/proc/net/snmp),
// to show how many copies share a packet. Each sample runs under a CPU
// profile (bench.ProfiledRun), and its CPU per copy is what the profile
// attributes to the rig, split into the sending end (what a connector's
// endpoint pays) and the receivers: the process's CPU time, also logged,
// holds the idle rigs' keep-alives too (a -test.cpuprofile run fails, as
// a process has one CPU profile at a time). WEIDA_SCALE_IDLE_TIMEOUT sets the weida
// listener's idle timeout (default 2 s), which with a thousand subscribers
// in this process can close one that reads. WEIDA_SCALE_PACKETS=1 counts
// each end's QUIC packets by what they carry (bench.Options.CountPackets)
// and logs them per copy; the tracing that takes costs CPU, so leave it
// off for the CPU figures. It runs only with WEIDA_BENCH=1.
func TestSubscriberScale(t *testing.T) {
	requireBench(t, "to run the scale measurement")
	subs := envInt(t, "WEIDA_SCALE_SUBSCRIBERS", 1000)
	rounds := envInt(t, "WEIDA_BENCH_ROUNDS", 3)
	sample := envDuration(t, "WEIDA_BENCH_SAMPLE", 2*time.Second)
	opts := bench.Options{
		IdleTimeout:  envDuration(t, "WEIDA_SCALE_IDLE_TIMEOUT", 0),
		CountPackets: os.Getenv("WEIDA_SCALE_PACKETS") == "1",
	}
	if opts.CountPackets {
		t.Log("counting packets: every CPU figure below includes quic-go's tracing of each packet")
	}
	build := func(n int, raw bool) (bench.Rig, time.Duration, int64) {
		h0 := heapNow()
		start := time.Now()
		var r bench.Rig
		var err error
		if raw {
			r, err = bench.NewRaw(ctx(t, 5*time.Minute), n, opts)
		} else {
			r, err = bench.NewWeida(ctx(t, 5*time.Minute), n, opts)
		}
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { r.Close() })
		return r, time.Since(start), int64(heapNow()) - int64(h0)
	}
	one, took1, heap1 := build(1, false)
	many, tookN, heapN := build(subs, false)
	rawOne, _, _ := build(1, true)
	rawMany, _, rawHeapN := build(subs, true)
	t.Logf("1 subscriber: set up in %v, heap +%.1f MiB; %d subscribers: set up in %v, heap +%.1f MiB (%.0f KiB per subscriber; raw quic-go %.0f KiB per connection)",
		took1.Round(time.Millisecond), float64(heap1)/(1<<20), subs, tookN.Round(time.Millisecond), float64(heapN)/(1<<20),
		float64(heapN)/float64(subs)/1024, float64(rawHeapN)/float64(subs)/1024)
	rigs := []bench.Rig{one, many, rawOne, rawMany}
	for _, r := range rigs { // warm-up
		if _, err := r.Run(ctx(t, 5*time.Minute), bench.Load{Duration: sample / 4}); err != nil {
			t.Fatal(err)
		}
	}
	// cpu is each sample's CPU per copy as its profile attributes it to
	// the rig (both ends and the shared runtime): the process's own CPU
	// time also holds the other three rigs' keep-alives, which the
	// 1,000-subscriber weida rig's listener sends every 500 ms.
	var cpu, endpointCPU, receiverCPU, copies, datagrams [4][]float64
	for round := range rounds {
		for k := range rigs {
			i := (k + round) % len(rigs)
			runtime.GC()
			sent0, in0 := udpDatagramsSent(), udpCounter("InDatagrams")
			s, c, err := bench.ProfiledRun(ctx(t, 5*time.Minute), rigs[i], bench.Load{Duration: sample})
			if err != nil {
				t.Fatal(err)
			}
			perCopy := float64(udpDatagramsSent()-sent0) / float64(s.Copies)
			packetsPerCopy := float64(udpCounter("InDatagrams")-in0) / float64(s.Copies)
			per := func(d time.Duration) time.Duration { return d / time.Duration(s.Copies) }
			cpu[i] = append(cpu[i], float64(per(c.Rig())))
			endpointCPU[i] = append(endpointCPU[i], float64(per(c.Endpoint)))
			receiverCPU[i] = append(receiverCPU[i], float64(per(c.Receiver)))
			copies[i] = append(copies[i], s.CopiesPerSecond())
			datagrams[i] = append(datagrams[i], perCopy)
			t.Logf("round %d, %s: %.0f msgs/s, %.0f copies/s, CPU/copy %v (sending end %v, receiving end %v, runtime %v; the process %v, other rigs %v), allocs/copy %.1f, UDP send calls per copy %.2f, datagrams received %.2f",
				round+1, rigs[i].Name(), s.MessagesPerSecond(), s.CopiesPerSecond(), per(c.Rig()),
				per(c.Endpoint), per(c.Receiver), per(c.Runtime), s.CPUPerCopy(), per(c.OtherRigs), s.AllocsPerCopy(), perCopy, packetsPerCopy)
			if opts.CountPackets {
				logPackets(t, s)
			}
		}
	}
	ratioOf := func(cpu [4][]float64) func(a, b int) (med, lo, hi float64) {
		return func(a, b int) (med, lo, hi float64) {
			var r []float64
			for round := range rounds {
				r = append(r, cpu[a][round]/cpu[b][round])
			}
			return median(r), slices.Min(r), slices.Max(r)
		}
	}
	ratio, endpointRatio, receiverRatio := ratioOf(cpu), ratioOf(endpointCPU), ratioOf(receiverCPU)
	fanOut, fanLo, fanHi := ratio(1, 0)
	rawFanOut, rawLo, rawHi := ratio(3, 2)
	hop, hopLo, hopHi := ratio(0, 2)
	hopN, hopNLo, hopNHi := ratio(1, 3)
	epFanOut, epLo, epHi := endpointRatio(1, 0)
	epRawFanOut, epRawLo, epRawHi := endpointRatio(3, 2)
	epHop, epHopLo, epHopHi := endpointRatio(0, 2)
	rcvHop, rcvHopLo, rcvHopHi := receiverRatio(0, 2)
	fmt.Printf("subscriber scale: 1 subscriber %.0f copies/s %.2f µs/copy %.2f send calls/copy; %d subscribers %.0f copies/s %.2f µs/copy %.2f send calls/copy; CPU per copy ratio %.2fx (%.2f–%.2f); heap %.0f KiB per subscriber; set up in %v\n",
		median(copies[0]), median(cpu[0])/1e3, median(datagrams[0]), subs, median(copies[1]), median(cpu[1])/1e3, median(datagrams[1]),
		fanOut, fanLo, fanHi, float64(heapN)/float64(subs)/1024, tookN.Round(time.Millisecond))
	fmt.Printf("raw quic-go: 1 connection %.0f copies/s %.2f µs/copy %.2f send calls/copy; %d connections %.0f copies/s %.2f µs/copy %.2f send calls/copy; CPU per copy ratio %.2fx (%.2f–%.2f)\n",
		median(copies[2]), median(cpu[2])/1e3, median(datagrams[2]), subs, median(copies[3]), median(cpu[3])/1e3, median(datagrams[3]),
		rawFanOut, rawLo, rawHi)
	fmt.Printf("weida against raw quic-go, CPU per copy: 1 receiver %.2fx (%.2f–%.2f); %d receivers %.2fx (%.2f–%.2f)\n",
		hop, hopLo, hopHi, subs, hopN, hopNLo, hopNHi)
	fmt.Printf("sending end only: weida %.2f µs/copy with 1 subscriber, %.2f with %d, ratio %.2fx (%.2f–%.2f); raw quic-go %.2f and %.2f, ratio %.2fx (%.2f–%.2f); weida against raw with 1 receiver %.2fx (%.2f–%.2f), receiving end %.2fx (%.2f–%.2f)\n",
		median(endpointCPU[0])/1e3, median(endpointCPU[1])/1e3, subs, epFanOut, epLo, epHi,
		median(endpointCPU[2])/1e3, median(endpointCPU[3])/1e3, epRawFanOut, epRawLo, epRawHi, epHop, epHopLo, epHopHi, rcvHop, rcvHopLo, rcvHopHi)
}

// logPackets logs, per copy, the QUIC packets each end of a sample's rig
// sent, by what they carried.
func logPackets(t *testing.T, s bench.Sample) {
	t.Helper()
	per := func(n int64) float64 { return float64(n) / float64(s.Copies) }
	for _, end := range []struct {
		name string
		p    bench.Packets
	}{{"sending end", s.EndpointPackets}, {"receivers", s.ReceiverPackets}} {
		p := end.p
		t.Logf("  %s sent per copy: %.3f packets of %.0f bytes on average; %.3f with STREAM frames, %.3f only ACK, %.3f PING without STREAM; %.2f MAX_STREAMS frames; %.4f declared lost",
			end.name, per(p.Sent), float64(p.Bytes)/float64(max(p.Sent, 1)), per(p.WithStream), per(p.AckOnly), per(p.PingNoStream), per(p.MaxStreams), per(p.Lost))
	}
}
