package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// seqPayloads counts, per payload "m-<i>", how often the collector got it.
func seqPayloads(c *weidaCollector) map[string]int {
	seen := map[string]int{}
	for _, m := range c.Messages() {
		seen[string(m.Payload)]++
	}
	return seen
}

func seqName(i int) string { return fmt.Sprintf("m-%04d", i) }

// waitBrokerBack waits until the connector has counted a broker reconnect
// and is ready again.
func waitBrokerBack(t *testing.T, c *Connector, name string) ResourceStatus {
	t.Helper()
	var st ResourceStatus
	Eventually(t, 30*time.Second, "the connector to reconnect to nats-server by itself", func() bool {
		st, _ = c.Status(name)
		return st.Counters.Reconnects >= 1 && st.ready()
	})
	if v := c.Metric(`weida_connector_reconnects_total{resource="` + name + `",side="broker"}`); v < 1 {
		t.Errorf("metric reconnects_total{side=broker} = %v, want ≥ 1", v)
	}
	return st
}

// TestNATSCoreServerRestart kills nats-server mid-stream and starts it
// again. The connector reconnects and subscribes again by itself, and the
// stream resumes; core NATS is at-most-once (the resource declares it), so
// what was published while the connector was not subscribed is lost: the
// test counts that loss, and checks that nothing arrives twice and nothing
// arrives that was not sent.
func TestNATSCoreServerRestart(t *testing.T) {
	srv := brokertest.StartNATS(t)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/core", freePort(t, "udp"))
	res := natsResource{Name: "nats-core-restart", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		Routes: []string{u + ".m.*"}}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "core.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	// The publisher reconnects by itself too, buffering while away.
	pub := natsConn(t, srv.Addr(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	sub.Sync(20*time.Second, "probe", func() { pub.Publish(u+".m.probe", []byte("probe")); pub.Flush() })

	// Half the stream before the kill; after the restart the stream goes on
	// until 100 of its messages have crossed, so that the connector has to
	// come back while messages flow.
	const half = 300
	publishErrs, n := 0, 0
	after := func() int {
		k := 0
		for p := range seqPayloads(sub) {
			if i, err := strconv.Atoi(strings.TrimPrefix(p, "m-")); err == nil && i >= half {
				k++
			}
		}
		return k
	}
	deadline := time.Now().Add(60 * time.Second)
	for ; n < half || after() < 100; n++ {
		if n == half {
			Eventually(t, 20*time.Second, "the first half across", func() bool { return len(seqPayloads(sub)) >= half/2 })
			srv.Kill()
			time.Sleep(300 * time.Millisecond)
			srv.Start()
		}
		if time.Now().After(deadline) {
			t.Fatalf("bridging did not resume within 60 s of the restart; %d sent", n)
		}
		if err := pub.Publish(u+".m."+strconv.Itoa(n%5), []byte(seqName(n))); err != nil {
			publishErrs++
		}
		time.Sleep(time.Millisecond)
	}
	waitBrokerBack(t, c, res.Name)
	// The end of the stream: a marker published after it has arrived.
	Eventually(t, 20*time.Second, "the end marker", func() bool {
		pub.Publish(u+".m.end", []byte("end"))
		pub.Flush()
		time.Sleep(20 * time.Millisecond)
		return sub.hasPayload("end")
	})
	seen := seqPayloads(sub)
	lost, dups := 0, 0
	for i := range n {
		switch k := seen[seqName(i)]; {
		case k == 0:
			lost++
		case k > 1:
			dups += k - 1
		}
	}
	for p := range seen {
		if !strings.HasPrefix(p, "m-") && p != "end" && p != "probe" {
			t.Errorf("unexpected payload %q", p)
		}
	}
	if dups != 0 {
		t.Errorf("%d duplicates: core NATS delivers at most once", dups)
	}
	st, _ := c.Status(res.Name)
	t.Logf("core NATS across a server kill: %d sent (%d refused by the publisher's client), %d lost (declared at-most-once), reconnects %d, status dropped %v",
		n, publishErrs, lost, st.Counters.Reconnects, st.Counters.Dropped)
}

// TestNATSJetStreamServerRestart kills nats-server mid-stream (JetStream
// with a file store) and starts it again: the connector reconnects by
// itself, and every message the stream acknowledged reaches the weida
// subscriber (at least once).
func TestNATSJetStreamServerRestart(t *testing.T) {
	srv := brokertest.StartNATS(t)
	u := unique()
	stream, durable := "RESTART_"+u, "bridge-"+u
	admin := natsConn(t, srv.Addr(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	js := createStream(t, admin, stream, u+".js.>")
	// The operator creates the consumer (a short ack wait, so that what
	// was in flight at the kill comes back quickly); the connector binds
	// it.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, FilterSubject: u + ".js.*",
	}); err != nil {
		t.Fatal(err)
	}
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/js", freePort(t, "udp"))
	res := natsResource{Name: "nats-js-restart", Direction: policy.Inbound, Broker: srv.Addr(), Endpoint: endpoint,
		Stream: stream, Durable: durable, Routes: []string{u + ".js.*"}}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "js.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	// publish retries until the stream acknowledges; the message id makes
	// a retry whose first attempt did land a duplicate the stream drops.
	publish := func(subject, payload, id string) {
		t.Helper()
		deadline := time.Now().Add(30 * time.Second)
		for {
			pctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			_, err := js.Publish(pctx, subject, []byte(payload), jetstream.WithMsgID(id))
			cancel()
			if err == nil {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("the stream did not acknowledge %q within 30 s: %v", payload, err)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	probes := 0
	sub.Sync(20*time.Second, "probe", func() { probes++; publish(u+".js.probe", "probe", fmt.Sprint("probe-", probes)) })

	const n = 600
	for i := range n {
		if i == n/2 {
			Eventually(t, 20*time.Second, "the first half across", func() bool { return len(seqPayloads(sub)) >= n/4 })
			srv.Kill()
			time.Sleep(300 * time.Millisecond)
			srv.Start()
		}
		publish(u+".js."+strconv.Itoa(i%5), seqName(i), seqName(i))
	}
	waitBrokerBack(t, c, res.Name)
	Eventually(t, 60*time.Second, fmt.Sprintf("all %d messages at the weida subscriber", n), func() bool {
		seen := seqPayloads(sub)
		for i := range n {
			if seen[seqName(i)] == 0 {
				return false
			}
		}
		return true
	})
	dups := 0
	for p, k := range seqPayloads(sub) {
		if k > 1 {
			dups += k - 1
		}
		if !strings.HasPrefix(p, "m-") && p != "probe" {
			t.Errorf("unexpected payload %q", p)
		}
	}
	st, _ := c.Status(res.Name)
	t.Logf("JetStream across a server kill: %d sent, 0 lost, %d duplicates (redelivery), reconnects %d", n, dups, st.Counters.Reconnects)
}
