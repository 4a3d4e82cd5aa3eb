package e2e

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
	amqpconn "weida.dev/connector/connectors/amqp"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The AMQP throughput benchmark's rigs, in the frame of bench_frame_test.go:
// a window of benchWindow messages in flight, 256-byte payloads, routing key
// benchSubject.

const benchPrefetch = 256 // broker-baselines.md: confirms + manual ack, prefetch 256

// rabbitPublisher is a publisher in confirm mode that does not wait for each
// confirm (the window bounds what is in flight); a goroutine drains the
// confirms and fails the benchmark on a nack.
func rabbitPublisher(t *testing.T, addr, exchange string) (publish func(p []byte) error) {
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
	return func(p []byte) error {
		return c.ch.Publish(exchange, benchSubject, false, false, amqp.Publishing{Body: p})
	}
}

// rabbitConsumer consumes an exclusive queue bound with bench.*.data, with
// manual acks and prefetch benchPrefetch, reporting every delivery to rig.
func rabbitConsumer(t *testing.T, addr, exchange string, rig *benchRig) {
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
			rig.arrived(d.Body, nil)
		}
	}()
}

// rabbitDirectRig: an amqp091 publisher with confirms → amq-style topic
// exchange → a consumer with manual acks, as in broker-baselines.md.
func rabbitDirectRig(t *testing.T, addr string) *benchRig {
	rig := &benchRig{name: "RabbitMQ direct", delivered: make(chan struct{}, benchWindow)}
	rabbitConsumer(t, addr, "bench-direct", rig)
	rig.publish = rabbitPublisher(t, addr, "bench-direct")
	syncRig(t, rig, func() error { return rig.publish(benchPayload) })
	rig.close = func() {}
	return rig
}

func amqpBenchRoute(t *testing.T) (policy.Policy, []connectors.Route) {
	p := policy.AMQPWordsV1()
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
	l, wpub, url := benchEndpoint(t)
	spec := connectors.Spec{Name: "bench-in", Protocol: policy.AMQP, Direction: policy.Inbound, Policy: p, Routes: routes, Endpoint: url}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := amqpconn.Config{Host: host, Port: port, Exchange: "bench-in", Prefetch: benchPrefetch, ConnectionName: "bench-in"}
	b := connectors.NewInbound(spec, func(report connectors.StateFunc) (connectors.Source, error) {
		return amqpconn.NewSource(cfg, report)
	}, wpub, connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	rig := &benchRig{name: "RabbitMQ → bridge → weida", delivered: make(chan struct{}, benchWindow)}
	stopRecv := weidaReceiver(t, url, rig)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	rig.publish = rabbitPublisher(t, addr, "bench-in")
	syncRig(t, rig, func() error { return rig.publish(benchPayload) })
	rig.close = func() {
		stopRecv()
		closeBridgeRig(t, rig, b, stopBridge, l)
	}
	return rig
}

// amqpOutboundRig: a weida publisher → connectors.Bridge with the AMQP Sink
// (dialling it, in this process; confirms, limits.inFlight's default) →
// RabbitMQ → a consumer with manual acks.
func amqpOutboundRig(t *testing.T, addr string) *benchRig {
	p, routes := amqpBenchRoute(t)
	l, wpub, url := benchEndpoint(t)
	rig := &benchRig{name: "weida → bridge → RabbitMQ", delivered: make(chan struct{}, benchWindow)}
	rabbitConsumer(t, addr, "bench-out", rig)
	spec := connectors.Spec{Name: "bench-out", Protocol: policy.AMQP, Direction: policy.Outbound, Policy: p, Routes: routes,
		Endpoint: url, InFlight: resourcesDefaultInFlight}
	host, port := brokertest.SplitAddr(t, addr)
	cfg := amqpconn.Config{Host: host, Port: port, Exchange: "bench-out", ConnectionName: "bench-out"}
	b := connectors.NewOutbound(spec,
		func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, weida.DialConfig{}) },
		func(report connectors.StateFunc) (connectors.Sink, error) { return amqpconn.NewSink(cfg, report) },
		connectors.Deps{Metrics: connectors.NewMetrics(prometheus.NewRegistry())})
	stopBridge := runBridge(t, b)
	waitSubscribers(t, wpub, 1, 10*time.Second)
	syncRig(t, rig, func() error { return publishWeida(wpub, benchPayload) })
	rig.publish = func(p []byte) error { return publishWeida(wpub, p) }
	rig.close = func() { closeBridgeRig(t, rig, b, stopBridge, l) }
	return rig
}

// TestAMQPThroughput measures, in one run, 256-byte messages per second
// through RabbitMQ alone (publisher confirms, manual acks, prefetch 256),
// through weida alone, and through the bridge in each direction, and prints
// the ratio of each bridged rate to the smaller direct rate (the goal is
// 80 %). It runs only with WEIDA_BENCH=1; WEIDA_BENCH_MESSAGES and
// WEIDA_BENCH_ROUNDS change the sample size (default 50000) and the number
// of rounds (default 5); WEIDA_BENCH_RIGS (rabbitmq, weida, in, out) runs
// only the rigs named. The broker is a private RabbitMQ node, so that other
// tests' traffic does not skew the numbers.
func TestAMQPThroughput(t *testing.T) {
	requireBench(t, "to run the throughput benchmark")
	rb := brokertest.StartRabbit(t)
	throughput{broker: "RabbitMQ", pid: rb.VMPid(), rigs: []namedRig{
		{short: "rabbitmq", build: func() *benchRig { return rabbitDirectRig(t, rb.Addr()) }},
		{short: "weida", build: func() *benchRig { return weidaDirectRig(t) }},
		{short: "in", build: func() *benchRig { return amqpInboundRig(t, rb.Addr()) }},
		{short: "out", build: func() *benchRig { return amqpOutboundRig(t, rb.Addr()) }},
	}}.run(t, envInt(t, "WEIDA_BENCH_MESSAGES", 50000), envInt(t, "WEIDA_BENCH_ROUNDS", 5))
}
