package nats

import (
	"context"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	"go.uber.org/goleak"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// The loopback nats-server (with JetStream) that scripts/brokers starts.
const (
	loopback   = "127.0.0.1"
	serverPort = 4222
	serverAddr = "127.0.0.1:4222"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m,
		// quic-go keeps one package-level goroutine for its connection ID
		// generator's timer wheel on some platforms.
		goleak.IgnoreAnyFunction("github.com/quic-go/quic-go.(*Transport).listen"),
	)
}

func requireServer(t testing.TB) {
	t.Helper()
	c, err := net.DialTimeout("tcp", serverAddr, 2*time.Second)
	if err != nil {
		t.Fatalf("nats-server is not listening on %s (run scripts/brokers): %v", serverAddr, err)
	}
	c.Close()
}

// harness runs the conformance suite in core mode, or in JetStream mode
// when stream is set.
type harness struct {
	t      testing.TB
	stream string // JetStream stream capturing prefix.>, or ""
	prefix string // first token of every subject
	addr   string // the server; "" means serverAddr
	user   string // credentials presented, if any
}

func (h harness) server() string {
	if h.addr != "" {
		return h.addr
	}
	return serverAddr
}

// PrivateBroker: nats-server starts in milliseconds, so every subtest gets
// its own. The JetStream harness has none: its stream lives on the shared
// server, and the core harness covers the driver's connection handling.
func (h harness) PrivateBroker(t *testing.T) *brokertest.Broker {
	if h.stream != "" {
		return nil
	}
	return brokertest.NewNATS(t)
}

func (h harness) At(t *testing.T, addr string) conntest.Harness {
	h.t, h.addr = t, addr
	return h
}

// Refusing points at a private server that wants a password and presents
// the wrong one.
func (h harness) Refusing(t *testing.T) conntest.Harness {
	b := brokertest.StartNATS(t, "--user", "conntest", "--pass", "right")
	h.t, h.addr, h.user = t, b.Addr(), "conntest"
	return h
}

func (h harness) Policy() policy.Policy { return Driver.Policies()[0] }

func (h harness) config(name, marker string, inbound bool) Config {
	host, port := brokertest.SplitAddr(h.t, h.server())
	cfg := Config{
		Host:       host,
		Port:       port,
		Name:       name,
		LoopMarker: marker,
		Backoff:    connectors.ExponentialBackoff(50*time.Millisecond, time.Second),
		// One connection attempt is not cut short by Start's ctx: keep it
		// short so that the suite's cancellations stay prompt.
		ConnectTimeout: time.Second,
	}
	if h.user != "" {
		cfg.User, cfg.Password = h.user, "wrong"
	}
	if h.stream != "" {
		cfg.JetStream = &JetStream{Stream: h.stream}
		if inbound {
			cfg.JetStream.Durable = name
		}
	}
	return cfg
}

func (h harness) NewSource(name, marker string, report connectors.StateFunc) (connectors.Source, error) {
	return NewSource(h.config(name, marker, true), report)
}

func (h harness) NewSink(name, marker string, report connectors.StateFunc) (connectors.Sink, error) {
	return NewSink(h.config(name+"-out", marker, false), report)
}

func (h harness) Topics() (filter, selected, other, unconvertible string) {
	u := h.prefix + "." + conntest.Unique()
	// A selected subject longer than weida's 256-byte topic limit has no
	// weida form.
	long := u + "." + strings.Repeat("x", 300) + ".temp"
	return u + ".*.temp", u + ".a.temp", u + ".a.b.temp", long
}

func (h harness) Capabilities() conntest.Capabilities {
	caps := conntest.Capabilities{Metadata: true, Redelivery: h.stream != "", CredentialsRefused: true, RetriesInStart: true}
	if h.stream != "" {
		// A message left unacknowledged at Close comes back after the
		// durable consumer's AckWait, the server's default of 30 s.
		caps.RedeliverAfter = 30 * time.Second
	}
	return caps
}

func dial(t testing.TB) *natsgo.Conn { return dialAt(t, serverAddr) }

func dialAt(t testing.TB, addr string) *natsgo.Conn {
	t.Helper()
	nc, err := natsgo.Connect("nats://"+addr, natsgo.Name("conntest-direct"))
	if err != nil {
		t.Fatalf("connecting to nats-server: %v", err)
	}
	return nc
}

func (h harness) Publish(ctx context.Context, m *connectors.Message) error {
	nc, err := natsgo.Connect("nats://"+h.server(), natsgo.Name("conntest-direct"))
	if err != nil {
		return err
	}
	defer nc.Close()
	msg := fromMessage(m, "")
	if h.stream != "" {
		js, err := jetstream.New(nc)
		if err != nil {
			return err
		}
		_, err = js.PublishMsg(ctx, msg)
		return err
	}
	if err := nc.PublishMsg(msg); err != nil {
		return err
	}
	return nc.FlushWithContext(ctx)
}

func (h harness) Subscribe(ctx context.Context, filter string) (<-chan *connectors.Message, func(), error) {
	nc := dialAt(h.t, h.server())
	ch := make(chan *connectors.Message, 64)
	_, err := nc.Subscribe(filter, func(m *natsgo.Msg) {
		select {
		case ch <- toMessage(m.Subject, m.Data, m.Header, ""):
		default:
		}
	})
	if err == nil {
		err = nc.FlushWithContext(ctx)
	}
	if err != nil {
		nc.Close()
		return nil, nil, fmt.Errorf("direct subscribe: %w", err)
	}
	return ch, nc.Close, nil
}

func TestConformanceCore(t *testing.T) {
	requireServer(t)
	conntest.Run(t, func(t *testing.T) conntest.Harness { return harness{t: t, prefix: "ct"} })
}

func TestConformanceJetStream(t *testing.T) {
	requireServer(t)
	stream, prefix := newStream(t)
	conntest.Run(t, func(t *testing.T) conntest.Harness { return harness{t: t, stream: stream, prefix: prefix} })
}

// newStream creates a stream capturing <prefix>.> for one test and deletes
// it (with its consumers) when the test ends.
func newStream(t testing.TB) (stream, prefix string) {
	t.Helper()
	u := conntest.Unique()
	stream, prefix = "CONNTEST_"+u, "ctjs"+u
	nc := dial(t)
	t.Cleanup(nc.Close)
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{
		Name: stream, Subjects: []string{prefix + ".>"}, Storage: jetstream.MemoryStorage, MaxAge: 10 * time.Minute,
	}); err != nil {
		t.Fatalf("creating stream: %v", err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := js.DeleteStream(ctx, stream); err != nil {
			t.Errorf("deleting stream %s: %v", stream, err)
		}
	})
	return stream, prefix
}

// BenchmarkConformance measures the bridged path through the runtime both
// ways on the loopback NATS server, in core mode (see conntest.Benchmark).
func BenchmarkConformance(b *testing.B) {
	requireServer(b)
	conntest.Benchmark(b, harness{t: b, prefix: "ct"})
}
