package e2e

// The frame every throughput benchmark shares (nats_bench_test.go,
// amqp_bench_test.go): rigs that each move 256-byte messages along one
// path with a bounded window in flight, and one measuring loop that runs
// them in alternating rounds and reports rates, CPU per message and the
// ratios the issues set goals for.

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/weida"
)

// benchRig is one path messages take in the throughput measurement:
// publish sends one message with payload p (256 bytes; the rig must not
// keep p after publish returns), and every message received at the far end
// is passed to arrived, which signals it on delivered.
type benchRig struct {
	name      string
	publish   func(p []byte) error
	delivered chan struct{}
	close     func()
	// lat, while a latency sample runs, records the time each stamped
	// payload took from publish to arrival (see stampPayload).
	lat atomic.Pointer[latencyRecorder]
}

// arrived reports one message the far end received, with its payload,
// unless the rig is being torn down.
func (r *benchRig) arrived(payload []byte, done <-chan struct{}) {
	if l := r.lat.Load(); l != nil {
		l.record(payload)
	}
	signal(r.delivered, done)
}

// benchWindow bounds the messages in flight (sent, not yet received) in
// every rig, as weida/bench does: a rig measures delivery, not drops by a
// buffer that an unpaced publisher overfills.
const benchWindow = conntest.DefaultWindow

// runRig sends n messages through rig with at most benchWindow in flight
// and returns the rate at which they were received.
func runRig(t *testing.T, rig *benchRig, n int) float64 {
	t.Helper()
	rate, _ := runRigCPU(t, rig, n)
	return rate
}

// runRigCPU is runRig that also returns this process's CPU time (user and
// system, every goroutine: both ends of the rig and the bridge, not the
// broker) per message.
func runRigCPU(t *testing.T, rig *benchRig, n int) (rate float64, cpu time.Duration) {
	t.Helper()
	// The measuring loop is the conformance suite's, so that a driver's
	// BenchmarkConformance and these rigs measure alike.
	publish := func() error { return rig.publish(benchPayload) }
	return conntest.Measure(t, &conntest.Rig{Name: rig.name, Publish: publish, Delivered: rig.delivered, Window: benchWindow}, n)
}

// signal reports one delivery unless the rig is being torn down.
func signal(delivered chan<- struct{}, done <-chan struct{}) {
	select {
	case delivered <- struct{}{}:
	case <-done:
	}
}

// benchSubject is the topic every weida publisher of a rig uses, and the
// routing key or subject of the broker rigs of other protocols (see
// amqp_bench_test.go).
const benchSubject = "bench.x.data"

var benchPayload = make([]byte, 256)

// weidaEndpoint hosts a weida publisher and dials a subscriber to it that
// signals every copy on delivered.
func weidaDirectRig(t *testing.T) *benchRig {
	l, pub, url := benchEndpoint(t)
	rig := &benchRig{name: "weida direct", delivered: make(chan struct{}, benchWindow)}
	stop := weidaReceiver(t, url, rig)
	waitSubscribers(t, pub, 1, 10*time.Second)
	rig.publish = func(p []byte) error { return publishWeida(pub, p) }
	syncRig(t, rig, func() error { return publishWeida(pub, benchPayload) })
	rig.close = func() { stop(); l.Close() }
	return rig
}

func publishWeida(pub *weida.Publisher, p []byte) error {
	return publishWeidaTopic(pub, benchSubject, p)
}

func publishWeidaTopic(pub *weida.Publisher, topic string, p []byte) error {
	r, err := pub.Publish(context.Background(), weida.Message{Topic: topic, Payload: p})
	if err == nil && r.Dropped > 0 {
		err = fmt.Errorf("weida dropped %d copies (%+v, %+v)", r.Dropped, r, pub)
	}
	return err
}

// weidaReceiver dials url, subscribes to every topic and reports each
// copy to rig until stop.
func weidaReceiver(t *testing.T, url string, rig *benchRig) (stop func()) {
	t.Helper()
	sub, err := weida.Dial(ctx(t, 10*time.Second), url, weida.DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Subscribe(ctx(t, 10*time.Second), "#"); err != nil {
		t.Fatal(err)
	}
	rctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			m, err := sub.Receive(rctx)
			if err != nil {
				return
			}
			rig.arrived(m.Payload, rctx.Done())
		}
	}()
	return func() { cancel(); sub.Close(); <-done }
}

// syncRig publishes until one message comes through (a weida SUBSCRIBE has
// no acknowledgement), then empties delivered.
func syncRig(t *testing.T, rig *benchRig, publish func() error) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := publish(); err != nil {
			t.Fatal(err)
		}
		select {
		case <-rig.delivered:
			time.Sleep(100 * time.Millisecond)
			for len(rig.delivered) > 0 {
				<-rig.delivered
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: nothing came through", rig.name)
		}
	}
}

func runBridge(t *testing.T, b *connectors.Bridge) (stop func()) {
	t.Helper()
	bctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- b.Run(bctx) }()
	Eventually(t, 20*time.Second, "the bridge ready", func() bool { return b.Status().Ready() })
	return func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("bridge: %v", err)
		}
	}
}

// resourcesDefaultInFlight is limits.inFlight's default, what `connector
// run` gives a resource that names none.
const resourcesDefaultInFlight = 256

// requireBench skips the test unless WEIDA_BENCH=1: the measurements
// take minutes and the machine's cores, so the test command runs none of
// them. why finishes "set WEIDA_BENCH=1 ...".
func requireBench(t *testing.T, why string) {
	t.Helper()
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 " + why)
	}
}

func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.Atoi(s)
	if err != nil || v <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return v
}

