// Package e2e runs the connector binary against the real brokers on
// loopback (Mosquitto 1883, NATS 4222, RabbitMQ 5672; scripts/brokers starts
// them) and real weida peers, the way an operator would.
package e2e

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"weida.dev/connector/internal/brokertest"
)

// connectorBin is the binary TestMain builds once for every test.
var connectorBin string

func TestMain(m *testing.M) {
	if os.Getenv(idleChildEnv) == "1" {
		os.Exit(m.Run()) // a child of TestIdleSubscribers runs no connector
	}
	dir, err := os.MkdirTemp("", "connector-e2e")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	connectorBin = filepath.Join(dir, "connector")
	build := exec.Command("go", "build", "-race", "-o", connectorBin, "weida.dev/connector/cmd/connector")
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "e2e: building the connector:", err)
		os.Exit(1)
	}
	code := m.Run()
	os.RemoveAll(dir)
	os.Exit(code)
}

// requireTCP fails the test unless something listens on addr: the e2e
// suite runs against real brokers, never stand-ins.
func requireTCP(t testing.TB, what, addr string) {
	t.Helper()
	c, err := net.DialTimeout("tcp", addr, 2*time.Second)
	if err != nil {
		t.Fatalf("%s is not listening on %s (run scripts/brokers): %v", what, addr, err)
	}
	c.Close()
}

// freePort returns a loopback port that was free a moment ago.
func freePort(t testing.TB, network string) int { return brokertest.FreePort(t, network) }

// writeFile writes content under dir and returns its path.
func writeFile(t testing.TB, dir, name, content string) string {
	t.Helper()
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// Connector is one running `connector run` process.
type Connector struct {
	t     testing.TB
	cmd   *exec.Cmd
	Admin string // host:port of the admin listener

	output brokertest.Output // stdout and stderr, interleaved
	done   chan struct{}
	err    error
}

// Output returns everything the process printed so far.
func (c *Connector) Output() string { return c.output.String() }

// StartConnector runs `connector run --admin <free port> args...` with env
// added to the process environment, and with a temporary --state-dir
// unless args name one. The process is stopped (SIGTERM, then
// SIGKILL) when the test ends.
func StartConnector(t testing.TB, env []string, args ...string) *Connector {
	t.Helper()
	c := &Connector{t: t, Admin: fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp")), done: make(chan struct{})}
	full := append([]string{"run", "--admin", c.Admin, "--log-format", "text"}, args...)
	if !slices.ContainsFunc(args, func(a string) bool { return strings.HasPrefix(a, "--state-dir") }) {
		// Each test its own identities, never the machine's.
		full = append(full, "--state-dir", t.TempDir())
	}
	c.cmd = exec.Command(connectorBin, full...)
	c.cmd.Env = append(os.Environ(), env...)
	c.cmd.Stdout, c.cmd.Stderr = &c.output, &c.output
	if err := c.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		c.err = c.cmd.Wait()
		close(c.done)
	}()
	t.Cleanup(func() {
		c.Stop()
		if t.Failed() {
			t.Logf("connector output:\n%s", c.Output())
		}
	})
	return c
}

// Stop sends SIGTERM and waits up to 20 s, then kills. It returns the exit
// code.
func (c *Connector) Stop() int {
	select {
	case <-c.done:
	default:
		_ = c.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			c.t.Errorf("connector did not exit within 20 s of SIGTERM")
			_ = c.cmd.Process.Kill()
			<-c.done
		}
	}
	return c.cmd.ProcessState.ExitCode()
}

// Wait waits for the process to exit by itself and returns its exit code.
func (c *Connector) Wait(d time.Duration) (int, bool) {
	select {
	case <-c.done:
		return c.cmd.ProcessState.ExitCode(), true
	case <-time.After(d):
		return 0, false
	}
}

// Signal sends sig to the process.
func (c *Connector) Signal(sig os.Signal) {
	if err := c.cmd.Process.Signal(sig); err != nil {
		c.t.Fatal(err)
	}
}

