package e2e

import (
	"bytes"
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"os/user"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// privateRabbit is a RabbitMQ node of the test's own: its own node name,
// AMQP and distribution ports on loopback, and its data in a temporary
// directory, so that a test can stop and restart it without disturbing the
// shared broker. (`rabbitmqctl stop_app`/`start_app` would be faster, but on
// RabbitMQ 3.10.8 here start_app fails to re-open the listener with
// eaddrinuse, which on the shared broker would break every other test.)
// Every restart is a full one: a new Erlang VM that recovers durable
// queues and persistent messages from disk. The node is stopped when the
// test ends.
type privateRabbit struct {
	t    testing.TB
	node string
	port int
	dir  string
	env  []string
	ctl  string
	bin  string

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}
	out  bytes.Buffer
}

func sbin(name string) string {
	if p, err := exec.LookPath(name); err == nil {
		return p
	}
	return "/usr/sbin/" + name
}

// startPrivateRabbit configures a node in a fresh directory and starts it.
func startPrivateRabbit(t testing.TB, extraConf ...string) *privateRabbit {
	t.Helper()
	r := &privateRabbit{t: t, bin: sbin("rabbitmq-server"), ctl: sbin("rabbitmqctl")}
	if _, err := os.Stat(r.bin); err != nil {
		t.Fatalf("rabbitmq-server is not installed (run scripts/brokers): %v", err)
	}
	dir, err := os.MkdirTemp("", "e2e-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	r.dir = dir
	t.Cleanup(func() { os.RemoveAll(dir) })
	// Run as root, the server script switches to the rabbitmq user, which
	// must own the node's directory.
	if os.Getuid() == 0 {
		if u, err := user.Lookup("rabbitmq"); err == nil {
			uid, _ := strconv.Atoi(u.Uid)
			gid, _ := strconv.Atoi(u.Gid)
			if err := os.Chown(dir, uid, gid); err != nil {
				t.Fatal(err)
			}
		}
	}
	r.port = freePort(t, "tcp")
	r.node = fmt.Sprintf("e2e-%08x@localhost", rand.Uint32())
	conf := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\nloopback_users.guest = true\n", r.port)
	for _, l := range extraConf {
		conf += l + "\n"
	}
	writeFile(t, dir, "rabbitmq.conf", conf)
	writeFile(t, dir, "enabled_plugins", "[].\n")
	r.env = []string{
		"RABBITMQ_NODENAME=" + r.node,
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(freePort(t, "tcp")),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "pid"),
	}
	t.Cleanup(func() {
		r.Stop()
		if t.Failed() {
			t.Logf("private RabbitMQ output:\n%s", r.output())
		}
	})
	r.Start()
	return r
}

// Addr returns the node's AMQP address.
func (r *privateRabbit) Addr() string { return fmt.Sprintf("127.0.0.1:%d", r.port) }

func (r *privateRabbit) output() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.out.String()
}

type rabbitOut struct{ r *privateRabbit }

func (w rabbitOut) Write(p []byte) (int, error) {
	w.r.mu.Lock()
	defer w.r.mu.Unlock()
	return w.r.out.Write(p)
}

