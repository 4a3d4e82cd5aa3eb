package e2e

import (
	"context"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	natsconn "weida.dev/connector/connectors/nats"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// benchRig is one path messages take in the throughput measurement:
// publish sends one 256-byte message, and every message received at the far
// end is signalled on delivered.
type benchRig struct {
	name      string
	publish   func() error
	delivered chan struct{}
	close     func()
}

// benchWindow bounds the messages in flight (sent, not yet received) in
// every rig, as weida/bench does: a rig measures delivery, not drops by a
// buffer that an unpaced publisher overfills.
const benchWindow = 512

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
	cpu0 := processCPU()
	// One timer for the whole run: a receive that waits this long means a
	// message was lost, which makes the measurement meaningless.
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
	for range n {
		if inFlight == benchWindow {
			wait()
			inFlight--
		}
		if err := rig.publish(); err != nil {
			t.Fatalf("%s: publish: %v", rig.name, err)
		}
		inFlight++
	}
	for range inFlight {
		wait()
	}
	return float64(n) / time.Since(start).Seconds(), (processCPU() - cpu0) / time.Duration(n)
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
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

// The NATS rigs share one server: each has its own first token, so that no
// rig's subscriber sees another rig's messages. "<rig>.*.data" selects
// "<rig>.x.data"; the outbound rig, whose subjects come from weida's
// benchSubject, uses "bench".
func natsBenchFilter(rig string) string  { return rig + ".*.data" }
func natsBenchSubject(rig string) string { return rig + ".x.data" }

var benchPayload = make([]byte, 256)

// natsDirectRig: a nats.go publisher and a wildcard subscriber on another
// connection, as in reference/broker-baselines.md.
func natsDirectRig(t *testing.T, addr string) *benchRig {
	pub := natsConn(t, addr)
	sub := natsConn(t, addr)
	rig := &benchRig{name: "nats-server direct", delivered: make(chan struct{}, benchWindow)}
	done := make(chan struct{})
	s, err := sub.Subscribe(natsBenchFilter("direct"), func(*natsgo.Msg) { signal(rig.delivered, done) })
	if err != nil {
		t.Fatal(err)
	}
	if err := s.SetPendingLimits(-1, -1); err != nil {
		t.Fatal(err)
	}
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	rig.publish = func() error { return pub.Publish(natsBenchSubject("direct"), benchPayload) }
	rig.close = func() { close(done); s.Unsubscribe() }
	return rig
}

// weidaEndpoint hosts a weida publisher and dials a subscriber to it that
// signals every copy on delivered.
func weidaDirectRig(t *testing.T) *benchRig {
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	pub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	rig := &benchRig{name: "weida direct", delivered: make(chan struct{}, benchWindow)}
	stop := weidaReceiver(t, "weida://"+l.Fingerprint()+"@"+l.Addr().String()+"/bench", rig.delivered)
	waitSubscribers(t, pub, 1, 10*time.Second)
	syncRig(t, rig, func() error { return publishWeida(pub) })
	rig.publish = func() error { return publishWeida(pub) }
	rig.close = func() { stop(); l.Close() }
	return rig
}

func publishWeida(pub *weida.Publisher) error { return publishWeidaTopic(pub, benchSubject) }

func publishWeidaTopic(pub *weida.Publisher, topic string) error {
	r, err := pub.Publish(context.Background(), weida.Message{Topic: topic, Payload: benchPayload})
	if err == nil && r.Dropped > 0 {
		err = fmt.Errorf("weida dropped %d copies (%+v, %+v)", r.Dropped, r, pub)
	}
	return err
}

// weidaReceiver dials url, subscribes to every topic and signals each
// copy on delivered until stop.
func weidaReceiver(t *testing.T, url string, delivered chan<- struct{}) (stop func()) {
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
			if _, err := sub.Receive(rctx); err != nil {
				return
			}
			signal(delivered, rctx.Done())
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

func natsBenchRoute(t *testing.T, filter string) (policy.Policy, []connectors.Route) {
	p, err := policy.Lookup(policy.NATSTokens)
	if err != nil {
		t.Fatal(err)
	}
	wf, err := p.ConvertFilter(filter)
	if err != nil {
		t.Fatal(err)
	}
	return p, []connectors.Route{{Name: "bench", Foreign: filter, Weida: wf}}
}

// inboundRig: a nats.go publisher → nats-server → connectors.Bridge with
// the NATS Source (in this process) → the bridge's weida endpoint → a weida
// subscriber.
func inboundRig(t *testing.T, addr string) *benchRig {
	p, routes := natsBenchRoute(t, natsBenchFilter("in"))
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	wpub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench"
	spec := connectors.Spec{Name: "bench-in", Protocol: policy.NATS, Direction: policy.Inbound, Policy: p, Routes: routes, Endpoint: url}
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return natsconn.NewSource(natsconn.Config{URL: "nats://" + addr, Name: "bench-in", LoopMarker: "bench"}, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	rig := &benchRig{name: "nats-server → bridge → weida", delivered: make(chan struct{}, benchWindow)}
	stopRecv := weidaReceiver(t, url, rig.delivered)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	pub := natsConn(t, addr)
	rig.publish = func() error { return pub.Publish(natsBenchSubject("in"), benchPayload) }
	syncRig(t, rig, func() error { pub.Publish(natsBenchSubject("in"), benchPayload); return pub.Flush() })
	rig.close = func() {
		stopRecv()
		stopBridge()
		l.Close()
		if c := b.Status().Counters; len(c.Dropped) > 0 {
			t.Errorf("%s dropped messages: %v", rig.name, c.Dropped)
		}
	}
	return rig
}

// outboundRig: a weida publisher → connectors.Bridge with the NATS Sink
// (dialling it, in this process) → nats-server → a nats.go subscriber.
func outboundRig(t *testing.T, addr string, blockingWrites bool) *benchRig {
	prefix := "bench"
	if blockingWrites {
		prefix = "benchw"
	}
	p, routes := natsBenchRoute(t, natsBenchFilter(prefix))
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	wpub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench"
	rig := &benchRig{name: "weida → bridge → nats-server", delivered: make(chan struct{}, benchWindow)}
	if blockingWrites {
		rig.name += " (Write)"
	}
	sub := natsConn(t, addr)
	done := make(chan struct{})
	s, err := sub.Subscribe(natsBenchFilter(prefix), func(*natsgo.Msg) { signal(rig.delivered, done) })
	if err != nil {
		t.Fatal(err)
	}
	s.SetPendingLimits(-1, -1)
	if err := sub.Flush(); err != nil {
		t.Fatal(err)
	}
	spec := connectors.Spec{Name: "bench-out", Protocol: policy.NATS, Direction: policy.Outbound, Policy: p, Routes: routes,
		Endpoint: url, InFlight: envInt(t, "WEIDA_BENCH_INFLIGHT", resourcesDefaultInFlight)}
	// As `connector run` does, the Sink marks every message with the
	// loop marker header.
	var sink *natsconn.Sink
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) {
			var err error
			sink, err = natsconn.NewSink(natsconn.Config{URL: "nats://" + addr, Name: "bench-out", LoopMarker: "bench"}, report)
			if blockingWrites {
				return struct{ connectors.Sink }{sink}, err // hides WriteAsync
			}
			return sink, err
		}, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	syncRig(t, rig, func() error { return publishWeidaTopic(wpub, natsBenchSubject(prefix)) })
	rig.publish = func() error {
		if err := publishWeidaTopic(wpub, natsBenchSubject(prefix)); err != nil {
			return fmt.Errorf("%w; listener %+v; bridge %+v", err, l.Stats(), b.Status())
		}
		return nil
	}
	rig.close = func() {
		close(done)
		if st := sink.Stats(); st.FlushRounds > 0 {
			t.Logf("%s: %d publishes confirmed by %d PING/PONG rounds (%.1f per round)",
				rig.name, st.Confirmed, st.FlushRounds, float64(st.Confirmed)/float64(st.FlushRounds))
		}
		stopBridge()
		s.Unsubscribe()
		l.Close()
		if c := b.Status().Counters; len(c.Dropped) > 0 {
			t.Errorf("%s dropped messages: %v", rig.name, c.Dropped)
		}
	}
	return rig
}

// resourcesDefaultInFlight is limits.inFlight's default, what `connector
// run` gives a resource that names none.
const resourcesDefaultInFlight = 256

// TestNATSThroughput measures, in one run, 256-byte messages per second
// through nats-server alone, through weida alone, and through the bridge in
// each direction, and prints the ratio of each bridged rate to the smaller
// direct rate (the goal is 80 %). It runs only with WEIDA_BENCH=1;
// WEIDA_BENCH_MESSAGES and WEIDA_BENCH_ROUNDS change the sample size
// (default 100000) and the number of rounds (default 5); the rigs alternate
// within each round and the medians are reported.
func TestNATSThroughput(t *testing.T) {
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 to run the throughput benchmark")
	}
	n := envInt(t, "WEIDA_BENCH_MESSAGES", 100000)
	rounds := envInt(t, "WEIDA_BENCH_ROUNDS", 5)
	// A private server: other tests' traffic on the shared one would
	// skew the numbers.
	srv := startPrivateNATS(t)
	// WEIDA_BENCH_RIGS keeps only the rigs named (nats, weida, in, out;
	// comma-separated), for profiling one path; ratios need all four.
	only := os.Getenv("WEIDA_BENCH_RIGS")
	var rigs []*benchRig
	for _, r := range []struct {
		short string
		build func() *benchRig
	}{
		{"nats", func() *benchRig { return natsDirectRig(t, srv.Addr()) }},
		{"weida", func() *benchRig { return weidaDirectRig(t) }},
		{"in", func() *benchRig { return inboundRig(t, srv.Addr()) }},
		{"out", func() *benchRig { return outboundRig(t, srv.Addr(), false) }},
		{"out-write", func() *benchRig { return outboundRig(t, srv.Addr(), true) }},
	} {
		if only == "" && r.short != "out-write" || slices.Contains(strings.Split(only, ","), r.short) {
			rigs = append(rigs, r.build())
		}
	}
	defer func() {
		for _, r := range rigs {
			r.close()
		}
	}()
	// Warm up every rig once.
	for _, r := range rigs {
		runRig(t, r, n/10)
	}
	rates := make([][]float64, len(rigs))
	cpus := make([][]float64, len(rigs))       // this process, per message
	serverCPUs := make([][]float64, len(rigs)) // nats-server, per message
	pid := srv.Pid()
	for round := range rounds {
		for i, r := range rigs {
			s0 := cpuTime(t, pid)
			rate, cpu := runRigCPU(t, r, n)
			server := (cpuTime(t, pid) - s0) / time.Duration(n)
			rates[i] = append(rates[i], rate)
			cpus[i] = append(cpus[i], float64(cpu))
			serverCPUs[i] = append(serverCPUs[i], float64(server))
			t.Logf("round %d: %-32s %9.0f msg/s; CPU/msg %7s here, %7s nats-server", round+1, r.name, rate, cpu, server)
		}
	}
	med := make([]float64, len(rigs))
	total := make([]float64, len(rigs)) // median CPU per message, both processes
	for i := range rigs {
		med[i] = median(rates[i])
		total[i] = median(cpus[i]) + median(serverCPUs[i])
		t.Logf("median %-32s %9.0f msg/s (min %.0f, max %.0f); CPU/msg %s in this process, %s in nats-server",
			rigs[i].name, med[i], slices.Min(rates[i]), slices.Max(rates[i]),
			time.Duration(median(cpus[i])), time.Duration(median(serverCPUs[i])))
	}
	if len(rigs) != 4 || only != "" {
		return
	}
	// The machine is shared: a ratio taken within one round, where the
	// rigs ran back to back, varies less than a ratio of medians.
	var ratioIn, ratioOut []float64
	for r := range rounds {
		direct := min(rates[0][r], rates[1][r])
		ratioIn = append(ratioIn, rates[2][r]/direct)
		ratioOut = append(ratioOut, rates[3][r]/direct)
	}
	direct := min(med[0], med[1])
	t.Logf("inbound  bridged / min(direct): medians %.0f / %.0f = %.1f %%; per round median %.1f %% (min %.1f, max %.1f)",
		med[2], direct, 100*med[2]/direct, 100*median(ratioIn), 100*slices.Min(ratioIn), 100*slices.Max(ratioIn))
	t.Logf("outbound bridged / min(direct): medians %.0f / %.0f = %.1f %%; per round median %.1f %% (min %.1f, max %.1f)",
		med[3], direct, 100*med[3]/direct, 100*median(ratioOut), 100*slices.Min(ratioOut), 100*slices.Max(ratioOut))
	// When the rigs are CPU-bound on the same cores, a rate is inversely
	// proportional to the CPU each message costs. Any bridge between the
	// two pays at least what both direct rigs pay per message (its two
	// client halves are those rigs' ends), so that is the best ratio a
	// bridge could reach here, and the bridged rigs' CPU shows how far off
	// they are.
	t.Logf("CPU per message, both processes: nats-server direct %.1f µs, weida direct %.1f µs, inbound %.1f µs, outbound %.1f µs; "+
		"a bridge costing nothing beyond the two direct rigs would reach %.0f %% of weida direct",
		total[0]/1e3, total[1]/1e3, total[2]/1e3, total[3]/1e3, 100*total[1]/(total[0]+total[1]))
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
