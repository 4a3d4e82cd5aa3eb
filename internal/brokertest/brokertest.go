// Package brokertest runs brokers of a test's own: a Mosquitto, a
// nats-server or a RabbitMQ node on a free loopback port, with its
// configuration and data in a temporary directory, so that a test may kill,
// pause and restart it without disturbing the shared brokers that
// scripts/brokers starts (or the tests of other developers using them).
//
// Every constructor takes a testing.TB and registers the broker's end with
// t.Cleanup; a method that cannot do its job fails the test. A Broker keeps
// its port and data directory across Stop, Kill and Start, so that clients
// configured with its address reconnect to the same broker and a persistent
// one recovers what it had stored.
//
// RabbitMQ nodes take seconds to start: use one only where a real broker
// process must die, and reuse it within a test where possible.
package brokertest

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// Broker is one broker process of a test, running or not. Its methods may
// be called from any goroutine.
type Broker struct {
	t       testing.TB
	kind    string // for messages: "mosquitto", "nats-server", "RabbitMQ"
	port    int
	dir     string
	command func() *exec.Cmd
	// stop asks a running broker to end cleanly; nil means SIGTERM.
	stop func(cmd *exec.Cmd)
	// vmPid returns the pid of a process outside the broker's process
	// group that Kill must end too (RabbitMQ's Erlang VM, started by su
	// in a session of its own), or 0.
	vmPid   func() int
	startIn time.Duration // how long a start may take

	rabbit *rabbitNode // RabbitMQ only

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{} // closed when cmd has exited
	out  Output
}

