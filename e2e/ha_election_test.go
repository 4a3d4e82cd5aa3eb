package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
)

// haElectionBound is what TestHAFailoverDuringElection asserts: the
// failover goal and 2 s for a loaded machine and the election itself
// (etcd answers nothing for about an election timeout, 0.5 s here). It is
// under the goal plus a lease duration, which a failover overlapping an
// election took while the standbys waited for etcd to expire the dead
// holder's key (a new etcd leader gives every etcd lease its whole TTL
// again).
const haElectionBound = haFailoverGoal + 2*time.Second

// TestHAFailoverDuringElection: two replicas share two idle core NATS
// inbound resources through leases on a real three-member etcd cluster.
// The holder of one is SIGKILLed and, 3 s later (before its leases could
// expire), the etcd leader is SIGKILLed too, so that the survivors' etcd
// elects another: the surviving replica must still run the resource
// within haElectionBound of the first kill. The dead replica's membership
// lease must go as fast as its resource leases, since until it goes the
// survivor's fair share (one of two) leaves it no room. Three rounds,
// alternating the resources; the etcd member and a new replica are
// started again after each.
func TestHAFailoverDuringElection(t *testing.T) {
	requireTCP(t, "NATS", natsAddr)
	etcd := brokertest.StartEtcdCluster(t)
	u := unique()
	dir := t.TempDir()
	var names []string
	for i := range 2 {
		r := natsResource{Name: fmt.Sprintf("election-%d", i), Direction: policy.Inbound,
			Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/election-%d", freePort(t, "udp"), i),
			Routes:   []string{fmt.Sprintf("%s.%d", u, i)}}
		writeFile(t, dir, r.Name+".yaml", r.YAML(t))
		names = append(names, r.Name)
	}
	h := &haCluster{t: t, names: names, args: []string{"-f", dir, "--placement", "etcd",
		"--etcd-endpoints", etcd.Endpoints(), "--etcd-prefix", "/" + u + "/"}}
	for range 2 {
		h.start()
	}
	h.waitSpread(60 * time.Second)

	const electAfter = 3 * time.Second
	for k := range 3 {
		victim := names[k%len(names)]
		holder := h.holders()[victim]
		if len(holder) != 1 {
			t.Fatalf("round %d: %s runs on %v", k+1, victim, holder)
		}
		r := h.replica(holder[0])
		r.c.Signal(syscall.SIGKILL)
		killed := time.Now()
		if _, ok := r.c.Wait(10 * time.Second); !ok {
			t.Fatalf("replica %s did not die of SIGKILL", r.id)
		}
		h.remove(r)
		time.Sleep(electAfter - time.Since(killed))
		leader := etcd.Leader()
		if leader < 0 {
			t.Fatalf("round %d: no etcd member leads", k+1)
		}
		etcd.Kill(leader)
		electedAt := time.Since(killed)
		var running time.Time
		Eventually(t, 30*time.Second, victim+" running on the survivor", func() bool {
			for _, s := range h.replicas {
				if s.placements()[victim].runsHere() {
					running = time.Now()
					return true
				}
			}
			return false
		})
		d := running.Sub(killed)
		t.Logf("round %d: SIGKILL of %s (holder of %s), etcd leader m%d killed %s later (m%d leads now): running on the survivor after %s (goal %s)",
			k+1, r.id, victim, leader, electedAt.Round(10*time.Millisecond), etcd.Leader(), d.Round(10*time.Millisecond), haFailoverGoal)
		if d > haElectionBound {
			t.Errorf("%s took %s to fail over across an etcd election; the bound is %s", victim, d.Round(10*time.Millisecond), haElectionBound)
		}
		etcd.Start(leader)
		etcd.WaitHealthy()
		h.start()
		h.waitSpread(60 * time.Second)
	}
}
