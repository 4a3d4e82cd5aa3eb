package e2e

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/quic-go/quic-go"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// bareHandshakes completes n QUIC handshakes with the endpoint at addr
// from a UDP socket on local, sending nothing else (the attack of issue
// 25), and returns how many completed. The connections stay open until
// the test ends or the endpoint closes them.
func bareHandshakes(t *testing.T, local net.IP, addr string, n int) int {
	t.Helper()
	udp, err := net.ListenUDP("udp", &net.UDPAddr{IP: local})
	if err != nil {
		t.Skipf("no loopback address %s: %v", local, err)
	}
	tr := &quic.Transport{Conn: udp}
	t.Cleanup(func() {
		_ = tr.Close()
		_ = udp.Close()
	})
	ua, err := net.ResolveUDPAddr("udp", addr)
	if err != nil {
		t.Fatal(err)
	}
	done := 0
	for range n {
		dctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		qc, err := tr.Dial(dctx, ua, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{weida.ALPN}}, &quic.Config{})
		cancel()
		if err == nil {
			done++
			t.Cleanup(func() { _ = qc.CloseWithError(0, "") })
		}
	}
	return done
}

// TestConnectionsPerAddress: the real connector with
// spec.weida.maxConnectionsPerAddress: one address taking its share of
// connections leaves a subscriber from another address bridged, the
// refusals are counted by limit, and `connector weida sub` refused for
// that limit says so without the --cert hint (issue 25, item 3).
func TestConnectionsPerAddress(t *testing.T) {
	requireTCP(t, "nats-server", natsAddr)
	u := unique()
	port := freePort(t, "udp")
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/fair", port)
	res := natsResource{Name: "fair-in", Direction: policy.Inbound, Endpoint: endpoint, Routes: []string{u + ".*"}}
	doc := strings.Replace(res.YAML(t), "    listen: "+endpoint+"\n", "    listen: "+endpoint+"\n    maxConnectionsPerAddress: 4\n", 1)
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "in.yaml", doc))
	c.WaitReady(30 * time.Second)
	hostPort := fmt.Sprintf("127.0.0.1:%d", port)

	// The second host: ten bare handshakes, four of them admitted.
	if n := bareHandshakes(t, net.IPv4(127, 0, 0, 2), hostPort, 10); n != 10 {
		t.Fatalf("%d of 10 handshakes from 127.0.0.2 completed", n)
	}
	refused := `weida_connector_weida_listener_events_total{event="refused-max-connections-per-address"`
	Eventually(t, 10*time.Second, "six refusals counted", func() bool { return c.Metric(refused) == 6 })

	// A subscriber from 127.0.0.1 connects and is bridged to within 5 s.
	start := time.Now()
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	nc := natsConn(t, natsAddr)
	sub.Sync(5*time.Second, "after-"+u, func() {
		_ = nc.PublishMsg(&natsgo.Msg{Subject: u + ".probe", Data: []byte("after-" + u)})
	})
	if took := time.Since(start); took > 5*time.Second {
		t.Errorf("the subscriber from another address took %s", took)
	}

	// 127.0.0.1 now holds 1 + 3 connections: the CLI's is one too many.
	if n := bareHandshakes(t, net.IPv4(127, 0, 0, 1), hostPort, 3); n != 3 {
		t.Fatalf("%d of 3 handshakes from 127.0.0.1 completed", n)
	}
	cctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	out, err := exec.CommandContext(cctx, connectorBin, "weida", "sub", endpoint, "--insecure-skip-verify-for-testing",
		"--filter", "", "--dial-timeout", "5s").CombinedOutput()
	if err == nil {
		t.Fatalf("connector weida sub was admitted past the limit:\n%s", out)
	}
	if !strings.Contains(string(out), "max_connections_per_address") || strings.Contains(string(out), "--cert") {
		t.Errorf("connector weida sub said:\n%s\nwant the per-address limit named and no --cert hint", out)
	}
}