// Start starts the node and waits until it accepts AMQP connections.
func (r *privateRabbit) Start() {
	r.t.Helper()
	cmd := exec.Command(r.bin)
	cmd.Env = append(os.Environ(), r.env...)
	cmd.Stdout, cmd.Stderr = rabbitOut{r}, rabbitOut{r}
	// Its own process group, so that a failed test can end the node's
	// whole tree (the script, su, and the Erlang VM) and nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		r.t.Fatal(err)
	}
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	r.mu.Lock()
	r.cmd, r.done = cmd, done
	r.mu.Unlock()
	deadline := time.Now().Add(90 * time.Second)
	for {
		c, err := net.DialTimeout("tcp", r.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			r.t.Fatalf("private RabbitMQ exited while starting:\n%s", r.output())
		default:
		}
		if time.Now().After(deadline) {
			r.t.Fatalf("private RabbitMQ not listening on %s after 90 s:\n%s", r.Addr(), r.output())
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// Stop stops the node gracefully and waits for its VM to exit; if it will
// not, it kills the node's process group. It does nothing when the node is
// not running.
func (r *privateRabbit) Stop() {
	r.mu.Lock()
	cmd, done := r.cmd, r.done
	r.cmd = nil
	r.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return // it exited by itself (it may never have started)
	default:
	}
	// rabbitmqctl stop waits for the node's pid file: bound it, and end
	// its whole tree (the script and su) if it overruns.
	sctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := exec.CommandContext(sctx, r.ctl, "-n", r.node, "stop", filepath.Join(r.dir, "pid"))
	stop.Env = append(os.Environ(), r.env...)
	stop.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stop.Cancel = func() error { return syscall.Kill(-stop.Process.Pid, syscall.SIGKILL) }
	if out, err := stop.CombinedOutput(); err != nil {
		r.t.Logf("rabbitmqctl stop: %v\n%s", err, out)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		r.t.Errorf("private RabbitMQ did not stop within 30 s; killing it")
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		<-done
	}
}

// reliablePublisher publishes persistent messages with confirms, redialling
// and publishing again whatever was not confirmed, so that every message is
// on the broker at least once even across broker restarts.
type reliablePublisher struct {
	addr   string
	client *amqpClient
}

func (p *reliablePublisher) publish(ctx context.Context, exchange, key, body string) error {
	for {
		if p.client == nil {
			c, err := amqpDial(p.addr)
			if err == nil {
				p.client = c
			}
		}
		if p.client != nil {
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err := p.client.publish(pctx, exchange, key, amqp.Publishing{Body: []byte(body)})
			cancel()
			if err == nil {
				return nil
			}
			p.client.conn.Close()
			p.client = nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func (p *reliablePublisher) close() {
	if p.client != nil {
		p.client.conn.Close()
	}
}

// missing returns the payloads of want that col has not received.
func missing(col *weidaCollector, want []string) []string {
	have := map[string]bool{}
	for _, m := range col.Messages() {
		have[string(m.Payload)] = true
	}
	var out []string
	for _, w := range want {
		if !have[w] {
			out = append(out, w)
		}
	}
	return out
}

// TestAMQPBrokerRestartLosesNothing runs an inbound resource on a durable
// queue of a private RabbitMQ and restarts the broker twice:
//
//  1. mid-stream, with the connector running: it notices, reports the
//     broker down, reconnects by itself, declares and binds again and
//     resumes; every message published (with confirms, persistent) arrives
//     at the weida subscriber, the ones unacknowledged at the restart
//     redelivered from the queue;
//  2. with the connector stopped: what is published meanwhile waits in the
//     durable queue across the broker restart, and a connector started
//     while the broker is still down connects once it is back and delivers
//     all of it.
func TestAMQPBrokerRestartLosesNothing(t *testing.T) {
	rb := startPrivateRabbit(t)
	u := unique()
	queue := "e2e-restart-" + u
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/restart", freePort(t, "udp"))
	res := amqpResource{
		Name: "amqp-restart", Direction: policy.Inbound, Broker: rb.Addr(),
		QueueName: queue, Durable: true, Prefetch: 16, Endpoint: endpoint,
		Routes: []amqpRoute{{"stream", "stream.#"}},
	}
	file := writeFile(t, t.TempDir(), "restart.yaml", res.YAML(t))
	c := StartConnector(t, amqpEnv, "-f", file)
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := &reliablePublisher{addr: rb.Addr()}
	defer pub.close()
	sub.Sync(20*time.Second, "probe-"+u, func() {
		if err := pub.publish(ctx(t, 10*time.Second), "amq.topic", "stream.probe", "probe-"+u); err != nil {
			t.Fatal(err)
		}
	})

	// 1. Mid-stream: the publisher keeps going until told to stop, before,
	// during and after the restart.
	var (
		mu        sync.Mutex
		want      []string
		stopPub   = make(chan struct{})
		pubDone   = make(chan error, 1)
		confirmed = func() int { mu.Lock(); defer mu.Unlock(); return len(want) }
	)
	go func() {
		pctx, cancel := context.WithTimeout(context.Background(), 120*time.Second)
		defer cancel()
		for i := 0; ; i++ {
			select {
			case <-stopPub:
				pubDone <- nil
				return
			default:
			}
			body := fmt.Sprintf("s-%05d", i)
			if err := pub.publish(pctx, "amq.topic", fmt.Sprintf("stream.%d", i), body); err != nil {
				pubDone <- fmt.Errorf("publishing %s: %w", body, err)
				return
			}
			mu.Lock()
			want = append(want, body)
			mu.Unlock()
			time.Sleep(2 * time.Millisecond)
		}
	}()
	Eventually(t, 30*time.Second, "60 confirmed messages", func() bool { return confirmed() >= 60 })
	rb.Stop()
	Eventually(t, 30*time.Second, "the connector to report the broker down", func() bool {
		st, _ := c.Status("amqp-restart")
		s, _ := condition(st, "BrokerConnected")
		return s == "False"
	})
	atRestart := confirmed()
	rb.Start()
	c.WaitReady(60 * time.Second)
	Eventually(t, 60*time.Second, "60 more confirmed messages after the restart", func() bool { return confirmed() >= atRestart+60 })
	close(stopPub)
	if err := <-pubDone; err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	n := len(want)
	mu.Unlock()
	Eventually(t, 60*time.Second, fmt.Sprintf("all %d streamed messages at the weida subscriber", n), func() bool { return len(missing(sub, want)) == 0 })
	st, _ := c.Status("amqp-restart")
	if st.Counters.Reconnects < 1 {
		t.Errorf("status reconnects = %d, want ≥ 1", st.Counters.Reconnects)
	}
	if s, reason := condition(st, "BrokerConnected"); s != "True" {
		t.Errorf("BrokerConnected = %s (%s) after the restart", s, reason)
	}
	if dup := sub.Len() - n; dup > 0 {
		t.Logf("%d messages arrived twice: unacknowledged at the restart, redelivered (at-least-once)", dup)
	}

	// 2. Connector away, broker restarted.
	if code := c.Stop(); code != 0 {
		t.Fatalf("connector exit code %d after SIGTERM", code)
	}
	var held []string
	for i := range 100 {
		body := fmt.Sprintf("h-%03d", i)
		held = append(held, body)
		if err := pub.publish(ctx(t, 30*time.Second), "amq.topic", "stream.held", body); err != nil {
			t.Fatal(err)
		}
	}
	pub.close()
	pub.client = nil
	rb.Stop()
	c2 := StartConnector(t, amqpEnv, "-f", file)
	// The endpoint is hosted while the broker is down; the collector
	// re-dials it by itself.
	Eventually(t, 30*time.Second, "the weida subscriber back on the new connector", func() bool {
		st, ok := c2.Status("amqp-restart")
		return ok && st.Counters.Subscribers >= 1
	})
	st2, _ := c2.Status("amqp-restart")
	if s, reason := condition(st2, "BrokerConnected"); s == "True" {
		t.Fatalf("BrokerConnected True (%s) while the broker is down", reason)
	}
	rb.Start()
	c2.WaitReady(60 * time.Second)
	Eventually(t, 60*time.Second, "every held message at the weida subscriber", func() bool { return len(missing(sub, held)) == 0 })
	if !strings.Contains(c2.StatusJSON(), "durable queue") {
		t.Errorf("status does not describe the durable queue:\n%s", c2.StatusJSON())
	}
}
