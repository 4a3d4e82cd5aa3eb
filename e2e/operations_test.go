package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/chromedp/chromedp"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// shippedReadinessPath is the readiness probe's path in the shipped
// Kubernetes deployment, read from the manifest so that the test checks
// what is shipped.
func shippedReadinessPath(t *testing.T) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "deploy", "kubernetes", "deployment.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?s)readinessProbe:\s*\n\s*httpGet:\s*\n\s*path:\s*(\S+)`).FindSubmatch(b)
	if m == nil {
		t.Fatal("deploy/kubernetes/deployment.yaml has no readinessProbe with an httpGet path")
	}
	return string(m[1])
}

// operatorDoc is the part of /status these tests read besides the
// resources.
type operatorDoc struct {
	Ready          bool     `json:"ready"`
	ReadyResources []string `json:"readyResources"`
	NotReady       []string `json:"notReady"`
	Process        struct {
		Ready bool `json:"ready"`
	} `json:"process"`
	LastReload *struct {
		Result  string   `json:"result"`
		Trigger string   `json:"trigger"`
		Errors  []string `json:"errors"`
	} `json:"lastReload"`
}

func (c *Connector) operatorDoc() operatorDoc {
	c.t.Helper()
	var d operatorDoc
	if err := json.Unmarshal([]byte(c.StatusJSON()), &d); err != nil {
		c.t.Fatalf("/status: %v\n%s", err, c.StatusJSON())
	}
	return d
}

// TestReadinessOneResourceFailing: one resource whose broker cannot be
// reached (its address is a closed port) and one healthy: the shipped
// readiness probe answers ready, the healthy endpoint bridges, and /status
// and /readyz/{resource} show which one failed.
func TestReadinessOneResourceFailing(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	u := unique()
	probe := shippedReadinessPath(t)
	healthyEP := fmt.Sprintf("weida://127.0.0.1:%d/ok", freePort(t, "udp"))
	brokenEP := fmt.Sprintf("weida://127.0.0.1:%d/broken", freePort(t, "udp"))
	closed := fmt.Sprintf("127.0.0.1:%d", freePort(t, "tcp")) // nothing listens there
	healthy := mqttResource{Name: "healthy", Direction: policy.Inbound, QoS: 1, Endpoint: healthyEP,
		Routes: []mqttRoute{{"all", u + "/ok/#"}}}
	broken := mqttResource{Name: "broken", Direction: policy.Inbound, QoS: 1, Endpoint: brokenEP, Broker: closed,
		Routes: []mqttRoute{{"all", u + "/broken/#"}}}
	dir := t.TempDir()
	writeFile(t, dir, "healthy.yaml", healthy.YAML(t))
	writeFile(t, dir, "broken.yaml", broken.YAML(t))
	c := StartConnector(t, nil, fastRetry("-f", dir)...)

	Eventually(t, 30*time.Second, "the healthy resource Ready and the shipped probe "+probe+" 200", func() bool {
		st, ok := c.Status("healthy")
		return ok && st.ready() && c.code(probe) == http.StatusOK
	})
	// The broken resource is down, whether its driver ends the attempt
	// (a failure the supervisor retries) or retries the broker inside it.
	var st ResourceStatus
	Eventually(t, 30*time.Second, "broken to report its broker unreachable", func() bool {
		var ok bool
		st, ok = c.Status("broken")
		status, reason := condition(st, "BrokerConnected")
		return ok && !st.ready() && status == "False" && reason != "Starting"
	})
	if c.code(probe) != http.StatusOK {
		t.Errorf("the shipped readiness probe %s answers %d while only one resource is down", probe, c.code(probe))
	}
	for path, want := range map[string]int{"/readyz/healthy": 200, "/readyz/broken": 503} {
		if got := c.code(path); got != want {
			t.Errorf("%s = %d, want %d", path, got, want)
		}
	}
	d := c.operatorDoc()
	if d.Ready || !d.Process.Ready || !slices.Equal(d.NotReady, []string{"broken"}) || !slices.Equal(d.ReadyResources, []string{"healthy"}) {
		t.Errorf("/status: ready %t, process ready %t, readyResources %q, notReady %q; want false, true, [healthy], [broken]",
			d.Ready, d.Process.Ready, d.ReadyResources, d.NotReady)
	}
	if _, reason := condition(st, "Ready"); reason == "" || reason == "Bridging" {
		t.Errorf("broken's Ready condition gives no reason:\n%s", c.StatusJSON())
	}

	// The healthy endpoint bridges meanwhile.
	sub := collectWeida(t, healthyEP, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/ok/probe", "probe-"+u) })
	pub.publish(t, 1, u+"/ok/x", "bridged")
	Eventually(t, 10*time.Second, "the healthy endpoint to bridge", func() bool { return sub.Has(u+".ok.x", "bridged") })
	if c.code(probe) != http.StatusOK {
		t.Errorf("the shipped readiness probe %s answers %d after bridging", probe, c.code(probe))
	}
}

// TestReloadVisible: a refused reload shows in /status (lastReload), in
// /metrics and as a banner on the status page (in a browser, without a
// page reload); a good reload clears all three.
func TestReloadVisible(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	br := newBrowser(t)
	u := unique()
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/rl", freePort(t, "udp"))
	res := mqttResource{Name: "reloaded", Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		Routes: []mqttRoute{{"a", u + "/a/#"}}}
	dir := t.TempDir()
	file := writeFile(t, dir, "rl.yaml", res.YAML(t))
	c := StartConnector(t, nil, "-f", file)
	c.WaitReady(30 * time.Second)
	if d := c.operatorDoc(); d.LastReload != nil {
		t.Errorf("lastReload before any reload: %+v", d.LastReload)
	}
	for metric, want := range map[string]float64{
		`weida_connector_reloads_total{result="refused"}`: 0,
		`weida_connector_reloads_total{result="success"}`: 0,
		`weida_connector_last_reload_successful`:          1,
	} {
		if got := c.Metric(metric); got != want {
			t.Errorf("at start %s = %v, want %v", metric, got, want)
		}
	}
	if c.Metric("weida_connector_last_reload_success_timestamp_seconds") <= 0 {
		t.Error("weida_connector_last_reload_success_timestamp_seconds is not set at start")
	}

	br.do("load the page", chromedp.Navigate("http://"+c.Admin+"/"), chromedp.WaitVisible(chromedp.CSS("section.res")))
	banner := func() bool { return eval[bool](br, `!document.getElementById("reload-banner").hidden`) }
	if banner() {
		t.Error("the reload banner shows before any reload")
	}
	eval[bool](br, `window.__sameDocument = true`)

	// A route whose filter has no exact weida form: the file is refused.
	bad := res
	bad.Routes = []mqttRoute{{"a", u + "/a/#"}, {"c", u + "/c.d/+"}}
	writeFile(t, dir, "rl.yaml", bad.YAML(t))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "lastReload refused in /status", func() bool {
		d := c.operatorDoc()
		return d.LastReload != nil && d.LastReload.Result == "refused"
	})
	d := c.operatorDoc()
	if d.LastReload.Trigger != "signal" || !strings.Contains(strings.Join(d.LastReload.Errors, "\n"), "mqtt-dotted-level") {
		t.Errorf("lastReload = %+v; want trigger signal and the error naming mqtt-dotted-level", *d.LastReload)
	}
	for metric, want := range map[string]float64{
		`weida_connector_reloads_total{result="refused"}`: 1,
		`weida_connector_last_reload_successful`:          0,
	} {
		if got := c.Metric(metric); got != want {
			t.Errorf("after the refused reload %s = %v, want %v", metric, got, want)
		}
	}
	Eventually(t, 10*time.Second, "the reload banner on the page", banner)
	if text := br.text(`document.getElementById("reload-banner").innerText`); !strings.Contains(text, "refused") || !strings.Contains(text, "mqtt-dotted-level") {
		t.Errorf("the banner reads %q; want it to say the reload was refused and why", text)
	}
	br.screenshot(screenshotDir(t), "statuspage-reload-refused.png")
	if st, ok := c.Status("reloaded"); !ok || !st.ready() {
		t.Errorf("the running resource is not Ready after a refused reload:\n%s", c.StatusJSON())
	}

	// A good file clears it.
	res.Routes = []mqttRoute{{"a", u + "/a/#"}, {"b", u + "/b/+"}}
	writeFile(t, dir, "rl.yaml", res.YAML(t))
	c.Signal(syscall.SIGHUP)
	Eventually(t, 20*time.Second, "lastReload success in /status", func() bool {
		d := c.operatorDoc()
		return d.LastReload != nil && d.LastReload.Result == "success"
	})
	for metric, want := range map[string]float64{
		`weida_connector_reloads_total{result="refused"}`: 1,
		`weida_connector_reloads_total{result="success"}`: 1,
		`weida_connector_last_reload_successful`:          1,
	} {
		if got := c.Metric(metric); got != want {
			t.Errorf("after the good reload %s = %v, want %v", metric, got, want)
		}
	}
	Eventually(t, 10*time.Second, "the reload banner to go", func() bool { return !banner() })
	if !eval[bool](br, `window.__sameDocument === true`) {
		t.Error("the page reloaded instead of updating in place")
	}
	br.screenshot(screenshotDir(t), "statuspage-reloaded.png")
	if dialogs, errs := br.problems(); len(dialogs)+len(errs) > 0 {
		t.Errorf("dialogs %q, page errors %q", dialogs, errs)
	}
}

