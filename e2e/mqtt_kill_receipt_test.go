package e2e

import (
	"context"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestMQTTKillAwaitReceipt SIGKILLs a connector bridging an MQTT QoS 1
// persistent session to weida, several times under steady traffic, and
// restarts it; a weida subscriber reconnects each time. With
// spec.delivery.acknowledge: received the broker is acknowledged only
// once a copy was received by the subscriber's QUIC stack, so nothing is
// lost: what the killed process had in hand the broker delivers again
// (duplicates, which QoS 1 allows, are counted). The same run with
// acknowledge: queued may lose the copies queued at the moment of the
// kill: logged, not asserted, as it is rare. Both hold while nobody
// subscribes (whenNoSubscriber: hold), so that the moments between a
// restart and the subscriber's return lose nothing either.
func TestMQTTKillAwaitReceipt(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	for _, ack := range []string{"received", "queued"} {
		t.Run(ack, func(t *testing.T) {
			r := runKillUnderTraffic(t, broker.Addr(), ack, killRunKills, killRunRate)
			t.Logf("acknowledge: %s: %d sent, %d lost, %d duplicated over %d kills", ack, r.sent, r.lost, r.dups, len(r.perKill))
			for i, k := range r.perKill {
				t.Logf("  kill %d: lost %d, duplicated %d", i+1, k.lost, k.dups)
			}
			if len(r.lostSample) > 0 {
				t.Logf("  lost, first ones: %v", r.lostSample)
			}
			if ack == "received" && r.lost > 0 {
				t.Errorf("acknowledge: received lost %d of %d messages across %d kills; want 0", r.lost, r.sent, len(r.perKill))
			}
		})
	}
}

const (
	killRunKills = 4
	killRunRate  = 200 // messages per second
)

type killTally struct{ lost, dups int }

type killRunResult struct {
	sent, lost, dups int
	perKill          []killTally
	lostSample       []int
}

// runKillUnderTraffic publishes rate QoS 1 messages a second to the broker
// at addr for (kills+1) × 3 s while killing and restarting the connector
// kills times, then accounts for every message at the weida subscriber:
// each lost or duplicated one is charged to the kill nearest to when it was
// sent.
func runKillUnderTraffic(t *testing.T, addr, ack string, kills, rate int) killRunResult {
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/kill", freePort(t, "udp"))
	res := mqttResource{
		Name: "kill-" + ack, Direction: policy.Inbound, QoS: 1, Broker: addr,
		Endpoint: endpoint, SessionExpiry: "300s", Hold: true, Acknowledge: ack,
		Routes: []mqttRoute{{"all", u + "/#"}},
	}
	lives := startLives(t, nil, res.Name, "-f", writeFile(t, t.TempDir(), "kill.yaml", res.YAML(t)), "--state-dir", t.TempDir())
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	probe := &resilientPublisher{t: t, addr: addr, id: "probe-" + u}
	sub.Sync(20*time.Second, "probe", func() { probe.publish(u+"/probe", "probe") })

	period := 3 * time.Second
	n := rate * int(period/time.Second) * (kills + 1)
	sentAt := make([]time.Time, n)
	var sent atomic.Int64
	stop := make(chan struct{})
	senderDone := make(chan error, 1)
	go func() { senderDone <- sendSteadily(addr, "pub-"+u, u, n, rate, sentAt, &sent, stop) }()
	t.Cleanup(func() {
		select {
		case <-stop:
		default:
			close(stop)
		}
	})

	var killedAt []time.Time
	start := time.Now()
	for k := 1; k <= kills; k++ {
		time.Sleep(time.Until(start.Add(time.Duration(k) * period)))
		before := sent.Load()
		lives.kill()
		killedAt = append(killedAt, lives.killedAt)
		t.Logf("kill %d at message %d; restarted and ready %.1f s later", k, before, time.Since(lives.killedAt).Seconds())
	}
	if err := <-senderDone; err != nil {
		t.Fatalf("publishing: %v", err)
	}

	count := func() map[int]int {
		seen := make(map[int]int)
		for _, m := range sub.Messages() {
			if i, err := strconv.Atoi(strings.TrimPrefix(string(m.Payload), "m-")); err == nil && strings.HasPrefix(string(m.Payload), "m-") {
				seen[i]++
			}
		}
		return seen
	}
	// received: everything arrives, however long the redeliveries take.
	// queued: what is missing after the traffic has settled is lost.
	wait := 60 * time.Second
	if ack == "queued" {
		wait = 15 * time.Second
	}
	deadline := time.Now().Add(wait)
	for time.Now().Before(deadline) && len(count()) < n {
		time.Sleep(100 * time.Millisecond)
	}
	nearest := func(at time.Time) int {
		best := 0
		for k, kt := range killedAt {
			if at.Sub(kt).Abs() < at.Sub(killedAt[best]).Abs() {
				best = k
			}
		}
		return best
	}
	r := killRunResult{sent: n, perKill: make([]killTally, len(killedAt))}
	seen := count()
	for i := range n {
		k := nearest(sentAt[i])
		switch c := seen[i]; {
		case c == 0:
			r.lost++
			r.perKill[k].lost++
			if len(r.lostSample) < 20 {
				r.lostSample = append(r.lostSample, i)
			}
		case c > 1:
			r.dups += c - 1
			r.perKill[k].dups += c - 1
		}
	}
	sort.Ints(r.lostSample)
	return r
}

// sendSteadily publishes n QoS 1 messages "m-<i>" on topics under prefix
// at rate a second, from a client of its own that reconnects and
// republishes until the broker acknowledges each: what it returns from,
// the broker took. It records when each was sent and how many were.
func sendSteadily(addr, id, prefix string, n, rate int, sentAt []time.Time, sent *atomic.Int64, stop <-chan struct{}) error {
	var c *mqttClient
	defer func() {
		if c != nil {
			c.close()
		}
	}()
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		select {
		case <-tick.C:
		case <-stop:
			return fmt.Errorf("stopped at message %d", i)
		}
		deadline := time.Now().Add(30 * time.Second)
		for {
			if c == nil {
				dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				c, _ = mqttDial(dctx, addr, id, func(mqttMsg) {})
				cancel()
			}
			if c != nil {
				pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				resp, err := c.Publish(pctx, &paho.Publish{Topic: fmt.Sprintf("%s/m/%d", prefix, i%7), QoS: 1, Payload: []byte(fmt.Sprintf("m-%d", i))})
				cancel()
				if err == nil && (resp == nil || resp.ReasonCode < 0x80) {
					break
				}
				c.close()
				c = nil
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("message %d not taken by the broker within 30 s", i)
			}
			time.Sleep(20 * time.Millisecond)
		}
		sentAt[i] = time.Now()
		sent.Add(1)
	}
	return nil
}
