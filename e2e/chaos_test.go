package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"
	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// The fault suite (issue 12, item 6). For each broker mode and direction it
// sends numbered messages at a steady rate through the connector binary
// while one fault is injected, and accounts for every message: received,
// or dropped and counted by the connector (its /metrics, summed over its
// process lifetimes) or by the test's own weida publisher (Publish with
// Matched == 0, copies lost after queueing, a publisher closed by the
// fault), or refused to the test's own broker publisher. What is left is
// unaccounted loss, and must be 0; with hold on a durable source nothing
// may be missing at all (when the fault kills the connector, with
// acknowledge: received, the setting that promises it).
//
// Without WEIDA_CHAOS the suite runs a short subset (one inbound and one
// outbound cell, a few hundred messages) that fits CI; scripts/chaos sets
// WEIDA_CHAOS=1 for the whole matrix. WEIDA_CHAOS_N (messages per cell),
// WEIDA_CHAOS_RATE (messages per second), WEIDA_CHAOS_MODES and
// WEIDA_CHAOS_FAULTS (comma-separated names) narrow or widen a run.

// chaosFault is one fault a cell injects.
type chaosFault string

const (
	faultBrokerKill    chaosFault = "broker-kill"    // SIGKILL, then start again
	faultBrokerPause   chaosFault = "broker-pause"   // SIGSTOP for 3 s, then SIGCONT
	faultWeidaRestart  chaosFault = "weida-restart"  // the test's weida peer closed for 2 s
	faultConnectorKill chaosFault = "connector-kill" // SIGKILL, then start again on the same --state-dir
	// faultConnectorKillLagging is connector-kill, outbound only, at
	// chaosLagFactor times the rate and the messages: fast enough that the
	// connector lags its weida publisher (the broker paces it), so that
	// the kill takes copies it had read or left unread for longer than the
	// publisher's unconfirmed window (issue 21). It runs only when
	// WEIDA_CHAOS_FAULTS names it.
	faultConnectorKillLagging chaosFault = "connector-kill-lagging"
	chaosLagFactor                       = 5
	chaosPause                           = 3 * time.Second   // how long a paused broker hangs
	chaosWeidaAway                       = 2 * time.Second   // how long the weida peer is away
	chaosSettle                          = 8 * time.Second   // no progress for this long ends a cell's wait
	chaosCellLimit                       = 4 * time.Minute   // a cell's whole bound
	chaosRecoveryNA                      = time.Duration(-1) // no message arrived after the fault
	chaosDefaultN                        = 2000
	chaosDefaultRate                     = 200
)

var chaosFaults = []chaosFault{faultBrokerKill, faultBrokerPause, faultWeidaRestart, faultConnectorKill}

// Reasons the test's own peers count per message number. A missing message
// is counted under the first of these it carries, and only if it is
// missing: a publish reported refused may have landed anyway.
const (
	// The broker said that no subscription matched the message, so it
	// discarded it: core NATS's 503 "no responders" reply.
	reasonNoInterest = "broker:no-interest"
	// The test's broker publisher could not hand the message over.
	reasonBrokerRefused = "publisher:broker-refused"
	// Outbound: weida Publish matched nobody.
	reasonNoSubscriber = "publisher:no-subscriber"
	// Outbound: the weida publisher was closed by the fault.
	reasonPublisherClosed = "publisher:closed"
	// Outbound: Publish matched a subscriber but dropped its copy (buffer
	// full, closing).
	reasonPublisherDropped = "publisher:dropped"
	// outbound: the weida publisher wrote the copy to the connector's
	// connection, which then vanished (Publisher.OnCopiesUnconfirmed):
	// delivered or not, nobody could tell, and it is missing.
	reasonPublisherUnconfirmed = "publisher:unconfirmed"
	// Outbound: the weida publisher queued the copy, and the connector's
	// connection closed before it was written (Publisher.OnCopyLost).
	reasonPublisherConnClosed = "publisher:connection-closed"
)

// reasonWrittenToKilled: inbound core NATS, the connector SIGKILLed. The
// messages nats-server had written (or queued) to the killed process's
// connection that neither arrived nor were counted by it: lost in the
// dying process or its socket, and counted by the server alone, in its
// closed connection's out_msgs (GET /connz?state=closed). Not per message.
const reasonWrittenToKilled = "broker:written-to-killed-connection"

// reasonUndelivered: outbound core NATS. The server took the connector's
// publish (the witness stream stored it) and the test's reader never got
// it: the server had no subscription of the reader's when it came (the
// reader resubscribing after a restart), and core NATS keeps nothing.
// The lowest precedence: every other reason says more.
const reasonUndelivered = "broker:undelivered"

var chaosPeerReasons = []string{reasonNoInterest, reasonBrokerRefused, reasonNoSubscriber, reasonPublisherClosed, reasonPublisherDropped, reasonPublisherConnClosed, reasonPublisherUnconfirmed, reasonUndelivered}

// chaosPossibleReasons are the connector's counts that are upper bounds, not
// losses: a redelivered message it dropped may have been delivered before
// (redelivery-dropped), and a write in flight when the broker connection
// failed may have been stored by the broker before it could confirm it
// (connection-lost; RabbitMQ keeps such a message across its restart).
// They account for missing messages only up to what the other reasons
// leave unexplained: a message both received and counted there is a
// message delivered once. So are the copies the test's weida subscriber
// discarded unread at a close (subscriber:unread): from a durable source
// held for the subscriber, the broker delivers such a message again when
// the connector's acknowledgement did not reach it. The cap only ever
// turns an over-count into 0; it never explains a message that nothing
// counted.
var chaosPossibleReasons = []string{"redelivery-dropped", "connection-lost", "subscriber:unread"}

// brokerAt is where a mode's resources and clients find the broker: a
// broker of the cell's own, or a shared one on loopback (TestHAPlacementByLease).
type brokerAt interface{ Addr() string }

// chaosMode is one way of using a broker: how to start it, how the
// connector's resource reads it, how the test publishes into it and reads
// from it.
type chaosMode struct {
	name    string
	durable bool // inbound with whenNoSubscriber: hold; nothing may be missing
	start   func(t *testing.T) *brokertest.Broker
	// inbound renders the inbound resource and returns a function that
	// publishes payload into the broker (retrying where the protocol lets
	// a retry be told apart), reporting whether the broker took it. A
	// broker that tells the publisher later what became of a message
	// reports it through lost, by payload and reason (one of
	// chaosPeerReasons); settle, when not nil, returns once every such
	// report for what send sent has been made.
	inbound func(t *testing.T, b brokerAt, u, name, endpoint string, lost func(payload, reason string)) (yaml string, send func(payload string) bool, settle func())
	// outbound renders the outbound resource and starts a reader of what
	// the connector publishes; it returns the weida topic to publish on.
	// A broker that can tell which messages it took from the connector
	// and may not have delivered to the reader (core NATS: a stream that
	// witnesses the subject) returns witness, which calls visit with each
	// such payload stored since its last call.
	outbound func(t *testing.T, b brokerAt, u, name, dial string, arr *arrivals) (yaml, topic string, witness func(visit func(payload string)))
}

