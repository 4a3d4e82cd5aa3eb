package mqtt

import (
	"context"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	"go.uber.org/goleak"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// The loopback Mosquitto that scripts/brokers starts.
const (
	loopback   = "127.0.0.1"
	brokerPort = 1883
	brokerAddr = "127.0.0.1:1883"
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
		t.Fatalf("Mosquitto is not listening on %s (run scripts/brokers): %v", brokerAddr, err)
	}
	c.Close()
}

// harness runs the suite on the shared broker, or on addr when set.
type harness struct {
	t    testing.TB
	addr string
}

func (h harness) broker() string {
	if h.addr != "" {
		return h.addr
	}
	return brokerAddr
}

// PrivateBroker: Mosquitto starts in milliseconds, so every subtest gets
// its own.
func (h harness) PrivateBroker(t *testing.T) *brokertest.Broker { return brokertest.NewMosquitto(t) }

func (h harness) At(t *testing.T, addr string) conntest.Harness { return harness{t: t, addr: addr} }

// Refusing points at a private broker that admits no anonymous client.
func (h harness) Refusing(t *testing.T) conntest.Harness {
	b := brokertest.StartMosquitto(t, "allow_anonymous false")
	return harness{t: t, addr: b.Addr()}
}

func (h harness) Policy() policy.Policy { return Driver.Policies()[0] }

func (h harness) config(name, marker string) Config {
	host, port := brokertest.SplitAddr(h.t, h.broker())
	return Config{
		Host:          host,
		Port:          port,
		ClientID:      name,
		QoS:           1,
		SessionExpiry: time.Minute,
		LoopMarker:    marker,
		Backoff:       connectors.ExponentialBackoff(50*time.Millisecond, time.Second),
	}
}

func (h harness) NewSource(name, marker string, report connectors.StateFunc) (connectors.Source, error) {
	return NewSource(h.config(name, marker), report)
}

func (h harness) NewSink(name, marker string, report connectors.StateFunc) (connectors.Sink, error) {
	return NewSink(h.config(name+"-out", marker), report)
}

func (h harness) Topics() (filter, selected, other, unconvertible string) {
	u := conntest.Unique()
	return u + "/+/temp", u + "/a/temp", u + "/a/b/temp", u + "/a.b/temp"
}

func (h harness) Capabilities() conntest.Capabilities {
	return conntest.Capabilities{Metadata: true, Redelivery: true, CredentialsRefused: true, RetriesInStart: true}
}

// direct connects a plain paho client, bypassing the connector.
func direct(ctx context.Context, addr, id string, onPublish func(paho.PublishReceived) (bool, error)) (*paho.Client, error) {
	conn, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	cfg := paho.ClientConfig{ClientID: id, Conn: conn}
	if onPublish != nil {
		cfg.OnPublishReceived = []func(paho.PublishReceived) (bool, error){onPublish}
	}
	c := paho.NewClient(cfg)
	if _, err := c.Connect(ctx, &paho.Connect{ClientID: id, CleanStart: true, KeepAlive: 30}); err != nil {
		conn.Close()
		return nil, err
	}
	return c, nil
}

func (h harness) Publish(ctx context.Context, m *connectors.Message) error {
	c, err := direct(ctx, h.broker(), "pub-"+conntest.Unique(), nil)
	if err != nil {
		return err
	}
	defer c.Disconnect(&paho.Disconnect{})
	props := &paho.PublishProperties{ContentType: m.ContentType}
	if m.Traceparent != "" {
		props.User.Add("traceparent", m.Traceparent)
	}
	if m.Tracestate != "" {
		props.User.Add("tracestate", m.Tracestate)
	}
	_, err = c.Publish(ctx, &paho.Publish{Topic: m.Topic, QoS: 1, Payload: m.Payload, Properties: props})
	return err
}

func (h harness) Subscribe(ctx context.Context, filter string) (<-chan *connectors.Message, func(), error) {
	ch := make(chan *connectors.Message, 64)
	c, err := direct(ctx, h.broker(), "sub-"+conntest.Unique(), func(pr paho.PublishReceived) (bool, error) {
		p := pr.Packet
		m := &connectors.Message{Topic: p.Topic, Payload: p.Payload}
		if p.Properties != nil {
			m.ContentType = p.Properties.ContentType
			m.Traceparent = userProperty(p.Properties, "traceparent")
			m.Tracestate = userProperty(p.Properties, "tracestate")
		}
		select {
		case ch <- m:
		default:
		}
		return true, nil
	})
	if err != nil {
		return nil, nil, err
	}
	if _, err := c.Subscribe(ctx, &paho.Subscribe{Subscriptions: []paho.SubscribeOptions{{Topic: filter, QoS: 1}}}); err != nil {
		c.Disconnect(&paho.Disconnect{})
		return nil, nil, fmt.Errorf("direct subscribe: %w", err)
	}
	return ch, func() { c.Disconnect(&paho.Disconnect{}); <-c.Done() }, nil
}

func TestConformance(t *testing.T) {
	requireBroker(t)
	conntest.Run(t, func(t *testing.T) conntest.Harness { return harness{t: t} })
}

// BenchmarkConformance measures the bridged path through the runtime both
// ways on the loopback Mosquitto (see conntest.Benchmark).
func BenchmarkConformance(b *testing.B) {
	requireBroker(b)
	conntest.Benchmark(b, harness{t: b})
}
