package e2e

import (
	"cmp"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
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
	"weida.dev/connector/weida/bench"
)

// TestMQTTBench measures, in one run, 256-byte messages through Mosquitto
// directly, through weida directly, and through the MQTT bridge in both
// directions, and prints the rates, the ratio of each bridged rate to the
// smaller direct one, and the latency the bridge adds. It is skipped unless
// WEIDA_BENCH=1; docs/PERFORMANCE.md (section MQTT) has the command and the
// recorded numbers.
//
// Everything but the broker runs in this process, so that -cpuprofile sees
// the bridge: the bridge is a connectors.Bridge with the mqtt driver and a
// weida listener, exactly what `connector run` builds for a resource. The
// broker is a private Mosquitto on a free port, so that no other test's
// traffic shares it.
//
// Settings (environment): WEIDA_BENCH_MSGS messages per sample (default
// 100000), WEIDA_BENCH_ROUNDS samples per rig (default 3; medians are
// reported), WEIDA_BENCH_PACE the QoS 0 publishers' paces in msgs/s, comma
// separated (default 60000,100000), WEIDA_BENCH_LATENCY_RATE the pace of the latency runs (default
// 5000), WEIDA_BENCH_RIGS a comma-separated subset of rigs (by name),
// WEIDA_BENCH_NODELAY=0 Mosquitto's stock Nagle setting,
// WEIDA_BENCH_INFLIGHT the outbound bridge's limits.inFlight (default 256,
// the resource default).
func TestMQTTBench(t *testing.T) {
	requireBench(t, "to run the MQTT throughput benchmark")
	n := int(envUint(t, "WEIDA_BENCH_MSGS", 100000))
	rounds := int(envUint(t, "WEIDA_BENCH_ROUNDS", 3))
	latRate := int(envUint(t, "WEIDA_BENCH_LATENCY_RATE", 5000))
	var paces []int
	for _, f := range strings.Split(cmp.Or(os.Getenv("WEIDA_BENCH_PACE"), "60000,100000"), ",") {
		v, err := strconv.Atoi(strings.TrimSpace(f))
		if err != nil || v <= 0 {
			t.Fatalf("WEIDA_BENCH_PACE: %q is not a positive rate", f)
		}
		paces = append(paces, v)
	}
	// Stock settings but one: Nagle's algorithm off (set_tcp_nodelay),
	// which otherwise holds Mosquitto's small QoS 0 writes for the peer's
	// delayed ACK and puts ~40 ms into the p99 of every QoS 0 path alike
	// (broker-baselines.md). WEIDA_BENCH_NODELAY=0 keeps it on.
	conf := []string{"persistence false"}
	if os.Getenv("WEIDA_BENCH_NODELAY") != "0" {
		conf = append(conf, "set_tcp_nodelay true")
	}
	broker := brokertest.StartMosquitto(t, conf...)
	addr := broker.Addr()

	wrig, err := bench.NewWeida(ctx(t, 20*time.Second), 1, bench.Options{Size: mqttBenchSize})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { wrig.Close() })

	// A rig is one path; kind names the path ("bridge in qos0"), name adds
	// the pace of a paced rig ("bridge in qos0 @60k"). Each path has its
	// own topic root, so that a subscriber of one never costs the broker
	// anything during another's sample.
	type rig struct {
		kind, name string
		pace       int
		run        func(n, pace int) mqttBenchResult
	}
	var rigs []rig
	add := func(kind string, run func(n, pace int) mqttBenchResult, paced bool) {
		if !paced {
			rigs = append(rigs, rig{kind: kind, name: kind, run: run})
			return
		}
		for _, p := range paces {
			rigs = append(rigs, rig{kind: kind, name: fmt.Sprintf("%s @%dk", kind, p/1000), pace: p, run: run})
		}
	}
	// WEIDA_BENCH_RIGS keeps only the paths whose names contain one of its
	// comma-separated words (for profiling one path).
	want := func(kind string) bool {
		only := os.Getenv("WEIDA_BENCH_RIGS")
		if only == "" {
			return true
		}
		for _, w := range strings.Split(only, ",") {
			if strings.Contains(kind, w) {
				return true
			}
		}
		return false
	}
	for _, q := range []byte{1, 0} {
		paced := q == 0 // QoS 0 is paced on every path, the outbound weida publisher too
		if k := fmt.Sprintf("mosquitto qos%d", q); want(k) {
			add(k, newMQTTDirect(t, addr, fmt.Sprintf("d%d", q), q).run, paced)
		}
		if k := fmt.Sprintf("bridge in qos%d", q); want(k) {
			add(k, newMQTTInboundBridge(t, addr, fmt.Sprintf("i%d", q), q).run, paced)
		}
		if k := fmt.Sprintf("bridge out qos%d", q); want(k) {
			add(k, newMQTTOutboundBridge(t, addr, fmt.Sprintf("o%d", q), q).run, paced)
		}
	}
	if want("weida") {
		add("weida", func(n, _ int) mqttBenchResult {
			s, err := wrig.Run(ctx(t, time.Minute), bench.Load{Messages: int64(n)})
			if err != nil {
				t.Fatal(err)
			}
			return mqttBenchResult{sent: int(s.Messages), received: int(s.Copies), elapsed: s.Elapsed}
		}, false)
	}

	measure := func(r rig, n, pace int) mqttBenchResult {
		runtime.GC()
		c0, b0 := proccpu.Self(), cpuTime(t, broker.Pid())
		res := r.run(n, pace)
		res.cpu, res.broker = proccpu.Self()-c0, cpuTime(t, broker.Pid())-b0
		return res
	}
	// Throughput: every rig once per round; the order turns every round,
	// so that drift in the machine's load spreads over all of them.
	results := map[string][]mqttBenchResult{}
	for round := 1; round <= rounds; round++ {
		for k := range rigs {
			r := rigs[(k+round-1)%len(rigs)]
			res := measure(r, n, r.pace)
			results[r.name] = append(results[r.name], res)
			self, bro := res.cpuPerMsg()
			t.Logf("round %d %-22s %8.0f msgs/s  received %d/%d  cpu/msg: process %v, mosquitto %v",
				round, r.name, res.rate(), res.received, res.sent, self, bro)
		}
	}
	// Latency: once per path, paced at a moderate rate where queueing
	// does not dominate.
	latency := map[string]mqttBenchResult{}
	for _, r := range rigs {
		if _, done := latency[r.kind]; done || r.kind == "weida" {
			continue
		}
		latency[r.kind] = measure(r, latRate, latRate)
	}

	med := func(name string) float64 {
		var v []float64
		for _, r := range results[name] {
			v = append(v, r.rate())
		}
		return bench.Median(v)
	}
	lost := func(name string) int {
		l := 0
		for _, r := range results[name] {
			l += r.sent - r.received
		}
		return l
	}
	medCPU := func(name string) time.Duration { // process + broker
		var v []float64
		for _, r := range results[name] {
			x, y := r.cpuPerMsg()
			v = append(v, float64(x+y))
		}
		return time.Duration(bench.Median(v)).Round(100 * time.Nanosecond)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "MQTT bridge benchmark: %d-byte payloads, %d messages per sample, median of %d rounds\n", mqttBenchSize, n, rounds)
	fmt.Fprintf(&b, "%-22s %9s %7s %9s %9s %9s %9s\n", "rig", "msgs/s", "lost", "cpu/msg", "of which", "p50", "p99")
	fmt.Fprintf(&b, "%-22s %9s %7s %9s %9s %9s %9s\n", "", "", "", "", "broker", "latency", "latency")
	for _, r := range rigs {
		var bro []float64
		for _, x := range results[r.name] {
			_, y := x.cpuPerMsg()
			bro = append(bro, float64(y))
		}
		p50, p99 := "-", "-"
		if l := latency[r.kind]; len(l.lat) > 0 {
			p50, p99 = l.percentile(50).Round(time.Microsecond).String(), l.percentile(99).Round(time.Microsecond).String()
		}
		fmt.Fprintf(&b, "%-22s %9.0f %7d %9v %9v %9s %9s\n", r.name, med(r.name), lost(r.name), medCPU(r.name),
			time.Duration(bench.Median(bro)).Round(100*time.Nanosecond), p50, p99)
	}
	fmt.Fprintf(&b, "(cpu/msg: this process (publisher, bridge, subscriber) plus Mosquitto; latency: publish to receipt, paced at %d msgs/s)\n", latRate)
	weidaRate := med("weida")
	for _, r := range rigs {
		if !strings.HasPrefix(r.kind, "bridge") {
			continue
		}
		q := r.kind[len(r.kind)-4:]
		directName := "mosquitto " + q + strings.TrimPrefix(r.name, r.kind)
		if len(results[directName]) != len(results[r.name]) {
			continue
		}
		// The ratio per round (the rigs of a round ran minutes apart at
		// most), then its median: steadier than a ratio of medians when
		// the machine's load drifts.
		var ratios []float64
		for k, x := range results[r.name] {
			d := results[directName][k].rate()
			if weidaRate > 0 {
				d = min(d, results["weida"][k].rate())
			}
			if d > 0 {
				ratios = append(ratios, 100*x.rate()/d)
			}
		}
		if len(ratios) == 0 {
			continue
		}
		d, l := latency["mosquitto "+q], latency[r.kind]
		fmt.Fprintf(&b, "%-22s %5.1f%% of min(%s, weida) (rounds %.0f%%–%.0f%%); cpu/msg %v vs %v; added latency p50 %v, p99 %v\n",
			r.name, bench.Median(ratios), directName, slices.Min(ratios), slices.Max(ratios), medCPU(r.name), medCPU(directName),
			(l.percentile(50) - d.percentile(50)).Round(time.Microsecond),
			(l.percentile(99) - d.percentile(99)).Round(time.Microsecond))
	}
	fmt.Println(b.String())
}

