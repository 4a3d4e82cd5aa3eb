package e2e

// The bridge benchmark (issue 16): what the bridge costs on top of its two
// halves. For each broker it runs, in paired rounds, the direct broker rig
// (broker publisher → broker → broker subscriber), the direct weida rig
// (weida publisher → weida subscriber) and the two bridged rigs (inbound
// broker → bridge → weida, outbound weida → bridge → broker), then paced
// latency samples, and reports per bridged rig the CPU per message against
// the sum of the two direct rigs' in the same rounds. scripts/bench-bridge
// (`make bench-bridge`) runs it; docs/PERFORMANCE.md records a run.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// latencyRecorder keeps the publish-to-arrival time of every stamped
// payload of one latency sample. Safe for concurrent use.
type latencyRecorder struct {
	n    atomic.Int64
	lat  []time.Duration
	sent []int64 // send times, Unix ns, for the dump (WEIDA_BENCH_LATENCY_DUMP)
}

func newLatencyRecorder(n int) *latencyRecorder {
	return &latencyRecorder{lat: make([]time.Duration, n), sent: make([]int64, n)}
}

// record takes the send time from the first 8 bytes of payload; payloads
// without a stamp (the throughput samples' zeroed payload) are ignored.
func (l *latencyRecorder) record(payload []byte) {
	if len(payload) < 8 {
		return
	}
	sent := int64(binary.LittleEndian.Uint64(payload))
	if sent == 0 {
		return
	}
	d := time.Duration(time.Now().UnixNano() - sent)
	if i := l.n.Add(1) - 1; i < int64(len(l.lat)) {
		l.lat[i] = d
		l.sent[i] = sent
	}
}

// percentiles returns the p-th percentiles of what was recorded.
func (l *latencyRecorder) percentiles(ps ...int) []time.Duration {
	s := slices.Clone(l.lat[:min(int(l.n.Load()), len(l.lat))])
	slices.Sort(s)
	out := make([]time.Duration, len(ps))
	for i, p := range ps {
		out[i] = percentile(s, p)
	}
	return out
}

// percentile is the p-th percentile of sorted, 0 when it is empty.
func percentile(sorted []time.Duration, p int) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	return sorted[min(len(sorted)-1, len(sorted)*p/100)]
}

// stampedPayload returns a fresh 256-byte payload carrying the current time,
// for latency samples (fresh, because a bridge may still hold the previous
// one).
func stampedPayload() []byte {
	p := make([]byte, len(benchPayload))
	binary.LittleEndian.PutUint64(p, uint64(time.Now().UnixNano()))
	return p
}

// runPaced sends n stamped messages through rig at pace msgs/s (see
// sendPaced) and returns the p50 and p99 of publish to arrival.
func runPaced(t *testing.T, rig *benchRig, n int, pace float64) (p50, p99 time.Duration) {
	t.Helper()
	rec := newLatencyRecorder(n)
	rig.lat.Store(rec)
	defer rig.lat.Store(nil)
	sendPaced(t, rig, n, pace, stampedPayload)
	ps := rec.percentiles(50, 99)
	rec.dump(t, rig.name, pace)
	return ps[0], ps[1]
}

// dump writes, when WEIDA_BENCH_LATENCY_DUMP names a directory, one line
// per message of the sample (send time relative to the first send and
// latency, both in ns, in arrival order), so that a tail can be traced to
// where in the paced bursts, or when in the sample, it happened.
func (l *latencyRecorder) dump(t *testing.T, rig string, pace float64) {
	dir := os.Getenv("WEIDA_BENCH_LATENCY_DUMP")
	if dir == "" {
		return
	}
	n := min(int(l.n.Load()), len(l.lat))
	first := slices.Min(l.sent[:n])
	var b strings.Builder
	fmt.Fprintf(&b, "# %s at %.0f msg/s\n", rig, pace)
	for i := range n {
		fmt.Fprintf(&b, "%d %d\n", l.sent[i]-first, int64(l.lat[i]))
	}
	name := fmt.Sprintf("%s/lat-%d.txt", dir, time.Now().UnixNano())
	if err := os.WriteFile(name, []byte(b.String()), 0o644); err != nil {
		t.Fatal(err)
	}
}