// arrivals records which numbered messages arrived, how often and when.
type arrivals struct {
	prefix string
	mu     sync.Mutex
	count  map[int]int
	times  []time.Time // arrival time of each numbered message, in order
	probe  bool
}

func newArrivals(prefix string) *arrivals { return &arrivals{prefix: prefix, count: map[int]int{}} }

func (a *arrivals) add(payload string, at time.Time) {
	a.mu.Lock()
	defer a.mu.Unlock()
	rest, ok := strings.CutPrefix(payload, a.prefix)
	if !ok {
		return
	}
	if rest == "probe" {
		a.probe = true
		return
	}
	i, err := strconv.Atoi(rest)
	if err != nil {
		return
	}
	a.count[i]++
	a.times = append(a.times, at)
}

// before counts the distinct numbered messages that arrived before t.
func (a *arrivals) before(t time.Time) int {
	a.mu.Lock()
	defer a.mu.Unlock()
	n := 0
	for _, at := range a.times {
		if at.Before(t) {
			n++
		}
	}
	return n
}

func (a *arrivals) sawProbe() bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.probe
}

func (a *arrivals) distinct() int {
	a.mu.Lock()
	defer a.mu.Unlock()
	return len(a.count)
}

// firstAfter returns how long after t the first numbered message arrived.
func (a *arrivals) firstAfter(t time.Time) time.Duration {
	a.mu.Lock()
	defer a.mu.Unlock()
	best := chaosRecoveryNA
	for _, at := range a.times {
		if d := at.Sub(t); d >= 0 && (best < 0 || d < best) {
			best = d
		}
	}
	return best
}

// chaosResult is one cell's line of the table.
type chaosResult struct {
	mode, direction string
	fault           chaosFault
	durable         bool
	awaitReceipt    bool // spec.delivery.acknowledge: received
	sent            int
	received        int
	duplicates      int
	missing         int
	drops           map[string]float64 // by reason; "publisher:" reasons are the test's weida publisher's
	unaccounted     int
	recovery        time.Duration
}

func (r chaosResult) dropsText() string {
	if len(r.drops) == 0 {
		return "0"
	}
	var parts []string
	for k, v := range r.drops {
		parts = append(parts, fmt.Sprintf("%s %d", k, int(v)))
	}
	slices.Sort(parts)
	return strings.Join(parts, ", ")
}

func (r chaosResult) row() string {
	rec := "-"
	if r.recovery >= 0 {
		rec = r.recovery.Round(10 * time.Millisecond).String()
	}
	mode := r.mode
	switch {
	case r.awaitReceipt:
		mode += " (hold, received)"
	case r.durable:
		mode += " (hold)"
	}
	return fmt.Sprintf("| %s | %s | %s | %d | %d | %d | %d | %s | %d | %s |",
		mode, r.direction, r.fault, r.sent, r.received, r.duplicates, r.missing, r.dropsText(), r.unaccounted, rec)
}

const chaosHeader = "| mode | direction | fault | sent | received | duplicates | missing | drops by reason | unaccounted | recovery |\n" +
	"| --- | --- | --- | ---: | ---: | ---: | ---: | --- | ---: | ---: |"

func chaosEnvInt(t *testing.T, name string, def int) int {
	v := os.Getenv(name)
	if v == "" {
		return def
	}
	n, err := strconv.Atoi(v)
	if err != nil || n <= 0 {
		t.Fatalf("%s=%q: want a positive integer", name, v)
	}
	return n
}

func chaosEnvList(name string) map[string]bool {
	v := os.Getenv(name)
	if v == "" {
		return nil
	}
	m := map[string]bool{}
	for _, s := range strings.Split(v, ",") {
		m[strings.TrimSpace(s)] = true
	}
	return m
}

// TestChaos runs the fault matrix; see the comment at the top of the file.
func TestChaos(t *testing.T) {
	full := os.Getenv("WEIDA_CHAOS") != ""
	if testing.Short() && !full {
		t.Skip("the fault suite: run scripts/chaos")
	}
	n := chaosEnvInt(t, "WEIDA_CHAOS_N", chaosDefaultN)
	rate := chaosEnvInt(t, "WEIDA_CHAOS_RATE", chaosDefaultRate)
	modes, faults := chaosEnvList("WEIDA_CHAOS_MODES"), chaosEnvList("WEIDA_CHAOS_FAULTS")
	type cell struct {
		dir   policy.Direction
		fault chaosFault
	}
	var cells []cell
	for _, d := range []policy.Direction{policy.Inbound, policy.Outbound} {
		for _, f := range chaosFaults {
			cells = append(cells, cell{d, f})
		}
	}
	if faults[string(faultConnectorKillLagging)] {
		cells = append(cells, cell{policy.Outbound, faultConnectorKillLagging})
	}
	if !full {
		// What fits CI: one cell each way on the broker that starts
		// fastest, through the faults the issue found losses in.
		// The stream must outlast the fault, which starts after a
		// third of it and lasts about 3 s: 600 messages at 100/s last 6 s.
		n = chaosEnvInt(t, "WEIDA_CHAOS_N", 600)
		rate = chaosEnvInt(t, "WEIDA_CHAOS_RATE", 100)
		modes = map[string]bool{"nats-jetstream": true}
		cells = []cell{{policy.Inbound, faultConnectorKill}, {policy.Outbound, faultWeidaRestart}}
	}
	var (
		mu      sync.Mutex
		results []chaosResult
	)
	for _, m := range chaosModes() {
		if modes != nil && !modes[m.name] {
			continue
		}
		t.Run(m.name, func(t *testing.T) {
			b := m.start(t)
			for _, c := range cells {
				if faults != nil && !faults[string(c.fault)] {
					continue
				}
				t.Run(fmt.Sprintf("%s/%s", c.dir, c.fault), func(t *testing.T) {
					n, rate := n, rate
					if c.fault == faultConnectorKillLagging {
						n, rate = n*chaosLagFactor, rate*chaosLagFactor
					}
					r := runChaosCell(t, m, b, c.dir, c.fault, n, rate)
					mu.Lock()
					results = append(results, r)
					mu.Unlock()
					t.Log(chaosHeader + "\n" + r.row())
					if r.unaccounted > 0 {
						t.Errorf("%d messages lost and counted nowhere: %s", r.unaccounted, r.row())
					}
					if r.durable && r.missing > 0 {
						t.Errorf("%d messages missing from a durable source held for the subscriber: %s", r.missing, r.row())
					}
				})
			}
		})
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "chaos results, %d messages per cell at %d/s, %s:\n%s\n", n, rate, time.Now().UTC().Format(time.DateOnly), chaosHeader)
	for _, r := range results {
		sb.WriteString(r.row() + "\n")
	}
	t.Log(sb.String())
	if out := os.Getenv("WEIDA_CHAOS_TABLE"); out != "" {
		if err := os.WriteFile(out, []byte(sb.String()), 0o644); err != nil {
			t.Error(err)
		}
	}
}

