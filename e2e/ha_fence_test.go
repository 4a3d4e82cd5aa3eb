package e2e

import (
	"context"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// TestHAFenceSIGSTOP is the split-brain test of issue 23: three replicas
// (three processes) share an MQTT QoS 1 inbound resource and a NATS
// outbound resource through leases on a real three-member etcd cluster,
// under steady traffic both ways. The holder of one resource is SIGSTOPped
// for longer than its lease; once another replica runs the resource, the
// stopped one is resumed. Of what reached it after it was stopped it must
// deliver nothing to weida and publish nothing to NATS, although its
// sockets hold what the brokers and the weida endpoint sent it meanwhile
// and its own goroutines have not yet noticed that the lease is gone: only
// the fence on the data path (connectors.Unit.Fence) stops them. What it
// had already handed to a client library before the stop may leave when
// it resumes (no broker here takes a fencing token), at most the
// in-flight bound; the test logs how much. Then it stands by. Each
// resource in turn is the victim.
//
// Who delivered what is observed from outside each process: every replica
// hosts the inbound endpoint on an address of its own (each its own copy
// of the resource files, differing only there), with a weida subscriber
// per address, and every replica marks what it publishes with its own
// loop marker (--instance), which the NATS subscriber reads. Every
// message is numbered, so that what was sent after the stop is known.
//
// Without the fence (service/placed.go not setting Unit.Fence) it fails:
// in two runs the resumed outbound holder published 126 and 100 messages
// it had received while stopped, and in one the inbound holder delivered
// 3 to a weida subscriber that had reconnected to it in the moment after
// the resume (the others had timed out while it was stopped: a hosted
// listener's QUIC idle timeout is 2 s, and its MQTT session had been
// taken over by the new holder's connection with the same client ID).
func TestHAFenceSIGSTOP(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	requireTCP(t, "NATS", natsAddr)
	etcd := brokertest.StartEtcdCluster(t)
	u := unique()
	const inName, outName = "fence-mqtt-in", "fence-nats-out"
	out, dialURL := weidaPublisher(t, "/fence-out")

	const n = 3
	h := &haCluster{t: t, names: []string{inName, outName}}
	weidaSubs := make(map[string]*weidaCollector) // by replica
	for i := range n {
		id := fmt.Sprintf("r%d", i)
		dir := t.TempDir()
		listen := fmt.Sprintf("weida://127.0.0.1:%d/in", freePort(t, "udp"))
		in := mqttResource{Name: inName, Direction: policy.Inbound, QoS: 1, ClientID: "fence-" + u,
			Endpoint: listen, Routes: []mqttRoute{{"r", u + "/in/#"}}}
		ob := natsResource{Name: outName, Direction: policy.Outbound, Endpoint: dialURL, Routes: []string{u + ".out.*"}}
		writeFile(t, dir, "in.yaml", in.YAML(t))
		writeFile(t, dir, "out.yaml", ob.YAML(t))
		r := &haReplica{id: id, c: StartConnector(t, nil, "-f", dir, "--placement", "etcd",
			"--etcd-endpoints", etcd.Endpoints(), "--etcd-prefix", "/"+u+"/", "--replica-id", id,
			"--instance", "fence-"+id,
			// A 2 s lease renewed every 250 ms: a holder stops within
			// 1 s of its last renewal, at least 1 s before the lease
			// can move.
			"--lease-duration", "2s", "--lease-renew-deadline", "1s", "--lease-retry", "250ms")}
		h.replicas = append(h.replicas, r)
		t.Cleanup(func() {
			// Never leave a stopped process behind, whatever failed.
			_ = r.c.cmd.Process.Signal(syscall.SIGCONT)
			if o := r.c.Output(); strings.Contains(o, "DATA RACE") {
				t.Errorf("replica %s reported a data race:\n%s", id, o)
			}
		})
		weidaSubs[id] = collectWeidaLater(t, listen, "#")
	}
	h.waitSpread(60 * time.Second)

	// Steady traffic both ways, numbered: MQTT QoS 1 into the inbound
	// resource, weida into the outbound one, one message every 10 ms each.
	var inSeq, outSeq atomic.Int64
	stop := make(chan struct{})
	var traffic sync.WaitGroup
	t.Cleanup(func() { close(stop); traffic.Wait() })
	mq := mqttConnect(t, mosquittoAddr, "fence-pub-"+u)
	// every10ms calls send with 1, 2, 3... every 10 ms until the test ends.
	every10ms := func(seq *atomic.Int64, send func(ctx context.Context, s int64)) {
		traffic.Go(func() {
			tick := time.NewTicker(10 * time.Millisecond)
			defer tick.Stop()
			for {
				select {
				case <-stop:
					return
				case <-tick.C:
				}
				pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				send(pctx, seq.Add(1))
				cancel()
			}
		})
	}
	every10ms(&inSeq, func(ctx context.Context, s int64) {
		_, _ = mq.Publish(ctx, &paho.Publish{Topic: fmt.Sprintf("%s/in/s%d", u, s), QoS: 1, Payload: []byte(strconv.FormatInt(s, 10))})
	})
	every10ms(&outSeq, func(ctx context.Context, s int64) {
		_, _ = out.Publish(ctx, weida.Message{Topic: fmt.Sprintf("%s.out.s%d", u, s), Payload: []byte(strconv.FormatInt(s, 10))})
	})
	nc := natsConn(t, natsAddr)
	published := collectNATS(t, nc, u+".out.*")
	// publishedBy counts what replica id published to NATS, and of it
	// what the test's weida publisher sent after message after.
	publishedBy := func(id string, after int64) (all, later int) {
		for _, m := range published.Messages() {
			if m.Header.Get("x-weida-connector") == "fence-"+id {
				all++
				if s, _ := strconv.ParseInt(string(m.Data), 10, 64); s > after {
					later++
				}
			}
		}
		return all, later
	}
	// deliveredBy is the same for what replica id delivered to weida.
	deliveredBy := func(id string, after int64) (all, later int) {
		for _, m := range weidaSubs[id].Messages() {
			all++
			if s, _ := strconv.ParseInt(string(m.Payload), 10, 64); s > after {
				later++
			}
		}
		return all, later
	}

	for _, victim := range []string{inName, outName} {
		holder := h.holders()[victim][0]
		old := h.replica(holder)
		// The victim is live before it is stopped: otherwise the test
		// proves nothing.
		Eventually(t, 30*time.Second, holder+" moving traffic of "+victim, func() bool {
			if victim == inName {
				return weidaSubs[holder].Len() > 0
			}
			all, _ := publishedBy(holder, 0)
			return all > 0
		})

		old.c.Signal(syscall.SIGSTOP)
		Eventually(t, 5*time.Second, holder+" stopped", func() bool { return procState(old.c.cmd.Process.Pid) == 'T' })
		stopped := time.Now()
		// Whatever the brokers and the weida endpoint take from here on,
		// the stopped holder cannot have read before it was stopped.
		inAtStop, outAtStop := inSeq.Load(), outSeq.Load()
		Eventually(t, 30*time.Second, victim+" running on another replica", func() bool {
			for _, r := range h.replicas {
				if r != old && r.placements()[victim].runsHere() {
					return true
				}
			}
			return false
		})
		took := time.Since(stopped)
		// The new holder moves traffic before the old one resumes:
		// from here on, anything the old one sends is split brain.
		newHolder := ""
		for _, r := range h.replicas {
			if r != old && r.placements()[victim].runsHere() {
				newHolder = r.id
			}
		}
		Eventually(t, 30*time.Second, newHolder+" moving traffic of "+victim, func() bool {
			if victim == inName {
				return weidaSubs[newHolder].Len() > 0
			}
			all, _ := publishedBy(newHolder, 0)
			return all > 0
		})
		time.Sleep(200 * time.Millisecond) // what the old one sent before the stop has arrived
		deliveredBefore, _ := deliveredBy(holder, inAtStop)
		publishedBefore, _ := publishedBy(holder, outAtStop)
		inAtCont, outAtCont := inSeq.Load(), outSeq.Load()

		old.c.Signal(syscall.SIGCONT)
		resumed := time.Now()
		Eventually(t, 20*time.Second, holder+" standing by for "+victim, func() bool {
			p := old.placements()[victim]
			return p.Placement != nil && p.Placement.Role == "standby" && p.Placement.Holder == newHolder
		})
		standby := time.Since(resumed)
		// Anything in the old process's sockets has been read by now.
		Eventually(t, 10*time.Second, "traffic to go on past the resume", func() bool {
			return inSeq.Load() > inAtCont+50 && outSeq.Load() > outAtCont+50
		})
		// Nothing that reached it while it was stopped goes out: that is
		// the fence. What it had already handed to a client library
		// before the stop (a publish in nats.go's buffer, a check passed
		// just before the signal) may still leave on resuming, at most
		// the in-flight bound (64); that residue is counted and logged.
		deliveredAll, deliveredLater := deliveredBy(holder, inAtStop)
		publishedAll, publishedLater := publishedBy(holder, outAtStop)
		if deliveredLater != 0 || publishedLater != 0 {
			t.Errorf("%s (stopped holder of %s), once resumed, delivered %d messages to weida and published %d to NATS that reached it after it was stopped; want 0",
				holder, victim, deliveredLater, publishedLater)
		}
		inHand := deliveredAll - deliveredBefore - deliveredLater + publishedAll - publishedBefore - publishedLater
		if inHand > 64 {
			t.Errorf("%s, once resumed, sent %d messages it held before the stop; want at most the in-flight bound", holder, inHand)
		}
		// The unit's series went with it; its log says whether the
		// fence had anything to stop.
		t.Logf("SIGSTOP of %s (holder of %s): %s ran it after %s; resumed, it stood by after %s (fence tripped: %v; sent on resuming what it held before the stop: %d)",
			holder, victim, newHolder, took.Round(10*time.Millisecond), standby.Round(10*time.Millisecond),
			strings.Contains(old.c.Output(), "fenced: this replica no longer holds"), inHand)
		Eventually(t, 10*time.Second, holder+" to log losing its lease", func() bool {
			return strings.Contains(old.c.Output(), "lease lost")
		})

		// A replica's readiness never depends on what it does not hold:
		// every replica answers /readyz, and the probe of a resource it
		// stands by for, whatever the holder's state.
		for _, r := range h.replicas {
			if code := httpStatus("http://" + r.c.Admin + "/readyz"); code != http.StatusOK {
				t.Errorf("%s /readyz = %d after the failover; want 200", r.id, code)
			}
		}
		if code := httpStatus("http://" + old.c.Admin + "/readyz/" + victim); code != http.StatusOK {
			t.Errorf("%s /readyz/%s = %d as a standby; want 200", holder, victim, code)
		}
		h.waitSpread(60 * time.Second)
	}
}

// collectWeidaLater is collectWeida for an endpoint that may not be
// hosted yet (a standby's): it dials in the background until it answers,
// and again after every loss.
func collectWeidaLater(t testing.TB, url string, filters ...string) *weidaCollector {
	t.Helper()
	c := &weidaCollector{
		t:       t,
		url:     url,
		cfg:     weida.DialConfig{InsecureSkipVerifyForTesting: true},
		filters: filters,
		done:    make(chan struct{}),
	}
	rctx, cancel := context.WithCancel(context.Background())
	c.cancel = cancel
	go func() {
		sub, err := c.dial(rctx)
		if err != nil {
			close(c.done)
			return
		}
		c.run(rctx, sub)
	}()
	t.Cleanup(c.Close)
	return c
}

// procState is the state letter of process pid in /proc ('T' once
// stopped), or 0.
func procState(pid int) byte {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// pid (comm) state ...: comm may hold spaces, so read after the last ')'.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return 0
	}
	return s[i+2]
}

// httpStatus returns the status code of a GET of url, or 0.
func httpStatus(url string) int {
	resp, err := http.Get(url)
	if err != nil {
		return 0
	}
	resp.Body.Close()
	return resp.StatusCode
}
