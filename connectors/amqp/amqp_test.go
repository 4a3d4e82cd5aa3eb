package amqp

import (
	"context"
	"net"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"
	"go.uber.org/goleak"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// The loopback RabbitMQ that scripts/brokers starts.
const (
	loopback   = "127.0.0.1"
	brokerPort = 5672
	brokerAddr = "127.0.0.1:5672"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// quic-go keeps one package-level goroutine for its connection ID
		// generator's timer wheel on some platforms.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*Transport).listen"),
	)
}

func requireBroker(t testing.TB) {
	t.Helper()
	c, err := net.DialTimeout("tcp", brokerAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("RabbitMQ is not listening on %s (run scripts/brokers): %v", brokerAddr, err)
	}
	c.Close()
}

// testConfig is a Config for the loopback broker.
func testConfig(name, marker string) Config {
	return Config{
		Host:           loopback,
		Port:           brokerPort,
		Username:       "guest",
		Password:       "guest",
		ConnectionName: name,
		LoopMarker:     marker,
	}
}

// directChannel opens a connection and channel that bypass the driver;
// both close when the test ends.
func directChannel(t testing.TB) (*amqp.Connection, *amqp.Channel) {
	t.Helper()
	conn, err := amqp.Dial("amqp://guest:guest@" + brokerAddr + "/")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close() })
	ch, err := conn.Channel()
	if err != nil {
		t.Fatal(err)
	}
	return conn, ch
}

// deleteQueue removes a queue the test made, whatever state it is in.
func deleteQueue(t testing.TB, name string) {
	t.Helper()
	conn, err := amqp.Dial("amqp://guest:guest@" + brokerAddr + "/")
	if err != nil {
		t.Errorf("deleting queue %q: %v", name, err)
		return
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		t.Errorf("deleting queue %q: %v", name, err)
		return
	}
	if _, err := ch.QueueDelete(name, false, false, false); err != nil {
		t.Errorf("deleting queue %q: %v", name, err)
	}
}

// harness runs the suite on the shared broker, or on addr with the
// password pass when set.
type harness struct {
	t    testing.TB
	ch   *amqp.Channel // on the shared broker; nil elsewhere
	addr string
	pass string

	private *brokertest.Broker // shared by the subtests of one test

	// queues the Sources made on the shared broker, deleted when the
	// test ends: by a clean-up registered before any bridge's, so that it
	// runs after every bridge has stopped consuming.
	mu     sync.Mutex
	queues []string
}

func (h *harness) deleteQueues() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for _, q := range h.queues {
		deleteQueue(h.t, q)
	}
}

func (h *harness) broker() string {
	if h.addr != "" {
		return h.addr
	}
	return brokerAddr
}

// PrivateBroker returns one node for every subtest of the test: a
// RabbitMQ node takes seconds to start.
func (h *harness) PrivateBroker(t *testing.T) *brokertest.Broker { return h.private }

func (h *harness) At(t *testing.T, addr string) conntest.Harness {
	return &harness{t: t, addr: addr, pass: h.pass, private: h.private}
}

// Refusing presents a wrong password to the shared broker.
func (h *harness) Refusing(t *testing.T) conntest.Harness {
	rh := &harness{t: t, pass: "wrong", private: h.private}
	t.Cleanup(rh.deleteQueues)
	return rh
}

func (h *harness) Policy() policy.Policy { return Driver.Policies()[0] }

func (h *harness) config(name, marker string) Config {
	cfg := testConfig(name, marker)
	cfg.Host, cfg.Port = brokertest.SplitAddr(h.t, h.broker())
	if h.pass != "" {
		cfg.Password = h.pass
	}
	// Start's ctx does not cut a handshake short: keep one brief.
	cfg.ConnectTimeout = time.Second
	return cfg
}

func (h *harness) NewSource(name, marker string, report connectors.StateFunc) (connectors.Source, error) {
	cfg := h.config(name, marker)
	cfg.Queue = Queue{Name: "conntest-" + name, Durable: true}
	if h.addr == "" {
		h.mu.Lock()
		h.queues = append(h.queues, cfg.Queue.Name)
		h.mu.Unlock()
	}
	return NewSource(cfg, report)
}

func (h *harness) NewSink(name, marker string, report connectors.StateFunc) (connectors.Sink, error) {
	return NewSink(h.config(name+"-out", marker), report)
}

// Topics: a non-UTF-8 word is a routing key RabbitMQ routes and weida
// cannot carry.
func (h *harness) Topics() (filter, selected, other, unconvertible string) {
	u := conntest.Unique()
	return u + ".*.temp", u + ".a.temp", u + ".a.b.temp", u + ".\xff.temp"
}

func (h *harness) Capabilities() conntest.Capabilities {
	return conntest.Capabilities{Metadata: true, Redelivery: true, CredentialsRefused: true}
}

func (h *harness) Publish(ctx context.Context, m *connectors.Message) error {
	pub := amqp.Publishing{ContentType: m.ContentType, Body: m.Payload, Headers: amqp.Table{}}
	if m.Traceparent != "" {
		pub.Headers[headerTraceparent] = m.Traceparent
	}
	if m.Tracestate != "" {
		pub.Headers[headerTracestate] = m.Tracestate
	}
	if h.ch != nil {
		return h.ch.PublishWithContext(ctx, DefaultExchange, m.Topic, false, false, pub)
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + h.broker() + "/")
	if err != nil {
		return err
	}
	defer conn.Close()
	ch, err := conn.Channel()
	if err != nil {
		return err
	}
	return ch.PublishWithContext(ctx, DefaultExchange, m.Topic, false, false, pub)
}

func (h *harness) Subscribe(ctx context.Context, filter string) (<-chan *connectors.Message, func(), error) {
	conn, err := amqp.Dial("amqp://guest:guest@" + h.broker() + "/")
	if err != nil {
		return nil, nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		var q amqp.Queue
		q, err = ch.QueueDeclare("", false, true, true, false, nil)
		if err == nil {
			err = ch.QueueBind(q.Name, filter, DefaultExchange, false, nil)
		}
		var ds <-chan amqp.Delivery
		if err == nil {
			ds, err = ch.Consume(q.Name, "", true, true, false, false, nil)
		}
		if err == nil {
			out := make(chan *connectors.Message, 64)
			go func() {
				for d := range ds {
					m := &connectors.Message{
						Topic:       d.RoutingKey,
						Payload:     d.Body,
						ContentType: d.ContentType,
						Traceparent: headerString(d.Headers, headerTraceparent),
						Tracestate:  headerString(d.Headers, headerTracestate),
					}
					select {
					case out <- m:
					default:
					}
				}
			}()
			return out, func() { conn.Close() }, nil
		}
	}
	conn.Close()
	return nil, nil, err
}

func TestConformance(t *testing.T) {
	requireBroker(t)
	// Not started: StartWhileUnreachable starts it.
	private := brokertest.NewRabbit(t)
	conntest.Run(t, func(t *testing.T) conntest.Harness {
		_, ch := directChannel(t)
		h := &harness{t: t, ch: ch, private: private}
		t.Cleanup(h.deleteQueues)
		return h
	})
}

// BenchmarkConformance measures the bridged path through the runtime both
// ways on the loopback RabbitMQ (see conntest.Benchmark).
func BenchmarkConformance(b *testing.B) {
	requireBroker(b)
	_, ch := directChannel(b)
	h := &harness{t: b, ch: ch}
	b.Cleanup(h.deleteQueues)
	conntest.Benchmark(b, h)
}
