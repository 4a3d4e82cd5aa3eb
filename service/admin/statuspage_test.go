package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
)

const (
	hostileName    = `<script>alert("name")</script>`
	hostileForeign = `sensors/<script>/x`
	hostileWeida   = `sensors.<script>.x`
	hostileError   = `dial: <img src=x onerror=alert(1)> & "quoted"`
	hostileReason  = `<b onmouseover=alert(2)>`
)

// fixedRuntime is a runtime that reports a fixed set of statuses, so the
// page can be shown text no real resource would produce. That the real
// runtime reports such text verbatim is connectors' TestStatusesKeepHostileText.
type fixedRuntime struct {
	statuses []connectors.Status
	alive    func(context.Context) bool
}

func (f fixedRuntime) Alive(ctx context.Context) bool {
	if f.alive != nil {
		return f.alive(ctx)
	}
	return true
}

func (f fixedRuntime) Ready() bool {
	for _, s := range f.statuses {
		if !s.Ready() {
			return false
		}
	}
	return len(f.statuses) > 0
}

func (f fixedRuntime) Statuses() []connectors.Status { return f.statuses }

// hostileRuntime returns a runtime holding one resource whose name, route,
// drop reason and error text are all markup, with known counters: the
// status connectors' hostileRuntime reports.
func hostileRuntime(t *testing.T) Runtime {
	t.Helper()
	now := time.Now()
	return fixedRuntime{statuses: []connectors.Status{{
		Name:      hostileName,
		Protocol:  "mqtt",
		Direction: "inbound",
		Broker:    "mqtt://127.0.0.1:1883",
		Endpoint:  "weida://127.0.0.1:7000/x",
		Routes:    []connectors.RouteStatus{{Name: hostileForeign, Foreign: hostileForeign, Weida: hostileWeida}},
		Losses:    []string{"dotted-levels", "ordering"},
		Conditions: []connectors.Condition{
			{Type: connectors.CondBrokerConnected, Status: "Unknown", Reason: "Starting", LastTransitionTime: now},
			{Type: connectors.CondWeidaReady, Status: "False", Reason: connectors.FailListen, Message: hostileError, LastTransitionTime: now},
			{Type: connectors.CondReady, Status: "False", Reason: connectors.FailListen, Message: hostileError, LastTransitionTime: now},
		},
		Counters: connectors.Counters{Received: 7, Bridged: 5, Dropped: map[string]uint64{"mqtt-dotted-level": 1, hostileReason: 1}},
		Failure:  &connectors.FailureStatus{Reason: connectors.FailListen, Message: hostileError, Attempts: 1, LastErrorTime: now},
	}}}
}

func get(t *testing.T, h http.Handler, path string) (*http.Response, string) {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	res := rec.Result()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		t.Fatal(err)
	}
	return res, string(b)
}

