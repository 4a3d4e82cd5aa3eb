package main

import (
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
)

// TestHealth: the probe the image's health check runs exits 0 on a ready
// listener, 1 with the listener's reason on a 503, 1 naming the flag when
// nothing listens, and asks a wildcard listener on loopback.
func TestHealth(t *testing.T) {
	var ready atomic.Bool
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/readyz" {
			http.NotFound(w, r)
			return
		}
		if !ready.Load() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: mqtt-sensors-in\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	}))
	defer srv.Close()
	addr := srv.Listener.Addr().String()

	code, _, errOut := runCLI(t, "", "health", "--admin", addr)
	if code != exitFailure || !strings.Contains(errOut, "503") || !strings.Contains(errOut, "mqtt-sensors-in") {
		t.Errorf("not ready: exit %d, stderr %q; want 1 with the status and the resource", code, errOut)
	}
	ready.Store(true)
	if code, out, errOut := runCLI(t, "", "health", "--admin", addr); code != exitOK || !strings.Contains(out, "ready") {
		t.Errorf("ready: exit %d, stdout %q, stderr %q; want 0", code, out, errOut)
	}
	_, port, _ := net.SplitHostPort(addr)
	if code, _, errOut := runCLI(t, "", "health", "--admin", ":"+port); code != exitOK {
		t.Errorf("--admin :%s (as run takes it) is not asked on loopback: exit %d, %q", port, code, errOut)
	}
	if code, _, errOut := runCLI(t, "", "health", "--admin", addr, "--path", "/healthz"); code != exitFailure || !strings.Contains(errOut, "404") {
		t.Errorf("--path /healthz on a listener without it: exit %d, %q", code, errOut)
	}

	closed := srv.Listener.Addr().String()
	srv.Close()
	if code, _, errOut := runCLI(t, "", "health", "--admin", closed); code != exitFailure || !strings.Contains(errOut, "--admin "+closed) {
		t.Errorf("nothing listening: exit %d, stderr %q; want 1 naming --admin", code, errOut)
	}
	for _, bad := range [][]string{{"--admin", "9090"}, {"--path", "readyz"}, {"extra"}} {
		if code, _, _ := runCLI(t, "", append([]string{"health"}, bad...)...); code != exitUsage {
			t.Errorf("health %v: exit %d, want a usage error", bad, code)
		}
	}
}

func TestProbeURL(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9090": "http://127.0.0.1:9090/readyz",
		":9090":          "http://127.0.0.1:9090/readyz",
		"0.0.0.0:9090":   "http://127.0.0.1:9090/readyz",
		"[::]:9090":      "http://[::1]:9090/readyz",
		"[::1]:9090":     "http://[::1]:9090/readyz",
	} {
		if got, err := probeURL(addr, "/readyz"); err != nil || got != want {
			t.Errorf("probeURL(%q) = %q, %v; want %q", addr, got, err, want)
		}
	}
}