const mqttBenchSize = 256

// mqttBenchResult is one sample: how many were sent and received, from the
// first send to the last receipt, and each receipt's latency.
type mqttBenchResult struct {
	sent, received int
	elapsed        time.Duration
	lat            []time.Duration
	// cpu is this process's CPU time during the sample (publisher,
	// bridge and subscriber), broker Mosquitto's.
	cpu, broker time.Duration
}

// cpuPerMsg returns this process's and the broker's CPU time per message
// received.
func (r mqttBenchResult) cpuPerMsg() (self, broker time.Duration) {
	if r.received == 0 {
		return 0, 0
	}
	return r.cpu / time.Duration(r.received), r.broker / time.Duration(r.received)
}

func (r mqttBenchResult) rate() float64 {
	if r.elapsed <= 0 {
		return 0
	}
	return float64(r.received) / r.elapsed.Seconds()
}

func (r mqttBenchResult) percentile(p int) time.Duration {
	if len(r.lat) == 0 {
		return 0
	}
	s := slices.Clone(r.lat)
	slices.Sort(s)
	return s[min(len(s)-1, len(s)*p/100)]
}

// mqttRecorder counts receipts and their latencies; the payload carries the
// send time in its first 8 bytes. Safe for concurrent use.
type mqttRecorder struct {
	want  int
	count atomic.Int64
	last  atomic.Int64 // unix nanos of the latest receipt
	lat   []time.Duration
	done  chan struct{}
	once  sync.Once
}

