package e2e

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// privateMosquitto is a Mosquitto process of the test's own, on a free
// loopback port, with its configuration and persistence in a temporary
// directory, so that a test may kill and restart it without disturbing
// the shared broker. It is stopped when the test ends.
type privateMosquitto struct {
	t    testing.TB
	port int
	conf string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  bytes.Buffer
}

// startPrivateMosquitto writes a configuration (listener on 127.0.0.1,
// anonymous clients, persistence in a temporary directory, plus extra
// lines) and starts the broker.
func startPrivateMosquitto(t testing.TB, extra ...string) *privateMosquitto {
	t.Helper()
	bin, err := exec.LookPath("mosquitto")
	if err != nil {
		bin = "/usr/sbin/mosquitto"
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("mosquitto is not installed (run scripts/brokers): %v", err)
	}
	dir := t.TempDir()
	m := &privateMosquitto{t: t, port: freePort(t, "tcp"), conf: filepath.Join(dir, "mosquitto.conf")}
	var b bytes.Buffer
	fmt.Fprintf(&b, "listener %d 127.0.0.1\nallow_anonymous true\n", m.port)
	fmt.Fprintf(&b, "persistence true\npersistence_location %s/\n", dir)
	// Run as root, Mosquitto would switch to its own user, which cannot
	// write the test's directory.
	if os.Getuid() == 0 {
		b.WriteString("user root\n")
	}
	b.WriteString("max_queued_messages 100000\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n")
	for _, l := range extra {
		b.WriteString(l + "\n")
	}
	if err := os.WriteFile(m.conf, b.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	m.start(bin)
	t.Cleanup(func() {
		m.stop(syscall.SIGKILL)
		if t.Failed() {
			t.Logf("private mosquitto output:\n%s", m.output())
		}
	})
	return m
}

// pid returns the broker's process id.
func (m *privateMosquitto) pid() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.cmd.Process.Pid
}

// Addr is the broker's host:port.
func (m *privateMosquitto) Addr() string { return fmt.Sprintf("127.0.0.1:%d", m.port) }

func (m *privateMosquitto) output() string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.out.String()
}

type mosqWriter struct{ m *privateMosquitto }

func (w mosqWriter) Write(p []byte) (int, error) {
	w.m.mu.Lock()
	defer w.m.mu.Unlock()
	return w.m.out.Write(p)
}