// connectorLives runs the connector across restarts and sums the drop
// counters of each process lifetime: a killed process takes its counters
// with it, so each is read just before the kill.
type connectorLives struct {
	t        *testing.T
	args     []string
	env      []string
	resource string
	c        *Connector
	past     map[string]float64
	killedAt time.Time // when the last kill sent SIGKILL
	// restartedAt is when the process after the last kill was started:
	// nothing it bridges can arrive before then.
	restartedAt time.Time
}

func startLives(t *testing.T, env []string, resource string, args ...string) *connectorLives {
	l := &connectorLives{t: t, args: args, env: env, resource: resource, past: map[string]float64{}}
	l.c = StartConnector(t, env, args...)
	l.c.WaitReady(60 * time.Second)
	return l
}

// kill SIGKILLs the connector after reading its counters, and starts a new
// process once it is gone.
func (l *connectorLives) kill() {
	for k, v := range chaosDrops(l.c, l.resource) {
		l.past[k] += v
	}
	l.killedAt = time.Now()
	l.c.Signal(syscall.SIGKILL)
	if _, ok := l.c.Wait(10 * time.Second); !ok {
		l.t.Fatal("the connector survived SIGKILL")
	}
	time.Sleep(500 * time.Millisecond)
	l.restartedAt = time.Now()
	l.c = StartConnector(l.t, l.env, l.args...)
	l.c.WaitReady(60 * time.Second)
}

// baseline forgets what was dropped so far (probes sent before the
// subscriber was there), so that drops counts the cell's messages only.
func (l *connectorLives) baseline() {
	for k, v := range chaosDrops(l.c, l.resource) {
		l.past[k] -= v
	}
}

func (l *connectorLives) drops() map[string]float64 {
	sum := map[string]float64{}
	for k, v := range l.past {
		sum[k] += v
	}
	for k, v := range chaosDrops(l.c, l.resource) {
		sum[k] += v
	}
	for k, v := range sum {
		if v == 0 {
			delete(sum, k)
		}
	}
	return sum
}

var chaosDropLine = regexp.MustCompile(`^weida_connector_messages_dropped_total\{(.*)\} (\S+)$`)
var chaosLabel = regexp.MustCompile(`(\w+)="([^"]*)"`)

// chaosDrops reads a resource's drops by reason from /metrics (summed over
// routes).
func chaosDrops(c *Connector, resource string) map[string]float64 {
	c.t.Helper()
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		c.t.Fatalf("reading /metrics: %v", err)
	}
	defer resp.Body.Close()
	out := map[string]float64{}
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := chaosDropLine.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		labels := map[string]string{}
		for _, l := range chaosLabel.FindAllStringSubmatch(m[1], -1) {
			labels[l[1]] = l[2]
		}
		if labels["resource"] != resource {
			continue
		}
		v, _ := strconv.ParseFloat(m[2], 64)
		if v > 0 {
			out[labels["reason"]] += v
		}
	}
	return out
}