// runPacedCPU sends n unstamped messages through rig at pace msgs/s (and
// at most benchWindow in flight) and returns the rate reached and this
// process's CPU per message.
func runPacedCPU(t *testing.T, rig *benchRig, n int, pace float64) (rate float64, cpu time.Duration) {
	t.Helper()
	cpu0 := proccpu.Self()
	elapsed := sendPaced(t, rig, n, pace, func() []byte { return benchPayload })
	return float64(n) / elapsed.Seconds(), (proccpu.Self() - cpu0) / time.Duration(max(n, 1))
}

// sendPaced sends n messages with payloads from payload through rig at
// pace msgs/s, with at most benchWindow in flight, waits until all have
// arrived and returns how long that took. Go's sleeps are coarse here
// (about 1 ms when idle), so a paced sender emits small bursts, as in
// broker-baselines.md.
func sendPaced(t *testing.T, rig *benchRig, n int, pace float64, payload func() []byte) time.Duration {
	t.Helper()
	stuck := time.NewTimer(time.Minute)
	defer stuck.Stop()
	wait := func() {
		select {
		case <-rig.delivered:
		case <-stuck.C:
			t.Fatalf("%s: a message was lost (not received within a minute)", rig.name)
		}
	}
	start := time.Now()
	inFlight := 0
	for i := range n {
		due := time.Duration(float64(i) / pace * float64(time.Second))
		for time.Since(start) < due {
			time.Sleep(100 * time.Microsecond)
		}
		if inFlight == benchWindow {
			wait()
			inFlight--
		}
		if err := rig.publish(payload()); err != nil {
			t.Fatalf("%s: publish: %v", rig.name, err)
		}
		inFlight++
	}
	for range inFlight {
		wait()
	}
	return time.Since(start)
}

// mqttAsyncPublisher publishes at QoS 1 on c from 32 goroutines, so that
// Mosquitto's Receive Maximum, not one round trip, bounds what is in flight;
// publish hands a payload over and returns. Errors fail the test.
func mqttAsyncPublisher(t *testing.T, c *mqttClient, topic string) (publish func(p []byte) error) {
	jobs := make(chan []byte, benchWindow)
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for p := range jobs {
				if _, err := c.Publish(context.Background(), &paho.Publish{Topic: topic, QoS: 1, Payload: p}); err != nil {
					t.Errorf("mqtt publish: %v", err)
				}
			}
		})
	}
	t.Cleanup(func() { close(jobs); wg.Wait() })
	return func(p []byte) error { jobs <- p; return nil }
}

// mqttSubscriberRig connects a QoS 1 subscriber to filter that reports
// every message to rig.
func mqttSubscriberRig(t *testing.T, addr, id, filter string, rig *benchRig, done <-chan struct{}) {
	sub, err := mqttDial(ctx(t, 10*time.Second), addr, id, func(m mqttMsg) { rig.arrived(m.Payload, done) })
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.close)
	sub.subscribe(t, 1, filter)
}

// mqttDirectRig: a paho publisher at QoS 1 → Mosquitto → a paho subscriber
// at QoS 1, both with the buffered connection the bridge's client has.
func mqttDirectRig(t *testing.T, addr string) *benchRig {
	rig := &benchRig{name: "Mosquitto direct", delivered: make(chan struct{}, benchWindow)}
	done := make(chan struct{})
	mqttSubscriberRig(t, addr, "bb-direct-sub", "bbd/+/data", rig, done)
	rig.publish = mqttAsyncPublisher(t, mqttConnect(t, addr, "bb-direct-pub"), "bbd/x/data")
	syncRig(t, rig, func() error { return rig.publish(benchPayload) })
	rig.close = func() { close(done) }
	return rig
}

