package e2e

import (
	"encoding/binary"
	"slices"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/bench"
)

// TestFanOutLatency measures how long a copy takes to reach each of many
// subscribers when the endpoint is not saturated: messages paced at
// WEIDA_FANOUT_RATE a second (default 50) for WEIDA_BENCH_SAMPLE (default
// 10 s) to WEIDA_SCALE_SUBSCRIBERS subscribers (default 1,000), all in
// this process. Each payload carries its publish time; the test logs the
// percentiles of every copy's latency and of each message's last copy
// (the whole fan-out), and the process's CPU per copy, which says whether
// the latency is a wait or the rig running out of CPU. Send turns decide in what order a thousand writers
// hand copies to QUIC, so this is what a change to them can cost at
// ordinary load. It asserts no latency, and runs only with WEIDA_BENCH=1.
func TestFanOutLatency(t *testing.T) {
	requireBench(t, "to run the fan-out latency measurement")
	subs := envInt(t, "WEIDA_SCALE_SUBSCRIBERS", 1000)
	rate := envInt(t, "WEIDA_FANOUT_RATE", 50)
	sample := envDuration(t, "WEIDA_BENCH_SAMPLE", 10*time.Second)
	c := ctx(t, sample+5*time.Minute)

	rig, err := bench.NewWeida(c, subs, bench.Options{})
	if err != nil {
		t.Fatal(err)
	}
	defer rig.Close()
	pub, ss := rig.Publisher(), rig.Subscribers()

	messages := int(sample.Seconds() * float64(rate))
	start := time.Now()
	// latency[m][s] is copy m's latency at subscriber s.
	latency := make([][]time.Duration, messages)
	for m := range latency {
		latency[m] = make([]time.Duration, subs)
	}
	var readers sync.WaitGroup
	for si, s := range ss {
		readers.Go(func() {
			for range messages {
				msg, err := s.Receive(c)
				if err != nil {
					t.Errorf("subscriber %d: %v", si, err)
					return
				}
				m := binary.BigEndian.Uint64(msg.Payload)
				sent := time.Duration(binary.BigEndian.Uint64(msg.Payload[8:]))
				latency[m][si] = time.Since(start) - sent
			}
		})
	}
	cpu0 := proccpu.Self()
	payload := make([]byte, 256)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for m := range messages {
		<-tick.C
		binary.BigEndian.PutUint64(payload, uint64(m))
		binary.BigEndian.PutUint64(payload[8:], uint64(time.Since(start)))
		if r, err := pub.Publish(c, weida.Message{Topic: bench.Topic, Payload: payload}); err != nil || r.Queued != subs {
			t.Fatalf("publish %d: %+v, %v", m, r, err)
		}
	}
	readers.Wait()
	cpu := proccpu.Self() - cpu0

	var every, last []time.Duration
	for _, perSub := range latency {
		every = append(every, perSub...)
		last = append(last, slices.Max(perSub))
	}
	slices.Sort(every)
	slices.Sort(last)
	at := func(d []time.Duration, p int) time.Duration { return percentile(d, p).Round(10 * time.Microsecond) }
	t.Logf("%d subscribers, %d messages at %d/s: every copy p50 %v p99 %v max %v; a message's last copy p50 %v p99 %v max %v; "+
		"CPU per copy (both ends, this process) %v",
		subs, messages, rate, at(every, 50), at(every, 99), every[len(every)-1].Round(10*time.Microsecond),
		at(last, 50), at(last, 99), last[len(last)-1].Round(10*time.Microsecond), cpu/time.Duration(len(every)))
}