// runChaosCell runs one cell and returns its line.
func runChaosCell(t *testing.T, m chaosMode, b *brokertest.Broker, dir policy.Direction, fault chaosFault, n, rate int) chaosResult {
	u := unique()
	prefix := u + "-"
	arr := newArrivals(prefix)
	name := "chaos-" + m.name
	port := freePort(t, "udp")
	state := t.TempDir()
	files := t.TempDir()
	r := chaosResult{mode: m.name, direction: string(dir), fault: fault, durable: m.durable && dir == policy.Inbound, sent: n}
	// A killed connector takes with it the copies it had queued or
	// written and not yet sent; with acknowledge: queued the broker had
	// forgotten those messages (RELIABILITY.md, finding 8), so "nothing
	// missing" is promised only with acknowledge: received, and a durable
	// cell that kills the connector runs with it.
	r.awaitReceipt = r.durable && fault == faultConnectorKill
	deadline := time.Now().Add(chaosCellLimit)

	// Accounted losses the test itself sees.
	var (
		lostMu      sync.Mutex
		lost        = map[string]map[int]bool{} // by reason in chaosPeerReasons, the message numbers
		unkept      atomic.Int64                // copies it wrote to a connection that vanished, without knowing which
		unread      *atomic.Int64               // copies the test's weida subscriber discarded unread when it closed
		faultAt     = n / 3
		faultStart  time.Time
		faultEnd    time.Time
		sentAt      = make([]time.Time, n) // written by the sender only, read once it is done
		sentCounter atomic.Int64
	)
	mark := func(reason string, i int) {
		lostMu.Lock()
		if lost[reason] == nil {
			lost[reason] = map[int]bool{}
		}
		lost[reason][i] = true
		lostMu.Unlock()
	}

	var (
		lives  *connectorLives
		send   func(i int)
		settle func() // inbound: waits for the broker's late reports
		bounce func() // the weida peer's fault
		// witness, when not nil, marks the messages the broker took and
		// may not have delivered (reasonUndelivered).
		witness   func()
		witnessed atomic.Int64 // numbered messages the witness saw stored
	)
	if dir == policy.Inbound {
		endpoint := fmt.Sprintf("weida://127.0.0.1:%d/chaos", port)
		brokerLost := func(payload, reason string) {
			rest, ok := strings.CutPrefix(payload, prefix)
			if !ok {
				return
			}
			if i, err := strconv.Atoi(rest); err == nil && i >= 0 && i < n {
				mark(reason, i)
			} // else a probe
		}
		var (
			yaml       string
			sendBroker func(string) bool
		)
		yaml, sendBroker, settle = m.inbound(t, b, u, name, endpoint, brokerLost)
		if r.awaitReceipt {
			yaml = withAcknowledge(t, yaml, "received")
		}
		lives = startLives(t, amqpEnv, name, "-f", writeFile(t, files, "r.yaml", yaml), "--state-dir", state, "--instance", "chaos-"+u)
		sink := startWeidaSink(t, endpoint, arr)
		Eventually(t, 30*time.Second, "the probe across the bridge", func() bool {
			sendBroker(prefix + "probe")
			time.Sleep(100 * time.Millisecond)
			return arr.sawProbe()
		})
		send = func(i int) {
			if !sendBroker(prefix + strconv.Itoa(i)) {
				mark(reasonBrokerRefused, i)
			}
		}
		bounce = func() { sink.bounce(chaosWeidaAway) }
		unread = &sink.unread
	} else {
		number := func(m weida.Message) (int, bool) {
			rest, ok := strings.CutPrefix(string(m.Payload), prefix)
			i, err := strconv.Atoi(rest)
			return i, ok && err == nil && i >= 0 && i < n
		}
		src := startWeidaSource(t, port, files, func(m weida.Message) {
			if i, ok := number(m); ok {
				mark(reasonPublisherConnClosed, i)
			}
		}, func(u weida.UnconfirmedCopies) {
			for _, m := range u.Messages {
				if i, ok := number(m); ok {
					mark(reasonPublisherUnconfirmed, i)
				}
			}
			unkept.Add(int64(u.Unkept))
		})
		yaml, topic, w := m.outbound(t, b, u, name, src.url, arr)
		if w != nil {
			witness = func() {
				w(func(payload string) {
					if i, ok := number(weida.Message{Payload: []byte(payload)}); ok {
						witnessed.Add(1)
						mark(reasonUndelivered, i)
					}
				})
			}
		}
		lives = startLives(t, amqpEnv, name, "-f", writeFile(t, files, "r.yaml", yaml), "--state-dir", state, "--instance", "chaos-"+u)
		Eventually(t, 30*time.Second, "the probe across the bridge", func() bool {
			src.publish(topic, prefix+"probe")
			time.Sleep(100 * time.Millisecond)
			return arr.sawProbe()
		})
		send = func(i int) {
			res, err := src.publish(topic, prefix+strconv.Itoa(i))
			switch {
			case err != nil:
				mark(reasonPublisherClosed, i)
			case res.Matched == 0:
				mark(reasonNoSubscriber, i)
			case res.Queued == 0:
				mark(reasonPublisherDropped, i)
			}
		}
		bounce = func() { src.bounce(chaosWeidaAway) }
	}

	lives.baseline()
	var killWatch *natsKillWatch
	if mon, ok := natsMonitors.Load(b); ok && dir == policy.Inbound && fault == faultConnectorKill {
		killWatch = watchNATSConn(t, mon.(int), u+".m")
	}

	// The sender: steady rate, whatever the fault does to it.
	senderDone := make(chan struct{})
	sendCtx, stopSending := context.WithCancel(context.Background())
	t.Cleanup(func() { stopSending(); <-senderDone })
	go func() {
		defer close(senderDone)
		interval := time.Second / time.Duration(rate)
		start := time.Now()
		for i := range n {
			if sendCtx.Err() != nil {
				return // the cell failed and ends
			}
			if d := time.Until(start.Add(time.Duration(i) * interval)); d > 0 {
				time.Sleep(d)
			}
			sentAt[i] = time.Now()
			send(i)
			sentCounter.Add(1)
		}
	}()
	waitSent := func(k int) {
		for sentCounter.Load() < int64(k) && time.Now().Before(deadline) {
			time.Sleep(10 * time.Millisecond)
		}
	}

	waitSent(faultAt)
	faultStart = time.Now()
	switch fault {
	case faultBrokerKill:
		b.Kill()
		time.Sleep(time.Second)
		b.Start()
	case faultBrokerPause:
		b.Pause()
		time.Sleep(chaosPause)
		b.Resume()
	case faultWeidaRestart:
		bounce()
	case faultConnectorKill, faultConnectorKillLagging:
		lives.kill()
		// Reading the counters first takes a moment; what was sent
		// meanwhile still met the old process.
		faultStart = lives.killedAt
	}
	faultEnd = time.Now()
	select {
	case <-senderDone:
	case <-time.After(time.Until(deadline)):
		t.Fatalf("the sender did not finish within %s (%d of %d sent)", chaosCellLimit, sentCounter.Load(), n)
	}

	if settle != nil {
		settle()
	}

	// accounted returns how many messages are received or counted as
	// dropped, and the drops by reason. The test's per-message reasons
	// count only missing messages, each under the first reason it carries.
	accounted := func() (int, map[string]float64) {
		if witness != nil {
			witness()
		}
		drops := lives.drops()
		if v := unkept.Load(); v > 0 {
			drops["publisher:unconfirmed-unkept"] = float64(v)
		}
		if unread != nil && unread.Load() > 0 {
			drops["subscriber:unread"] = float64(unread.Load())
		}
		if killWatch != nil && !lives.restartedAt.IsZero() {
			// What nats-server wrote to the killed process and nobody
			// received or counted: the server's count of the dead
			// connection's deliveries since the baseline, less what
			// arrived before the new process started, what the old
			// one counted before it was killed (lives.past) and what
			// the test's subscriber discarded unread.
			if written, ok := killWatch.writtenSince(); ok {
				counted := 0.0
				for _, v := range lives.past {
					counted += v
				}
				// The copies the killed process had handed to the
				// test's weida subscriber and that it discarded unread
				// when that connection died are counted already
				// (subscriber:unread).
				if unread != nil {
					counted += float64(unread.Load())
				}
				if n := written - arr.before(lives.restartedAt) - int(counted); n > 0 {
					drops[reasonWrittenToKilled] = float64(n)
				}
			}
		}
		arr.mu.Lock()
		defer arr.mu.Unlock()
		lostMu.Lock()
		defer lostMu.Unlock()
		for i := range n {
			if arr.count[i] > 0 {
				continue
			}
			for _, reason := range chaosPeerReasons {
				if lost[reason][i] {
					drops[reason]++
					break
				}
			}
		}
		return len(arr.count) + int(chaosCounted(drops, n-len(arr.count))), drops
	}

	// Wait until everything is accounted for, or nothing has moved for
	// chaosSettle while the resource runs. A resource still waiting out its
	// backoff (a failure on record) is not stuck: a broker that took long
	// to restart leaves it a retry of up to --retry-max away, and what the
	// broker holds arrives after that.
	last, lastMove := -1, time.Now()
	for time.Now().Before(deadline) {
		got, _ := accounted()
		if got >= n || (r.durable && arr.distinct() == n) {
			break
		}
		if st, ok := lives.c.Status(name); got != last || ok && st.Failure != nil {
			last, lastMove = got, time.Now()
		} else if time.Since(lastMove) > chaosSettle {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}

	// The result.
	_, r.drops = accounted()
	arr.mu.Lock()
	for _, k := range arr.count {
		if k > 1 {
			r.duplicates += k - 1
		}
	}
	r.received = len(arr.count)
	arr.mu.Unlock()
	r.missing = n - r.received
	r.unaccounted = r.missing - int(chaosCounted(r.drops, r.missing))
	r.recovery = arr.firstAfter(faultEnd)
	if witness != nil {
		t.Logf("the broker's witness stream stored %d of the %d messages", witnessed.Load(), n)
	}
	if total := chaosCounted(r.drops, n); total > float64(r.missing) {
		t.Logf("%v more counted than missing, capped by the reasons that are upper bounds (%v): %d missing, %v counted",
			total-float64(r.missing), chaosPossibleReasons, r.missing, r.drops)
	}
	if r.unaccounted < 0 {
		t.Logf("more drops counted (%v) than messages missing (%d): a copy counted lost also arrived, or a drop was counted twice", r.drops, r.missing)
	}
	if r.unaccounted > 0 {
		// The connector's counts are not per message, so the unaccounted
		// ones hide among these; when each was sent, against the fault,
		// tells where they were lost.
		var unexplained []int
		arr.mu.Lock()
		lostMu.Lock()
		for i := range n {
			if arr.count[i] > 0 {
				continue
			}
			if !slices.ContainsFunc(chaosPeerReasons, func(reason string) bool { return lost[reason][i] }) {
				unexplained = append(unexplained, i)
			}
		}
		lostMu.Unlock()
		arr.mu.Unlock()
		t.Logf("%d unaccounted; the %d missing messages without a per-message reason (connector drops %v are among them), by number, with when each run was sent relative to the fault's start (the fault lasted %s):\n%s",
			r.unaccounted, len(unexplained), lives.drops(), faultEnd.Sub(faultStart).Round(time.Millisecond), chaosRuns(unexplained, sentAt, faultStart))
	}
	return r
}

// chaosCounted is how many of missing messages drops accounts for: every
// firm count, and the possible ones (chaosPossibleReasons) up to what the
// firm ones leave.
func chaosCounted(drops map[string]float64, missing int) float64 {
	firm, possible := 0.0, 0.0
	for k, v := range drops {
		if slices.Contains(chaosPossibleReasons, k) {
			possible += v
		} else {
			firm += v
		}
	}
	return firm + min(possible, max(0, float64(missing)-firm))
}

// chaosRuns renders ascending message numbers as runs of consecutive ones,
// each with the send times of its first and last message relative to t0.
func chaosRuns(nums []int, sentAt []time.Time, t0 time.Time) string {
	const most = 40
	var sb strings.Builder
	runs := 0
	for k := 0; k < len(nums); {
		j := k
		for j+1 < len(nums) && nums[j+1] == nums[j]+1 {
			j++
		}
		if runs == most {
			fmt.Fprintf(&sb, "  ... and %d more messages\n", len(nums)-k)
			break
		}
		first, last := sentAt[nums[k]].Sub(t0), sentAt[nums[j]].Sub(t0)
		fmt.Fprintf(&sb, "  %d-%d (%d): sent %+.3fs .. %+.3fs\n", nums[k], nums[j], j-k+1, first.Seconds(), last.Seconds())
		runs++
		k = j + 1
	}
	return sb.String()
}

// weidaSink is the inbound cell's weida subscriber: it dials again whenever
// its connection ends, and bounce closes it for a while, as a subscriber
// process that dies and comes back.
type weidaSink struct {
	t      *testing.T
	url    string
	arr    *arrivals
	mu     sync.Mutex
	cur    *weida.Subscriber
	away   time.Time    // no dialling before this
	unread atomic.Int64 // copies that arrived and were discarded unread at a close
	cancel context.CancelFunc
	done   chan struct{}
}

func startWeidaSink(t *testing.T, url string, arr *arrivals) *weidaSink {
	ctx, cancel := context.WithCancel(context.Background())
	s := &weidaSink{t: t, url: url, arr: arr, cancel: cancel, done: make(chan struct{})}
	go s.run(ctx)
	t.Cleanup(func() { cancel(); <-s.done })
	return s
}

func (s *weidaSink) run(ctx context.Context) {
	defer close(s.done)
	for ctx.Err() == nil {
		s.mu.Lock()
		wait := time.Until(s.away)
		s.mu.Unlock()
		if wait > 0 {
			select {
			case <-time.After(wait):
			case <-ctx.Done():
				return
			}
		}
		dctx, cancel := context.WithTimeout(ctx, 3*time.Second)
		sub, err := weida.Dial(dctx, s.url, weida.DialConfig{InsecureSkipVerifyForTesting: true})
		if err == nil {
			if err = sub.Subscribe(dctx, "#"); err != nil {
				sub.Close()
			}
		}
		cancel()
		if err != nil {
			select {
			case <-time.After(50 * time.Millisecond):
			case <-ctx.Done():
			}
			continue
		}
		s.mu.Lock()
		s.cur = sub
		s.mu.Unlock()
		for {
			m, err := sub.Receive(ctx)
			if err != nil {
				break
			}
			s.arr.add(string(m.Payload), time.Now())
		}
		sub.Close()
		s.unread.Add(int64(sub.Stats().DroppedUnread))
	}
}

// bounce closes the subscriber's connection and keeps it away for d.
func (s *weidaSink) bounce(d time.Duration) {
	s.mu.Lock()
	s.away = time.Now().Add(d)
	sub := s.cur
	s.mu.Unlock()
	if sub != nil {
		// A subscriber that leaves cleanly, as a well-behaved process on
		// SIGTERM does: UNSUBSCRIBE, take what is in flight, then close.
		// The run loop goes on receiving meanwhile.
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sub.Shutdown(ctx)
		cancel()
	}
	time.Sleep(d)
}

// weidaSource is the outbound cell's weida publisher: a listener on a fixed
// address with a fixed identity, so that it can be closed and started again
// where the connector's resource pins it.
type weidaSource struct {
	t        *testing.T
	addr     string
	cfg      weida.ListenConfig
	url      string
	onLost   func(weida.Message)
	onUnconf func(weida.UnconfirmedCopies)
	mu       sync.Mutex
	l        *weida.Listener
	pub      *weida.Publisher
}

func startWeidaSource(t *testing.T, port int, dir string, onLost func(weida.Message), onUnconfirmed func(weida.UnconfirmedCopies)) *weidaSource {
	cert, key, fp := weidaCert(t, dir)
	s := &weidaSource{t: t, addr: fmt.Sprintf("127.0.0.1:%d", port), cfg: weida.ListenConfig{CertFile: cert, KeyFile: key}, onLost: onLost, onUnconf: onUnconfirmed}
	s.url = "weida://" + fp + "@" + s.addr + "/chaos"
	s.listen()
	t.Cleanup(func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		if s.l != nil {
			s.l.Close()
		}
	})
	return s
}