// WaitReady polls until every resource is Ready (/status "ready", which
// /readyz no longer waits for: it answers for the process) and /readyz
// answers 200.
func (c *Connector) WaitReady(d time.Duration) {
	c.t.Helper()
	deadline := time.Now().Add(d)
	for time.Now().Before(deadline) {
		select {
		case <-c.done:
			c.t.Fatalf("connector exited early (%v):\n%s", c.err, c.Output())
		default:
		}
		var doc struct {
			Ready bool `json:"ready"`
		}
		if json.Unmarshal([]byte(c.StatusJSON()), &doc) == nil && doc.Ready {
			resp, err := http.Get("http://" + c.Admin + "/readyz")
			if err == nil {
				resp.Body.Close()
				if resp.StatusCode == 200 {
					return
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	c.t.Fatalf("connector not ready within %s; status:\n%s", d, c.StatusJSON())
}

// StatusJSON returns /status as text.
func (c *Connector) StatusJSON() string {
	resp, err := http.Get("http://" + c.Admin + "/status")
	if err != nil {
		return err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return string(b)
}

// ResourceStatus is the part of /status the tests read.
type ResourceStatus struct {
	Name          string `json:"name"`
	Fingerprint   string `json:"fingerprint"`
	SubscriberURL string `json:"subscriberURL"`
	Conditions    []struct {
		Type, Status, Reason, Message string
	} `json:"conditions"`
	Counters struct {
		Received     uint64            `json:"received"`
		Bridged      uint64            `json:"bridged"`
		Acknowledged uint64            `json:"acknowledged"`
		InFlight     int64             `json:"inFlight"`
		Dropped      map[string]uint64 `json:"dropped"`
		Reconnects   uint64            `json:"reconnects"`
		Subscribers  int               `json:"weidaSubscribers"`
		Held         uint64            `json:"held"`
		HoldingSince time.Time         `json:"holdingSince"`
		LastValue    *struct {
			Entries  int               `json:"entries"`
			Bytes    int64             `json:"bytes"`
			Evicted  map[string]uint64 `json:"evicted"`
			Replayed uint64            `json:"replayed"`
			Withheld uint64            `json:"withheld"`
			Stale    bool              `json:"stale"`
		} `json:"lastValue"`
	} `json:"counters"`
	// Failure is present only while the resource is down after a failed
	// attempt to start it.
	Failure *Failure `json:"failure"`
}

// Failure is why a resource is down and when the connector tries again.
type Failure struct {
	Reason        string    `json:"reason"`
	Message       string    `json:"message"`
	Attempts      int       `json:"attempts"`
	Permanent     bool      `json:"permanent"`
	LastErrorTime time.Time `json:"lastErrorTime"`
	NextRetryTime time.Time `json:"nextRetryTime"`
}

// Status returns the named resource's status, or false when it is absent.
func (c *Connector) Status(name string) (ResourceStatus, bool) {
	var all struct {
		Resources []ResourceStatus `json:"resources"`
	}
	if err := json.Unmarshal([]byte(c.StatusJSON()), &all); err != nil {
		return ResourceStatus{}, false
	}
	for _, r := range all.Resources {
		if r.Name == name {
			return r, true
		}
	}
	return ResourceStatus{}, false
}

// Metric returns the value of the first /metrics sample whose line starts
// with prefix (metric name and the labels in the order Prometheus prints
// them, e.g. `weida_connector_messages_dropped_total{reason="loop",resource="x"`),
// or -1 when there is none.
func (c *Connector) Metric(prefix string) float64 {
	resp, err := http.Get("http://" + c.Admin + "/metrics")
	if err != nil {
		return -1
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, prefix) {
			var v float64
			if i := strings.LastIndexByte(line, ' '); i >= 0 {
				fmt.Sscan(line[i+1:], &v)
			}
			return v
		}
	}
	return -1
}

// Eventually polls cond every 20 ms until it holds or d passes.
func Eventually(t testing.TB, d time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(d)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out after %s waiting for %s", d, what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// ctx returns a context cancelled when the test ends or after d.
func ctx(t testing.TB, d time.Duration) context.Context {
	c, cancel := context.WithTimeout(context.Background(), d)
	t.Cleanup(cancel)
	return c
}

// Quiesce waits until the named inbound resource has settled everything it
// read (nothing in flight, every message received acknowledged). Take
// counter baselines after it: a weida subscriber can see a copy before the
// bridge has counted and acknowledged it.
func (c *Connector) Quiesce(name string) {
	c.t.Helper()
	Eventually(c.t, 10*time.Second, name+" to settle what it read", func() bool {
		st, ok := c.Status(name)
		return ok && st.Counters.InFlight == 0 && st.Counters.Acknowledged == st.Counters.Received
	})
}