// FreePort returns a loopback port (network "tcp" or "udp") that was free a
// moment ago.
func FreePort(t testing.TB, network string) int {
	t.Helper()
	if network == "udp" {
		c, err := net.ListenPacket("udp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		return c.LocalAddr().(*net.UDPAddr).Port
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// sbin finds an installed broker program.
func sbin(t testing.TB, name string) string {
	t.Helper()
	p, err := exec.LookPath(name)
	if err != nil {
		p = "/usr/sbin/" + name
	}
	if _, err := os.Stat(p); err != nil {
		t.Fatalf("%s is not installed (run scripts/brokers): %v", name, err)
	}
	return p
}

// NewMosquitto configures a Mosquitto (listener on 127.0.0.1, anonymous
// clients, persistence in the broker's directory, then the extra
// configuration lines) without starting it.
func NewMosquitto(t testing.TB, extra ...string) *Broker {
	t.Helper()
	bin := sbin(t, "mosquitto")
	b := &Broker{t: t, kind: "mosquitto", port: FreePort(t, "tcp"), dir: t.TempDir(), startIn: 10 * time.Second}
	conf := filepath.Join(b.dir, "mosquitto.conf")
	var c bytes.Buffer
	fmt.Fprintf(&c, "listener %d 127.0.0.1\nallow_anonymous true\n", b.port)
	fmt.Fprintf(&c, "persistence true\npersistence_location %s/\n", b.dir)
	// Run as root, Mosquitto would switch to its own user, which cannot
	// write the test's directory.
	if os.Getuid() == 0 {
		c.WriteString("user root\n")
	}
	c.WriteString("max_queued_messages 100000\nlog_dest stderr\nlog_type error\nlog_type warning\nlog_type notice\n")
	for _, l := range extra {
		c.WriteString(l + "\n")
	}
	if err := os.WriteFile(conf, c.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	b.command = func() *exec.Cmd { return exec.Command(bin, "-c", conf) }
	t.Cleanup(b.cleanup(b.Kill))
	return b
}

// StartMosquitto is [NewMosquitto] and [Broker.Start].
func StartMosquitto(t testing.TB, extra ...string) *Broker {
	t.Helper()
	b := NewMosquitto(t, extra...)
	b.Start()
	return b
}

// NewNATS configures a nats-server with JetStream, its store in the
// broker's directory and extra arguments after the address, port and
// store, without starting it.
func NewNATS(t testing.TB, extraArgs ...string) *Broker {
	t.Helper()
	bin := sbin(t, "nats-server")
	b := &Broker{t: t, kind: "nats-server", port: FreePort(t, "tcp"), dir: t.TempDir(), startIn: 15 * time.Second}
	args := append([]string{"-a", "127.0.0.1", "-p", strconv.Itoa(b.port), "-js", "-sd", b.dir}, extraArgs...)
	b.command = func() *exec.Cmd { return exec.Command(bin, args...) }
	t.Cleanup(b.cleanup(b.Kill))
	return b
}

// StartNATS is [NewNATS] and [Broker.Start].
func StartNATS(t testing.TB, extraArgs ...string) *Broker {
	t.Helper()
	b := NewNATS(t, extraArgs...)
	b.Start()
	return b
}

// rabbitNode is what rabbitmqctl needs to reach a private node.
type rabbitNode struct {
	node string
	env  []string
	ctl  string
}

// NewRabbit configures a RabbitMQ node of its own (node name, AMQP and
// distribution ports on loopback, data in a fresh directory, then the extra
// rabbitmq.conf lines) without starting it. Every start is a full one: a
// new Erlang VM that recovers durable queues and persistent messages from
// disk. (`rabbitmqctl stop_app`/`start_app` would be faster, but on
// RabbitMQ 3.10 start_app can fail to re-open the listener with
// eaddrinuse.) The node is stopped cleanly when the test ends.
func NewRabbit(t testing.TB, extraConf ...string) *Broker {
	t.Helper()
	bin := sbin(t, "rabbitmq-server")
	ctl := sbin(t, "rabbitmqctl")
	// Not t.TempDir: the node runs as the rabbitmq user, which must own
	// the directory, and it may still be writing there when the test's
	// own clean-up of TempDir runs.
	dir, err := os.MkdirTemp("", "brokertest-rabbitmq-")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := chownToRabbit(dir); err != nil {
		t.Fatal(err)
	}
	b := &Broker{t: t, kind: "RabbitMQ", port: FreePort(t, "tcp"), dir: dir, startIn: 90 * time.Second}
	node := fmt.Sprintf("brokertest-%d-%d@localhost", os.Getpid(), b.port)
	conf := fmt.Sprintf("listeners.tcp.local = 127.0.0.1:%d\nloopback_users.guest = true\n", b.port)
	for _, l := range extraConf {
		conf += l + "\n"
	}
	for name, content := range map[string]string{"rabbitmq.conf": conf, "enabled_plugins": "[].\n"} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(content), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	env := []string{
		"RABBITMQ_NODENAME=" + node,
		"RABBITMQ_DIST_PORT=" + strconv.Itoa(FreePort(t, "tcp")),
		"RABBITMQ_CONFIG_FILE=" + filepath.Join(dir, "rabbitmq"),
		"RABBITMQ_MNESIA_BASE=" + filepath.Join(dir, "mnesia"),
		"RABBITMQ_LOG_BASE=" + filepath.Join(dir, "log"),
		"RABBITMQ_ENABLED_PLUGINS_FILE=" + filepath.Join(dir, "enabled_plugins"),
		"RABBITMQ_PID_FILE=" + filepath.Join(dir, "pid"),
	}
	b.rabbit = &rabbitNode{node: node, env: env, ctl: ctl}
	b.command = func() *exec.Cmd {
		cmd := exec.Command(bin)
		cmd.Env = append(os.Environ(), env...)
		return cmd
	}
	b.stop = b.rabbitStop
	b.vmPid = b.rabbitVMPid
	t.Cleanup(b.cleanup(b.Stop))
	return b
}

// StartRabbit is [NewRabbit] and [Broker.Start].
func StartRabbit(t testing.TB, extraConf ...string) *Broker {
	t.Helper()
	b := NewRabbit(t, extraConf...)
	b.Start()
	return b
}

// cleanup ends the broker with end and shows its output if the test failed.
func (b *Broker) cleanup(end func()) func() {
	return func() {
		b.Resume()
		end()
		if b.t.Failed() {
			b.t.Logf("private %s output:\n%s", b.kind, b.Output())
		}
	}
}

// Addr returns the broker's host:port on loopback.
func (b *Broker) Addr() string { return "127.0.0.1:" + strconv.Itoa(b.port) }

// Dir returns the broker's directory: its configuration and data.
func (b *Broker) Dir() string { return b.dir }

// Pid returns the process id of the running broker (for RabbitMQ, of the
// start script; see [Broker.VMPid]), or 0 when it is not running.
func (b *Broker) Pid() int {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.cmd == nil {
		return 0
	}
	return b.cmd.Process.Pid
}

// VMPid returns the process that does the broker's work: for RabbitMQ the
// Erlang VM, for the others [Broker.Pid].
func (b *Broker) VMPid() int {
	if b.vmPid != nil {
		if pid := b.vmPid(); pid != 0 {
			return pid
		}
	}
	return b.Pid()
}

// Running reports whether the broker process has been started and has not
// exited.
func (b *Broker) Running() bool {
	b.mu.Lock()
	cmd, done := b.cmd, b.done
	b.mu.Unlock()
	if cmd == nil {
		return false
	}
	select {
	case <-done:
		return false
	default:
		return true
	}
}

// Output returns what the broker has written to its stdout and stderr.
func (b *Broker) Output() string { return b.out.String() }

// Output collects what a process writes to its stdout and stderr, which
// exec copies from two goroutines. The zero value is ready to use.
type Output struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (o *Output) Write(p []byte) (int, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.Write(p)
}

// String returns everything written so far.
func (o *Output) String() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	return o.buf.String()
}

// Start starts the broker and waits until it accepts TCP connections. It
// does nothing when the broker is running.
func (b *Broker) Start() {
	b.t.Helper()
	if b.Running() {
		return
	}
	cmd := b.command()
	cmd.Stdout, cmd.Stderr = &b.out, &b.out
	// A process group of its own, so that Kill, Pause and Resume reach
	// every process of the broker (a start script and its children) and
	// nothing else.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		b.t.Fatalf("starting private %s: %v", b.kind, err)
	}
	done := make(chan struct{})
	go func() { _ = cmd.Wait(); close(done) }()
	b.mu.Lock()
	b.cmd, b.done = cmd, done
	b.mu.Unlock()
	deadline := time.Now().Add(b.startIn)
	for {
		c, err := net.DialTimeout("tcp", b.Addr(), time.Second)
		if err == nil {
			c.Close()
			return
		}
		select {
		case <-done:
			b.t.Fatalf("private %s exited while starting:\n%s", b.kind, b.Output())
		default:
		}
		if time.Now().After(deadline) {
			b.t.Fatalf("private %s not listening on %s after %v:\n%s", b.kind, b.Addr(), b.startIn, b.Output())
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// take returns the running process and forgets it.
func (b *Broker) take() (*exec.Cmd, chan struct{}) {
	b.mu.Lock()
	defer b.mu.Unlock()
	cmd, done := b.cmd, b.done
	b.cmd = nil
	return cmd, done
}

// Stop ends the broker cleanly (SIGTERM, which makes Mosquitto save its
// persistence file; `rabbitmqctl stop` for RabbitMQ) and waits for it to
// exit, killing it if it takes more than 30 s. It does nothing when the
// broker is not running.
func (b *Broker) Stop() {
	vm := 0
	if b.vmPid != nil {
		vm = b.vmPid()
	}
	cmd, done := b.take()
	if cmd == nil {
		return
	}
	select {
	case <-done:
		return
	default:
	}
	if b.stop != nil {
		b.stop(cmd)
	} else {
		_ = cmd.Process.Signal(syscall.SIGTERM)
	}
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		b.t.Errorf("private %s did not stop within 30 s; killing it", b.kind)
		kill(cmd, vm, done)
	}
}

// Kill ends the broker with SIGKILL, as a crash would, and waits for it to
// exit. It does nothing when the broker is not running.
func (b *Broker) Kill() {
	vm := 0
	if b.vmPid != nil {
		vm = b.vmPid()
	}
	cmd, done := b.take()
	if cmd == nil {
		return
	}
	kill(cmd, vm, done)
	if b.rabbit != nil {
		// A killed VM leaves its pid file; a stale one would make the
		// next Kill signal whatever process got that pid since.
		_ = os.Remove(filepath.Join(b.dir, "pid"))
	}
}

func kill(cmd *exec.Cmd, vm int, done <-chan struct{}) {
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	if vm > 0 {
		_ = syscall.Kill(vm, syscall.SIGKILL)
	}
	<-done
}

// Restart kills the broker (SIGKILL) and starts it again on the same port
// with the same data directory.
func (b *Broker) Restart() {
	b.t.Helper()
	b.Kill()
	b.Start()
}

// Signal sends sig to the broker's process (SIGHUP makes nats-server and
// Mosquitto read their configuration again).
func (b *Broker) Signal(sig syscall.Signal) {
	b.t.Helper()
	b.mu.Lock()
	cmd := b.cmd
	b.mu.Unlock()
	if cmd == nil {
		b.t.Fatalf("signalling private %s, which is not running", b.kind)
	}
	if err := cmd.Process.Signal(sig); err != nil {
		b.t.Fatalf("signalling private %s: %v", b.kind, err)
	}
}

// Pause stops the broker's processes (SIGSTOP): its port still accepts TCP
// connections, which the kernel queues, but nothing answers, as with a
// broker that hangs or a network that drops every packet.
// Pause returns once the kernel reports the broker's main process stopped:
// a signal takes effect asynchronously, and on a busy machine a broker can
// still answer a connection made right after kill(2) returned.
func (b *Broker) Pause() {
	b.group(syscall.SIGSTOP)
	b.mu.Lock()
	cmd := b.cmd
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) && !stopped(cmd.Process.Pid) {
		time.Sleep(time.Millisecond)
	}
}

// stopped reports whether /proc says pid is stopped by a signal (state T).
func stopped(pid int) bool {
	stat, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/stat")
	if err != nil {
		return false
	}
	// The state follows the command name, which is in parentheses and
	// may itself hold spaces or parentheses.
	i := bytes.LastIndexByte(stat, ')')
	return i >= 0 && i+2 < len(stat) && stat[i+2] == 'T'
}

// Resume continues a paused broker (SIGCONT). It does nothing when the
// broker is not paused.
func (b *Broker) Resume() { b.group(syscall.SIGCONT) }

func (b *Broker) group(sig syscall.Signal) {
	b.mu.Lock()
	cmd := b.cmd
	b.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, sig)
	if b.vmPid != nil {
		if vm := b.vmPid(); vm > 0 {
			_ = syscall.Kill(vm, sig)
		}
	}
}

// RabbitCtl runs rabbitmqctl against a RabbitMQ node of [NewRabbit] and
// fails the test if it fails.
func (b *Broker) RabbitCtl(args ...string) {
	b.t.Helper()
	if b.rabbit == nil {
		b.t.Fatalf("rabbitmqctl on a private %s", b.kind)
	}
	cmd := exec.Command(b.rabbit.ctl, append([]string{"-n", b.rabbit.node}, args...)...)
	cmd.Env = append(os.Environ(), b.rabbit.env...)
	if out, err := cmd.CombinedOutput(); err != nil {
		b.t.Fatalf("rabbitmqctl %v: %v\n%s", args, err, out)
	}
}

// rabbitStop stops the node with rabbitmqctl, which waits for its pid
// file: bounded, and its whole tree (the script and su) ended if it
// overruns.
func (b *Broker) rabbitStop(*exec.Cmd) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	stop := exec.CommandContext(ctx, b.rabbit.ctl, "-n", b.rabbit.node, "stop", filepath.Join(b.dir, "pid"))
	stop.Env = append(os.Environ(), b.rabbit.env...)
	stop.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	stop.Cancel = func() error { return syscall.Kill(-stop.Process.Pid, syscall.SIGKILL) }
	if out, err := stop.CombinedOutput(); err != nil {
		b.t.Logf("rabbitmqctl stop: %v\n%s", err, out)
	}
}

// rabbitVMPid reads the Erlang VM's pid from the node's pid file; 0 when
// it has not written one (yet).
func (b *Broker) rabbitVMPid() int {
	raw, err := os.ReadFile(filepath.Join(b.dir, "pid"))
	if err != nil {
		return 0
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(raw)))
	if err != nil {
		return 0
	}
	return pid
}

// SplitAddr returns the host and port of addr ("host:port"). The drivers'
// Configs take a broker's address already parsed, as package resources
// hands it to them, not a URL.
func SplitAddr(t testing.TB, addr string) (host string, port int) {
	t.Helper()
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		t.Fatal(err)
	}
	port, err = strconv.Atoi(p)
	if err != nil {
		t.Fatalf("port of %s: %v", addr, err)
	}
	return host, port
}