func (s *weidaSource) listen() {
	var l *weida.Listener
	var err error
	// The port of the closed listener may take a moment to be free again.
	for range 50 {
		if l, err = weida.Listen(context.Background(), s.addr, s.cfg); err == nil {
			break
		}
		time.Sleep(50 * time.Millisecond)
	}
	if err != nil {
		s.t.Fatalf("weida listener on %s: %v", s.addr, err)
	}
	pub, err := l.Publisher("/chaos")
	if err != nil {
		s.t.Fatal(err)
	}
	pub.OnCopyLost(s.onLost)
	pub.OnCopiesUnconfirmed(s.onUnconf)
	s.mu.Lock()
	s.l, s.pub = l, pub
	s.mu.Unlock()
}

func (s *weidaSource) publish(topic, payload string) (weida.Result, error) {
	s.mu.Lock()
	pub := s.pub
	s.mu.Unlock()
	if pub == nil {
		return weida.Result{}, weida.ErrClosed
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return pub.Publish(ctx, weida.Message{Topic: topic, Payload: []byte(payload)})
}

// bounce closes the listener, as a weida publisher process that dies, and
// starts it again on the same address and identity after d.
func (s *weidaSource) bounce(d time.Duration) {
	s.mu.Lock()
	l := s.l
	s.l, s.pub = nil, nil
	s.mu.Unlock()
	// A publisher process that stops cleanly: its queues go out first.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	l.Shutdown(ctx)
	cancel()
	time.Sleep(d)
	s.listen()
}

func chaosModes() []chaosMode {
	return []chaosMode{
		{name: "mqtt-qos1", durable: true, start: func(t *testing.T) *brokertest.Broker {
			// Mosquitto writes its store only every autosave_interval
			// (30 min by default) and at a clean exit: killed, it forgets
			// every session and queued message since. Saving at each
			// change makes the broker durable, as a persistent session
			// meant to survive it needs.
			return brokertest.StartMosquitto(t, "autosave_on_changes true", "autosave_interval 1")
		}, inbound: mqttChaosIn, outbound: mqttChaosOut},
		{name: "nats-jetstream", durable: true, start: func(t *testing.T) *brokertest.Broker {
			return brokertest.StartNATS(t)
		}, inbound: jsChaosIn, outbound: jsChaosOut},
		{name: "nats-core", start: func(t *testing.T) *brokertest.Broker {
			// With its monitoring port, to read what it wrote to a killed
			// connector's connection (natsWrittenToKilled).
			mon := freePort(t, "tcp")
			b := brokertest.StartNATS(t, "-m", strconv.Itoa(mon))
			natsMonitors.Store(b, mon)
			return b
		}, inbound: coreChaosIn, outbound: coreChaosOut},
		{name: "amqp-durable", durable: true, start: func(t *testing.T) *brokertest.Broker {
			return brokertest.StartRabbit(t)
		}, inbound: amqpChaosIn, outbound: amqpChaosOut},
	}
}

// sendUntil retries try until it succeeds or 30 s pass.
func sendUntil(try func() error) bool {
	deadline := time.Now().Add(30 * time.Second)
	for {
		if try() == nil {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// mqttSession is a reconnecting MQTT client: a fresh connection whenever
// the last one failed, resuming the same session when expiry > 0.
type mqttSession struct {
	t      *testing.T
	addr   string
	id     string
	expiry uint32
	onMsg  func(mqttMsg)
	topics []string // subscribed at QoS 1 on each connection
	mu     sync.Mutex
	c      *mqttClient
}

func (s *mqttSession) get() (*mqttClient, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		select {
		case <-s.c.Done():
			s.c = nil
		default:
			return s.c, nil
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	c, err := mqttDialSession(ctx, s.addr, s.id, s.expiry, s.onMsg)
	if err != nil {
		return nil, err
	}
	if len(s.topics) > 0 {
		sub := &paho.Subscribe{}
		for _, f := range s.topics {
			sub.Subscriptions = append(sub.Subscriptions, paho.SubscribeOptions{Topic: f, QoS: 1})
		}
		if _, err := c.Subscribe(ctx, sub); err != nil {
			c.close()
			return nil, err
		}
	}
	s.c = c
	return c, nil
}

func (s *mqttSession) drop(c *mqttClient) {
	s.mu.Lock()
	if s.c == c {
		s.c = nil
	}
	s.mu.Unlock()
	c.close()
}

func (s *mqttSession) close() {
	s.mu.Lock()
	c := s.c
	s.c = nil
	s.mu.Unlock()
	if c != nil {
		c.close()
	}
}

func mqttChaosIn(t *testing.T, b brokerAt, u, name, endpoint string, _ func(string, string)) (string, func(string) bool, func()) {
	res := mqttResource{Name: name, Direction: policy.Inbound, Broker: b.Addr(), QoS: 1, SessionExpiry: "300s", Hold: true,
		Endpoint: endpoint, Routes: []mqttRoute{{"r", u + "/#"}}}
	pub := &mqttSession{t: t, addr: b.Addr(), id: "pub-" + u}
	t.Cleanup(pub.close)
	return res.YAML(t), func(payload string) bool {
		return sendUntil(func() error {
			c, err := pub.get()
			if err != nil {
				return err
			}
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			resp, err := c.Publish(ctx, &paho.Publish{Topic: u + "/m", QoS: 1, Payload: []byte(payload)})
			if err == nil && resp != nil && resp.ReasonCode >= 0x80 {
				err = fmt.Errorf("puback 0x%02x", resp.ReasonCode)
			}
			if err != nil {
				pub.drop(c)
			}
			return err
		})
	}, nil
}

func mqttChaosOut(t *testing.T, b brokerAt, u, name, dial string, arr *arrivals) (string, string, func(func(string))) {
	res := mqttResource{Name: name, Direction: policy.Outbound, Broker: b.Addr(), QoS: 1, Endpoint: dial,
		Routes: []mqttRoute{{"r", u + "/#"}}}
	// The reader keeps a session of its own, so that what the broker took
	// while the reader was cut off waits for it.
	rd := &mqttSession{t: t, addr: b.Addr(), id: "rd-" + u, expiry: 300, topics: []string{u + "/#"},
		onMsg: func(m mqttMsg) { arr.add(string(m.Payload), time.Now()) }}
	keepConnected(t, func() error {
		c, err := rd.get()
		if err != nil {
			return err
		}
		<-c.Done()
		rd.drop(c)
		return nil
	}, rd.close)
	p, err := policy.Lookup(mqtt.Driver.Policies(), policy.MQTTLevels)
	if err != nil {
		t.Fatal(err)
	}
	return res.YAML(t), weidaTopic(t, p, u+"/m"), nil
}

// keepConnected runs hold (which returns when its connection ended) again
// and again until the test ends; stop makes a running hold return.
func keepConnected(t *testing.T, hold func() error, stop func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			if err := hold(); err != nil {
				select {
				case <-time.After(100 * time.Millisecond):
				case <-ctx.Done():
				}
			}
		}
	}()
	t.Cleanup(func() {
		cancel()
		for {
			stop()
			select {
			case <-done:
				return
			case <-time.After(100 * time.Millisecond):
			}
		}
	})
}

func jsSetup(t *testing.T, b brokerAt, u string) (*natsgo.Conn, jetstream.JetStream, string) {
	nc := natsConn(t, b.Addr(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	stream := "CHAOS_" + u
	return nc, createStream(t, nc, stream, u+".>"), stream
}

func jsChaosIn(t *testing.T, b brokerAt, u, name, endpoint string, _ func(string, string)) (string, func(string) bool, func()) {
	_, js, stream := jsSetup(t, b, u)
	durable := "bridge-" + u
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := js.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{
		Durable: durable, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 2 * time.Second, FilterSubject: u + ".m",
	}); err != nil {
		t.Fatal(err)
	}
	res := natsResource{Name: name, Direction: policy.Inbound, Broker: b.Addr(), Endpoint: endpoint,
		Stream: stream, Durable: durable, Routes: []string{u + ".m"}, Hold: true}
	return res.YAML(t), func(payload string) bool {
		// The message id makes a retry of a publish that did land one
		// the stream drops.
		return sendUntil(func() error {
			ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_, err := js.Publish(ctx, u+".m", []byte(payload), jetstream.WithMsgID(payload))
			return err
		})
	}, nil
}

func jsChaosOut(t *testing.T, b brokerAt, u, name, dial string, arr *arrivals) (string, string, func(func(string))) {
	_, js, stream := jsSetup(t, b, u)
	res := natsResource{Name: name, Direction: policy.Outbound, Broker: b.Addr(), Endpoint: dial,
		Stream: stream, Routes: []string{u + ".m"}}
	// A durable consumer of the test's own reads what the stream stored,
	// across the broker's restarts.
	cctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cons, err := js.CreateConsumer(cctx, stream, jetstream.ConsumerConfig{Durable: "rd-" + u, AckPolicy: jetstream.AckExplicitPolicy, AckWait: 5 * time.Second})
	if err != nil {
		t.Fatal(err)
	}
	var stopped atomic.Bool
	keepConnected(t, func() error {
		if stopped.Load() {
			time.Sleep(50 * time.Millisecond)
			return nil
		}
		batch, err := cons.Fetch(100, jetstream.FetchMaxWait(time.Second))
		if err != nil {
			return err
		}
		for m := range batch.Messages() {
			at := time.Now()
			if md, err := m.Metadata(); err == nil {
				at = md.Timestamp // when the stream stored it
			}
			arr.add(string(m.Data()), at)
			_ = m.Ack()
		}
		return batch.Error()
	}, func() { stopped.Store(true) })
	return res.YAML(t), weidaTopic(t, policy.NATSTokensV1(), u+".m"), nil
}

func coreChaosIn(t *testing.T, b brokerAt, u, name, endpoint string, lost func(payload, reason string)) (string, func(string) bool, func()) {
	nc := natsConn(t, b.Addr(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	// Core NATS discards a message no subscription matches, but it tells
	// a publisher that asks: a message published with a reply subject by
	// a connection that announced headers and no_responders (nats.go does
	// by default) draws a status 503 "no responders" message on that reply
	// subject when nobody was interested. That is how the messages sent
	// while the connector holds no subscription at the server (the server
	// or the connector restarting) are counted. The 503 carries no
	// payload, so each message's reply subject ends in its payload. The
	// server answers only on the publishing connection, and nats.go
	// subscribes again after a reconnect, before it sends what it buffered
	// meanwhile.
	replies := "chaos-reply." + u
	const settleMark = "settle"
	settled := make(chan struct{})
	var settleOnce sync.Once
	if _, err := nc.Subscribe(replies+".*", func(m *natsgo.Msg) {
		if m.Header.Get("Status") != "503" {
			return
		}
		payload := strings.TrimPrefix(m.Subject, replies+".")
		if payload == settleMark {
			settleOnce.Do(func() { close(settled) })
			return
		}
		lost(payload, reasonNoInterest)
	}); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	res := natsResource{Name: name, Direction: policy.Inbound, Broker: b.Addr(), Endpoint: endpoint, Routes: []string{u + ".m"}}
	send := func(payload string) bool {
		// At most once: one attempt. A failed flush may still have
		// delivered the message; the accounting counts refusals only
		// among the missing.
		if err := nc.PublishMsg(&natsgo.Msg{Subject: u + ".m", Reply: replies + "." + payload, Data: []byte(payload)}); err != nil {
			return false
		}
		return nc.FlushTimeout(time.Second) == nil
	}
	// One subscription's messages reach its handler in order, and the
	// server answers one connection's publishes in order: once the 503 for
	// a last publish on a subject nobody reads has been handled, so has
	// every 503 before it, including those for messages nats.go held
	// across a reconnect and sent late.
	settle := func() {
		deadline := time.Now().Add(30 * time.Second)
		for {
			_ = nc.PublishMsg(&natsgo.Msg{Subject: u + ".nobody", Reply: replies + "." + settleMark})
			select {
			case <-settled:
				return
			case <-time.After(time.Second):
			}
			if time.Now().After(deadline) {
				t.Errorf("core NATS: no 503 for the settling publish on %s.nobody in 30 s; late no-interest reports may be missing from the count", u)
				return
			}
		}
	}
	return res.YAML(t), send, settle
}

func coreChaosOut(t *testing.T, b brokerAt, u, name, dial string, arr *arrivals) (string, string, func(func(string))) {
	nc := natsConn(t, b.Addr(), natsgo.MaxReconnects(-1), natsgo.ReconnectWait(50*time.Millisecond))
	if _, err := nc.Subscribe(u+".m", func(m *natsgo.Msg) { arr.add(string(m.Data), time.Now()) }); err != nil {
		t.Fatal(err)
	}
	if err := nc.FlushTimeout(10 * time.Second); err != nil {
		t.Fatal(err)
	}
	// The witness: a stream on the same server capturing the subject, on
	// disk, so that it outlives the server's restarts. Core NATS delivers
	// a publish only to the subscriptions the server holds at that
	// moment; after a restart the connector may publish (what it held
	// across the outage, confirmed by its PONG) before the reader's
	// subscription is back, and the server discards those for the
	// reader, telling nobody. The stream shows which messages the server
	// took: one stored and never received was lost at the server, on the
	// way to a subscriber that was not there (broker:undelivered).
	stream := "WITNESS_" + u
	js := createStream(t, nc, stream, u+".m")
	var last uint64 // the stream sequence read up to
	witness := func(visit func(string)) {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		st, err := js.Stream(ctx, stream)
		if err != nil {
			t.Logf("core NATS witness stream: %v", err)
			return
		}
		info, err := st.Info(ctx)
		if err != nil || info.State.LastSeq <= last {
			return
		}
		cons, err := st.OrderedConsumer(ctx, jetstream.OrderedConsumerConfig{
			DeliverPolicy: jetstream.DeliverByStartSequencePolicy, OptStartSeq: last + 1})
		if err != nil {
			t.Logf("core NATS witness consumer: %v", err)
			return
		}
		for last < info.State.LastSeq && ctx.Err() == nil {
			batch, err := cons.Fetch(500, jetstream.FetchMaxWait(time.Second))
			if err != nil {
				t.Logf("core NATS witness: %v", err)
				return
			}
			got := 0
			for m := range batch.Messages() {
				got++
				if md, err := m.Metadata(); err == nil {
					last = md.Sequence.Stream
				}
				visit(string(m.Data()))
			}
			if got == 0 {
				return
			}
		}
	}
	res := natsResource{Name: name, Direction: policy.Outbound, Broker: b.Addr(), Endpoint: dial, Routes: []string{u + ".m"}}
	return res.YAML(t), weidaTopic(t, policy.NATSTokensV1(), u+".m"), witness
}

// amqpSession is a reconnecting AMQP publisher with confirms.
type amqpSession struct {
	addr string
	mu   sync.Mutex
	c    *amqpClient
}

func (s *amqpSession) publish(key, body string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c == nil || s.c.conn.IsClosed() {
		c, err := amqpDial(s.addr)
		if err != nil {
			return err
		}
		s.c = c
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	err := s.c.publish(ctx, "amq.topic", key, amqp.Publishing{Body: []byte(body)})
	if err != nil {
		s.c.conn.Close()
		s.c = nil
	}
	return err
}

func (s *amqpSession) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.c != nil {
		s.c.conn.Close()
	}
}

func amqpChaosIn(t *testing.T, b brokerAt, u, name, endpoint string, _ func(string, string)) (string, func(string) bool, func()) {
	queue := "chaos-" + u
	exclusive := false
	res := amqpResource{Name: name, Direction: policy.Inbound, Broker: b.Addr(), Endpoint: endpoint, QueueName: queue, Durable: true,
		Exclusive: &exclusive, Routes: []amqpRoute{{Filter: u + ".m"}}, Hold: true}
	pub := &amqpSession{addr: b.Addr()}
	t.Cleanup(pub.close)
	return res.YAML(t), func(payload string) bool {
		return sendUntil(func() error { return pub.publish(u+".m", payload) })
	}, nil
}

func amqpChaosOut(t *testing.T, b brokerAt, u, name, dial string, arr *arrivals) (string, string, func(func(string))) {
	queue := "rd-" + u
	// The reader's queue is durable and bound before the connector
	// starts, so that it keeps what the connector publishes across the
	// broker's restarts; it acknowledges what it recorded.
	c := amqpConnect(t, b.Addr())
	if _, err := c.ch.QueueDeclare(queue, true, false, false, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := c.ch.QueueBind(queue, u+".m", "amq.topic", false, nil); err != nil {
		t.Fatal(err)
	}
	var (
		mu  sync.Mutex
		cur *amqp.Connection
	)
	keepConnected(t, func() error {
		rc, err := amqpDial(b.Addr())
		if err != nil {
			return err
		}
		defer rc.conn.Close()
		mu.Lock()
		cur = rc.conn
		mu.Unlock()
		ds, err := rc.ch.Consume(queue, "", false, false, false, false, nil)
		if err != nil {
			return err
		}
		for d := range ds {
			arr.add(string(d.Body), time.Now())
			_ = d.Ack(false)
		}
		return errors.New("deliveries ended")
	}, func() {
		mu.Lock()
		if cur != nil {
			cur.Close()
		}
		mu.Unlock()
	})
	res := amqpResource{Name: name, Direction: policy.Outbound, Broker: b.Addr(), Endpoint: dial, Routes: []amqpRoute{{Filter: u + ".m"}}}
	return res.YAML(t), weidaTopic(t, policy.AMQPWordsV1(), u+".m"), nil
}

// weidaTopic converts a foreign topic the test chose, which must have a
// weida form.
func weidaTopic(t *testing.T, p policy.Policy, foreign string) string {
	t.Helper()
	wt, err := p.TopicToWeida(foreign)
	if err != nil {
		t.Fatal(err)
	}
	return wt
}

// natsMonitors maps a private nats-server started with its monitoring port
// to that port.
var natsMonitors sync.Map // *brokertest.Broker → int

// natsKillWatch follows one client connection of a nats-server through its
// monitoring endpoint: its out_msgs when the watch began, and, once the
// connection has closed, its final out_msgs from the server's record of
// closed connections.
type natsKillWatch struct {
	t       *testing.T
	monitor int
	cid     uint64
	base    int
}

type natsConnz struct {
	Connections []struct {
		CID     uint64   `json:"cid"`
		OutMsgs int      `json:"out_msgs"`
		Subs    []string `json:"subscriptions_list"`
	} `json:"connections"`
}

func readConnz(monitor int, state string) (natsConnz, error) {
	var z natsConnz
	resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/connz?state=%s&subs=1&limit=1024", monitor, state))
	if err != nil {
		return z, err
	}
	defer resp.Body.Close()
	return z, json.NewDecoder(resp.Body).Decode(&z)
}

// watchNATSConn finds the open connection subscribed to subject (the
// connector's) and notes its out_msgs.
func watchNATSConn(t *testing.T, monitor int, subject string) *natsKillWatch {
	z, err := readConnz(monitor, "open")
	if err != nil {
		t.Fatalf("nats-server monitoring: %v", err)
	}
	for _, c := range z.Connections {
		if slices.Contains(c.Subs, subject) {
			return &natsKillWatch{t: t, monitor: monitor, cid: c.CID, base: c.OutMsgs}
		}
	}
	t.Fatalf("no connection of nats-server subscribes to %s", subject)
	return nil
}

// writtenSince returns how many messages the server delivered to the
// watched connection since the watch began, once it has closed.
func (w *natsKillWatch) writtenSince() (int, bool) {
	z, err := readConnz(w.monitor, "closed")
	if err != nil {
		w.t.Logf("nats-server monitoring: %v", err)
		return 0, false
	}
	for _, c := range z.Connections {
		if c.CID == w.cid {
			return c.OutMsgs - w.base, true
		}
	}
	return 0, false
}
