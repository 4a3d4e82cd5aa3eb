package admin

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

const testToken = "s3cret-admin-token-0123456789abcdef"

// writeToken writes content to dir/token through a rename, as a Secret
// volume's swap replaces the file, and returns the path.
func writeToken(t *testing.T, dir, content string) string {
	t.Helper()
	p := filepath.Join(dir, "token")
	tmp := p + ".tmp"
	if err := os.WriteFile(tmp, []byte(content), 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Rename(tmp, p); err != nil {
		t.Fatal(err)
	}
	return p
}

// syncBuffer collects log output from the server's goroutines.
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

// protected serves the admin handler behind the token of file, over a
// real loopback HTTP server.
func protected(t *testing.T, file string, log *slog.Logger) *httptest.Server {
	t.Helper()
	f, err := OpenTokenFile(file, log)
	if err != nil {
		t.Fatal(err)
	}
	h := Handler(twoResources(), prometheus.NewRegistry(), Options{TokenRequired: true})
	srv := httptest.NewServer(RequireToken(h, f))
	t.Cleanup(srv.Close)
	return srv
}

// do GETs path from srv, setting the Authorization header when auth is
// not empty.
func do(t *testing.T, srv *httptest.Server, path, auth string) (*http.Response, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, srv.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	if auth != "" {
		req.Header.Set("Authorization", auth)
	}
	res, err := srv.Client().Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func basic(user, pass string) string {
	req, _ := http.NewRequest(http.MethodGet, "/", nil)
	req.SetBasicAuth(user, pass)
	return req.Header.Get("Authorization")
}

// TestRequireToken: with a token, the probes answer anyone; every other
// path (the page, its files, /status, /metrics, a path that does not
// exist) answers 401 with both challenges unless the request carries the
// token as a Bearer token or as a Basic password under any user name.
func TestRequireToken(t *testing.T) {
	srv := protected(t, writeToken(t, t.TempDir(), testToken+"\n"), nil)

	for _, p := range []string{"/healthz", "/readyz", "/readyz/healthy"} {
		if res, body := do(t, srv, p, ""); res.StatusCode != http.StatusOK {
			t.Errorf("probe %s without a token: %d %q, want 200", p, res.StatusCode, body)
		}
	}
	if res, _ := do(t, srv, "/readyz/broken", ""); res.StatusCode != http.StatusServiceUnavailable {
		t.Errorf("probe /readyz/broken without a token: %d, want the probe's own 503", res.StatusCode)
	}

	paths := []string{"/", "/ui/page.css", "/status", "/metrics", "/no-such-path", "/healthz/../status"}
	refusals := map[string]string{
		"none":          "",
		"wrong bearer":  "Bearer wrong-token",
		"prefix":        "Bearer " + testToken[:len(testToken)-1],
		"longer":        "Bearer " + testToken + "x",
		"empty bearer":  "Bearer ",
		"wrong basic":   basic("admin", "wrong-token"),
		"token as user": basic(testToken, ""),
		"other scheme":  "Token " + testToken,
	}
	for _, p := range paths {
		for name, auth := range refusals {
			res, body := do(t, srv, p, auth)
			if res.StatusCode != http.StatusUnauthorized {
				t.Errorf("%s with %s: %d, want 401", p, name, res.StatusCode)
				continue
			}
			ch := res.Header.Values("WWW-Authenticate")
			if !slices.Contains(ch, `Basic realm="weida-connector", charset="UTF-8"`) || !slices.Contains(ch, `Bearer realm="weida-connector"`) {
				t.Errorf("%s with %s: challenges %q, want Basic and Bearer", p, name, ch)
			}
			if strings.Contains(body, testToken) {
				t.Errorf("%s with %s: the refusal shows the token", p, name)
			}
		}
	}

	accepted := map[string]string{
		"bearer":       "Bearer " + testToken,
		"bearer case":  "bearer " + testToken,
		"basic":        basic("admin", testToken),
		"basic anyone": basic("someone-else", testToken),
		"basic nobody": basic("", testToken),
	}
	for name, auth := range accepted {
		for _, p := range []string{"/", "/status", "/metrics"} {
			if res, body := do(t, srv, p, auth); res.StatusCode != http.StatusOK {
				t.Errorf("%s with %s: %d %q, want 200", p, name, res.StatusCode, body)
			}
		}
	}

	_, body := do(t, srv, "/status", "Bearer "+testToken)
	var doc struct{ Process Process }
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if !doc.Process.AdminTokenRequired {
		t.Error("/status does not say the listener asks for a token")
	}
	if _, page := do(t, srv, "/", "Bearer "+testToken); !strings.Contains(page, ">token required<") {
		t.Error("the status page does not say the listener asks for a token")
	}
}

// TestStatusSaysOpen: without a token /status and the page say so.
func TestStatusSaysOpen(t *testing.T) {
	_, body := get(t, Handler(twoResources(), prometheus.NewRegistry(), Options{}), "/status")
	if !strings.Contains(body, `"adminTokenRequired": false`) {
		t.Errorf("/status of an open listener lacks adminTokenRequired false:\n%s", body)
	}
	if _, page := get(t, Handler(twoResources(), prometheus.NewRegistry(), Options{}), "/"); !strings.Contains(page, ">open: no token<") {
		t.Error("the status page of an open listener does not say so")
	}
}

// TestTokenRotation: a new token in the file is in force at the next
// request, without a restart; the old one is refused. A file that changes
// into no usable token keeps the last good one in force and logs why,
// without the token; a good file after it is taken again.
func TestTokenRotation(t *testing.T) {
	dir := t.TempDir()
	var logs syncBuffer
	file := writeToken(t, dir, testToken)
	srv := protected(t, file, slog.New(slog.NewTextHandler(&logs, nil)))
	status := func(tok string) int {
		res, _ := do(t, srv, "/status", "Bearer "+tok)
		return res.StatusCode
	}
	if c := status(testToken); c != http.StatusOK {
		t.Fatalf("first token: %d", c)
	}

	const second = "second-token-fedcba9876543210"
	writeToken(t, dir, second+"\n")
	if c := status(second); c != http.StatusOK {
		t.Errorf("the rotated token: %d, want 200", c)
	}
	if c := status(testToken); c != http.StatusUnauthorized {
		t.Errorf("the token rotated away: %d, want 401", c)
	}

	for _, bad := range []string{"", "\n  \n", "two\nlines"} {
		writeToken(t, dir, bad)
		if c := status(second); c != http.StatusOK {
			t.Errorf("after the file became %q, the last good token: %d, want 200", bad, c)
		}
	}
	if err := os.Remove(file); err != nil {
		t.Fatal(err)
	}
	if c := status(second); c != http.StatusOK {
		t.Errorf("after the file was removed, the last good token: %d, want 200", c)
	}
	if !strings.Contains(logs.String(), "holds no usable token") {
		t.Errorf("a bad token file was not logged:\n%s", logs.String())
	}

	const third = "third-token-0011223344556677"
	writeToken(t, dir, third)
	if c := status(third); c != http.StatusOK {
		t.Errorf("a good file after bad ones: %d, want 200", c)
	}
	for _, tok := range []string{testToken, second, third} {
		if strings.Contains(logs.String(), tok) {
			t.Errorf("the logs show a token:\n%s", logs.String())
		}
	}
}

// TestOpenTokenFileRefuses: a file without a usable token fails at start,
// and the error names the file but not its content.
func TestOpenTokenFileRefuses(t *testing.T) {
	dir := t.TempDir()
	for name, content := range map[string]string{
		"empty":  "",
		"blank":  " \n\t\n",
		"spaces": "a token with spaces",
		"lines":  "first-line\nsecond-line",
	} {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
		_, err := OpenTokenFile(p, nil)
		if !errors.Is(err, ErrBadToken) || !strings.Contains(err.Error(), p) {
			t.Errorf("%s: %v, want ErrBadToken naming the file", name, err)
		} else if c := strings.TrimSpace(content); c != "" && strings.Contains(err.Error(), c) {
			t.Errorf("%s: the error shows the content: %v", name, err)
		}
	}
	if _, err := OpenTokenFile(filepath.Join(dir, "missing"), nil); err == nil {
		t.Error("a missing file was accepted")
	}
	if _, err := OpenTokenFile(dir, nil); err == nil {
		t.Error("a directory was accepted")
	}
}