// mqttInRig: a paho publisher at QoS 1 → Mosquitto → connectors.Bridge with
// the MQTT Source at QoS 1 → the bridge's weida endpoint → a weida
// subscriber.
func mqttInRig(t *testing.T, addr string) *benchRig {
	p := policy.MQTTLevelsV1()
	filter := "bbi/+/data"
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatal(err)
	}
	l, wpub, url := benchEndpoint(t)
	spec := connectors.Spec{Name: "bench-in", Protocol: policy.MQTT, Direction: policy.Inbound, Policy: p,
		Routes: []connectors.Route{{Name: "bench", Foreign: filter, Weida: wf}}, Endpoint: url}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := mqtt.Config{Host: host, Port: port, ClientID: "bb-in", QoS: 1, CleanStart: true}
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return mqtt.NewSource(cfg, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	rig := &benchRig{name: "Mosquitto → bridge → weida", delivered: make(chan struct{}, benchWindow)}
	stopRecv := weidaReceiver(t, url, rig)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	rig.publish = mqttAsyncPublisher(t, mqttConnect(t, addr, "bb-in-pub"), "bbi/x/data")
	syncRig(t, rig, func() error { return rig.publish(benchPayload) })
	rig.close = func() {
		stopRecv()
		closeBridgeRig(t, rig, b, stopBridge, l)
	}
	return rig
}

// mqttOutRig: a weida publisher → connectors.Bridge with the MQTT Sink at
// QoS 1 (limits.inFlight's default) → Mosquitto → a paho subscriber at
// QoS 1.
func mqttOutRig(t *testing.T, addr string) *benchRig {
	p := policy.MQTTLevelsV1()
	filter := "bench/+/data" // benchSubject's levels, as the policy maps them
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatal(err)
	}
	l, wpub, url := benchEndpoint(t)
	rig := &benchRig{name: "weida → bridge → Mosquitto", delivered: make(chan struct{}, benchWindow)}
	done := make(chan struct{})
	mqttSubscriberRig(t, addr, "bb-out-sub", filter, rig, done)
	spec := connectors.Spec{Name: "bench-out", Protocol: policy.MQTT, Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{{Name: "bench", Foreign: filter, Weida: wf}}, Endpoint: url, InFlight: resourcesDefaultInFlight}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := mqtt.Config{Host: host, Port: port, ClientID: "bb-out", QoS: 1}
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) { return mqtt.NewSink(cfg, report) },
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	rig.publish = func(p []byte) error { return publishWeida(wpub, p) }
	syncRig(t, rig, func() error { return publishWeida(wpub, benchPayload) })
	rig.close = func() {
		close(done)
		closeBridgeRig(t, rig, b, stopBridge, l)
	}
	return rig
}

// bridgeBenchConfig sizes a run; the zero value of a field means its
// default.
type bridgeBenchConfig struct {
	Rounds   int           // paired rounds (3)
	Sample   time.Duration // length of one throughput sample (2s)
	Latency  time.Duration // length of one latency sample (1s)
	Messages int           // messages per sample, overriding Sample and Latency (smoke runs)
	// Only, when set, runs one rig alone ("nats-in", "mqtt-out", ...), for
	// a CPU profile of it; nothing is compared.
	Only string
	// Pace, when above zero, paces the throughput samples at that many
	// msgs/s instead of running the rigs flat out: CPU per message depends
	// on the rate (batching, wake-ups), so a direct rig paced at a bridged
	// rig's rate tells how much of the bridge's excess is the rate alone.
	Pace float64
}

// rigStats is one rig's per-round samples.
type rigStats struct {
	Name      string    `json:"name"`
	Rate      []float64 `json:"rate"`       // msgs/s
	SelfCPU   []float64 `json:"self_ns"`    // CPU of the test process per message, ns
	BrokerCPU []float64 `json:"broker_ns"`  // CPU of the broker process per message, ns
	P50       []float64 `json:"p50_ns"`     // latency samples (bridged rigs)
	P99       []float64 `json:"p99_ns"`     //
	Messages  int       `json:"messages"`   // per throughput sample
	LatencyN  int       `json:"latency_n"`  // per latency sample
	LatencyAt float64   `json:"latency_at"` // pace of the latency samples, msgs/s
}

func (s *rigStats) total(r int) float64 { return s.SelfCPU[r] + s.BrokerCPU[r] }