func newMQTTRecorder(want int) *mqttRecorder {
	return &mqttRecorder{want: want, lat: make([]time.Duration, want), done: make(chan struct{})}
}

func (r *mqttRecorder) record(payload []byte) {
	now := time.Now().UnixNano()
	i := int(r.count.Add(1)) - 1
	if i < len(r.lat) && len(payload) >= 8 {
		r.lat[i] = time.Duration(now - int64(binary.LittleEndian.Uint64(payload)))
	}
	r.last.Store(now)
	if i+1 == r.want {
		r.once.Do(func() { close(r.done) })
	}
}

// wait returns once every message arrived, or nothing arrived for 2 s.
func (r *mqttRecorder) wait() {
	prev := int64(-1)
	for {
		select {
		case <-r.done:
			return
		case <-time.After(2 * time.Second):
			c := r.count.Load()
			if c == prev {
				return
			}
			prev = c
		}
	}
}

func (r *mqttRecorder) result(sent int, start time.Time) mqttBenchResult {
	got := min(int(r.count.Load()), r.want)
	return mqttBenchResult{sent: sent, received: got, elapsed: time.Duration(r.last.Load() - start.UnixNano()), lat: r.lat[:got]}
}

// stamp fills a payload: send time, sequence number, padding.
func mqttStamp(p []byte, seq int) {
	binary.LittleEndian.PutUint64(p, uint64(time.Now().UnixNano()))
	binary.LittleEndian.PutUint64(p[8:], uint64(seq))
}