func median(v []float64) float64 {
	s := slices.Clone(v)
	slices.Sort(s)
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

// cpuTime returns the CPU time another process (a broker, a connector) has
// used, and fails t when it cannot be read: a broker that stopped reports
// pid 0, and a sample of no process must not pass for the broker's.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	cpu, err := proccpu.Of(pid)
	if err != nil {
		t.Fatal(err)
	}
	return cpu
}

// benchEndpoint hosts a weida publisher on a fresh loopback listener and
// returns it with the URL a subscriber dials.
func benchEndpoint(t *testing.T) (*weida.Listener, *weida.Publisher, string) {
	t.Helper()
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	return l, pub, "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench"
}

// closeBridgeRig stops a bridged rig's bridge and listener and fails the
// test if the bridge dropped anything: a drop makes the rate meaningless.
func closeBridgeRig(t *testing.T, rig *benchRig, b *connectors.Bridge, stopBridge func(), l *weida.Listener) {
	stopBridge()
	l.Close()
	if c := b.Status().Counters; len(c.Dropped) > 0 {
		t.Errorf("%s dropped messages: %v", rig.name, c.Dropped)
	}
}

// namedRig is a rig a benchmark may build, under a short name for
// WEIDA_BENCH_RIGS.
type namedRig struct {
	short string
	build func() *benchRig
	// onRequest rigs run only when WEIDA_BENCH_RIGS names them.
	onRequest bool
}

// throughput is one throughput benchmark: a broker process and its rigs,
// the first four being, in this order, the broker alone, weida alone,
// broker → bridge → weida and weida → bridge → broker.
type throughput struct {
	broker string // for the log
	pid    int    // the broker's process, whose CPU is measured
	rigs   []namedRig
}

// run builds the rigs WEIDA_BENCH_RIGS selects (default: all but those on
// request), warms them up, then runs rounds of n messages through each,
// alternating the order every round so that no rig always follows the same
// neighbour. It logs each sample, the medians with the CPU per message of
// this process and of the broker (and the cores that keeps busy) and, when
// the four standard rigs ran, the bridged/min(direct) ratios taken per
// round (samples made under the same load) and an estimate of the best
// ratio any bridge could reach here. The estimate holds when every rig keeps
// the same cores equally busy (compare the cores column): a rate then goes
// as 1 / (CPU per message), and a bridge costs at least what both direct
// rigs cost. A broker that busy-waits (RabbitMQ's Erlang schedulers) spends
// CPU it would yield, which the estimate cannot tell apart.
func (b throughput) run(t *testing.T, n, rounds int) {
	only := os.Getenv("WEIDA_BENCH_RIGS")
	var rigs []*benchRig
	for _, r := range b.rigs {
		if only == "" && !r.onRequest || slices.Contains(strings.Split(only, ","), r.short) {
			rigs = append(rigs, r.build())
		}
	}
	defer func() {
		for _, r := range rigs {
			r.close()
		}
	}()
	for _, r := range rigs {
		runRig(t, r, n/10)
	}
	rates := make([][]float64, len(rigs))
	selfCPU := make([][]float64, len(rigs))   // this process, per message
	brokerCPU := make([][]float64, len(rigs)) // the broker, per message
	for round := range rounds {
		order := make([]int, len(rigs))
		for i := range order {
			order[i] = i
		}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			b0 := cpuTime(t, b.pid)
			rate, cpu := runRigCPU(t, rigs[i], n)
			broker := (cpuTime(t, b.pid) - b0) / time.Duration(n)
			rates[i] = append(rates[i], rate)
			selfCPU[i] = append(selfCPU[i], float64(cpu))
			brokerCPU[i] = append(brokerCPU[i], float64(broker))
			t.Logf("round %d: %-36s %9.0f msg/s; CPU/msg %7s here, %7s %s", round+1, rigs[i].name, rate, cpu, broker, b.broker)
		}
	}
	total := make([]float64, len(rigs)) // median CPU per message, both processes
	for i, r := range rigs {
		total[i] = median(selfCPU[i]) + median(brokerCPU[i])
		t.Logf("median %-36s %9.0f msg/s (min %.0f, max %.0f); CPU/msg %s in this process, %s in %s; %.2f cores busy",
			r.name, median(rates[i]), slices.Min(rates[i]), slices.Max(rates[i]),
			time.Duration(median(selfCPU[i])), time.Duration(median(brokerCPU[i])), b.broker,
			median(rates[i])*total[i]/1e9)
	}
	if only != "" || len(rigs) < 4 {
		return
	}
	var ratioIn, ratioOut []float64
	for r := range rounds {
		direct := min(rates[0][r], rates[1][r])
		ratioIn = append(ratioIn, rates[2][r]/direct)
		ratioOut = append(ratioOut, rates[3][r]/direct)
	}
	t.Logf("inbound  bridged / min(direct): per round median %.1f %% (min %.1f, max %.1f)",
		100*median(ratioIn), 100*slices.Min(ratioIn), 100*slices.Max(ratioIn))
	t.Logf("outbound bridged / min(direct): per round median %.1f %% (min %.1f, max %.1f)",
		100*median(ratioOut), 100*slices.Min(ratioOut), 100*slices.Max(ratioOut))
	limiting := 0 // the direct rig with the smaller median rate
	if median(rates[1]) < median(rates[0]) {
		limiting = 1
	}
	t.Logf("CPU per message, both processes: %s direct %.1f µs, weida direct %.1f µs, inbound %.1f µs, outbound %.1f µs; "+
		"if every rig is CPU-bound, a bridge costing nothing beyond the two direct rigs would reach %.0f %% of %s",
		b.broker, total[0]/1e3, total[1]/1e3, total[2]/1e3, total[3]/1e3, 100*total[limiting]/(total[0]+total[1]), rigs[limiting].name)
}