func TestStatusPageEscapesHostileText(t *testing.T) {
	h := Handler(hostileRuntime(t), prometheus.NewRegistry(), Options{})
	res, body := get(t, h, "/")
	if res.StatusCode != 200 {
		t.Fatalf("GET / = %d\n%s", res.StatusCode, body)
	}
	if ct := res.Header.Get("Content-Type"); ct != "text/html; charset=utf-8" {
		t.Errorf("Content-Type = %q", ct)
	}
	for _, raw := range []string{hostileName, hostileForeign, hostileWeida, "<img", hostileReason, "onerror=alert(1)>"} {
		if strings.Contains(body, raw) {
			t.Errorf("the page contains %q unescaped", raw)
		}
	}
	for _, esc := range []string{
		`&lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;`,
		`sensors/&lt;script&gt;/x`,
		`sensors.&lt;script&gt;.x`,
		`&lt;img src=x onerror=alert(1)&gt; &amp; &#34;quoted&#34;`,
		`&lt;b onmouseover=alert(2)&gt;`,
	} {
		if !strings.Contains(body, esc) {
			t.Errorf("the page lacks the escaped text %s", esc)
		}
	}
	// The only script is the page's own file, and nothing inline would
	// run under the CSP anyway: no inline handlers or styles.
	if n := strings.Count(body, "<script"); n != 1 || !strings.Contains(body, `<script src="/ui/page.js" defer></script>`) {
		t.Errorf("want exactly the page's own script element, got %d <script", n)
	}
	if m := regexp.MustCompile(`(?i)<[^>]*\s(on[a-z]+|style)=`).FindString(body); m != "" {
		t.Errorf("inline handler or style attribute: %s", m)
	}
	// What the page shows is what /status says.
	for _, want := range []string{">7<", ">5<", "mqtt://127.0.0.1:1883", "weida://127.0.0.1:7000/x", "dotted-levels", "ListenFailed", "mqtt-dotted-level"} {
		if !strings.Contains(body, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
}

func TestStatusPageHeaders(t *testing.T) {
	h := Handler(hostileRuntime(t), prometheus.NewRegistry(), Options{})
	res, _ := get(t, h, "/")
	csp := res.Header.Get("Content-Security-Policy")
	for _, want := range []string{"default-src 'none'", "script-src 'self'", "style-src 'self'", "connect-src 'self'", "frame-ancestors 'none'"} {
		if !strings.Contains(csp, want) {
			t.Errorf("CSP %q lacks %q", csp, want)
		}
	}
	for _, bad := range []string{"unsafe-inline", "unsafe-eval", "http:", "https:", "*"} {
		if strings.Contains(csp, bad) {
			t.Errorf("CSP %q allows %q", csp, bad)
		}
	}
	if v := res.Header.Get("X-Content-Type-Options"); v != "nosniff" {
		t.Errorf("X-Content-Type-Options = %q", v)
	}
}

func TestStatusPageAssets(t *testing.T) {
	h := Handler(hostileRuntime(t), prometheus.NewRegistry(), Options{})
	for path, want := range map[string]string{
		"/ui/page.js":     "text/javascript; charset=utf-8",
		"/ui/page.css":    "text/css; charset=utf-8",
		"/ui/favicon.svg": "image/svg+xml",
	} {
		res, body := get(t, h, path)
		if res.StatusCode != 200 || res.Header.Get("Content-Type") != want || len(body) == 0 {
			t.Errorf("GET %s = %d %q (%d bytes), want 200 %q", path, res.StatusCode, res.Header.Get("Content-Type"), len(body), want)
		}
		if res.Header.Get("Content-Security-Policy") == "" {
			t.Errorf("GET %s: no CSP", path)
		}
	}
	for _, path := range []string{"/ui/", "/ui/page.html", "/ui/x/page.js", "/nope", "/index.html"} {
		if res, _ := get(t, h, path); res.StatusCode != 404 {
			t.Errorf("GET %s = %d, want 404", path, res.StatusCode)
		}
	}
	// ServeMux redirects a path with .. to its clean form, which is not
	// found either.
	if res, body := get(t, h, "/ui/../statuspage.go"); res.StatusCode == 200 || strings.Contains(body, "package") {
		t.Errorf("GET /ui/../statuspage.go = %d", res.StatusCode)
	}
	// The routes that were there before the page keep answering.
	res, body := get(t, h, "/status")
	var st struct{ Resources []connectors.Status }
	if err := json.Unmarshal([]byte(body), &st); res.StatusCode != 200 || err != nil || len(st.Resources) != 1 {
		t.Fatalf("GET /status = %d, %v:\n%s", res.StatusCode, err, body)
	}
	if r := st.Resources[0]; r.Broker != "mqtt://127.0.0.1:1883" || len(r.Routes) != 1 || r.Routes[0].Weida != hostileWeida ||
		len(r.Losses) != 2 {
		t.Errorf("/status lacks the broker, routes or losses: %+v", r)
	}
	if res, _ := get(t, h, "/healthz"); res.StatusCode != 200 {
		t.Errorf("GET /healthz = %d", res.StatusCode)
	}
}

// The script must never hand data to the HTML parser.
func TestStatusPageScriptUsesTextContent(t *testing.T) {
	js, err := statusPageFiles.ReadFile("statuspage/page.js")
	if err != nil {
		t.Fatal(err)
	}
	for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function"} {
		if bytes.Contains(js, []byte(sink)) {
			t.Errorf("page.js uses %s", sink)
		}
	}
}

// A status may carry a "failure" object (the supervisor's account of a
// resource that is down); the page shows it, escaped, when present.
func TestStatusPageRendersFailure(t *testing.T) {
	page := &statusPage{tmpl: mustStatusTemplate()}
	at := time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC)
	d := pageData{Generated: at, Resources: []pageResource{
		{Status: connectors.Status{Name: "down"}, Failure: &pageFailure{Reason: "ConnectFailed", Message: hostileError, Attempts: 3,
			LastErrorTime: at, NextRetryTime: at.Add(4 * time.Second)}},
		{Status: connectors.Status{Name: "fine"}},
	}}
	var buf bytes.Buffer
	if err := page.tmpl.Execute(&buf, d); err != nil {
		t.Fatal(err)
	}
	body := buf.String()
	for _, want := range []string{"ConnectFailed", `&lt;img src=x onerror=alert(1)&gt;`, ">3<", "2026-12-01 10:00:04 UTC"} {
		if !strings.Contains(body, want) {
			t.Errorf("the failure box lacks %q", want)
		}
	}
	if strings.Contains(body, "<img") {
		t.Error("the failure message is not escaped")
	}
	if n := strings.Count(body, `class="failure" data-f="failure" hidden`); n != 1 {
		t.Errorf("%d hidden failure boxes, want 1 (the resource without a failure)", n)
	}

	// Decoding tolerates the field: /status JSON with a failure object
	// reaches the template.
	var r pageResource
	if err := json.Unmarshal([]byte(`{"name":"n","failure":{"reason":"R","message":"M","attempts":2,"lastErrorTime":"2026-12-01T10:00:00Z","nextRetryTime":"2026-12-01T10:00:05Z","extra":1}}`), &r); err != nil {
		t.Fatal(err)
	}
	if r.Failure == nil || r.Failure.Reason != "R" || r.Failure.Attempts != 2 || !r.Failure.NextRetryTime.Equal(at.Add(5*time.Second)) {
		t.Errorf("decoded failure = %+v", r.Failure)
	}
}