// mqttSend publishes n stamped messages on root/<k>/data. QoS 1 keeps many
// publishes in flight at once (Mosquitto's Receive Maximum bounds them);
// QoS 0 has one publisher goroutine. With pace > 0 messages are released at
// pace msgs/s (QoS 0 must be paced, because Mosquitto drops what it cannot
// queue instead of pushing back; see broker-baselines.md).
func mqttSend(t testing.TB, c *mqttClient, root string, qos byte, n, pace int) time.Time {
	t.Helper()
	topics := make([]string, 8)
	for k := range topics {
		topics[k] = fmt.Sprintf("%s/%d/data", root, k)
	}
	workers := 1
	if qos == 1 {
		workers = 32
	}
	next := make(chan int, 1024)
	var wg sync.WaitGroup
	for range workers {
		wg.Go(func() {
			p := make([]byte, mqttBenchSize)
			for i := range next {
				mqttStamp(p, i)
				if _, err := c.Publish(context.Background(), &paho.Publish{Topic: topics[i%8], QoS: qos, Payload: slices.Clone(p)}); err != nil {
					t.Errorf("publish: %v", err)
					return
				}
			}
		})
	}
	start := time.Now()
	mqttPace(n, pace, start, func(i int) { next <- i })
	close(next)
	wg.Wait()
	return start
}

// mqttPace calls send(i) for i in [0, n), at pace calls per second when
// pace > 0. Go's sleeps are coarse (about 1 ms here), so a paced sender
// emits small bursts, as in broker-baselines.md.
func mqttPace(n, pace int, start time.Time, send func(int)) {
	for i := range n {
		if pace > 0 {
			due := time.Duration(float64(i) / float64(pace) * float64(time.Second))
			for time.Since(start) < due {
				time.Sleep(100 * time.Microsecond)
			}
		}
		send(i)
	}
}

// mqttDirect is Mosquitto alone: a paho publisher and a paho subscriber,
// both with the buffered connection the bridge's client has.
type mqttDirect struct {
	t    testing.TB
	root string
	qos  byte
	pub  *mqttClient
	rec  atomic.Pointer[mqttRecorder]
}

