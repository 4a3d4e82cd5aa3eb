package e2e

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/policy"
)

// rabbitAddr is the loopback RabbitMQ that scripts/brokers starts.
const rabbitAddr = "127.0.0.1:5672"

// amqpEnv gives `connector run` the password the resources refer to.
var amqpEnv = []string{"AMQP_PASSWORD=guest"}

// amqpResource describes one AMQP Connector resource for a test; YAML
// renders it.
type amqpResource struct {
	Name      string
	Direction policy.Direction
	Broker    string // host:port; empty means rabbitAddr
	VHost     string // the URL's path after "/", escaped; empty means the default vhost
	Exchange  string // empty means amq.topic
	// ExchangePassive uses Exchange as it exists instead of declaring it.
	ExchangePassive bool
	// Queue, inbound only: empty Name asks the broker to name one.
	QueueName string
	Durable   bool
	Exclusive *bool // nil: the default
	Prefetch  int   // zero: the default
	// Endpoint is the weida URL: listen (inbound) or dial (outbound).
	Endpoint string
	Routes   []amqpRoute
	InFlight int        // zero: the default
	TLS      *brokerPKI // set: amqps:// with the PKI's CA and client certificate
	Hold     bool       // spec.delivery.whenNoSubscriber: hold
}

type amqpRoute struct{ Name, Filter string }

// YAML renders the resource, declaring exactly the losses its policy incurs.
func (r amqpResource) YAML(t testing.TB) string {
	t.Helper()
	broker := r.Broker
	if broker == "" {
		broker = rabbitAddr
	}
	p := policy.AMQPWordsV1()
	var b strings.Builder
	fmt.Fprintf(&b, "apiVersion: connector.weida.dev/v1alpha1\nkind: Connector\nmetadata:\n  name: %s\nspec:\n", r.Name)
	fmt.Fprintf(&b, "  protocol: amqp\n  direction: %s\n", r.Direction)
	scheme := "amqp"
	if r.TLS != nil {
		scheme = "amqps"
	}
	fmt.Fprintf(&b, "  broker:\n    url: %s://%s/%s\n    clientID: %s-%s\n", scheme, broker, r.VHost, r.Name, unique())
	b.WriteString(r.TLS.yaml())
	b.WriteString("    credentials:\n      username: guest\n      password: {env: AMQP_PASSWORD}\n")
	b.WriteString("    amqp:\n")
	if r.Exchange != "" {
		fmt.Fprintf(&b, "      exchange: %s\n", r.Exchange)
	}
	if r.ExchangePassive {
		b.WriteString("      exchangePassive: true\n")
	}
	if r.Direction == policy.Inbound {
		b.WriteString("      queue:\n")
		if r.QueueName != "" {
			fmt.Fprintf(&b, "        name: %s\n", r.QueueName)
		}
		fmt.Fprintf(&b, "        durable: %t\n", r.Durable)
		if r.Exclusive != nil {
			fmt.Fprintf(&b, "        exclusive: %t\n", *r.Exclusive)
		}
		if r.Prefetch != 0 {
			fmt.Fprintf(&b, "      prefetch: %d\n", r.Prefetch)
		}
		fmt.Fprintf(&b, "  weida:\n    listen: %s\n", r.Endpoint)
	} else {
		fmt.Fprintf(&b, "  weida:\n    dial: %s\n", r.Endpoint)
	}
	fmt.Fprintf(&b, "  conversion:\n    policy: %s\n    losses:\n", p.Name())
	for _, l := range p.Losses(r.Direction, policy.Options{}) {
		fmt.Fprintf(&b, "      - %s\n", l)
	}
	if r.Hold {
		b.WriteString("  delivery:\n    whenNoSubscriber: hold\n")
	}
	b.WriteString("  routes:\n")
	for _, rt := range r.Routes {
		fmt.Fprintf(&b, "    - filter: %q\n", rt.Filter)
		if rt.Name != "" {
			fmt.Fprintf(&b, "      name: %s\n", rt.Name)
		}
	}
	if r.InFlight != 0 {
		fmt.Fprintf(&b, "  limits:\n    inFlight: %d\n", r.InFlight)
	}
	return b.String()
}

// amqpClient is a plain amqp091 connection with one confirming channel,
// bypassing the connector. It is closed when the test ends.
type amqpClient struct {
	conn *amqp.Connection
	ch   *amqp.Channel
}

func amqpConnect(t testing.TB, addr string) *amqpClient {
	t.Helper()
	return amqpConnectVHost(t, addr, "")
}

