package e2e

import (
	"bufio"
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// Steady traffic through the replicas of TestHAPlacementByLease, with the
// fault suite's accounting (chaos_test.go): each resource's numbered
// messages are received, or counted as dropped by the connectors (summed
// over every replica's lifetimes: a killed process takes its counters with
// it, so they are read just before the kill) or by the test's own peers.

// loopbackBroker is one of the shared brokers scripts/brokers starts.
type loopbackBroker string

func (b loopbackBroker) Addr() string { return string(b) }

// haFlowRate is each resource's message rate.
const haFlowRate = 50

// haFlow is one resource's traffic and what became of it.
type haFlow struct {
	t       *testing.T
	name    string
	dir     policy.Direction
	durable bool // a durable inbound source, held for the subscriber: nothing may be missing
	prefix  string
	arr     *arrivals
	// url is the pinned URL of an inbound resource's endpoint, the same
	// on every replica (shared certificate files and reset key).
	url    string
	sink   *weidaSink // inbound: the weida subscriber
	send   func(i int)
	settle func()
	// witness, when set, marks the messages the broker took and may not
	// have delivered (core NATS outbound).
	witness func()

	mu     sync.Mutex
	lost   map[string]map[int]bool // by reason in chaosPeerReasons
	past   map[string]float64      // drops counted by replicas since gone
	unkept atomic.Int64            // outbound: copies written to a vanished connection, unknown which

	sent   atomic.Int64
	sentAt []time.Time // by message number, under mu
	begin  time.Time   // when the sender started
	cancel context.CancelFunc
	done   chan struct{}
}

func (f *haFlow) mark(reason string, i int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.lost[reason] == nil {
		f.lost[reason] = map[int]bool{}
	}
	f.lost[reason][i] = true
}

// number returns the message number a payload of this flow carries.
func (f *haFlow) number(payload string) (int, bool) {
	rest, ok := strings.CutPrefix(payload, f.prefix)
	if !ok {
		return 0, false
	}
	i, err := strconv.Atoi(rest)
	return i, err == nil && i >= 0
}

// haInbound sets up an inbound resource of mode m whose endpoint presents
// the certificate in files (shared by every replica) and returns its flow
// and resource file's content. The subscriber starts with startSink.
func haInbound(t *testing.T, m chaosMode, name, files string) (*haFlow, string) {
	u := unique()
	f := &haFlow{t: t, name: name, dir: policy.Inbound, durable: m.durable, prefix: u + "-", arr: newArrivals(u + "-"),
		lost: map[string]map[int]bool{}, past: map[string]float64{}}
	certDir := filepath.Join(files, name+".identity")
	if err := os.Mkdir(certDir, 0o700); err != nil {
		t.Fatal(err)
	}
	cert, key, fp := weidaCert(t, certDir)
	addr := fmt.Sprintf("127.0.0.1:%d", freePort(t, "udp"))
	f.url = "weida://" + fp + "@" + addr + "/" + name
	if m.name == "amqp-durable" {
		deleteQueueAtEnd(t, rabbitAddr, "chaos-"+u)
	}
	yaml, send, settle := m.inbound(t, loopbackBroker(brokerFor(m)), u, name, "weida://"+addr+"/"+name, func(payload, reason string) {
		if i, ok := f.number(payload); ok {
			f.mark(reason, i)
		}
	})
	f.settle = settle
	f.send = func(i int) {
		if !send(f.prefix + strconv.Itoa(i)) {
			f.mark(reasonBrokerRefused, i)
		}
	}
	// Every replica presents the same identity: the files, not a
	// generated certificate in its own state directory.
	listen := "    listen: weida://" + addr + "/" + name + "\n"
	if !strings.Contains(yaml, listen) {
		t.Fatalf("no %q in the resource:\n%s", listen, yaml)
	}
	yaml = strings.Replace(yaml, listen, listen+"    certFile: "+cert+"\n    keyFile: "+key+"\n", 1)
	if m.durable {
		// A killed holder's queued copies would otherwise die with it
		// after the broker forgot them (RELIABILITY finding 8): the
		// broker is acknowledged only once they were received.
		const hold = "  delivery:\n    whenNoSubscriber: hold\n"
		if !strings.Contains(yaml, hold) {
			t.Fatalf("no %q in the durable resource:\n%s", hold, yaml)
		}
		yaml = strings.Replace(yaml, hold, hold+"    acknowledge: received\n", 1)
	}
	return f, yaml
}

// startSink starts the flow's weida subscriber on the pinned URL: it dials
// the same address again whenever its connection ends, which reaches the
// current holder, the only replica that binds it.
func (f *haFlow) startSink() { f.sink = startWeidaSink(f.t, f.url, f.arr) }

// haOutbound sets up an outbound resource of mode m, with the test's weida
// publisher that the holder dials and a reader on the broker.
func haOutbound(t *testing.T, m chaosMode, name, files string) (*haFlow, string) {
	u := unique()
	f := &haFlow{t: t, name: name, dir: policy.Outbound, prefix: u + "-", arr: newArrivals(u + "-"),
		lost: map[string]map[int]bool{}, past: map[string]float64{}}
	dir := filepath.Join(files, name+".publisher")
	if err := os.Mkdir(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	src := startWeidaSource(t, freePort(t, "udp"), dir, func(msg weida.Message) {
		if i, ok := f.number(string(msg.Payload)); ok {
			f.mark(reasonPublisherConnClosed, i)
		}
	}, func(uc weida.UnconfirmedCopies) {
		for _, msg := range uc.Messages {
			if i, ok := f.number(string(msg.Payload)); ok {
				f.mark(reasonPublisherUnconfirmed, i)
			}
		}
		f.unkept.Add(int64(uc.Unkept))
	})
	if m.name == "amqp-durable" {
		deleteQueueAtEnd(t, rabbitAddr, "rd-"+u)
	}
	yaml, topic, w := m.outbound(t, loopbackBroker(brokerFor(m)), u, name, src.url, f.arr)
	if w != nil {
		f.witness = func() {
			w(func(payload string) {
				if i, ok := f.number(payload); ok {
					f.mark(reasonUndelivered, i)
				}
			})
		}
	}
	f.send = func(i int) {
		res, err := src.publish(topic, f.prefix+strconv.Itoa(i))
		switch {
		case err != nil:
			f.mark(reasonPublisherClosed, i)
		case res.Matched == 0:
			f.mark(reasonNoSubscriber, i)
		case res.Queued == 0:
			f.mark(reasonPublisherDropped, i)
		}
	}
	return f, yaml
}

// brokerFor is the shared loopback broker of a chaos mode.
func brokerFor(m chaosMode) string {
	switch {
	case strings.HasPrefix(m.name, "mqtt"):
		return mosquittoAddr
	case strings.HasPrefix(m.name, "nats"):
		return natsAddr
	}
	return rabbitAddr
}

// haMode returns the chaos mode called name.
func haMode(t *testing.T, name string) chaosMode {
	for _, m := range chaosModes() {
		if m.name == name {
			return m
		}
	}
	t.Fatalf("no chaos mode %q", name)
	return chaosMode{}
}

// start sends numbered messages at haFlowRate until stop.
func (f *haFlow) start() {
	ctx, cancel := context.WithCancel(context.Background())
	f.cancel, f.done = cancel, make(chan struct{})
	f.begin = time.Now()
	go func() {
		defer close(f.done)
		interval := time.Second / haFlowRate
		for i := 0; ctx.Err() == nil; i++ {
			if d := time.Until(f.begin.Add(time.Duration(i) * interval)); d > 0 {
				select {
				case <-time.After(d):
				case <-ctx.Done():
					return
				}
			}
			f.mu.Lock()
			f.sentAt = append(f.sentAt, time.Now())
			f.mu.Unlock()
			f.send(i)
			f.sent.Add(1)
		}
	}()
	f.t.Cleanup(f.stop)
}

// stop ends the sender and waits for it; it may be called more than once.
func (f *haFlow) stop() {
	f.cancel()
	<-f.done
}

// keep adds what a replica about to die counted for this flow's resource.
func (f *haFlow) keep(c *Connector) {
	drops := chaosDrops(c, f.name)
	f.mu.Lock()
	defer f.mu.Unlock()
	for k, v := range drops {
		f.past[k] += v
	}
}

// haAccount is a flow's result.
type haAccount struct {
	sent, received, duplicates, missing, unaccounted int
	drops                                            map[string]float64
	// unexplained are the missing messages no peer counted, in order;
	// the connectors' counts are not per message, so the unaccounted
	// ones are among them.
	unexplained []int
}

func (a haAccount) String() string {
	var parts []string
	for k, v := range a.drops {
		parts = append(parts, fmt.Sprintf("%s %d", k, int(v)))
	}
	slices.Sort(parts)
	drops := "none"
	if len(parts) > 0 {
		drops = strings.Join(parts, ", ")
	}
	return fmt.Sprintf("sent %d, received %d (duplicates %d), missing %d, drops: %s, unaccounted %d",
		a.sent, a.received, a.duplicates, a.missing, drops, a.unaccounted)
}

// account reads what became of every message sent, with the drops of the
// live replicas and of those gone.
func (f *haFlow) account(live []*haReplica) haAccount {
	if f.witness != nil {
		f.witness()
	}
	n := int(f.sent.Load())
	drops := map[string]float64{}
	f.mu.Lock()
	for k, v := range f.past {
		drops[k] += v
	}
	f.mu.Unlock()
	for _, r := range live {
		for k, v := range chaosDrops(r.c, f.name) {
			drops[k] += v
		}
	}
	if v := f.unkept.Load(); v > 0 {
		drops["publisher:unconfirmed-unkept"] = float64(v)
	}
	if f.sink != nil && f.sink.unread.Load() > 0 {
		drops["subscriber:unread"] = float64(f.sink.unread.Load())
	}
	a := haAccount{sent: n}
	f.arr.mu.Lock()
	f.mu.Lock()
	for i := range n {
		k := f.arr.count[i]
		switch {
		case k > 1:
			a.duplicates += k - 1
			fallthrough
		case k == 1:
			a.received++
			continue
		}
		explained := false
		for _, reason := range chaosPeerReasons {
			if f.lost[reason][i] {
				drops[reason]++
				explained = true
				break
			}
		}
		if !explained {
			a.unexplained = append(a.unexplained, i)
		}
	}
	f.mu.Unlock()
	f.arr.mu.Unlock()
	for k, v := range drops {
		if v == 0 {
			delete(drops, k)
		}
	}
	a.drops = drops
	a.missing = n - a.received
	a.unaccounted = a.missing - int(chaosCounted(drops, a.missing))
	return a
}

// settleAll stops every sender and waits until each flow's messages are
// accounted for, or nothing has moved for chaosSettle.
func settleAll(flows []*haFlow, live func() []*haReplica) {
	for _, f := range flows {
		f.stop()
	}
	for _, f := range flows {
		if f.settle != nil {
			f.settle()
		}
	}
	deadline := time.Now().Add(2 * time.Minute)
	last, lastMove := -1, time.Now()
	for time.Now().Before(deadline) {
		total, done := 0, true
		for _, f := range flows {
			a := f.account(live())
			got := a.received + int(chaosCounted(a.drops, a.missing))
			total += got
			if got < a.sent && !(f.durable && a.missing == 0) {
				done = false
			}
		}
		if done {
			return
		}
		if total != last {
			last, lastMove = total, time.Now()
		} else if time.Since(lastMove) > chaosSettle {
			return
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// sharedResetKey writes one stateless reset key, in hex, for every
// replica's --reset-key-file: with the certificate files, it is what makes
// the replicas one identity to a subscriber. A new holder answers the
// packets of its predecessor's connections with a reset the subscriber
// recognises, so that the subscriber dials again at once rather than at
// its idle timeout.
func sharedResetKey(t *testing.T, dir string) string {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		t.Fatal(err)
	}
	file := filepath.Join(dir, "reset-key")
	if err := os.WriteFile(file, []byte(hex.EncodeToString(key)+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// medianDuration is bench_frame_test.go's median, of durations.
func medianDuration(ds []time.Duration) time.Duration {
	v := make([]float64, len(ds))
	for i, d := range ds {
		v[i] = float64(d)
	}
	return time.Duration(median(v))
}

// runs renders the unexplained missing messages as runs, with when each
// was sent relative to the start of the traffic.
func (f *haFlow) runs(a haAccount) string {
	f.mu.Lock()
	sentAt := slices.Clone(f.sentAt)
	f.mu.Unlock()
	return chaosRuns(a.unexplained, sentAt, f.begin)
}

// TestHAIdleCost measures what leases cost an idle deployment: the
// requests/s the replicas send to etcd (every member's
// grpc_server_started_total, summed: a client talks to one member, which
// forwards internally, so each request counts once) and the CPU each idle
// replica uses, against the same resources run without --placement. The
// resources are core NATS inbound ones without traffic or subscribers.
// It runs only with WEIDA_BENCH=1; WEIDA_BENCH_SAMPLE sets each window
// (20 s). The binary is the suite's, built with -race, so its CPU is an
// upper bound.
func TestHAIdleCost(t *testing.T) {
	requireBench(t, "to measure the idle cost of leases")
	requireTCP(t, "NATS", natsAddr)
	window := envDuration(t, "WEIDA_BENCH_SAMPLE", 20*time.Second)
	etcd := brokertest.StartEtcdCluster(t)
	t.Logf("load average at the start: %s", loadAverage())
	resources := func(n int) string {
		dir := t.TempDir()
		u := unique()
		for i := range n {
			r := natsResource{Name: fmt.Sprintf("idle-%02d", i), Direction: policy.Inbound,
				Endpoint: fmt.Sprintf("weida://127.0.0.1:%d/idle-%02d", freePort(t, "udp"), i),
				Routes:   []string{fmt.Sprintf("%s.%d", u, i)}}
			writeFile(t, dir, r.Name+".yaml", r.YAML(t))
		}
		return dir
	}
	requests := func() (float64, map[string]float64) {
		total, byMethod := 0.0, map[string]float64{}
		for ep := range strings.SplitSeq(etcd.Endpoints(), ",") {
			resp, err := http.Get(ep + "/metrics")
			if err != nil {
				t.Fatalf("etcd metrics: %v", err)
			}
			sc := bufio.NewScanner(resp.Body)
			for sc.Scan() {
				line := sc.Text()
				if !strings.HasPrefix(line, "grpc_server_started_total{") {
					continue
				}
				var v float64
				fmt.Sscan(line[strings.LastIndexByte(line, ' ')+1:], &v)
				method := ""
				if m := grpcMethodLabel.FindStringSubmatch(line); m != nil {
					method = m[1]
				}
				total += v
				byMethod[method] += v
			}
			resp.Body.Close()
		}
		return total, byMethod
	}
	// measure returns etcd's requests/s over the window, by method, and
	// each replica's CPU share (CPU seconds per second).
	measure := func(cs []*Connector) (float64, map[string]float64, []float64) {
		time.Sleep(5 * time.Second) // past the start's acquisitions
		r0, m0 := requests()
		c0 := make([]time.Duration, len(cs))
		for i, c := range cs {
			c0[i] = cpuTime(t, c.cmd.Process.Pid)
		}
		start := time.Now()
		time.Sleep(window)
		el := time.Since(start).Seconds()
		r1, m1 := requests()
		cpu := make([]float64, len(cs))
		for i, c := range cs {
			cpu[i] = (cpuTime(t, c.cmd.Process.Pid) - c0[i]).Seconds() / el
		}
		rate := map[string]float64{}
		for k, v := range m1 {
			if d := (v - m0[k]) / el; d > 0 {
				rate[k] = d
			}
		}
		return (r1 - r0) / el, rate, cpu
	}
	stopAll := func(cs []*Connector) {
		for _, c := range cs {
			c.Stop()
		}
	}

	const n = 20
	dir := resources(n)
	alone := StartConnector(t, nil, "-f", dir)
	alone.WaitReady(60 * time.Second)
	_, _, cpu := measure([]*Connector{alone})
	t.Logf("%d resources, no placement: CPU %.2f%%", n, 100*cpu[0])
	stopAll([]*Connector{alone})

	for i, c := range []struct{ replicas, resources int }{{1, 4}, {1, n}, {3, n}} {
		dir := resources(c.resources)
		var names []string
		for j := range c.resources {
			names = append(names, fmt.Sprintf("idle-%02d", j))
		}
		h := &haCluster{t: t, names: names, args: []string{"-f", dir, "--placement", "etcd",
			"--etcd-endpoints", etcd.Endpoints(), "--etcd-prefix", fmt.Sprintf("/idle-%d-%s/", i, unique())}}
		for range c.replicas {
			h.start()
		}
		h.waitSpread(60 * time.Second)
		var cs []*Connector
		for _, r := range h.replicas {
			cs = append(cs, r.c)
		}
		rate, byMethod, cpu := measure(cs)
		var cpus []string
		for _, v := range cpu {
			cpus = append(cpus, fmt.Sprintf("%.2f%%", 100*v))
		}
		t.Logf("%d replica(s), %d resources: %.1f etcd requests/s (%v), CPU per replica %s",
			c.replicas, c.resources, rate, roundRates(byMethod), strings.Join(cpus, ", "))
		stopAll(cs)
	}
}

var grpcMethodLabel = regexp.MustCompile(`grpc_method="([^"]*)"`)

// roundRates rounds each rate to a tenth, for the log.
func roundRates(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = float64(int(v*10+0.5)) / 10
	}
	return out
}
