package service_test

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/service"
)

// getAuth GETs url with the Authorization header auth ("" for none).
func getAuth(t *testing.T, url, auth string) int {
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

func tokenFile(t *testing.T, token string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), "admin-token")
	if err := os.WriteFile(p, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

// TestAdminTokenRun: with Config.AdminTokenFile, Run serves the probes to
// anyone and /metrics, /status, the page and pprof only with the token.
func TestAdminTokenRun(t *testing.T) {
	const token = "run-admin-token-0123456789"
	base := startAdmin(t, service.Config{AdminTokenFile: tokenFile(t, token), Pprof: true})
	for _, p := range []string{"/healthz", "/readyz"} {
		if c := getAuth(t, base+p, ""); c != http.StatusOK {
			t.Errorf("probe %s without the token: %d, want 200", p, c)
		}
	}
	for _, p := range []string{"/metrics", "/status", "/", "/debug/pprof/", "/debug/pprof/goroutine?debug=1"} {
		if c := getAuth(t, base+p, ""); c != http.StatusUnauthorized {
			t.Errorf("%s without the token: %d, want 401", p, c)
		}
		if c := getAuth(t, base+p, "Bearer "+token); c != http.StatusOK {
			t.Errorf("%s with the token: %d, want 200", p, c)
		}
	}
}

// runUntilUp runs the service with cfg (one outbound resource, its logs
// in logs) until its resources run, then stops it. It returns the error
// Run returned before starting, if any.
func runUntilUp(t *testing.T, cfg service.Config, logs *lockedBuffer) error {
	t.Helper()
	e := env(nil)
	e.Logger = slog.New(slog.NewJSONHandler(logs, nil))
	cfg.Env = e
	cfg.Paths = []string{outboundFile(t, "token")}
	cfg.Drain = time.Second
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	reload := make(chan struct{})
	done := make(chan error, 1)
	go func() { done <- service.Run(ctx, cfg, reload) }()
	select {
	case reload <- struct{}{}: // taken once the resources run, after the listener is up
	case err := <-done:
		return err
	case <-time.After(10 * time.Second):
		t.Fatalf("Run(%s) did not start", cfg.Admin)
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run(%s) = %v", cfg.Admin, err)
	}
	return nil
}

// TestAdminExposure: beyond loopback, pprof without a token is refused
// before anything starts, and an open listener is warned of, naming the
// flag to add; a token silences the warning and allows pprof; on loopback
// pprof without a token runs as before. Nothing is sent to the wildcard
// listeners; they only bind.
func TestAdminExposure(t *testing.T) {
	var logs lockedBuffer
	err := runUntilUp(t, service.Config{Admin: "0.0.0.0:0", Pprof: true}, &logs)
	var ae *service.AdminError
	if !errors.As(err, &ae) || !errors.Is(err, service.ErrPprofExposed) || !strings.Contains(err.Error(), "--admin-token-file") {
		t.Errorf("--pprof on 0.0.0.0 without a token: %v, want an AdminError naming --admin-token-file", err)
	}
	if strings.Contains(logs.String(), "connector running") {
		t.Errorf("the refused start ran the resources:\n%s", logs.String())
	}

	logs = lockedBuffer{}
	if err := runUntilUp(t, service.Config{Admin: "0.0.0.0:0"}, &logs); err != nil {
		t.Fatal(err)
	}
	if l := logs.String(); !strings.Contains(l, "reachable beyond this host") || !strings.Contains(l, "--admin-token-file") {
		t.Errorf("an open listener on 0.0.0.0: no warning naming --admin-token-file:\n%s", l)
	}

	logs = lockedBuffer{}
	if err := runUntilUp(t, service.Config{Admin: "0.0.0.0:0", Pprof: true, AdminTokenFile: tokenFile(t, "exposure-token-0123456789")}, &logs); err != nil {
		t.Fatalf("--pprof on 0.0.0.0 with a token: %v", err)
	}
	if strings.Contains(logs.String(), "reachable beyond this host") {
		t.Errorf("a listener with a token was warned of:\n%s", logs.String())
	}

	logs = lockedBuffer{}
	if err := runUntilUp(t, service.Config{Admin: "127.0.0.2:0", Pprof: true}, &logs); err != nil {
		t.Errorf("--pprof on loopback without a token: %v, want it to run as before", err)
	}
}

// TestAdminTokenFileRefused: a token file without a usable token stops
// the start, naming the file.
func TestAdminTokenFileRefused(t *testing.T) {
	empty := filepath.Join(t.TempDir(), "empty")
	if err := os.WriteFile(empty, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{empty, filepath.Join(t.TempDir(), "missing")} {
		var logs lockedBuffer
		err := runUntilUp(t, service.Config{Admin: "127.0.0.1:0", AdminTokenFile: f}, &logs)
		var ae *service.AdminError
		if !errors.As(err, &ae) || !strings.Contains(err.Error(), f) {
			t.Errorf("token file %s: %v, want an AdminError naming it", f, err)
		}
	}
}
