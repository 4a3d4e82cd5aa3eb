package e2e

import (
	"encoding/json"
	"fmt"
	"maps"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// haPlacement is the placement part of a resource in /status.
type haPlacement struct {
	Name      string `json:"name"`
	Placement *struct {
		Role     string   `json:"role"`
		Holder   string   `json:"holder"`
		Epoch    uint64   `json:"epoch"`
		Standbys []string `json:"standbys"`
	} `json:"placement"`
	Conditions []struct{ Type, Status, Reason, Message string } `json:"conditions"`
}

// haReplica is one `connector run --placement etcd` process.
type haReplica struct {
	id string
	c  *Connector
}

// placements returns what the replica says of every resource, by name;
// nil when it does not answer.
func (r *haReplica) placements() map[string]haPlacement {
	var all struct {
		Resources []haPlacement `json:"resources"`
	}
	if err := json.Unmarshal([]byte(r.c.StatusJSON()), &all); err != nil {
		return nil
	}
	out := make(map[string]haPlacement)
	for _, p := range all.Resources {
		out[p.Name] = p
	}
	return out
}

// runsHere reports whether the replica runs the resource: it holds the
// lease and the resource is up on both sides.
func (p haPlacement) runsHere() bool {
	if p.Placement == nil || p.Placement.Role != "holder" {
		return false
	}
	for _, c := range p.Conditions {
		if c.Type == "Ready" {
			return c.Status == "True"
		}
	}
	return false
}

// haCluster is the replicas of one test and the resources they share.
type haCluster struct {
	t        *testing.T
	args     []string
	replicas []*haReplica
	names    []string
	next     int
}

func (h *haCluster) start() *haReplica {
	id := fmt.Sprintf("r%d", h.next)
	h.next++
	r := &haReplica{id: id, c: StartConnector(h.t, amqpEnv, append(slices.Clone(h.args), "--replica-id", id)...)}
	h.replicas = append(h.replicas, r)
	// The binary is built with -race: a replica that saw a data race says
	// so in its output, even one that was killed later.
	h.t.Cleanup(func() {
		if out := r.c.Output(); strings.Contains(out, "DATA RACE") {
			h.t.Errorf("replica %s reported a data race:\n%s", id, out)
		}
	})
	return r
}

// holders returns, for every resource, the replicas that run it, sampling
// each replica once.
func (h *haCluster) holders() map[string][]string {
	out := make(map[string][]string)
	for _, r := range h.replicas {
		for name, p := range r.placements() {
			if p.Placement != nil && p.Placement.Role == "holder" {
				out[name] = append(out[name], r.id)
			}
		}
	}
	return out
}

// waitSpread waits until every resource runs on exactly one replica and
// none holds more than its share.
func (h *haCluster) waitSpread(d time.Duration) {
	h.t.Helper()
	share := (len(h.names) + len(h.replicas) - 1) / len(h.replicas)
	Eventually(h.t, d, "every resource running on one replica, spread evenly", func() bool {
		per := make(map[string]int)
		for _, r := range h.replicas {
			ps := r.placements()
			for _, name := range h.names {
				if ps[name].runsHere() {
					per[r.id]++
				}
			}
		}
		total := 0
		for _, r := range h.replicas {
			if per[r.id] > share {
				return false
			}
			total += per[r.id]
		}
		hs := h.holders()
		for _, name := range h.names {
			if len(hs[name]) != 1 {
				return false
			}
		}
		return total == len(h.names)
	})
}

func (h *haCluster) replica(id string) *haReplica {
	for _, r := range h.replicas {
		if r.id == id {
			return r
		}
	}
	h.t.Fatalf("no replica %s", id)
	return nil
}

func (h *haCluster) remove(r *haReplica) {
	h.replicas = slices.DeleteFunc(h.replicas, func(x *haReplica) bool { return x == r })
}

// haFailoverBound is the documented bound with the default timing (lease
// 5 s, retry 1 s): the lease expires at most 5 s after the holder's last
// renewal, a standby takes it within a retry period and starts the
// resource; the margin covers a loaded test machine.
const haFailoverBound = 10 * time.Second

// TestHAPlacementByLease: three replicas of the connector (three processes)
// share six inbound resources (MQTT QoS 1 sessions, NATS, AMQP durable
// queues) through leases on a real three-member etcd cluster. Every
// resource runs on exactly one replica, two per replica, at every sampled
// instant. Then the holder of a resource of each protocol is SIGKILLed in
// turn: a survivor runs it within the bound. Last, SIGTERM hands a
// resource over within about a retry period, without waiting for the lease
// to expire. Killing one etcd member moves nothing; stopping the whole
// cluster stops every holder within the renew deadline, and they resume
// when it returns.
func TestHAPlacementByLease(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	requireTCP(t, "NATS", natsAddr)
	requireTCP(t, "RabbitMQ", rabbitAddr)
	etcd := brokertest.StartEtcdCluster(t)
	u := unique()
	dir := t.TempDir()
	endpoint := func(path string) string {
		return fmt.Sprintf("weida://127.0.0.1:%d/%s", freePort(t, "udp"), path)
	}
	var names []string
	for _, s := range []string{"a", "b"} {
		m := mqttResource{Name: "ha-mqtt-" + s, Direction: policy.Inbound, QoS: 1, Endpoint: endpoint("mqtt-" + s),
			Routes: []mqttRoute{{"r", u + "/" + s + "/#"}}}
		n := natsResource{Name: "ha-nats-" + s, Direction: policy.Inbound, Endpoint: endpoint("nats-" + s),
			Routes: []string{u + "." + s + ".*"}}
		queue := "ha-" + u + "-" + s
		deleteQueueAtEnd(t, rabbitAddr, queue)
		a := amqpResource{Name: "ha-amqp-" + s, Direction: policy.Inbound, QueueName: queue, Durable: true,
			Endpoint: endpoint("amqp-" + s), Routes: []amqpRoute{{"r", u + "." + s + ".#"}}}
		writeFile(t, dir, m.Name+".yaml", m.YAML(t))
		writeFile(t, dir, n.Name+".yaml", n.YAML(t))
		writeFile(t, dir, a.Name+".yaml", a.YAML(t))
		names = append(names, m.Name, n.Name, a.Name)
	}
	slices.Sort(names)
	h := &haCluster{t: t, names: names, args: []string{"-f", dir, "--placement", "etcd",
		"--etcd-endpoints", etcd.Endpoints(), "--etcd-prefix", "/" + u + "/"}}
	for range 3 {
		h.start()
	}
	h.waitSpread(60 * time.Second)

	// At every sampled instant each resource runs on at most one replica
	// (and, at steady state, on exactly one).
	for i := range 20 {
		hs := h.holders()
		for _, name := range names {
			if len(hs[name]) != 1 {
				t.Fatalf("sample %d: %s runs on %v", i, name, hs[name])
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	for _, r := range h.replicas {
		if n := r.c.Metric("weida_connector_lease_held{"); n < 0 {
			t.Errorf("replica %s exports no weida_connector_lease_held", r.id)
		}
	}

	var took []time.Duration
	for _, victim := range []string{"ha-mqtt-a", "ha-nats-a", "ha-amqp-a"} {
		holder := h.holders()[victim][0]
		r := h.replica(holder)
		r.c.Signal(syscall.SIGKILL)
		killed := time.Now()
		if _, ok := r.c.Wait(10 * time.Second); !ok {
			t.Fatalf("replica %s did not die of SIGKILL", holder)
		}
		h.remove(r)
		Eventually(t, 30*time.Second, victim+" running on a survivor", func() bool {
			for _, s := range h.replicas {
				if s.placements()[victim].runsHere() {
					return true
				}
			}
			return false
		})
		d := time.Since(killed)
		took = append(took, d)
		t.Logf("SIGKILL of %s (holder of %s): running on a survivor after %s", holder, victim, d.Round(10*time.Millisecond))
		if d > haFailoverBound {
			t.Errorf("%s took %s to fail over; the bound is %s", victim, d, haFailoverBound)
		}
		h.start()
		h.waitSpread(60 * time.Second)
	}

	// SIGTERM: the holder stops the resource and releases its lease at
	// once, so a survivor takes it within a retry period or two.
	victim := "ha-nats-b"
	holder := h.holders()[victim][0]
	r := h.replica(holder)
	r.c.Signal(syscall.SIGTERM)
	termed := time.Now()
	Eventually(t, 30*time.Second, victim+" running on a survivor after SIGTERM", func() bool {
		for _, s := range h.replicas {
			if s != r && s.placements()[victim].runsHere() {
				return true
			}
		}
		return false
	})
	d := time.Since(termed)
	t.Logf("SIGTERM of %s (holder of %s): running on a survivor after %s", holder, victim, d.Round(10*time.Millisecond))
	if code, ok := r.c.Wait(20 * time.Second); !ok || code != 0 {
		t.Errorf("replica %s exited with %d (exited: %v) after SIGTERM", holder, code, ok)
	}
	if !strings.Contains(r.c.Output(), "lease released") {
		t.Errorf("replica %s did not log releasing its leases:\n%s", holder, r.c.Output())
	}
	if d > 4*time.Second {
		t.Errorf("a SIGTERM handover took %s: leases must be released at once, not left to expire", d)
	}
	t.Logf("failover after SIGKILL: %v", took)
	h.remove(r)
	h.start()
	h.waitSpread(60 * time.Second)

	// One etcd member killed: for longer than a lease, nothing moves.
	before := h.epochs()
	etcd.Kill(0)
	for end := time.Now().Add(7 * time.Second); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if now := h.epochs(); !maps.Equal(now, before) {
			t.Fatalf("with one etcd member down, placement moved: %v, was %v", now, before)
		}
	}
	etcd.Start(0)
	etcd.WaitHealthy()

	// The whole cluster down: every holder stops within the renew
	// deadline (3 s, with room for a loaded machine), /status says why,
	// and everything runs again once the cluster is back.
	for i := range 3 {
		etcd.Kill(i)
	}
	down := time.Now()
	Eventually(t, 8*time.Second, "every holder to stop with etcd down", func() bool {
		return len(h.holders()) == 0
	})
	t.Logf("etcd down: every resource stopped after %s", time.Since(down).Round(10*time.Millisecond))
	Eventually(t, 10*time.Second, "/status to say the coordination service does not answer", func() bool {
		return strings.Contains(h.replicas[0].c.StatusJSON(), "CoordinationUnreachable")
	})
	for i := range 3 {
		etcd.Start(i)
	}
	etcd.WaitHealthy()
	back := time.Now()
	h.waitSpread(60 * time.Second)
	t.Logf("etcd back: every resource running again after %s", time.Since(back).Round(10*time.Millisecond))
}

// epochs returns each resource's holder and epoch as its holder reports it.
func (h *haCluster) epochs() map[string]string {
	out := make(map[string]string)
	for _, r := range h.replicas {
		for name, p := range r.placements() {
			if p.Placement != nil && p.Placement.Role == "holder" {
				out[name] = fmt.Sprintf("%s@%d", r.id, p.Placement.Epoch)
			}
		}
	}
	return out
}
