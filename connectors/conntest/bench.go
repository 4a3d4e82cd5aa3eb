package conntest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/internal/proccpu"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// Rig is one path messages take in a throughput measurement: Publish sends
// one message, and every message received at the far end is signalled on
// Delivered. The suite's [Benchmark] and the e2e rigs measure with the same
// loop, [Measure].
type Rig struct {
	Name    string
	Publish func() error
	// Delivered receives one value per message that arrived; its buffer
	// should hold Window values, so that the receiving end never waits
	// on the measuring loop.
	Delivered chan struct{}
	// Window bounds the messages in flight (sent, not yet received);
	// zero means [DefaultWindow].
	Window int
	Close  func()
}

// DefaultWindow is a [Rig]'s Window when it sets none: enough in flight to
// keep every stage busy, few enough that no buffer of the path overfills
// (a rig measures delivery, not drops).
const DefaultWindow = 512

func (r *Rig) window() int {
	if r.Window > 0 {
		return r.Window
	}
	return DefaultWindow
}

// Measure sends n messages through rig with at most its Window in flight,
// and returns the rate at which they arrived and this process's CPU time
// (user and system, from getrusage: both ends of the rig and whatever
// bridge it runs, not the broker) per message. A message not received
// within a minute fails tb: a loss makes the rate meaningless.
func Measure(tb testing.TB, rig *Rig, n int) (rate float64, cpu time.Duration) {
	tb.Helper()
	cpu0 := proccpu.Self()
	stuck := time.NewTimer(time.Minute)
	defer stuck.Stop()
	wait := func() {
		select {
		case <-rig.Delivered:
		case <-stuck.C:
			tb.Fatalf("%s: a message was lost (not received within a minute)", rig.Name)
		}
	}
	window := rig.window()
	start := time.Now()
	inFlight := 0
	for range n {
		if inFlight == window {
			wait()
			inFlight--
		}
		if err := rig.Publish(); err != nil {
			tb.Fatalf("%s: publish: %v", rig.Name, err)
		}
		inFlight++
	}
	for range inFlight {
		wait()
	}
	return float64(n) / time.Since(start).Seconds(), (proccpu.Self() - cpu0) / time.Duration(max(n, 1))
}

// Synchronise publishes through rig until one message comes through (a
// weida SUBSCRIBE and most broker subscriptions have no acknowledgement
// the rig could wait for), then empties Delivered.
func Synchronise(tb testing.TB, rig *Rig) {
	tb.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		if err := rig.Publish(); err != nil {
			tb.Fatal(err)
		}
		select {
		case <-rig.Delivered:
			time.Sleep(100 * time.Millisecond)
			for len(rig.Delivered) > 0 {
				<-rig.Delivered
			}
			return
		case <-time.After(100 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			tb.Fatalf("%s: nothing came through", rig.Name)
		}
	}
}

// benchWindow is the window of the suite's rigs: below the 64 messages a
// harness's Subscribe buffers, which it may drop beyond.
const benchWindow = 32

var benchPayload = make([]byte, 256)

// Benchmark measures the bridged path through the runtime, as `connector
// run` runs a resource, in both directions: Inbound publishes to the broker
// directly and receives on a weida subscriber of the unit's endpoint;
// Outbound publishes on a weida endpoint the unit dials and receives on a
// direct broker subscription. Each reports msgs/s and cpu-ns/msg (this
// process: the driver, the runtime and both ends). A driver calls it from
// its BenchmarkConformance with a harness on its real broker.
func Benchmark(b *testing.B, h Harness) {
	b.Run("Inbound", func(b *testing.B) { runBench(b, inboundRig(b, h)) })
	b.Run("Outbound", func(b *testing.B) { runBench(b, outboundRig(b, h)) })
}

func runBench(b *testing.B, rig *Rig) {
	b.Cleanup(rig.Close)
	Synchronise(b, rig)
	b.ReportAllocs()
	b.ResetTimer()
	rate, cpu := Measure(b, rig, b.N)
	b.StopTimer()
	b.ReportMetric(rate, "msgs/s")
	b.ReportMetric(float64(cpu.Nanoseconds()), "cpu-ns/msg")
}