// spread is a median over rounds with its range.
type spread struct {
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

func spreadOf(v []float64) spread {
	if len(v) == 0 {
		return spread{}
	}
	return spread{Median: median(v), Min: slices.Min(v), Max: slices.Max(v)}
}

// bridgedResult is one line of the table: a bridged rig against the direct
// rigs of the same rounds.
type bridgedResult struct {
	Rig    string `json:"rig"` // "nats-in", ...
	Name   string `json:"name"`
	Broker string `json:"broker"`
	Rate   spread `json:"rate"`
	// CPU per message in ns: the bridged rig's test process and broker,
	// the direct broker rig's, and the direct rigs' totals (test process
	// and broker).
	SelfCPU         spread `json:"self_ns"`
	BrokerCPU       spread `json:"broker_ns"`
	DirectSelfCPU   spread `json:"direct_broker_self_ns"`
	DirectBrokerCPU spread `json:"direct_broker_broker_ns"`
	DirectCPU       spread `json:"direct_broker_ns"`
	WeidaCPU        spread `json:"direct_weida_ns"`
	CPURatio        spread `json:"cpu_ratio"`  // bridged ÷ (direct broker + direct weida), per round
	RateRatio       spread `json:"rate_ratio"` // bridged ÷ min(direct broker, direct weida), per round
	AddedP50        spread `json:"added_p50_ns"`
	AddedP99        spread `json:"added_p99_ns"`
	// The direct weida rig's own latency at the same pace: not added
	// by the bridge, but part of what it adds to the broker's.
	WeidaP50    spread  `json:"weida_p50_ns"`
	WeidaP99    spread  `json:"weida_p99_ns"`
	LatencyPace float64 `json:"latency_pace"`
	Rounds      int     `json:"rounds"`
}

// bridgeBenchBroker is one broker's four rigs, in the order direct broker,
// direct weida, inbound, outbound.
type bridgeBenchBroker struct {
	key, broker string
	pid         int
	build       [4]func() *benchRig
}

// sampleSize is the messages a sample of rig takes for d at rate.
func (c bridgeBenchConfig) sampleSize(rate float64, d time.Duration) int {
	if c.Messages > 0 {
		return c.Messages
	}
	return max(1000, int(rate*d.Seconds()))
}

// run measures one broker's rigs in paired rounds: every round runs each
// rig once, back to back, the order turning every round, so that drift in
// the machine's load hits direct and bridged rigs alike; then latency
// rounds pace the direct broker and each bridged rig at half that bridged
// rig's median rate.
func (bb bridgeBenchBroker) run(t *testing.T, cfg bridgeBenchConfig) []bridgedResult {
	names := [4]string{"direct", "weida", "in", "out"}
	var rigs []*benchRig
	for i, build := range bb.build {
		if cfg.Only == "" || cfg.Only == bb.key+"-"+names[i] {
			rigs = append(rigs, build())
		}
	}
	if len(rigs) == 0 {
		return nil
	}
	defer func() {
		for _, r := range rigs {
			r.close()
		}
	}()
	stats := make([]*rigStats, len(rigs))
	for i, r := range rigs {
		// Warm-up, which also sizes the samples.
		rate := runRig(t, r, cmpOr(cfg.Messages, 5000))
		if cfg.Pace > 0 {
			rate = cfg.Pace
		}
		stats[i] = &rigStats{Name: r.name, Messages: cfg.sampleSize(rate, cfg.Sample)}
	}
	for round := range cfg.Rounds {
		for k := range rigs {
			i := (k + round) % len(rigs)
			if round%2 == 1 {
				i = len(rigs) - 1 - i
			}
			s := stats[i]
			runtime.GC()
			b0 := cpuTime(t, bb.pid)
			var rate float64
			var cpu time.Duration
			if cfg.Pace > 0 {
				rate, cpu = runPacedCPU(t, rigs[i], s.Messages, cfg.Pace)
			} else {
				rate, cpu = runRigCPU(t, rigs[i], s.Messages)
			}
			broker := float64(cpuTime(t, bb.pid)-b0) / float64(s.Messages)
			s.Rate = append(s.Rate, rate)
			s.SelfCPU = append(s.SelfCPU, float64(cpu))
			s.BrokerCPU = append(s.BrokerCPU, broker)
			t.Logf("%s round %d: %-30s %9.0f msg/s; CPU/msg %6.2f µs here, %6.2f µs in %s",
				bb.key, round+1, s.Name, rate, float64(cpu)/1e3, broker/1e3, bb.broker)
		}
	}
	if len(rigs) < 4 {
		return nil
	}
	direct, weidaDirect := stats[0], stats[1]
	var out []bridgedResult
	for _, b := range []int{2, 3} {
		s := stats[b]
		pace := median(s.Rate) / 2
		n := cfg.sampleSize(pace, cfg.Latency)
		s.LatencyAt, s.LatencyN = pace, n
		var p50d, p99d, p50w, p99w []float64
		for round := range cfg.Rounds {
			// The direct weida rig at the same pace too: the bridged
			// rig's added latency holds a weida hop, whose own share
			// this shows.
			order := []int{0, 1, b}
			if round%2 == 1 {
				slices.Reverse(order)
			}
			for _, i := range order {
				p50, p99 := runPaced(t, rigs[i], n, pace)
				t.Logf("%s latency round %d at %.0f msg/s: %-30s p50 %v, p99 %v", bb.key, round+1, pace, rigs[i].name, p50, p99)
				switch i {
				case 0:
					p50d, p99d = append(p50d, float64(p50)), append(p99d, float64(p99))
				case 1:
					p50w, p99w = append(p50w, float64(p50)), append(p99w, float64(p99))
				default:
					s.P50, s.P99 = append(s.P50, float64(p50)), append(s.P99, float64(p99))
				}
			}
		}
		res := bridgedResult{
			Rig: bb.key + "-" + names[b], Name: s.Name, Broker: bb.broker, Rounds: cfg.Rounds, LatencyPace: pace,
			Rate: spreadOf(s.Rate), SelfCPU: spreadOf(s.SelfCPU), BrokerCPU: spreadOf(s.BrokerCPU),
		}
		var dcpu, wcpu, cpuRatio, rateRatio, a50, a99 []float64
		for r := range cfg.Rounds {
			dcpu = append(dcpu, direct.total(r))
			wcpu = append(wcpu, weidaDirect.total(r))
			cpuRatio = append(cpuRatio, s.total(r)/(direct.total(r)+weidaDirect.total(r)))
			rateRatio = append(rateRatio, s.Rate[r]/min(direct.Rate[r], weidaDirect.Rate[r]))
			a50 = append(a50, s.P50[r]-p50d[r])
			a99 = append(a99, s.P99[r]-p99d[r])
		}
		res.DirectCPU, res.WeidaCPU = spreadOf(dcpu), spreadOf(wcpu)
		res.DirectSelfCPU, res.DirectBrokerCPU = spreadOf(direct.SelfCPU), spreadOf(direct.BrokerCPU)
		res.CPURatio, res.RateRatio = spreadOf(cpuRatio), spreadOf(rateRatio)
		res.AddedP50, res.AddedP99 = spreadOf(a50), spreadOf(a99)
		res.WeidaP50, res.WeidaP99 = spreadOf(p50w), spreadOf(p99w)
		out = append(out, res)
	}
	for _, s := range stats {
		t.Logf("%s samples %s: %+v", bb.key, s.Name, *s)
	}
	return out
}

func cmpOr(v, def int) int {
	if v > 0 {
		return v
	}
	return def
}

// bridgeBenchBrokers returns the brokers whose keys are in keys (all when
// empty), each on a private instance so that other work's traffic does not
// share it.
func bridgeBenchBrokers(t *testing.T, keys []string) map[string]func(t *testing.T) bridgeBenchBroker {
	all := map[string]func(t *testing.T) bridgeBenchBroker{
		"nats": func(t *testing.T) bridgeBenchBroker {
			srv := brokertest.StartNATS(t)
			a := srv.Addr()
			return bridgeBenchBroker{key: "nats", broker: "nats-server", pid: srv.Pid(), build: [4]func() *benchRig{
				func() *benchRig { return natsDirectRig(t, a) },
				func() *benchRig { return weidaDirectRig(t) },
				func() *benchRig { return inboundRig(t, a, 1) },
				func() *benchRig { return outboundRig(t, a, false, 1, "bench") },
			}}
		},
		"mqtt": func(t *testing.T) bridgeBenchBroker {
			// Stock settings; QoS 1 is unaffected by Nagle (broker-baselines.md).
			srv := brokertest.StartMosquitto(t, "persistence false")
			a := srv.Addr()
			return bridgeBenchBroker{key: "mqtt", broker: "Mosquitto", pid: srv.Pid(), build: [4]func() *benchRig{
				func() *benchRig { return mqttDirectRig(t, a) },
				func() *benchRig { return weidaDirectRig(t) },
				func() *benchRig { return mqttInRig(t, a) },
				func() *benchRig { return mqttOutRig(t, a) },
			}}
		},
		"amqp": func(t *testing.T) bridgeBenchBroker {
			srv := brokertest.StartRabbit(t)
			a := srv.Addr()
			return bridgeBenchBroker{key: "amqp", broker: "RabbitMQ", pid: srv.VMPid(), build: [4]func() *benchRig{
				func() *benchRig { return rabbitDirectRig(t, a) },
				func() *benchRig { return weidaDirectRig(t) },
				func() *benchRig { return amqpInboundRig(t, a) },
				func() *benchRig { return amqpOutboundRig(t, a) },
			}}
		},
	}
	for _, k := range keys {
		if all[k] == nil {
			t.Fatalf("no broker %q (nats, mqtt, amqp)", k)
		}
	}
	return all
}

// runBridgeBench runs every selected broker's rigs and returns the table's
// lines.
func runBridgeBench(t *testing.T, cfg bridgeBenchConfig, keys []string) []bridgedResult {
	brokers := bridgeBenchBrokers(t, keys)
	var res []bridgedResult
	for _, k := range []string{"nats", "mqtt", "amqp"} {
		if len(keys) > 0 && !slices.Contains(keys, k) {
			continue
		}
		// A subtest, so that each broker and its rigs stop before the
		// next broker's are measured.
		t.Run(k, func(t *testing.T) { res = append(res, brokers[k](t).run(t, cfg)...) })
	}
	return res
}

// bridgeBenchTable renders the results as a markdown table.
func bridgeBenchTable(res []bridgedResult) string {
	us := func(s spread) string { return fmt.Sprintf("%.1f (%.1f–%.1f)", s.Median/1e3, s.Min/1e3, s.Max/1e3) }
	x := func(s spread) string { return fmt.Sprintf("**%.2fx** (%.2f–%.2f)", s.Median, s.Min, s.Max) }
	var b strings.Builder
	b.WriteString("| rig | bridged msg/s | bridged CPU/msg µs: test process + broker | direct broker rig CPU/msg µs: test process + broker = total | direct weida CPU/msg µs | CPU ratio bridged ÷ (broker + weida) | rate ratio bridged ÷ min(direct) | added latency p50 / p99 µs at half bridged max | direct weida p50 / p99 µs at that pace |\n")
	b.WriteString("| --- | ---: | --- | --- | --- | --- | --- | --- | --- |\n")
	for _, r := range res {
		fmt.Fprintf(&b, "| %s | %.0f (%.0f–%.0f) | %.1f + %.1f | %.1f + %.1f = %s | %s | %s | %.2f (%.2f–%.2f) | %.0f / %.0f (p99 %.0f–%.0f) at %.0f msg/s | %.0f / %.0f |\n",
			r.Name, r.Rate.Median, r.Rate.Min, r.Rate.Max, r.SelfCPU.Median/1e3, r.BrokerCPU.Median/1e3,
			r.DirectSelfCPU.Median/1e3, r.DirectBrokerCPU.Median/1e3, us(r.DirectCPU), us(r.WeidaCPU), x(r.CPURatio), r.RateRatio.Median, r.RateRatio.Min, r.RateRatio.Max,
			r.AddedP50.Median/1e3, r.AddedP99.Median/1e3, r.AddedP99.Min/1e3, r.AddedP99.Max/1e3, r.LatencyPace,
			r.WeidaP50.Median/1e3, r.WeidaP99.Median/1e3)
	}
	return b.String()
}

// TestBridgeBench is the bridge benchmark. It runs only with WEIDA_BENCH=1;
// scripts/bench-bridge sets the environment from its flags:
// WEIDA_BENCH_ROUNDS (3), WEIDA_BENCH_SAMPLE (2s per throughput sample),
// WEIDA_BENCH_LATENCY (1s per latency sample), WEIDA_BENCH_BROKERS (nats,
// mqtt, amqp; comma-separated; all by default), WEIDA_BENCH_ONLY (one rig
// alone, e.g. nats-out, for -cpuprofile), WEIDA_BENCH_PACE (with
// WEIDA_BENCH_ONLY: that rig paced at so many msgs/s), WEIDA_BENCH_JSON (a
// file for the results, to compare commits) and, set by hand,
// WEIDA_BENCH_LATENCY_DUMP (a directory for every latency sample).
func TestBridgeBench(t *testing.T) {
	requireBench(t, "(or run scripts/bench-bridge) to run the bridge benchmark")
	cfg := bridgeBenchConfig{
		Rounds:  envInt(t, "WEIDA_BENCH_ROUNDS", 3),
		Sample:  envDuration(t, "WEIDA_BENCH_SAMPLE", 2*time.Second),
		Latency: envDuration(t, "WEIDA_BENCH_LATENCY", time.Second),
		Only:    os.Getenv("WEIDA_BENCH_ONLY"),
	}
	if p := envInt(t, "WEIDA_BENCH_PACE", 0); p > 0 {
		if cfg.Only == "" {
			t.Fatal("WEIDA_BENCH_PACE paces one rig: set WEIDA_BENCH_ONLY too")
		}
		cfg.Pace = float64(p)
	}
	var keys []string
	if s := os.Getenv("WEIDA_BENCH_BROKERS"); s != "" {
		keys = strings.Split(s, ",")
	}
	if cfg.Only != "" {
		keys = []string{strings.SplitN(cfg.Only, "-", 2)[0]}
	}
	load0 := loadAverage()
	start := time.Now()
	res := runBridgeBench(t, cfg, keys)
	if cfg.Only != "" {
		return
	}
	fmt.Printf("\nBridge benchmark, %s, %s, %d rounds of %v samples (latency %v); load average %s before, %s after\n\n%s\n",
		start.UTC().Format(time.RFC3339), runtime.Version(), cfg.Rounds, cfg.Sample, cfg.Latency, load0, loadAverage(), bridgeBenchTable(res))
	if path := os.Getenv("WEIDA_BENCH_JSON"); path != "" {
		doc := struct {
			Date     time.Time       `json:"date"`
			Go       string          `json:"go"`
			LoadFrom string          `json:"load_before"`
			LoadTo   string          `json:"load_after"`
			Config   any             `json:"config"`
			Rigs     []bridgedResult `json:"rigs"`
		}{start.UTC(), runtime.Version(), load0, loadAverage(), cfg, res}
		b, err := json.MarshalIndent(doc, "", "  ")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, append(b, '\n'), 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// TestBridgeBenchSmoke runs the bridge benchmark's code with a handful of
// messages on the NATS and MQTT rigs, so that the default test run keeps it
// working; it measures nothing worth reading.
func TestBridgeBenchSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("-short")
	}
	res := runBridgeBench(t, bridgeBenchConfig{Rounds: 1, Messages: 200}, []string{"nats", "mqtt"})
	if len(res) != 4 {
		t.Fatalf("got %d result lines, want 4", len(res))
	}
	if tab := bridgeBenchTable(res); strings.Count(tab, "\n") != 6 {
		t.Errorf("table:\n%s", tab)
	}
}

func envDuration(t *testing.T, name string, def time.Duration) time.Duration {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	d, err := time.ParseDuration(s)
	if err != nil || d <= 0 {
		t.Fatalf("%s=%q: want a positive duration", name, s)
	}
	return d
}

// loadAverage is the 1, 5 and 15 minute load averages, for the record.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}
