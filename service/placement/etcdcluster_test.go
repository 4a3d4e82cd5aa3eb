package placement

import (
	"bytes"
	"context"
	"fmt"
	"net/http"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"

	clientv3 "go.etcd.io/etcd/client/v3"
	"weida.dev/connector/internal/brokertest"
)

// etcdCluster is a real three-member etcd cluster of a test's own on
// loopback, with Debian's etcd (scripts/brokers installs etcd-server). Its
// members keep their ports and data directories across Kill and Start, as
// a restarted member would.
type etcdCluster struct {
	t       *testing.T
	bin     string
	members []*etcdMember
	initial string
}

type etcdMember struct {
	name       string
	dir        string
	clientPort int
	peerPort   int

	mu   sync.Mutex
	cmd  *exec.Cmd
	done chan struct{}

	outMu sync.Mutex
	out   bytes.Buffer // what the member wrote, for a failing test's message
}

func (m *etcdMember) clientURL() string { return fmt.Sprintf("http://127.0.0.1:%d", m.clientPort) }
func (m *etcdMember) peerURL() string   { return fmt.Sprintf("http://127.0.0.1:%d", m.peerPort) }

func startEtcdCluster(t *testing.T) *etcdCluster {
	t.Helper()
	bin, err := exec.LookPath("etcd")
	if err != nil {
		t.Fatalf("etcd is not installed (run scripts/brokers, which installs Debian's etcd-server): %v", err)
	}
	c := &etcdCluster{t: t, bin: bin}
	var initial []string
	for i := range 3 {
		m := &etcdMember{
			name:       fmt.Sprintf("m%d", i),
			dir:        filepath.Join(t.TempDir(), "data"),
			clientPort: brokertest.FreePort(t, "tcp"),
			peerPort:   brokertest.FreePort(t, "tcp"),
		}
		c.members = append(c.members, m)
		initial = append(initial, m.name+"="+m.peerURL())
	}
	c.initial = strings.Join(initial, ",")
	t.Cleanup(func() {
		for _, m := range c.members {
			c.kill(m)
		}
		http.DefaultClient.CloseIdleConnections() // health and metrics reads
	})
	for _, m := range c.members {
		c.start(m)
	}
	c.waitHealthy(c.members...)
	return c
}

func (c *etcdCluster) endpoints() []string {
	var eps []string
	for _, m := range c.members {
		eps = append(eps, m.clientURL())
	}
	return eps
}

// start runs m; a member whose data directory exists rejoins with it and
// ignores the --initial flags.
func (c *etcdCluster) start(m *etcdMember) {
	c.t.Helper()
	cmd := exec.Command(c.bin,
		"--name", m.name,
		"--data-dir", m.dir,
		"--listen-client-urls", m.clientURL(),
		"--advertise-client-urls", m.clientURL(),
		"--listen-peer-urls", m.peerURL(),
		"--initial-advertise-peer-urls", m.peerURL(),
		"--initial-cluster", c.initial,
		"--initial-cluster-state", "new",
		"--initial-cluster-token", "placement-test",
		// Short raft timers, so that an election takes well under the
		// tests' renew deadline.
		"--heartbeat-interval", "50",
		"--election-timeout", "500",
		"--logger", "zap",
		"--log-level", "warn",
	)
	m.mu.Lock()
	defer m.mu.Unlock()
	cmd.Stdout, cmd.Stderr = (*memberOutput)(m), (*memberOutput)(m)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		c.t.Fatalf("starting etcd member %s: %v", m.name, err)
	}
	m.cmd, m.done = cmd, make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(m.done)
}

type memberOutput etcdMember

func (o *memberOutput) Write(p []byte) (int, error) {
	o.outMu.Lock()
	defer o.outMu.Unlock()
	return o.out.Write(p)
}

func (m *etcdMember) output() string {
	m.outMu.Lock()
	defer m.outMu.Unlock()
	return m.out.String()
}

// kill ends m with SIGKILL, as a crash would, and waits for it.
func (c *etcdCluster) kill(m *etcdMember) {
	m.mu.Lock()
	cmd, done := m.cmd, m.done
	m.cmd = nil
	m.mu.Unlock()
	if cmd == nil {
		return
	}
	_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
	<-done
}

// waitHealthy waits until every member of ms answers /health with a leader.
func (c *etcdCluster) waitHealthy(ms ...*etcdMember) {
	c.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for _, m := range ms {
		for {
			resp, err := http.Get(m.clientURL() + "/health")
			if err == nil {
				var b bytes.Buffer
				_, _ = b.ReadFrom(resp.Body)
				resp.Body.Close()
				if strings.Contains(b.String(), `"health":"true"`) {
					break
				}
			}
			if time.Now().After(deadline) {
				c.t.Fatalf("etcd member %s not healthy after 20 s (last: %v):\n%s", m.name, err, m.output())
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
}

// leader returns the member that leads the cluster now.
func (c *etcdCluster) leader(cli *clientv3.Client) *etcdMember {
	c.t.Helper()
	for _, m := range c.members {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, m.clientURL())
		cancel()
		if err == nil && st.Leader == st.Header.MemberId {
			return m
		}
	}
	c.t.Fatal("no etcd member says it leads")
	return nil
}

// moveLeader hands the cluster's leadership to another member, as an
// election after a leader's crash or a rolling restart would, and returns
// "from -> to". A member becomes leader by an election either way, and a
// new leader refreshes every etcd lease (lessor.Promote).
func (c *etcdCluster) moveLeader(t *testing.T) string {
	t.Helper()
	cli := c.client()
	from := c.leader(cli)
	var to *etcdMember
	var toID uint64
	for _, m := range c.members {
		if m == from {
			continue
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		st, err := cli.Status(ctx, m.clientURL())
		cancel()
		if err == nil {
			to, toID = m, st.Header.MemberId
			break
		}
	}
	if to == nil {
		t.Fatalf("no member but the leader %s answers", from.name)
	}
	// Only the leader accepts MoveLeader: ask it alone.
	lc, err := clientv3.New(clientv3.Config{Endpoints: []string{from.clientURL()}, DialTimeout: 2 * time.Second, Logger: zap.NewNop()})
	if err != nil {
		t.Fatal(err)
	}
	defer lc.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if _, err := lc.MoveLeader(ctx, toID); err != nil {
		t.Fatalf("moving the etcd leader from %s to %s: %v", from.name, to.name, err)
	}
	if now := c.leader(cli); now != to {
		t.Fatalf("moved the etcd leader from %s to %s, and %s leads", from.name, to.name, now.name)
	}
	return from.name + " -> " + to.name
}

// client returns a client of every member. Its reconnection backoff is
// capped at half a second: gRPC's default grows to two minutes, far beyond
// a lease, and would keep a replica away long after the cluster is back.
func (c *etcdCluster) client() *clientv3.Client {
	c.t.Helper()
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   c.endpoints(),
		DialTimeout: 2 * time.Second,
		Logger:      zap.NewNop(),
		DialOptions: []grpc.DialOption{grpc.WithConnectParams(grpc.ConnectParams{
			Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 500 * time.Millisecond},
			MinConnectTimeout: 500 * time.Millisecond,
		})},
	})
	if err != nil {
		c.t.Fatal(err)
	}
	c.t.Cleanup(func() { cli.Close() })
	return cli
}