func newMQTTDirect(t testing.TB, addr, root string, qos byte) *mqttDirect {
	d := &mqttDirect{t: t, root: root, qos: qos, pub: mqttConnect(t, addr, root+"-pub")}
	sub, err := mqttDial(ctx(t, 10*time.Second), addr, root+"-sub", func(m mqttMsg) {
		if r := d.rec.Load(); r != nil {
			r.record(m.Payload)
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.close)
	sub.subscribe(t, qos, root+"/+/data")
	return d
}

func (d *mqttDirect) run(n, pace int) mqttBenchResult {
	r := newMQTTRecorder(n)
	d.rec.Store(r)
	defer d.rec.Store(nil)
	start := mqttSend(d.t, d.pub, d.root, d.qos, n, pace)
	r.wait()
	return r.result(n, start)
}

// mqttInboundBridge is Mosquitto → connectors.Bridge (mqtt.Source, a weida
// listener) → a weida subscriber.
type mqttInboundBridge struct {
	t    testing.TB
	root string
	qos  byte
	pub  *mqttClient
	rec  atomic.Pointer[mqttRecorder]
}

func newMQTTInboundBridge(t testing.TB, addr, root string, qos byte) *mqttInboundBridge {
	ib := &mqttInboundBridge{t: t, root: root, qos: qos, pub: mqttConnect(t, addr, root+"-pub")}
	p := policy.MQTTLevelsV1()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	wpub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	filter := root + "/+/data"
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatal(err)
	}
	spec := connectors.Spec{
		Name: "bench-" + root, Protocol: policy.MQTT, Direction: policy.Inbound, Policy: p,
		Routes:   []connectors.Route{{Name: "r", Foreign: filter, Weida: wf}},
		Endpoint: "weida://" + l.Addr().String() + "/bench",
	}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := mqtt.Config{Host: host, Port: port, ClientID: "bench-" + root, QoS: qos, CleanStart: true}
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return mqtt.NewSource(cfg, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	mqttRunBridge(t, b)

	sub, err := weida.Dial(ctx(t, 10*time.Second), "weida://"+l.Fingerprint()+"@"+l.Addr().String()+"/bench", weida.DialConfig{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { sub.Close() })
	if err := sub.Subscribe(ctx(t, 10*time.Second), wf); err != nil {
		t.Fatal(err)
	}
	waitSubscribers(t, wpub, 1, 10*time.Second)
	mqttReceiveWeida(t, sub, func(m weida.Message) {
		if r := ib.rec.Load(); r != nil {
			r.record(m.Payload)
		}
	})
	return ib
}

func (ib *mqttInboundBridge) run(n, pace int) mqttBenchResult {
	r := newMQTTRecorder(n)
	ib.rec.Store(r)
	defer ib.rec.Store(nil)
	start := mqttSend(ib.t, ib.pub, ib.root, ib.qos, n, pace)
	r.wait()
	return r.result(n, start)
}

// mqttOutboundBridge is a weida publisher → connectors.Bridge (a weida
// subscriber, mqtt.Sink) → Mosquitto → a paho subscriber. The weida
// publisher keeps at most a window of messages outstanding, as the weida
// rig does: weida drops what a subscriber cannot take rather than pushing
// back, so an unbounded publisher would measure drops.
type mqttOutboundBridge struct {
	t       testing.TB
	root    string
	wpub    *weida.Publisher
	credits chan struct{}
	rec     atomic.Pointer[mqttRecorder]
}

func newMQTTOutboundBridge(t testing.TB, addr, root string, qos byte) *mqttOutboundBridge {
	ob := &mqttOutboundBridge{t: t, root: root, credits: make(chan struct{}, bench.DefaultWindow)}
	p := policy.MQTTLevelsV1()
	var url string
	ob.wpub, url = weidaPublisher(t, "/bench-"+root)
	filter := root + "/+/data"
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatal(err)
	}
	spec := connectors.Spec{
		Name: "bench-" + root, Protocol: policy.MQTT, Direction: policy.Outbound, Policy: p,
		Routes: []connectors.Route{{Name: "r", Foreign: filter, Weida: wf}}, Endpoint: url,
		// What `connector run` gives a resource that sets no limits.inFlight.
		InFlight: int(envUint(t, "WEIDA_BENCH_INFLIGHT", 256)),
	}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := mqtt.Config{Host: host, Port: port, ClientID: "bench-" + root, QoS: qos}
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) { return mqtt.NewSink(cfg, report) },
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	mqttRunBridge(t, b)
	waitSubscribers(t, ob.wpub, 1, 10*time.Second)

	sub, err := mqttDial(ctx(t, 10*time.Second), addr, root+"-sub", func(m mqttMsg) {
		if r := ob.rec.Load(); r != nil {
			r.record(m.Payload)
			// Never block paho's delivery goroutine: a late or duplicate
			// message may find no credit taken.
			select {
			case <-ob.credits:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(sub.close)
	sub.subscribe(t, 1, filter)
	return ob
}

func (ob *mqttOutboundBridge) run(n, pace int) mqttBenchResult {
	r := newMQTTRecorder(n)
	ob.rec.Store(r)
	defer ob.rec.Store(nil)
	topics := make([]string, 8)
	for k := range topics {
		topics[k] = fmt.Sprintf("%s.%d.data", ob.root, k)
	}
	p := make([]byte, mqttBenchSize)
	start := time.Now()
	sent := 0
	stalled := false
	mqttPace(n, pace, start, func(i int) {
		if stalled {
			return
		}
		select {
		case ob.credits <- struct{}{}:
		case <-time.After(5 * time.Second):
			ob.t.Logf("outbound %s: no credit for 5 s after %d messages", ob.root, i)
			stalled = true
			return
		}
		mqttStamp(p, i)
		res, err := ob.wpub.Publish(context.Background(), weida.Message{Topic: topics[i%8], Payload: p})
		if err != nil {
			ob.t.Fatal(err)
		}
		sent++
		if res.Dropped > 0 || res.Matched == 0 {
			<-ob.credits
		}
	})
	r.wait()
	// Give back the credits of messages that never arrived.
	for len(ob.credits) > 0 {
		<-ob.credits
	}
	return r.result(sent, start)
}

// mqttRunBridge runs b until the test ends and waits until it is ready.
func mqttRunBridge(t testing.TB, b *connectors.Bridge) {
	t.Helper()
	bctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := b.Run(bctx); err != nil {
			t.Errorf("bridge: %v", err)
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	Eventually(t, 20*time.Second, "bridge "+b.Spec().Name+" ready", func() bool { return b.Status().Ready() })
}

// mqttReceiveWeida calls fn for every copy sub receives, from 4 goroutines,
// until the test ends.
func mqttReceiveWeida(t testing.TB, sub *weida.Subscriber, fn func(weida.Message)) {
	rctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() {
			for {
				m, err := sub.Receive(rctx)
				if err != nil {
					return
				}
				fn(m)
			}
		})
	}
	t.Cleanup(func() { cancel(); wg.Wait() })
}