// TestStatusPageRendersPlacement renders a resource held here, one held by
// another replica, one no replica holds and one without placement: each
// placed resource shows its role, holder, epoch and standbys, escaped; the
// unplaced one shows no placement row at all. (The browser test runs a
// single replica without a coordination backend, so the placement row is
// proven here, on the rendered HTML.)
func TestStatusPageRendersPlacement(t *testing.T) {
	page := &statusPage{tmpl: mustStatusTemplate()}
	d := pageData{Generated: time.Date(2026, 12, 1, 10, 0, 0, 0, time.UTC), Resources: []pageResource{
		{Status: connectors.Status{Name: "held", Placement: &connectors.PlacementStatus{
			Role: "holder", Holder: "replica-a", Epoch: 42, Standbys: []string{"replica-b", hostileName}}}},
		{Status: connectors.Status{Name: "elsewhere", Placement: &connectors.PlacementStatus{
			Role: "standby", Holder: "replica-b", Standbys: []string{"replica-a"}}}},
		{Status: connectors.Status{Name: "orphan", Placement: &connectors.PlacementStatus{Role: "unheld"}}},
		{Status: connectors.Status{Name: "unplaced"}},
	}}
	var buf bytes.Buffer
	if err := page.tmpl.Execute(&buf, d); err != nil {
		t.Fatal(err)
	}
	body := buf.String()
	sections := map[string]string{}
	for _, s := range strings.Split(body, `<section class="res" data-resource="`)[1:] {
		name, rest, _ := strings.Cut(s, `"`)
		sections[name] = rest
	}
	row := regexp.MustCompile(`(?s)<div class="placement" data-f="placement.row">.*?</div>`)
	text := func(name string) string {
		m := row.FindString(sections[name])
		m = regexp.MustCompile(`<[^>]*>`).ReplaceAllString(m, " ")
		return strings.Join(strings.Fields(m), " ")
	}
	for name, want := range map[string]string{
		"held":      "Placement holder · holder replica-a · epoch 42 · standbys replica-b , &lt;script&gt;alert(&#34;name&#34;)&lt;/script&gt;",
		"elsewhere": "Placement standby · holder replica-b · epoch — · standbys replica-a",
		"orphan":    "Placement unheld · holder none · epoch — · standbys none",
	} {
		if got := text(name); got != want {
			t.Errorf("%s: placement row reads %q, want %q", name, got, want)
		}
	}
	if !strings.Contains(sections["held"], `class="role holder"`) {
		t.Error("the holder's role is not marked as such")
	}
	if strings.Contains(sections["unplaced"], "placement") {
		t.Error("a resource without placement shows a placement row")
	}
	if strings.Contains(body, hostileName) {
		t.Error("a standby's name is not escaped")
	}

	// What /status encodes reaches the template: the page decodes the
	// placement object of the JSON.
	var r pageResource
	if err := json.Unmarshal([]byte(`{"name":"n","placement":{"role":"holder","holder":"a","epoch":3,"standbys":["b"]}}`), &r); err != nil {
		t.Fatal(err)
	}
	if p := r.Placement; p == nil || p.Role != "holder" || p.Holder != "a" || p.Epoch != 3 || len(p.Standbys) != 1 {
		t.Errorf("decoded placement = %+v", r.Placement)
	}
}
