package main

import (
	"bytes"
	"context"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"
)

// syncBuffer is a bytes.Buffer that the running command writes to while
// the test reads it.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

// outboundResource writes a resource that starts without any broker or
// peer: an outbound NATS resource whose broker and weida sides are closed
// loopback ports it keeps retrying.
func outboundResource(t *testing.T) string {
	t.Helper()
	const res = `apiVersion: connector.weida.dev/v1alpha1
kind: Connector
metadata: {name: admin-test}
spec:
  protocol: nats
  direction: outbound
  broker: {url: "nats://127.0.0.1:9"}
  weida: {dial: "weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:9/x"}
  conversion: {losses: [at-most-once, delivery-best-effort, empty-segments, forbidden-chars, ordering, wildcard-names]}
  routes: [{filter: admin.*}]
`
	file := filepath.Join(t.TempDir(), "r.yaml")
	if err := os.WriteFile(file, []byte(res), 0o600); err != nil {
		t.Fatal(err)
	}
	return file
}

// freePort returns a TCP port free on every interface just now.
func freePort(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "0.0.0.0:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	_, port, _ := net.SplitHostPort(ln.Addr().String())
	return port
}

// startRun runs `connector run` with args until its resources run, and
// returns its stderr and a stop that ends it and returns its exit code.
func startRun(t *testing.T, args ...string) (*syncBuffer, func() int) {
	t.Helper()
	stderr := new(syncBuffer)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int, 1)
	all := append([]string{"run", "-f", outboundResource(t), "--state-dir", t.TempDir()}, args...)
	go func() { done <- run(ctx, all, strings.NewReader(""), new(syncBuffer), stderr) }()
	stop := func() int {
		cancel()
		select {
		case code := <-done:
			return code
		case <-time.After(15 * time.Second):
			t.Fatal("connector run did not stop")
			return -1
		}
	}
	deadline := time.Now().Add(15 * time.Second)
	for !strings.Contains(stderr.String(), "connector running") {
		select {
		case code := <-done:
			t.Fatalf("connector run %q exited %d:\n%s", args, code, stderr.String())
		default:
		}
		if time.Now().After(deadline) {
			stop()
			t.Fatalf("connector run %q did not start:\n%s", args, stderr.String())
		}
		time.Sleep(20 * time.Millisecond)
	}
	return stderr, stop
}

func status(t *testing.T, url, auth string) int {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode
}

// TestRunAdminBeyondLoopback: on all interfaces without a token, run
// warns once, naming the address and --admin-token-file; with one, it
// does not, the probes answer without it and the rest asks for it. Only
// loopback traffic: the listener is asked on 127.0.0.1.
func TestRunAdminBeyondLoopback(t *testing.T) {
	port := freePort(t)
	stderr, stop := startRun(t, "--admin", "0.0.0.0:"+port)
	if code := stop(); code != exitOK {
		t.Errorf("exit %d", code)
	}
	logs := stderr.String()
	var warnings []string
	for _, l := range strings.Split(logs, "\n") {
		if strings.Contains(l, "reachable beyond this host") {
			warnings = append(warnings, l)
		}
	}
	if len(warnings) != 1 || !strings.Contains(warnings[0], "--admin-token-file") || !strings.Contains(warnings[0], "0.0.0.0:"+port) {
		t.Errorf("want one warning naming 0.0.0.0:%s and --admin-token-file, got %q; logs:\n%s", port, warnings, logs)
	}

	const token = "cli-admin-token-0123456789abcdef"
	file := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	port = freePort(t)
	stderr, stop = startRun(t, "--admin", ":"+port, "--admin-token-file", file, "--pprof")
	base := "http://127.0.0.1:" + port
	if c := status(t, base+"/readyz", ""); c != http.StatusOK {
		t.Errorf("/readyz without the token: %d, want 200", c)
	}
	for _, p := range []string{"/status", "/metrics", "/debug/pprof/"} {
		if c := status(t, base+p, ""); c != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", p, c)
		}
		if c := status(t, base+p, "Bearer "+token); c != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", p, c)
		}
	}
	if code := stop(); code != exitOK {
		t.Errorf("exit %d", code)
	}
	if logs := stderr.String(); strings.Contains(logs, "reachable beyond this host") || strings.Contains(logs, token) {
		t.Errorf("with a token: a warning, or the token, in the logs:\n%s", logs)
	}
}

// TestRunPprofBeyondLoopbackRefused: --pprof on all interfaces without a
// token exits 1 before anything starts, saying what to add.
func TestRunPprofBeyondLoopbackRefused(t *testing.T) {
	code, _, errOut := runCLI(t, "", "run", "-f", outboundResource(t), "--state-dir", t.TempDir(), "--admin", "0.0.0.0:"+freePort(t), "--pprof")
	if code != exitFailure || !strings.Contains(errOut, "--admin-token-file") || !strings.Contains(errOut, "nothing was started") ||
		strings.Contains(errOut, "connector running") {
		t.Errorf("exit %d, stderr:\n%s\nwant 1, naming --admin-token-file, nothing started", code, errOut)
	}
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	code, _, errOut = runCLI(t, "", "run", "-f", outboundResource(t), "--state-dir", t.TempDir(), "--admin", "127.0.0.1:"+freePort(t), "--admin-token-file", empty)
	if code != exitFailure || !strings.Contains(errOut, empty) || !strings.Contains(errOut, "nothing was started") {
		t.Errorf("an empty token file: exit %d, stderr:\n%s", code, errOut)
	}
}
