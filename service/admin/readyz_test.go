package admin

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
)

// twoResources is a runtime with one resource Ready and one down.
func twoResources() fixedRuntime {
	now := time.Now()
	cond := func(ready bool) []connectors.Condition {
		st, reason := "False", connectors.FailBrokerUnreachable
		if ready {
			st, reason = "True", "Bridging"
		}
		return []connectors.Condition{{Type: connectors.CondReady, Status: st, Reason: reason, LastTransitionTime: now}}
	}
	return fixedRuntime{statuses: []connectors.Status{
		{Name: "broken", Conditions: cond(false)},
		{Name: "healthy", Conditions: cond(true), Fingerprint: "sha256:abc", SubscriberURL: "weida://sha256:abc@127.0.0.1:7000/x",
			Routes: []connectors.RouteStatus{{Name: "r", Foreign: "a/#", Weida: "a.#", Bridged: 41, Dropped: 2}}},
	}}
}

// TestReadyzPerResource: /readyz is the process's readiness, which one
// resource that is down does not take away; /readyz/{resource} is that
// resource's, and /status lists both kinds.
func TestReadyzPerResource(t *testing.T) {
	loaded := false
	h := Handler(twoResources(), prometheus.NewRegistry(), Options{Loaded: func() bool { return loaded }})
	if res, body := get(t, h, "/readyz"); res.StatusCode != 503 {
		t.Errorf("/readyz before the resources are loaded = %d %q, want 503", res.StatusCode, body)
	}
	loaded = true
	res, body := get(t, h, "/readyz")
	if res.StatusCode != 200 || !strings.Contains(body, "broken") {
		t.Errorf("/readyz with one resource down = %d %q, want 200 naming the resource that is down", res.StatusCode, body)
	}
	for path, want := range map[string]int{"/readyz/healthy": 200, "/readyz/broken": 503, "/readyz/absent": 503} {
		if res, body := get(t, h, path); res.StatusCode != want {
			t.Errorf("%s = %d %q, want %d", path, res.StatusCode, body, want)
		}
	}
	if _, body := get(t, h, "/readyz/broken"); !strings.Contains(body, connectors.FailBrokerUnreachable) {
		t.Errorf("/readyz/broken does not say why: %q", body)
	}

	_, body = get(t, h, "/status")
	var doc struct {
		Ready          bool     `json:"ready"`
		ReadyResources []string `json:"readyResources"`
		NotReady       []string `json:"notReady"`
		Process        struct {
			Ready bool `json:"ready"`
		} `json:"process"`
		Resources []struct {
			Name  string `json:"name"`
			Ready bool   `json:"ready"`
		} `json:"resources"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.Ready || !doc.Process.Ready || strings.Join(doc.ReadyResources, ",") != "healthy" || strings.Join(doc.NotReady, ",") != "broken" {
		t.Errorf("/status: ready %t, process ready %t, readyResources %q, notReady %q", doc.Ready, doc.Process.Ready, doc.ReadyResources, doc.NotReady)
	}
	if len(doc.Resources) != 2 || doc.Resources[0].Ready || !doc.Resources[1].Ready {
		t.Errorf("/status resources = %+v", doc.Resources)
	}
}

// TestStatusReload: the last reload is in /status, and a refused one puts
// the banner on the page with its errors, escaped; a good one hides it.
func TestStatusReload(t *testing.T) {
	at := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	last := Reload{Time: at, Result: ReloadRefused, Trigger: "signal", Errors: []string{"in.yaml:3: <b>bad</b>"}, LastSuccessTime: at.Add(-time.Hour)}
	h := Handler(twoResources(), prometheus.NewRegistry(), Options{LastReload: func() (Reload, bool) { return last, true },
		Version: "v1.2.3", Instance: "pod-7"})
	_, body := get(t, h, "/status")
	var doc struct {
		LastReload *Reload `json:"lastReload"`
		Process    Process `json:"process"`
	}
	if err := json.Unmarshal([]byte(body), &doc); err != nil {
		t.Fatal(err)
	}
	if doc.LastReload == nil || doc.LastReload.Result != ReloadRefused || len(doc.LastReload.Errors) != 1 || doc.Process.Version != "v1.2.3" || doc.Process.Instance != "pod-7" {
		t.Errorf("/status lastReload %+v, process %+v", doc.LastReload, doc.Process)
	}
	_, page := get(t, h, "/")
	if !strings.Contains(page, `<div id="reload-banner" class="banner">`) || !strings.Contains(page, "&lt;b&gt;bad&lt;/b&gt;") || strings.Contains(page, "<b>bad") {
		t.Errorf("the page lacks the refused-reload banner with its escaped error")
	}
	for _, want := range []string{"v1.2.3", "pod-7", "sha256:abc", "weida://sha256:abc@127.0.0.1:7000/x", `data-f="route.bridged">41<`, `data-f="route.dropped">2<`} {
		if !strings.Contains(page, want) {
			t.Errorf("the page lacks %q", want)
		}
	}
	last = Reload{Time: at.Add(time.Minute), Result: ReloadSuccess, Trigger: "watch", LastSuccessTime: at.Add(time.Minute)}
	if _, page := get(t, h, "/"); !strings.Contains(page, `<div id="reload-banner" class="banner" hidden>`) {
		t.Errorf("after a good reload the banner is shown")
	}
}

// TestRates: rates are taken against a reading at least the window old,
// once there is one, and start again for a resource whose counters went
// down.
func TestRates(t *testing.T) {
	r := newRateTracker()
	t0 := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	at := func(sec int, received uint64) *Rates {
		st := []connectors.Status{{Name: "x", Counters: connectors.Counters{Received: received, Bridged: received}}}
		return r.observe(t0.Add(time.Duration(sec)*time.Second), st)["x"]
	}
	if got := at(0, 0); got != nil {
		t.Fatalf("first reading has rates %+v", got)
	}
	if got := at(2, 20); got == nil || got.Received != 10 || got.WindowSeconds != 2 {
		t.Errorf("after 2 s and 20 messages: %+v, want 10/s over 2 s", got)
	}
	for s := 3; s <= 10; s++ {
		at(s, uint64(20+10*(s-2)))
	}
	if got := at(11, 110); got == nil || got.WindowSeconds < 5 || got.WindowSeconds > 6 || got.Received != 10 {
		t.Errorf("at 11 s: %+v, want 10/s over 5 to 6 s", got)
	}
	if got := at(12, 3); got != nil {
		t.Errorf("a counter that went down kept its history: %+v", got)
	}
}

// TestStatusPageFailingBox: an outbound resource retrying its weida dial
// inside an attempt has no supervisor failure, yet the page's Failing box
// shows the weida side's reason and message.
func TestStatusPageFailingBox(t *testing.T) {
	now := time.Now()
	rt := fixedRuntime{statuses: []connectors.Status{{
		Name: "out", Direction: "outbound",
		Conditions: []connectors.Condition{
			{Type: connectors.CondBrokerConnected, Status: "True", Reason: "Connected", LastTransitionTime: now},
			{Type: connectors.CondWeidaReady, Status: "False", Reason: connectors.FailWeidaDial, Message: "dial weida://127.0.0.1:1/x: no answer", LastTransitionTime: now},
			{Type: connectors.CondReady, Status: "False", Reason: "WeidaNotReady", LastTransitionTime: now},
		},
	}}}
	_, page := get(t, Handler(rt, prometheus.NewRegistry(), Options{}), "/")
	if !strings.Contains(page, `<div class="failure" data-f="failure">`) || !strings.Contains(page, connectors.FailWeidaDial) ||
		!strings.Contains(page, "no answer") || !strings.Contains(page, `data-f="failure.meta" hidden`) {
		t.Errorf("the page has no visible Failing box for the weida dial failure:\n%s", page)
	}
}