// TestStatusPageWeidaDialFailing: an outbound resource whose weida
// endpoint does not answer (its port is closed) shows a Failing box on the
// page, in a browser, naming the weida side's reason: the bridge retries
// the dial inside its attempt, so there is no supervisor failure to show.
func TestStatusPageWeidaDialFailing(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	br := newBrowser(t)
	u := unique()
	_, url := weidaPublisher(t, "/gone")
	// The same pinned fingerprint, at a port where nothing listens.
	url = regexp.MustCompile(`:\d+/`).ReplaceAllString(url, fmt.Sprintf(":%d/", freePort(t, "udp")))
	res := mqttResource{Name: "dial-fails", Direction: policy.Outbound, QoS: 1, Endpoint: url,
		Routes: []mqttRoute{{"all", u + "/#"}}}
	c := StartConnector(t, nil, fastRetry("-f", writeFile(t, t.TempDir(), "out.yaml", res.YAML(t)))...)
	var reason string
	Eventually(t, 60*time.Second, "the weida side of dial-fails to report False", func() bool {
		st, ok := c.Status("dial-fails")
		var status string
		status, reason = condition(st, "WeidaReady")
		return ok && status == "False" && reason != "Starting"
	})
	br.do("load the page", chromedp.Navigate("http://"+c.Admin+"/"), chromedp.WaitVisible(chromedp.CSS("section.res")))
	Eventually(t, 10*time.Second, "the Failing box on the page", func() bool {
		return eval[bool](br, `!document.querySelector('[data-f="failure"]').hidden`)
	})
	if got := br.text(`document.querySelector('[data-f="failure"]').innerText`); !strings.Contains(got, "Failing") || !strings.Contains(got, reason) {
		t.Errorf("the Failing box reads %q; want it to name %s", got, reason)
	}
	if dialogs, errs := br.problems(); len(dialogs)+len(errs) > 0 {
		t.Errorf("dialogs %q, page errors %q", dialogs, errs)
	}
}