// start runs the broker and waits until it accepts connections.
func (m *privateMosquitto) start(bin string) {
	m.t.Helper()
	cmd := exec.Command(bin, "-c", m.conf)
	cmd.Stdout, cmd.Stderr = mosqWriter{m}, mosqWriter{m}
	if err := cmd.Start(); err != nil {
		m.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	m.mu.Lock()
	m.cmd, m.done = cmd, done
	m.mu.Unlock()
	deadline := time.Now().Add(10 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", m.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			m.t.Fatalf("private mosquitto exited at start:\n%s", m.output())
		default:
		}
		if time.Now().After(deadline) {
			m.t.Fatalf("private mosquitto not listening on %s: %v", m.Addr(), err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// stop signals the broker and waits for it to exit (SIGTERM saves the
// persistence database; SIGKILL does not).
func (m *privateMosquitto) stop(sig syscall.Signal) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	_ = cmd.Process.Signal(sig)
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		_ = cmd.Process.Kill()
		<-done
	}
}

// restart stops the broker with sig and starts it again on the same port.
func (m *privateMosquitto) restart(sig syscall.Signal) {
	m.t.Helper()
	m.stop(sig)
	m.mu.Lock()
	bin := m.cmd.Path
	m.mu.Unlock()
	m.start(bin)
}

// TestMQTTBrokerRestartLosesNothing publishes at QoS 1 while the broker is
// stopped (SIGTERM, twice mid-stream) and killed (SIGKILL, once) and
// started again: the connector reconnects on its own, resumes its
// persistent session, and a weida subscriber receives every message (at
// least once: duplicates are QoS 1's right).
func TestMQTTBrokerRestartLosesNothing(t *testing.T) {
	broker := startPrivateMosquitto(t)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/restart", freePort(t, "udp"))
	res := mqttResource{
		Name: "mqtt-restart", Direction: policy.Inbound, QoS: 1, Broker: broker.Addr(),
		Endpoint: endpoint, SessionExpiry: "300s",
		Routes: []mqttRoute{{"all", u + "/#"}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "restart.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := &resilientPublisher{t: t, addr: broker.Addr(), id: "pub-" + u}
	sub.Sync(20*time.Second, "probe", func() { pub.publish(u+"/probe", "probe") })

	distinct := func() map[string]int {
		seen := make(map[string]int)
		for _, m := range sub.Messages() {
			seen[string(m.Payload)]++
		}
		return seen
	}
	const n = 400
	for i := range n {
		switch i {
		case n / 4, 3 * n / 4:
			// Mid-stream: messages may be in flight to the connector,
			// unacknowledged; the broker saves them with the session.
			broker.restart(syscall.SIGTERM)
		case n / 2:
			// A crash loses what Mosquitto had not saved, which is the
			// broker's durability, not the connector's: kill it once
			// what it acknowledged so far has crossed, and check that
			// the connector comes back and loses nothing after.
			Eventually(t, 30*time.Second, "the first half at the weida subscriber", func() bool { return len(distinct()) >= i })
			broker.restart(syscall.SIGKILL)
		}
		pub.publish(fmt.Sprintf("%s/m/%d", u, i%7), fmt.Sprintf("m-%03d", i))
		// A short pause keeps the stream going across the restarts
		// instead of finishing between two of them.
		time.Sleep(2 * time.Millisecond)
	}
	t.Logf("publisher reconnected %d times", pub.reconnects)

	Eventually(t, 60*time.Second, fmt.Sprintf("all %d messages at the weida subscriber", n), func() bool {
		seen := distinct()
		for i := range n {
			if seen[fmt.Sprintf("m-%03d", i)] == 0 {
				return false
			}
		}
		return true
	})
	dups := 0
	for p, k := range distinct() {
		if k > 1 {
			dups += k - 1
		}
		if len(p) > 0 && p[0] != 'm' && p != "probe" {
			t.Errorf("unexpected payload %q", p)
		}
	}
	t.Logf("%d messages, %d duplicates (QoS 1 redelivery), weida subscriber dialled %d times", n, dups, sub.Dials())

	st, _ := c.Status("mqtt-restart")
	if st.Counters.Reconnects == 0 {
		t.Errorf("status reconnects = 0 after two broker restarts:\n%s", c.StatusJSON())
	}
	if v := c.Metric(`weida_connector_reconnects_total{resource="mqtt-restart",side="broker"}`); v < 1 {
		t.Errorf("metric reconnects_total{side=broker} = %v, want > 0", v)
	}
	Eventually(t, 20*time.Second, "the connector ready again", func() bool {
		st, _ := c.Status("mqtt-restart")
		return st.ready()
	})
}

// resilientPublisher publishes at QoS 1 and, when the broker goes away,
// connects again and republishes until the broker acknowledges: once
// publish returns, the broker has taken responsibility for the message.
type resilientPublisher struct {
	t          testing.TB
	addr, id   string
	c          *mqttClient
	reconnects int
}

func (p *resilientPublisher) publish(topic, payload string) {
	p.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if p.c == nil {
			c, err := mqttDial(ctx(p.t, 5*time.Second), p.addr, p.id, func(mqttMsg) {})
			if err == nil {
				p.c = c
				p.t.Cleanup(c.close)
			}
		}
		if p.c != nil {
			pctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			resp, err := p.c.Publish(pctx, &paho.Publish{Topic: topic, QoS: 1, Payload: []byte(payload)})
			cancel()
			if err == nil && (resp == nil || resp.ReasonCode < 0x80) {
				return
			}
			p.c.close()
			p.c = nil
			p.reconnects++
		}
		if time.Now().After(deadline) {
			p.t.Fatalf("could not publish %q within 30 s", topic)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
