package service_test

import (
	"context"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/service"
)

// startAdmin runs the service with one outbound NATS resource and the
// admin listener on a free loopback port, and returns the listener's base
// URL once it answers. The run stops at the end of the test.
func startAdmin(t *testing.T, cfg service.Config) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	file := outboundFile(t, "admin")
	cfg.Env = env(nil)
	cfg.Paths = []string{file}
	cfg.Admin = addr
	cfg.Drain = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, cfg, make(chan struct{})) }()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not stop")
		}
	})
	base := "http://" + addr
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := http.Get(base + "/healthz")
		if err == nil {
			resp.Body.Close()
			return base
		}
		select {
		case err := <-done:
			t.Fatalf("Run returned %v", err)
		default:
		}
		if time.Now().After(deadline) {
			t.Fatalf("admin listener %s does not answer: %v", addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func get(t *testing.T, url string) (int, string) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, string(body)
}

// TestBuildInfoMetric: /metrics names the build Config.Build gives, and the
// Go version of the process when none is given.
func TestBuildInfoMetric(t *testing.T) {
	base := startAdmin(t, service.Config{Build: service.Build{Version: "v1.2.3", Revision: "0123abcd", GoVersion: "go1.26.0"}})
	code, body := get(t, base+"/metrics")
	if code != http.StatusOK {
		t.Fatalf("/metrics: %d", code)
	}
	want := `weida_connector_build_info{goversion="go1.26.0",revision="0123abcd",version="v1.2.3"} 1`
	if !strings.Contains(body, want+"\n") {
		t.Errorf("/metrics lacks %s", want)
	}

	base = startAdmin(t, service.Config{})
	_, body = get(t, base+"/metrics")
	want = `weida_connector_build_info{goversion="` + runtime.Version() + `",revision="",version="(unknown)"} 1`
	if !strings.Contains(body, want+"\n") {
		t.Errorf("with no Build, /metrics lacks %s", want)
	}
}

// TestPprofOnlyWhenAsked: /debug/pprof/ is not served unless Config.Pprof
// is set, and then its index and a profile are.
func TestPprofOnlyWhenAsked(t *testing.T) {
	base := startAdmin(t, service.Config{})
	if code, _ := get(t, base+"/debug/pprof/"); code != http.StatusNotFound {
		t.Errorf("without Pprof, /debug/pprof/ answers %d, want 404", code)
	}
	if code, _ := get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusNotFound {
		t.Errorf("without Pprof, /debug/pprof/goroutine answers %d, want 404", code)
	}

	base = startAdmin(t, service.Config{Pprof: true})
	code, body := get(t, base+"/debug/pprof/")
	if code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Errorf("with Pprof, /debug/pprof/ answers %d, want 200 and the index", code)
	}
	if code, body := get(t, base+"/debug/pprof/goroutine?debug=1"); code != http.StatusOK || !strings.Contains(body, "goroutine profile") {
		t.Errorf("with Pprof, /debug/pprof/goroutine answers %d", code)
	}
	if code, _ := get(t, base+"/status"); code != http.StatusOK {
		t.Errorf("with Pprof, /status answers %d, want 200", code)
	}
}