// benchRuntime applies one unit on a fresh runtime and waits until it is
// Ready; the runtime stops at the end of the benchmark.
func benchRuntime(tb testing.TB, u connectors.Unit) *connectors.Runtime {
	tb.Helper()
	rt := connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry()), Backoff: suiteBackoff, Drain: time.Second})
	tb.Cleanup(rt.Stop)
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if err := rt.Apply(ctx, []connectors.Unit{u}); err != nil {
		tb.Fatalf("Apply: %v", err)
	}
	for !rt.Ready() {
		if ctx.Err() != nil {
			tb.Fatalf("unit not ready: %+v", rt.Statuses())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return rt
}

func benchRoute(tb testing.TB, p policy.Policy, filter string) connectors.Route {
	tb.Helper()
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		tb.Fatalf("policy %s refuses the harness filter %q: %v", p.Name(), filter, err)
	}
	return connectors.Route{Name: "r", Foreign: filter, Weida: wf}
}

func inboundRig(tb testing.TB, h Harness) *Rig {
	filter, selected, _, _ := h.Topics()
	p := h.Policy()
	name, marker := "bench-in-"+Unique(), "m-"+Unique()
	listen := "127.0.0.1:" + strconv.Itoa(brokertest.FreePort(tb, "udp"))
	benchRuntime(tb, connectors.Unit{
		Spec: connectors.Spec{
			Name: name, Protocol: p.Protocol(), Direction: policy.Inbound, Policy: p,
			Routes: []connectors.Route{benchRoute(tb, p, filter)}, Endpoint: "weida://" + listen + "/bench",
		},
		Listen: listen, Path: "/bench",
		NewSource: func(report connectors.StateFunc) (connectors.Source, error) {
			return h.NewSource(name, marker, report)
		},
	})
	rig := &Rig{Name: string(p.Protocol()) + " → bridge → weida", Delivered: make(chan struct{}, benchWindow), Window: benchWindow}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	sub, err := weida.Dial(ctx, "weida://"+listen+"/bench", weida.DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		tb.Fatal(err)
	}
	if err := sub.Subscribe(ctx, ""); err != nil {
		sub.Close()
		tb.Fatal(err)
	}
	rctx, stop := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for {
			if _, err := sub.Receive(rctx); err != nil {
				return
			}
			select {
			case rig.Delivered <- struct{}{}:
			case <-rctx.Done():
				return
			}
		}
	}()
	// One deadline for every publish of the rig: some harnesses want one,
	// and a context per message would be measured too.
	pctx, pcancel := context.WithTimeout(context.Background(), time.Hour)
	rig.Publish = func() error {
		return h.Publish(pctx, &connectors.Message{Topic: selected, Payload: benchPayload})
	}
	rig.Close = func() { pcancel(); stop(); sub.Close(); <-done }
	return rig
}

func outboundRig(tb testing.TB, h Harness) *Rig {
	filter, selected, _, _ := h.Topics()
	p := h.Policy()
	wSel, err := p.TopicToWeida(selected)
	if err != nil {
		tb.Fatalf("policy %s refuses the harness topic %q: %v", p.Name(), selected, err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	msgs, stopSub, err := h.Subscribe(ctx, filter)
	if err != nil {
		tb.Fatal(err)
	}
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		stopSub()
		tb.Fatal(err)
	}
	pub, err := l.Publisher("/bench-out")
	if err != nil {
		stopSub()
		l.Close()
		tb.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench-out"
	name, marker := "bench-out-"+Unique(), "m-"+Unique()
	rig := &Rig{Name: "weida → bridge → " + string(p.Protocol()), Delivered: make(chan struct{}, benchWindow), Window: benchWindow}
	done, forwarded := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(forwarded)
		for {
			select {
			case <-msgs:
			case <-done:
				return
			}
			select {
			case rig.Delivered <- struct{}{}:
			case <-done:
				return
			}
		}
	}()
	rig.Close = func() { close(done); <-forwarded; stopSub(); l.Close() }
	benchRuntime(tb, connectors.Unit{
		Spec: connectors.Spec{
			Name: name, Protocol: p.Protocol(), Direction: policy.Outbound, Policy: p,
			Routes: []connectors.Route{benchRoute(tb, p, filter)}, Endpoint: url,
		},
		Dial: func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		NewSink: func(report connectors.StateFunc) (connectors.Sink, error) {
			return h.NewSink(name, marker, report)
		},
	})
	for deadline := time.Now().Add(10 * time.Second); pub.Subscribers() == 0; time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			rig.Close()
			tb.Fatal("the outbound unit never subscribed at the weida endpoint")
		}
	}
	rig.Publish = func() error {
		_, err := pub.Publish(context.Background(), weida.Message{Topic: wSel, Payload: benchPayload})
		return err
	}
	return rig
}
