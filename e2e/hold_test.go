package e2e

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

const holdCount = 200

// waitHolding waits until the connector holds a message of name for want
// of a subscriber, and checks it acknowledged and dropped nothing.
func waitHolding(t *testing.T, c *Connector, name string) {
	t.Helper()
	Eventually(t, 30*time.Second, "the connector to hold", func() bool {
		st, _ := c.Status(name)
		return !st.Counters.HoldingSince.IsZero()
	})
	// Give a wrong implementation time to acknowledge into the void.
	time.Sleep(500 * time.Millisecond)
	st, _ := c.Status(name)
	if st.Counters.Acknowledged != 0 || st.Counters.Bridged != 0 || len(st.Counters.Dropped) != 0 {
		t.Fatalf("while nobody subscribed: %+v; want nothing acknowledged, bridged or dropped", st.Counters)
	}
	if v := c.Metric(`weida_connector_holding{resource="` + name + `"}`); v != 1 {
		t.Errorf("weida_connector_holding = %v, want 1", v)
	}
}

// waitAll waits until the collector has every numbered message.
func waitAll(t *testing.T, sub *weidaCollector) {
	t.Helper()
	Eventually(t, 60*time.Second, fmt.Sprintf("all %d messages at the subscriber", holdCount), func() bool {
		return len(seqPayloads(sub)) == holdCount
	})
	seen := seqPayloads(sub)
	for i := range holdCount {
		if seen[seqName(i)] == 0 {
			t.Errorf("%s missing", seqName(i))
		}
	}
}

// TestNATSJetStreamHold: with whenNoSubscriber: hold, messages published
// while no weida subscriber listens stay unacknowledged in the durable
// consumer, and reach the first subscriber, all of them; the ack floor
// reaches the last one only then.
func TestNATSJetStreamHold(t *testing.T) {
	u := unique()
	stream, durable := "HOLD_"+u, "bridge-"+u
	admin := natsConn(t, natsAddr)
	js := createStream(t, admin, stream, u+".h.>")
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: time.Minute, FilterSubject: u + ".h.*",
	})
	if err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/hold", freePort(t, "udp"))
	name := "nats-js-hold"
	res := natsResource{Name: name, Direction: policy.Inbound, Endpoint: endpoint,
		Stream: stream, Durable: durable, Routes: []string{u + ".h.*"}, Hold: true}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "hold.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	for i := range holdCount {
		if _, err := js.Publish(ctx(t, 10*time.Second), u+".h.m", []byte(seqName(i))); err != nil {
			t.Fatal(err)
		}
	}
	waitHolding(t, c, name)
	ackFloor := func() uint64 {
		info, err := cons.Info(ctx(t, 10*time.Second))
		if err != nil {
			t.Fatal(err)
		}
		return info.AckFloor.Stream
	}
	if f := ackFloor(); f != 0 {
		t.Fatalf("ack floor %d while nobody subscribed, want 0", f)
	}

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	waitAll(t, sub)
	Eventually(t, 30*time.Second, "the ack floor to reach the last message", func() bool { return ackFloor() == holdCount })
	st, _ := c.Status(name)
	if st.Counters.Acknowledged != holdCount || st.Counters.Dropped[`no-subscriber`] != 0 || st.Counters.Held < 1 {
		t.Errorf("counters = %+v", st.Counters)
	}
}

// TestAMQPDurableQueueHold: the same with a durable AMQP queue: nothing is
// acknowledged while nobody listens, and every message reaches the first
// subscriber.
func TestAMQPDurableQueueHold(t *testing.T) {
	u := unique()
	queue := "hold-" + u
	deleteQueueAtEnd(t, rabbitAddr, queue)
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/hold", freePort(t, "udp"))
	name := "amqp-hold"
	exclusive := false
	res := amqpResource{Name: name, Direction: policy.Inbound, Endpoint: endpoint, QueueName: queue, Durable: true,
		Exclusive: &exclusive, Routes: []amqpRoute{{Filter: u + ".h.*"}}, Hold: true}
	c := StartConnector(t, amqpEnv, "-f", writeFile(t, t.TempDir(), "hold.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	pub := amqpConnect(t, rabbitAddr)
	for i := range holdCount {
		pub.mustPublish(t, "amq.topic", u+".h.m", seqName(i))
	}
	waitHolding(t, c, name)

	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	waitAll(t, sub)
	Eventually(t, 30*time.Second, "every message acknowledged", func() bool {
		st, _ := c.Status(name)
		return st.Counters.Acknowledged == holdCount && pub.queueDepth(queue) == 0
	})
	st, _ := c.Status(name)
	if st.Counters.Dropped[`no-subscriber`] != 0 || st.Counters.Held < 1 {
		t.Errorf("counters = %+v", st.Counters)
	}
}
