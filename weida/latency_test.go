package weida

import (
	"encoding/binary"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"runtime/trace"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/internal/proccpu"
)

// TestLatencyEpisodes is a diagnosis, not a test: the weida hop alone (a
// Listener's publisher and one Subscriber in this process), paced like the
// bridge benchmark's latency samples (e2e/bridge_bench_test.go: bursts
// after 100 µs sleeps, at most 512 copies in flight), reporting the
// publish-to-Receive percentiles, the episodes of copies slower than 1 ms,
// the garbage collections and both QUIC ends' counters, so that the
// tail can be traced to its cause (docs/PERFORMANCE.md "Latency"). It runs
// only with WEIDA_BENCH=1:
//
//	WEIDA_BENCH=1 go test -run TestLatencyEpisodes -v ./weida/
//	WEIDA_BENCH=1 WEIDA_LAT_PACE=87000 WEIDA_LAT_SECONDS=3 GOGC=off go test ...
//
// WEIDA_LAT_PACE (copies/s, 87000), WEIDA_LAT_SECONDS (per sample, 2),
// WEIDA_LAT_ROUNDS (3), WEIDA_LAT_UNI (the subscriber's
// MaxConcurrentUniStreams, the default when unset) and WEIDA_LAT_DUMP (a
// file for every copy's send time, latency and the collections' times)
// vary it.
func TestLatencyEpisodes(t *testing.T) {
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 to run the latency diagnosis")
	}
	pace := envFloat(t, "WEIDA_LAT_PACE", 87000)
	secs := envFloat(t, "WEIDA_LAT_SECONDS", 2)
	rounds := int(envFloat(t, "WEIDA_LAT_ROUNDS", 3))
	var limits Limits
	limits.MaxConcurrentUniStreams = int64(envFloat(t, "WEIDA_LAT_UNI", 0))

	l := listen(t, ListenConfig{})
	pub := publisher(t, l, "/lat")
	s := dial(t, l, "/lat", DialConfig{Limits: limits})
	subscribe(t, l, s, 1, "#")

	const window = 512
	delivered := make(chan struct{}, window)
	var mu sync.Mutex
	var lat, sent []int64 // ns; guarded by mu
	go func() {
		for {
			m, err := s.Receive(t.Context())
			if err != nil {
				return
			}
			if st := int64(binary.LittleEndian.Uint64(m.Payload)); st != 0 {
				now := time.Now().UnixNano()
				mu.Lock()
				lat, sent = append(lat, now-st), append(sent, st)
				mu.Unlock()
			}
			delivered <- struct{}{}
		}
	}()
	// One publish that comes through proves the subscription is applied.
	publish(t, pub, "lat", make([]byte, 256))
	<-delivered

	// gcEnds collects the time each collection's sweep started: a
	// finalizer re-armed on every cycle runs once per collection.
	var gcMu sync.Mutex
	var gcEnds []int64
	stopGC := make(chan struct{})
	var arm func()
	arm = func() {
		o := new([16]byte)
		runtime.SetFinalizer(o, func(*[16]byte) {
			gcMu.Lock()
			gcEnds = append(gcEnds, time.Now().UnixNano())
			gcMu.Unlock()
			select {
			case <-stopGC:
			default:
				arm()
			}
		})
	}
	arm()
	defer close(stopGC)

	n := int(pace * secs)
	for round := range rounds {
		mu.Lock()
		lat, sent = lat[:0], sent[:0]
		mu.Unlock()
		gcMu.Lock()
		gcEnds = gcEnds[:0]
		gcMu.Unlock()
		var ms0, ms1 runtime.MemStats
		runtime.ReadMemStats(&ms0)
		srv0, sub0 := serverStats(l), s.c.qc.ConnectionStats()
		wait0, ivcsw0 := runDelay(t)
		busy0, own0 := machineBusy(t), proccpu.Self()
		start := time.Now()
		// Under `go test -trace`, this lines the trace's clock up with the
		// dump's wall-clock send times.
		trace.Log(t.Context(), "wall", strconv.FormatInt(time.Now().UnixNano(), 10))
		inFlight := 0
		for i := range n {
			due := time.Duration(float64(i) / pace * float64(time.Second))
			for time.Since(start) < due {
				time.Sleep(100 * time.Microsecond)
			}
			if inFlight == window {
				<-delivered
				inFlight--
			}
			p := make([]byte, 256)
			binary.LittleEndian.PutUint64(p, uint64(time.Now().UnixNano()))
			if r, err := pub.Publish(t.Context(), Message{Topic: "lat", Payload: p}); err != nil || r.Dropped > 0 {
				t.Fatalf("publish: %+v %v", r, err)
			}
			inFlight++
		}
		for range inFlight {
			<-delivered
		}
		elapsed := time.Since(start)
		runtime.ReadMemStats(&ms1)
		srv1, sub1 := serverStats(l), s.c.qc.ConnectionStats()
		wait1, ivcsw1 := runDelay(t)
		busy1, own1 := machineBusy(t), proccpu.Self()
		mu.Lock()
		ls, ss := slices.Clone(lat), slices.Clone(sent)
		mu.Unlock()
		gcMu.Lock()
		gcs := slices.Clone(gcEnds)
		gcMu.Unlock()
		sorted := slices.Clone(ls)
		slices.Sort(sorted)
		pct := func(p int) time.Duration { return time.Duration(sorted[min(len(sorted)-1, len(sorted)*p/100)]) }
		eps, slowN, nearGC := episodes(ls, ss, gcs)
		t.Logf("round %d: %d copies at %.0f/s (reached %.0f/s): p50 %v p90 %v p99 %v max %v; over 1 ms: %d (%.1f%%) in %d episodes, %d of them within 3 ms of a GC's end; GCs %d (%.0f/s), STW total %v",
			round+1, len(ls), pace, float64(n)/elapsed.Seconds(), pct(50), pct(90), pct(99), time.Duration(sorted[len(sorted)-1]),
			slowN, 100*float64(slowN)/float64(len(ls)), len(eps), nearGC, ms1.NumGC-ms0.NumGC,
			float64(ms1.NumGC-ms0.NumGC)/elapsed.Seconds(), time.Duration(ms1.PauseTotalNs-ms0.PauseTotalNs))
		t.Logf("  listener QUIC: packets sent %d, lost %d, cwnd %d → %d B, srtt %v, min RTT %v; subscriber: packets sent %d (ACKs, MAX_STREAMS), received %d",
			srv1.PacketsSent-srv0.PacketsSent, srv1.PacketsLost-srv0.PacketsLost, srv0.CongestionWindow, srv1.CongestionWindow,
			srv1.SmoothedRTT, srv1.MinRTT, sub1.PacketsSent-sub0.PacketsSent, sub1.PacketsReceived-sub0.PacketsReceived)
		t.Logf("  kernel: this process's threads waited %v for a CPU (%.1f%% of the sample), %d involuntary context switches; CPU of this process %.2f cores, of everything else %.2f cores",
			wait1-wait0, 100*float64(wait1-wait0)/float64(elapsed), ivcsw1-ivcsw0,
			float64(own1-own0)/float64(elapsed), float64(busy1-busy0-(own1-own0))/float64(elapsed))
		if path := os.Getenv("WEIDA_LAT_DUMP"); path != "" {
			dumpLatency(t, fmt.Sprintf("%s.%d", path, round+1), ls, ss, gcs)
		}
	}
}

