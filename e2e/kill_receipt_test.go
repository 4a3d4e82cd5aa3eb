package e2e

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/weida"
)

// TestKillAwaitReceipt SIGKILLs a connector bridging a durable source to
// weida (MQTT QoS 1 persistent session, JetStream durable consumer, AMQP
// durable queue: the chaos suite's durable modes), several times under
// steady traffic, and restarts it; a weida subscriber reconnects each
// time. With spec.delivery.acknowledge: received the broker is
// acknowledged only once a copy was received by the subscriber's QUIC
// stack, so nothing is lost: what the killed process had in hand the
// broker delivers again (duplicates are counted, per kill). The same run
// with acknowledge: queued may lose the copies queued at the moment of a
// kill: logged, not asserted, as it is rare. Both hold while nobody
// subscribes (whenNoSubscriber: hold), so that the moments between a
// restart and the subscriber's return lose nothing either.
func TestKillAwaitReceipt(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	requireTCP(t, "NATS", natsAddr)
	requireTCP(t, "RabbitMQ", rabbitAddr)
	for _, mode := range []string{"mqtt-qos1", "nats-jetstream", "amqp-durable"} {
		for _, ack := range []string{"received", "queued"} {
			t.Run(mode+"/"+ack, func(t *testing.T) {
				r := runKillUnderTraffic(t, haMode(t, mode), ack, killRunKills, killRunRate)
				t.Logf("%s, acknowledge: %s: %d sent, %d lost, %d duplicated over %d kills", mode, ack, r.sent, r.lost, r.dups, len(r.perKill))
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

// runKillUnderTraffic sends rate messages a second into the broker of
// mode m for (kills+1) × 3 s while killing and restarting the connector
// kills times, then accounts for every message at the weida subscriber:
// each lost or duplicated one is charged to the kill nearest to when it was
// sent.
func runKillUnderTraffic(t *testing.T, m chaosMode, ack string, kills, rate int) killRunResult {
	u := unique()
	prefix := u + "-"
	name := "kill-" + u
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/kill", freePort(t, "udp"))
	if m.name == "amqp-durable" {
		deleteQueueAtEnd(t, rabbitAddr, "chaos-"+u)
	}
	yaml, send, _ := m.inbound(t, loopbackBroker(brokerFor(m)), u, name, endpoint, func(string, string) {})
	yaml = withAcknowledge(t, yaml, ack)
	lives := startLives(t, amqpEnv, name, "-f", writeFile(t, t.TempDir(), "kill.yaml", yaml), "--state-dir", t.TempDir())
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	sub.Sync(20*time.Second, prefix+"probe", func() { send(prefix + "probe") })

	period := 3 * time.Second
	n := rate * int(period/time.Second) * (kills + 1)
	sentAt := make([]time.Time, n)
	var sent atomic.Int64
	stop := make(chan struct{})
	senderDone := make(chan error, 1)
	go func() { senderDone <- sendSteadily(send, prefix, n, rate, sentAt, &sent, stop) }()
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
			rest, ok := strings.CutPrefix(string(m.Payload), prefix)
			if i, err := strconv.Atoi(rest); ok && err == nil {
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

// sendSteadily sends n messages "<prefix><i>" through send, which retries
// until the broker takes each (false: it did not within its bound), at
// rate a second. It records when each was sent and how many were.
func sendSteadily(send func(string) bool, prefix string, n, rate int, sentAt []time.Time, sent *atomic.Int64, stop <-chan struct{}) error {
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	for i := range n {
		select {
		case <-tick.C:
		case <-stop:
			return fmt.Errorf("stopped at message %d", i)
		}
		if !send(prefix + strconv.Itoa(i)) {
			return fmt.Errorf("message %d not taken by the broker", i)
		}
		sentAt[i] = time.Now()
		sent.Add(1)
	}
	return nil
}

// withAcknowledge sets spec.delivery.acknowledge in a durable resource
// (one that holds while nobody subscribes) made by a chaosMode.
func withAcknowledge(t *testing.T, yaml, ack string) string {
	t.Helper()
	const hold = "  delivery:\n    whenNoSubscriber: hold\n"
	if !strings.Contains(yaml, hold) {
		t.Fatalf("no %q in the durable resource:\n%s", hold, yaml)
	}
	return strings.Replace(yaml, hold, hold+"    acknowledge: "+ack+"\n", 1)
}