// amqpConnectVHost connects to the virtual host the escaped path names.
func amqpConnectVHost(t testing.TB, addr, vhost string) *amqpClient {
	t.Helper()
	if vhost != "" {
		addr += "/" + vhost
	}
	c, err := amqpDial(addr)
	if err != nil {
		t.Fatalf("amqp connect %s: %v", addr, err)
	}
	t.Cleanup(func() { c.conn.Close() })
	return c
}

// amqpDial connects to addr, which may end with a virtual host path
// ("host:port/vhost"; none means the default).
func amqpDial(addr string) (*amqpClient, error) {
	if !strings.Contains(addr, "/") {
		addr += "/"
	}
	conn, err := amqp.Dial("amqp://guest:guest@" + addr)
	if err != nil {
		return nil, err
	}
	ch, err := conn.Channel()
	if err == nil {
		err = ch.Confirm(false)
	}
	if err != nil {
		conn.Close()
		return nil, err
	}
	return &amqpClient{conn: conn, ch: ch}, nil
}

// publish sends one persistent message and waits for its confirm.
func (c *amqpClient) publish(ctx context.Context, exchange, key string, p amqp.Publishing) error {
	p.DeliveryMode = amqp.Persistent
	dc, err := c.ch.PublishWithDeferredConfirmWithContext(ctx, exchange, key, false, false, p)
	if err != nil {
		return err
	}
	ok, err := dc.WaitContext(ctx)
	if err != nil {
		return err
	}
	if !ok {
		return errors.New("the broker nacked the message")
	}
	return nil
}

func (c *amqpClient) mustPublish(t testing.TB, exchange, key, body string) {
	t.Helper()
	if err := c.publish(ctx(t, 10*time.Second), exchange, key, amqp.Publishing{Body: []byte(body)}); err != nil {
		t.Fatalf("publish %q: %v", key, err)
	}
}

// declareExchange declares a durable topic exchange and deletes it when the
// test ends.
func (c *amqpClient) declareExchange(t testing.TB, name string) {
	t.Helper()
	if err := c.ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.ch.ExchangeDelete(name, false, false) })
}

// queueDepth returns a queue's ready messages; -1 when it does not exist.
// It uses a channel of its own, which a missing queue closes.
func (c *amqpClient) queueDepth(name string) int {
	ch, err := c.conn.Channel()
	if err != nil {
		return -1
	}
	defer ch.Close()
	q, err := ch.QueueDeclarePassive(name, true, false, false, false, nil)
	if err != nil {
		return -1
	}
	return q.Messages
}

// deleteQueue deletes a queue when the test ends, on a connection of its own.
func deleteQueueAtEnd(t testing.TB, addr, name string) {
	t.Cleanup(func() {
		c, err := amqpDial(addr)
		if err != nil {
			return
		}
		defer c.conn.Close()
		c.ch.QueueDelete(name, false, false, false)
	})
}

// amqpCollector consumes an exclusive queue bound to an exchange and keeps
// every delivery.
type amqpCollector struct {
	mu   sync.Mutex
	msgs []amqp.Delivery
}

func amqpCollect(t testing.TB, addr, exchange string, keys ...string) *amqpCollector {
	t.Helper()
	c := amqpConnect(t, addr) // addr may end with a virtual host path
	q, err := c.ch.QueueDeclare("", false, true, true, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	for _, k := range keys {
		if err := c.ch.QueueBind(q.Name, k, exchange, false, nil); err != nil {
			t.Fatal(err)
		}
	}
	ds, err := c.ch.Consume(q.Name, "", true, true, false, false, nil)
	if err != nil {
		t.Fatal(err)
	}
	col := &amqpCollector{}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for d := range ds {
			col.mu.Lock()
			col.msgs = append(col.msgs, d)
			col.mu.Unlock()
		}
	}()
	t.Cleanup(func() { c.conn.Close(); <-done })
	return col
}

func (c *amqpCollector) Messages() []amqp.Delivery {
	c.mu.Lock()
	defer c.mu.Unlock()
	return append([]amqp.Delivery(nil), c.msgs...)
}

func (c *amqpCollector) Len() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.msgs)
}

// condition returns the named condition of a resource's status.
func condition(st ResourceStatus, typ string) (status, reason string) {
	for _, c := range st.Conditions {
		if c.Type == typ {
			return c.Status, c.Reason
		}
	}
	return "", ""
}

// settled returns how many messages a resource has finished with: bridged
// or dropped.
func settled(st ResourceStatus) uint64 {
	n := st.Counters.Bridged
	for _, d := range st.Counters.Dropped {
		n += d
	}
	return n
}