// episode is a run of copies over 1 ms whose send times lie within 1 ms of
// each other.
type episode struct{ from, to, worst int64 }

// episodes groups the copies over 1 ms into episodes, and counts how many
// episodes overlap the 3 ms after a collection's end (the finalizer runs
// after the cycle, so a cycle that caused an episode ends within or just
// after it).
func episodes(lat, sent, gcEnds []int64) (eps []episode, slow, nearGC int) {
	idx := make([]int, 0)
	for i, d := range lat {
		if d > int64(time.Millisecond) {
			idx = append(idx, i)
		}
	}
	slices.SortFunc(idx, func(a, b int) int { return int(sent[a] - sent[b]) })
	for _, i := range idx {
		if k := len(eps) - 1; k >= 0 && sent[i]-eps[k].to < int64(time.Millisecond) {
			eps[k].to = sent[i]
			eps[k].worst = max(eps[k].worst, lat[i])
			continue
		}
		eps = append(eps, episode{from: sent[i], to: sent[i], worst: lat[i]})
	}
	for _, e := range eps {
		for _, g := range gcEnds {
			if g >= e.from-int64(time.Millisecond) && g <= e.to+e.worst+3*int64(time.Millisecond) {
				nearGC++
				break
			}
		}
	}
	return eps, len(idx), nearGC
}

func dumpLatency(t *testing.T, path string, lat, sent, gcEnds []int64) {
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	first := slices.Min(sent)
	fmt.Fprintf(f, "first %d\n", first) // Unix ns, to line the copies up with a runtime trace
	for i := range lat {
		fmt.Fprintf(f, "m %d %d\n", sent[i]-first, lat[i])
	}
	for _, g := range gcEnds {
		fmt.Fprintf(f, "gc %d\n", g-first)
	}
}

// serverStats returns the QUIC statistics of the listener's one connection.
func serverStats(l *Listener) (st quic.ConnectionStats) {
	l.mu.Lock()
	defer l.mu.Unlock()
	for sc := range l.conns {
		return sc.c.qc.ConnectionStats()
	}
	return st
}

func envFloat(t *testing.T, name string, def float64) float64 {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	f, err := strconv.ParseFloat(v, 64)
	if err != nil {
		t.Fatalf("%s=%q: %v", name, v, err)
	}
	return f
}

// runDelay returns the time this process's threads have spent runnable but
// waiting for a CPU (/proc/self/task/*/schedstat, second field) and their
// involuntary context switches (getrusage): another process, or more
// runnable threads than cores, holding this one off.
func runDelay(t *testing.T) (time.Duration, int64) {
	var sum time.Duration
	tasks, _ := filepath.Glob("/proc/self/task/*/schedstat")
	for _, p := range tasks {
		b, err := os.ReadFile(p)
		if err != nil {
			continue // the thread ended
		}
		f := strings.Fields(string(b))
		if len(f) >= 2 {
			v, _ := strconv.ParseInt(f[1], 10, 64)
			sum += time.Duration(v)
		}
	}
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		t.Fatal(err)
	}
	return sum, ru.Nivcsw
}

// machineBusy returns the CPU time all cores spent busy (/proc/stat: user,
// nice, system, irq, softirq, steal), in ticks of 10 ms.
func machineBusy(t *testing.T) time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		t.Fatal(err)
	}
	f := strings.Fields(strings.SplitN(string(b), "\n", 2)[0])
	var sum int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} {
		v, _ := strconv.ParseInt(f[i], 10, 64)
		sum += v
	}
	return time.Duration(sum) * 10 * time.Millisecond
}
