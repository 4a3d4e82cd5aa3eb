package brokertest

import (
	"fmt"
	"io"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// EtcdCluster is a real three-member etcd cluster of a test's own on
// loopback, with Debian's etcd (scripts/brokers installs etcd-server),
// stopped when the test ends. service/placement's tests keep a richer
// copy (member restarts, the leader) for their failure cases.
type EtcdCluster struct {
	t       testing.TB
	members []*etcdMember
}

type etcdMember struct {
	args       []string
	cmd        *exec.Cmd
	done       chan struct{}
	out        Output
	clientPort int
}

func (m *etcdMember) clientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.clientPort) }

// StartEtcdCluster starts three members and waits until each is healthy.
func StartEtcdCluster(t testing.TB) *EtcdCluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd is not installed (run scripts/brokers, which installs Debian's etcd-server): %v", err)
	}
	c := &EtcdCluster{t: t}
	var initial []string
	peers := make([]int, 3)
	for i := range 3 {
		peers[i] = FreePort(t, "tcp")
		c.members = append(c.members, &etcdMember{clientPort: FreePort(t, "tcp")})
		initial = append(initial, fmt.Sprintf("m%d=http://127.0.0.1:%d", i, peers[i]))
	}
	t.Cleanup(func() {
		for i := range c.members {
			c.Kill(i)
		}
		http.DefaultClient.CloseIdleConnections()
	})
	for i, m := range c.members {
		peer := fmt.Sprintf("http://127.0.0.1:%d", peers[i])
		m.args = append([]string{bin},
			"--name", fmt.Sprintf("m%d", i),
			"--data-dir", filepath.Join(t.TempDir(), "data"),
			"--listen-client-urls", m.clientURL(), "--advertise-client-urls", m.clientURL(),
			"--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
			"--initial-cluster", strings.Join(initial, ","), "--initial-cluster-state", "new",
			"--initial-cluster-token", "brokertest",
			// Short raft timers: an election takes well under a renew deadline.
			"--heartbeat-interval", "50", "--election-timeout", "500",
			"--logger", "zap", "--log-level", "warn")
		c.Start(i)
	}
	c.WaitHealthy()
	return c
}

// Start starts member i again after Kill, with its data directory (it
// rejoins the cluster); it does nothing while the member runs.
func (c *EtcdCluster) Start(i int) {
	c.t.Helper()
	m := c.members[i]
	if m.cmd != nil {
		return
	}
	cmd := exec.Command(m.args[0], m.args[1:]...)
	cmd.Stdout, cmd.Stderr = &m.out, &m.out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting etcd member %d: %v", i, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(m.done)
}

// Kill ends member i with SIGKILL, as a crash would, and waits for it.
func (c *EtcdCluster) Kill(i int) {
	m := c.members[i]
	if m.cmd == nil {
		return
	}
	_ = syscall.Kill(-m.cmd.Process.Pid, syscall.SIGKILL)
	<-m.done
	m.cmd = nil
}

// WaitHealthy waits until every running member answers /health with a
// leader.
func (c *EtcdCluster) WaitHealthy() {
	c.t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for i, m := range c.members {
		if m.cmd == nil {
			continue
		}
		for !healthy(m.clientURL()) {
			if time.Now().After(deadline) {
				c.t.Fatalf("etcd member %d not healthy after 30 s:\n%s", i, m.out.String())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

func healthy(url string) bool {
	resp, err := http.Get(url + "/health")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return strings.Contains(string(b), `"health":"true"`)
}

// Leader returns the index of the member that leads the cluster now, as
// its etcd_server_is_leader metric says, or -1 when none does.
func (c *EtcdCluster) Leader() int {
	for i, m := range c.members {
		if m.cmd == nil {
			continue
		}
		resp, err := http.Get(m.clientURL() + "/metrics")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		for line := range strings.SplitSeq(string(b), "\n") {
			if strings.TrimSpace(line) == "etcd_server_is_leader 1" {
				return i
			}
		}
	}
	return -1
}

// Endpoints returns the members' client URLs, comma-separated.
func (c *EtcdCluster) Endpoints() string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL())
	}
	return strings.Join(eps, ",")
}
