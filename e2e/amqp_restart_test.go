package e2e

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// reliablePublisher publishes persistent messages with confirms, redialling
// and publishing again whatever was not confirmed, so that every message is
// on the broker at least once even across broker restarts.
type reliablePublisher struct {
	addr   string
	client *amqpClient
}

func (p *reliablePublisher) publish(ctx context.Context, exchange, key, body string) error {
	for {
		if p.client == nil {
			c, err := amqpDial(p.addr)
			if err == nil {
				p.client = c
			}
		}
		if p.client != nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := p.client.publish(pctx, exchange, key, amqp.Publishing{Body: []byte(body)})
			cancel()
			if err == nil {
				return nil
			}
			p.client.conn.Close()
			p.client = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *reliablePublisher) close() {
	if p.client != nil {
		p.client.conn.Close()
	}
}

// missing returns the payloads of want that col has not received.
func missing(col *weidaCollector, want []string) []string {
	have := map[string]bool{}
	for _, m := range col.Messages() {
		have[string(m.Payload)] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}

// TestAMQPBrokerRestartLosesNothing runs an inbound resource on a durable
// queue of a private RabbitMQ and restarts the broker twice:
//
//  1. mid-stream, with the connector running: it notices, reports the
//     broker down, reconnects by itself, declares and binds again and
//     resumes; every message published (with confirms, persistent) arrives
//     at the weida subscriber, the ones unacknowledged at the restart
//     redelivered from the queue;
//  2. with the connector stopped: what is published meanwhile waits in the
//     durable queue across the broker restart, and a connector started
//     while the broker is still down connects once it is back and delivers
//     all of it.
func TestAMQPBrokerRestartLosesNothing(t *testing.T) {
	rb := brokertest.StartRabbit(t)
	u := unique()
	queue := "e2e-restart-" + u
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/restart", freePort(t, "udp"))
	res := amqpResource{
		Name: "amqp-restart", Direction: policy.Inbound, Broker: rb.Addr(),
		QueueName: queue, Durable: true, Prefetch: 16, Endpoint: endpoint,
		Routes: []amqpRoute{{"stream", "stream.#"}},
	}
	file := writeFile(t, t.TempDir(), "restart.yaml", res.YAML(t))
	c := StartConnector(t, amqpEnv, "-f", file)
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := &reliablePublisher{addr: rb.Addr()}
	defer pub.close()
	sub.Sync(20*time.Second, "probe-"+u, func() {
		if err := pub.publish(ctx(t, 10*time.Second), "amq.topic", "stream.probe", "probe-"+u); err != nil {
			t.Fatal(err)
		}
	})

	// 1. Mid-stream: the publisher keeps going until told to stop, before,
	// during and after the restart.
	var (
		mu        sync.Mutex
		want      []string
		stopPub   = make(chan struct{})
		pubDone   = make(chan error, 1)
		confirmed = func() int { mu.Lock(); defer mu.Unlock(); return len(want) }
	)
	go func() {
		pctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				pubDone <- nil
				return
			default:
			}
			body := fmt.Sprintf("s-%05d", i)
			if err := pub.publish(pctx, "amq.topic", fmt.Sprintf("stream.%d", i), body); err != nil {
				pubDone <- fmt.Errorf("publishing %s: %w", body, err)
				return
			}
			mu.Lock()
			want = append(want, body)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	Eventually(t, 30*time.Second, "60 confirmed messages", func() bool { return confirmed() >= 60 })
	rb.Stop()
	Eventually(t, 30*time.Second, "the connector to report the broker down", func() bool {
		st, _ := c.Status("amqp-restart")
		s, _ := condition(st, "BrokerConnected")
		return s == "False"
	})
	atRestart := confirmed()
	rb.Start()
	c.WaitReady(60 * time.Second)
	Eventually(t, 60*time.Second, "60 more confirmed messages after the restart", func() bool { return confirmed() >= atRestart+60 })
	close(stopPub)
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := len(want)
	mu.Unlock()
	Eventually(t, 60*time.Second, fmt.Sprintf("all %d streamed messages at the weida subscriber", n), func() bool { return len(missing(sub, want)) == 0 })
	st, _ := c.Status("amqp-restart")
	if st.Counters.Reconnects < 1 {
		t.Errorf("status reconnects = %d, want ≥ 1", st.Counters.Reconnects)
	}
	if s, reason := condition(st, "BrokerConnected"); s != "True" {
		t.Errorf("BrokerConnected = %s (%s) after the restart", s, reason)
	}
	if dup := sub.Len() - n; dup > 0 {
		t.Logf("%d messages arrived twice: unacknowledged at the restart, redelivered (at-least-once)", dup)
	}

	// 2. Connector away, broker restarted.
	if code := c.Stop(); code != 0 {
		t.Fatalf("connector exit code %d after SIGTERM", code)
	}
	var held []string
	for i := range 100 {
		body := fmt.Sprintf("h-%03d", i)
		held = append(held, body)
		if err := pub.publish(ctx(t, 30*time.Second), "amq.topic", "stream.held", body); err != nil {
			t.Fatal(err)
		}
	}
	pub.close()
	pub.client = nil
	rb.Stop()
	c2 := StartConnector(t, amqpEnv, "-f", file)
	// The endpoint is hosted while the broker is down; the collector
	// re-dials it by itself.
	Eventually(t, 30*time.Second, "the weida subscriber back on the new connector", func() bool {
		st, ok := c2.Status("amqp-restart")
		return ok && st.Counters.Subscribers >= 1
	})
	st2, _ := c2.Status("amqp-restart")
	if s, reason := condition(st2, "BrokerConnected"); s == "True" {
		t.Fatalf("BrokerConnected True (%s) while the broker is down", reason)
	}
	rb.Start()
	c2.WaitReady(60 * time.Second)
	Eventually(t, 60*time.Second, "every held message at the weida subscriber", func() bool { return len(missing(sub, held)) == 0 })
	if !strings.Contains(c2.StatusJSON(), "durable queue") {
		t.Errorf("status does not describe the durable queue:\n%s", c2.StatusJSON())
	}
}
