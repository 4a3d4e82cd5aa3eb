package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
	amqpconn "weida.dev/connector/connectors/amqp"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The AMQP throughput benchmark reuses the rigs' frame of the NATS one
// (nats_bench_test.go): benchRig, runRig, a window of benchWindow messages
// in flight, 256-byte payloads, routing key benchSubject.

const benchPrefetch = 256 // broker-baselines.md: confirms + manual ack, prefetch 256

// rabbitPublisher is a publisher in confirm mode that does not wait for each
// confirm (the window bounds what is in flight); a goroutine drains the
// confirms and fails the benchmark on a nack.
func rabbitPublisher(t *testing.T, addr, exchange string) (publish func() error) {
	t.Helper()
	c := amqpConnect(t, addr)
	if err := c.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	confirms := c.ch.NotifyPublish(make(chan amqp.Confirmation, 4096))
	go func() {
		for cf := range confirms {
			if !cf.Ack {
				t.Errorf("RabbitMQ nacked publish %d", cf.DeliveryTag)
			}
		}
	}()
	return func() error {
		return c.ch.Publish(exchange, benchSubject, false, false, amqp.Publishing{Body: benchPayload})
	}
}

// rabbitConsumer consumes an exclusive queue bound with bench.*.data, with
// manual acks and prefetch benchPrefetch, signalling every delivery.
func rabbitConsumer(t *testing.T, addr, exchange string, delivered chan<- struct{}) {
	t.Helper()
	c := amqpConnect(t, addr)
	if err := c.ch.ExchangeDeclare(exchange, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	q, err := c.ch.QueueDeclare("", false, true, true, false, nil)
	if err == nil {
		err = c.ch.QueueBind(q.Name, "bench.*.data", exchange, false, nil)
	}
	if err == nil {
		err = c.ch.Qos(benchPrefetch, 0, false)
	}
	var ds <-chan amqp.Delivery
	if err == nil {
		ds, err = c.ch.Consume(q.Name, "", false, true, false, false, nil)
	}
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for d := range ds {
			d.Ack(false)
			delivered <- struct{}{}
		}
	}()
}

// rabbitDirectRig: an amqp091 publisher with confirms → amq-style topic
// exchange → a consumer with manual acks, as in broker-baselines.md.
func rabbitDirectRig(t *testing.T, addr string) *benchRig {
	rig := &benchRig{name: "RabbitMQ direct", delivered: make(chan struct{}, benchWindow)}
	rabbitConsumer(t, addr, "bench-direct", rig.delivered)
	rig.publish = rabbitPublisher(t, addr, "bench-direct")
	syncRig(t, rig, rig.publish)
	rig.close = func() {}
	return rig
}

func amqpBenchRoute(t *testing.T) (policy.Policy, []connectors.Route) {
	p := policy.Default(policy.AMQP)
	wf, err := p.ConvertFilter("bench.*.data")
	if err != nil {
		t.Fatal(err)
	}
	return p, []connectors.Route{{Name: "bench", Foreign: "bench.*.data", Weida: wf}}
}

