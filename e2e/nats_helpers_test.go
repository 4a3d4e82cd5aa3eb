package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/policy"
)

// natsAddr is the loopback nats-server (with JetStream) scripts/brokers
// starts.
const natsAddr = "127.0.0.1:4222"

// natsResource describes one NATS Connector resource for a test; YAML
// renders it.
type natsResource struct {
	Name      string
	Direction policy.Direction
	Broker    string // host:port; empty means natsAddr
	// Endpoint is the weida URL: listen (inbound) or dial (outbound).
	Endpoint   string
	QueueGroup string
	Stream     string // JetStream stream; empty means core NATS
	Durable    string // inbound JetStream consumer
	Routes     []string
	Policy     policy.Policy // nil means nats-tokens/v1
	InFlight   int
	TLS        *brokerPKI // set: tls:// with the PKI's CA and client certificate
	TokenFile  string     // set: credentials.token read from this file
	Hold       bool       // spec.delivery.whenNoSubscriber: hold
	LastValue  string     // inbound: spec.lastValue's body, e.g. "mode: retained"
}

// YAML renders the resource, declaring exactly the losses its conversion
// incurs.
func (r natsResource) YAML(t testing.TB) string {
	t.Helper()
	broker := r.Broker
	if broker == "" {
		broker = natsAddr
	}
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: connector.weida.dev/v1alpha1\nkind: Connector\nmetadata:\n  name: %s\nspec:\n", r.Name)
	fmt.Fprintf(&b, "  protocol: nats\n  direction: %s\n", r.Direction)
	scheme := "nats"
	if r.TLS != nil {
		scheme = "tls"
	}
	fmt.Fprintf(&b, "  broker:\n    url: %s://%s\n    clientID: %s-%s\n", scheme, broker, r.Name, unique())
	b.WriteString(r.TLS.yaml())
	if r.TokenFile != "" {
		fmt.Fprintf(&b, "    credentials:\n      token: {file: %s}\n", r.TokenFile)
	}
	if r.QueueGroup != "" || r.Stream != "" {
		b.WriteString("    nats:\n")
		if r.QueueGroup != "" {
			fmt.Fprintf(&b, "      queueGroup: %s\n", r.QueueGroup)
		}
		if r.Stream != "" {
			fmt.Fprintf(&b, "      jetstream:\n        stream: %s\n", r.Stream)
			if r.Durable != "" {
				fmt.Fprintf(&b, "        durable: %s\n", r.Durable)
			}
		}
	}
	if r.Direction == policy.Inbound {
		fmt.Fprintf(&b, "  weida:\n    listen: %s\n", r.Endpoint)
	} else {
		fmt.Fprintf(&b, "  weida:\n    dial: %s\n", r.Endpoint)
	}
	if r.LastValue != "" {
		b.WriteString("  lastValue:\n")
		for line := range strings.SplitSeq(r.LastValue, "\n") {
			fmt.Fprintf(&b, "    %s\n", line)
		}
	}
	p := r.Policy
	if p == nil {
		p = policy.NATSTokensV1()
	}
	fmt.Fprintf(&b, "  conversion:\n    policy: %s\n    losses:\n", p.Name())
	for _, l := range p.Losses(r.Direction, policy.Options{JetStream: r.Stream != "", LastValue: r.LastValue != ""}) {
		fmt.Fprintf(&b, "      - %s\n", l)
	}
	if r.Hold {
		b.WriteString("  delivery:\n    whenNoSubscriber: hold\n")
	}
	b.WriteString("  routes:\n")
	for _, f := range r.Routes {
		fmt.Fprintf(&b, "    - filter: %q\n", f)
	}
	if r.InFlight != 0 {
		fmt.Fprintf(&b, "  limits:\n    inFlight: %d\n", r.InFlight)
	}
	return b.String()
}

// natsConn connects a plain nats.go client to addr, closed when the test
// ends.
func natsConn(t testing.TB, addr string, opts ...natsgo.Option) *natsgo.Conn {
	t.Helper()
	nc, err := natsgo.Connect("nats://"+addr, opts...)
	if err != nil {
		t.Fatalf("connecting to nats-server %s: %v", addr, err)
	}
	t.Cleanup(nc.Close)
	return nc
}

// natsCollector subscribes directly on nats-server and keeps every message.
type natsCollector struct {
	mu   sync.Mutex
	msgs []*natsgo.Msg
}

func collectNATS(t testing.TB, nc *natsgo.Conn, filter string) *natsCollector {
	t.Helper()
	c := &natsCollector{}
	if _, err := nc.Subscribe(filter, func(m *natsgo.Msg) {
		c.mu.Lock()
		c.msgs = append(c.msgs, m)
		c.mu.Unlock()
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	return c
}

func (c *natsCollector) Messages() []*natsgo.Msg {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]*natsgo.Msg(nil), c.msgs...)
}

func (c *natsCollector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// createStream makes a file-backed stream capturing subjects on nc's
// server and deletes it when the test ends.
func createStream(t testing.TB, nc *natsgo.Conn, name string, subjects ...string) jetstream.JetStream {
	t.Helper()
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateStream(c, jetstream.StreamConfig{Name: name, Subjects: subjects, Storage: jetstream.FileStorage, MaxAge: time.Hour}); err != nil {
		t.Fatalf("creating stream %s: %v", name, err)
	}
	t.Cleanup(func() {
		c, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = js.DeleteStream(c, name)
	})
	return js
}
