package e2e

import (
	"context"
	"fmt"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestOutboundFailsOver: an outbound NATS resource lists two addresses of
// one weida endpoint (two listeners on loopback sharing an identity, as
// replicas do). It subscribes at the first; once that one closes, the
// connector dials the second, subscribes with the same filter and pin, and
// messages published there reach nats-server again. /status names the
// address that answered.
func TestOutboundFailsOver(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	path := "/" + u
	// One certificate for both: replicas of an endpoint share its identity.
	certFile, keyFile, _ := weidaCert(t, t.TempDir())
	replica := func(addr string) (*weida.Listener, *weida.Publisher, string) {
		l, err := weida.Listen(context.Background(), addr, weida.ListenConfig{CertFile: certFile, KeyFile: keyFile})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { l.Close() })
		pub, err := l.Publisher(path)
		if err != nil {
			t.Fatal(err)
		}
		return l, pub, "weida://" + l.Fingerprint() + "@" + l.Addr().String() + path
	}
	la, pa, urlA := replica("127.0.0.1:0")
	// The second replica listens only once the connector has subscribed
	// at the first, as a standby taking over would; its address (and the
	// shared certificate's pin) is in the resource from the start.
	addrB := fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp"))
	urlB := "weida://" + la.Fingerprint() + "@" + addrB + path

	res := natsResource{Name: "nats-failover", Direction: policy.Outbound, Endpoint: urlA, Routes: []string{u + ".orders.*"}}
	yaml := res.YAML(t)
	dial := "    dial: " + urlA + "\n"
	if !strings.Contains(yaml, dial) {
		t.Fatalf("the resource has no dial line:\n%s", yaml)
	}
	yaml = strings.Replace(yaml, dial, dial+"    failover:\n      - "+urlB+"\n", 1)
	file := writeFile(t, t.TempDir(), "out.yaml", yaml)
	nc := natsConn(t, natsAddr)
	got := collectNATS(t, nc, u+".>")
	c := StartConnector(t, nil, "-f", file, "--instance", "e2e-"+u)
	c.WaitReady(30 * time.Second)

	// deliver publishes on pub until one copy reaches nats-server: the
	// SUBSCRIBE may not be in force when the connection is.
	deliver := func(pub *weida.Publisher, payload string) {
		t.Helper()
		waitSubscribers(t, pub, 1, 30*time.Second)
		Eventually(t, 30*time.Second, payload+" on nats-server", func() bool {
			if _, err := pub.Publish(ctx(t, 5*time.Second), weida.Message{Topic: u + ".orders.x", Payload: []byte(payload)}); err != nil {
				t.Fatal(err)
			}
			time.Sleep(50 * time.Millisecond)
			for _, m := range got.Messages() {
				if string(m.Data) == payload {
					return true
				}
			}
			return false
		})
	}
	subscribedOn := func(url string) bool {
		s, ok := c.Status(res.Name)
		if !ok {
			return false
		}
		for _, cond := range s.Conditions {
			if cond.Type == "WeidaReady" && cond.Status == "True" && strings.HasSuffix(cond.Message, " on "+url) {
				return true
			}
		}
		return false
	}

	deliver(pa, "via-first")
	if !subscribedOn(urlA) {
		t.Errorf("/status does not name the first address as dialled:\n%s", c.StatusJSON())
	}
	_, pb, urlB2 := replica(addrB)
	if urlB2 != urlB {
		t.Fatalf("the second replica is at %s, not %s", urlB2, urlB)
	}

	// The first replica goes away; the connector moves to the second.
	if err := la.Close(); err != nil {
		t.Fatal(err)
	}
	deliver(pb, "via-second")
	Eventually(t, 10*time.Second, "/status naming the second address", func() bool { return subscribedOn(urlB) })
	if s, _ := c.Status(res.Name); s.Counters.Reconnects == 0 {
		t.Errorf("no reconnect counted after the failover:\n%s", c.StatusJSON())
	}
}