// amqpInboundRig: publisher with confirms → RabbitMQ → connectors.Bridge
// with the AMQP Source (in this process; a server-named queue, prefetch
// benchPrefetch) → the bridge's weida endpoint → a weida subscriber.
func amqpInboundRig(t *testing.T, addr string) *benchRig {
	p, routes := amqpBenchRoute(t)
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	wpub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench"
	spec := connectors.Spec{Name: "bench-in", Protocol: policy.AMQP, Direction: policy.Inbound, Policy: p, Routes: routes, Endpoint: url}
	cfg := amqpconn.Config{URL: "amqp://" + addr + "/", Exchange: "bench-in", Prefetch: benchPrefetch, ConnectionName: "bench-in"}
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return amqpconn.NewSource(cfg, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	rig := &benchRig{name: "RabbitMQ → bridge → weida", delivered: make(chan struct{}, benchWindow)}
	stopRecv := weidaReceiver(t, url, rig.delivered)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	rig.publish = rabbitPublisher(t, addr, "bench-in")
	syncRig(t, rig, rig.publish)
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

// amqpOutboundRig: a weida publisher → connectors.Bridge with the AMQP Sink
// (dialling it, in this process; confirms, limits.inFlight's default) →
// RabbitMQ → a consumer with manual acks.
func amqpOutboundRig(t *testing.T, addr string) *benchRig {
	p, routes := amqpBenchRoute(t)
	l, err := weida.Listen(context.Background(), "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		t.Fatal(err)
	}
	wpub, err := l.Publisher("/bench")
	if err != nil {
		t.Fatal(err)
	}
	url := "weida://" + l.Fingerprint() + "@" + l.Addr().String() + "/bench"
	rig := &benchRig{name: "weida → bridge → RabbitMQ", delivered: make(chan struct{}, benchWindow)}
	rabbitConsumer(t, addr, "bench-out", rig.delivered)
	spec := connectors.Spec{Name: "bench-out", Protocol: policy.AMQP, Direction: policy.Outbound, Policy: p, Routes: routes,
		Endpoint: url, InFlight: resourcesDefaultInFlight}
	cfg := amqpconn.Config{URL: "amqp://" + addr + "/", Exchange: "bench-out", ConnectionName: "bench-out"}
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) { return amqpconn.NewSink(cfg, report) },
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	syncRig(t, rig, func() error { return publishWeida(wpub) })
	rig.publish = func() error { return publishWeida(wpub) }
	rig.close = func() {
		stopBridge()
		l.Close()
		if c := b.Status().Counters; len(c.Dropped) > 0 {
			t.Errorf("%s dropped messages: %v", rig.name, c.Dropped)
		}
	}
	return rig
}

// cpuTime returns the CPU time (user and system) process pid has used; pid 0
// means this process. It reads /proc, in clock ticks of 10 ms.
func cpuTime(t *testing.T, pid int) time.Duration {
	t.Helper()
	path := "/proc/self/stat"
	if pid != 0 {
		path = fmt.Sprintf("/proc/%d/stat", pid)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	// The command name (field 2) may hold spaces; the fields after it
	// start at the last ')'.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// beamPid returns the private node's Erlang VM process id.
func (r *privateRabbit) beamPid(t *testing.T) int {
	b, err := os.ReadFile(filepath.Join(r.dir, "pid"))
	if err != nil {
		t.Fatal(err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		t.Fatal(err)
	}
	return pid
}

// TestAMQPThroughput measures, in one run, 256-byte messages per second
// through RabbitMQ alone (publisher confirms, manual acks, prefetch 256),
// through weida alone, and through the bridge in each direction, and prints
// the ratio of each bridged rate to the smaller direct rate (the goal is
// 80 %). It runs only with WEIDA_BENCH=1; WEIDA_BENCH_MESSAGES and
// WEIDA_BENCH_ROUNDS change the sample size (default 50000) and the number
// of rounds (default 5); the rigs alternate within each round and the
// medians are reported, with the ratios taken per round and the CPU time
// RabbitMQ and this process (publishers, bridge, subscribers) spent per
// message, which other load on the machine does not skew as much. The
// broker is a private RabbitMQ node, so that other tests' traffic does not
// skew the numbers.
func TestAMQPThroughput(t *testing.T) {
	if os.Getenv("WEIDA_BENCH") != "1" {
		t.Skip("set WEIDA_BENCH=1 to run the throughput benchmark")
	}
	n := envInt(t, "WEIDA_BENCH_MESSAGES", 50000)
	rounds := envInt(t, "WEIDA_BENCH_ROUNDS", 5)
	rb := startPrivateRabbit(t)
	rigs := []*benchRig{
		rabbitDirectRig(t, rb.Addr()),
		weidaDirectRig(t),
		amqpInboundRig(t, rb.Addr()),
		amqpOutboundRig(t, rb.Addr()),
	}
	defer func() {
		for _, r := range rigs {
			r.close()
		}
	}()
	for _, r := range rigs {
		runRig(t, r, n/10)
	}
	beam := rb.beamPid(t)
	rates := make([][]float64, len(rigs))
	brokerCPU := make([]time.Duration, len(rigs)) // per message, summed over rounds
	selfCPU := make([]time.Duration, len(rigs))
	var ratioIn, ratioOut []float64
	for round := range rounds {
		// Alternate the order, so that no rig always runs right after
		// the same neighbour; the ratios are taken per round, from
		// samples made under the same load.
		order := []int{0, 2, 1, 3}
		if round%2 == 1 {
			slices.Reverse(order)
		}
		for _, i := range order {
			b0, s0 := cpuTime(t, beam), cpuTime(t, 0)
			rate := runRig(t, rigs[i], n)
			brokerCPU[i] += (cpuTime(t, beam) - b0) / time.Duration(n*rounds)
			selfCPU[i] += (cpuTime(t, 0) - s0) / time.Duration(n*rounds)
			rates[i] = append(rates[i], rate)
			t.Logf("round %d: %-28s %9.0f msg/s", round+1, rigs[i].name, rate)
		}
		direct := min(rates[0][round], rates[1][round])
		ratioIn = append(ratioIn, rates[2][round]/direct)
		ratioOut = append(ratioOut, rates[3][round]/direct)
		t.Logf("round %d: inbound %.1f %%, outbound %.1f %% of min(direct)", round+1, 100*ratioIn[round], 100*ratioOut[round])
	}
	med := make([]float64, len(rigs))
	for i := range rigs {
		med[i] = median(rates[i])
		t.Logf("median %-28s %9.0f msg/s (min %.0f, max %.0f); CPU per message: RabbitMQ %.1f µs, this process %.1f µs",
			rigs[i].name, med[i], slices.Min(rates[i]), slices.Max(rates[i]),
			float64(brokerCPU[i].Nanoseconds())/1e3, float64(selfCPU[i].Nanoseconds())/1e3)
	}
	t.Logf("inbound  bridged / min(direct): median of rounds %.1f %% (min %.1f, max %.1f)",
		100*median(ratioIn), 100*slices.Min(ratioIn), 100*slices.Max(ratioIn))
	t.Logf("outbound bridged / min(direct): median of rounds %.1f %% (min %.1f, max %.1f)",
		100*median(ratioOut), 100*slices.Min(ratioOut), 100*slices.Max(ratioOut))
}
