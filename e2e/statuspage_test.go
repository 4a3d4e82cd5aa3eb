package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/chromedp/cdproto/cdp"
	"github.com/chromedp/cdproto/log"
	"github.com/chromedp/cdproto/page"
	"github.com/chromedp/cdproto/runtime"
	"github.com/chromedp/chromedp"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

const chromiumPath = "/usr/bin/chromium"

// browser is a headless Chromium tab driven over the DevTools protocol,
// with what the page reported on its console and any dialog it opened.
type browser struct {
	t   testing.TB
	ctx context.Context // the tab; its first Run started the browser

	wg      sync.WaitGroup // dialog dismissals under way
	mu      sync.Mutex
	dialogs []string
	errors  []string
}

// newBrowser starts Debian's Chromium headless for one test and stops it
// when the test ends. It skips the test when Chromium is absent and this
// machine cannot install it; where it can (root with apt-get),
// scripts/chromium installs it, and its absence is a failure.
func newBrowser(t *testing.T) *browser {
	t.Helper()
	if _, err := os.Stat(chromiumPath); err != nil {
		_, aptErr := exec.LookPath("apt-get")
		if os.Geteuid() != 0 || aptErr != nil {
			t.Skipf("%s is absent and cannot be installed here (needs root and apt-get): apt-get install chromium to run the browser tests", chromiumPath)
		}
		t.Fatalf("%s is absent: run scripts/chromium (scripts/test does)", chromiumPath)
	}
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(chromiumPath),
		chromedp.Headless,
		chromedp.NoSandbox,
		chromedp.DisableGPU,
		chromedp.NoFirstRun,
		chromedp.NoDefaultBrowserCheck,
		chromedp.Flag("disable-quic", true),
		chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true),
		chromedp.Flag("disable-sync", true),
		chromedp.Flag("disable-dev-shm-usage", true),
		chromedp.UserDataDir(t.TempDir()),
		chromedp.WindowSize(1280, 900),
	}
	b := &browser{t: t}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	tctx, cancelTab := chromedp.NewContext(actx, chromedp.WithListener(b.observe))
	b.ctx = tctx
	// Cleanups run last-in first-out: the tab closes, the dismissals it
	// ends return, then the browser exits, before t.TempDir (its user
	// data directory) is removed.
	t.Cleanup(cancelAlloc)
	t.Cleanup(b.wg.Wait)
	t.Cleanup(cancelTab)
	// The first call starts the browser and lives as long as it: no
	// timeout on it (chromedp's allocator bounds the start itself).
	if _, err := chromedp.Call(tctx, log.Enable, cdp.Empty{}); err != nil {
		t.Fatalf("starting %s: %v", chromiumPath, err)
	}
	return b
}

// observe records dialogs and errors. It runs on the tab's reading
// goroutine, so it must not block or call the browser itself.
func (b *browser) observe(ev any) {
	switch ev := ev.(type) {
	case *page.EventJavascriptDialogOpening:
		b.mu.Lock()
		b.dialogs = append(b.dialogs, string(ev.Type)+": "+ev.Message)
		b.mu.Unlock()
		// Dismiss it, or the page would stall on it.
		b.wg.Go(func() {
			_, _ = chromedp.Call(b.ctx, page.HandleJavaScriptDialog, page.HandleJavaScriptDialogParams{})
		})
	case *runtime.EventExceptionThrown:
		d := ev.ExceptionDetails
		msg := d.Text
		if d.Exception != nil {
			msg += " " + d.Exception.Description
		}
		b.mu.Lock()
		b.errors = append(b.errors, "exception: "+msg)
		b.mu.Unlock()
	case *log.EventEntryAdded:
		// CSP violations and failed loads arrive here.
		if ev.Entry.Level == log.EntryLevelError {
			b.mu.Lock()
			b.errors = append(b.errors, "console: "+ev.Entry.Text+" "+ev.Entry.URL)
			b.mu.Unlock()
		}
	}
}

// do runs actions in the tab, each call bounded by 30 s.
func (b *browser) do(what string, actions ...chromedp.Action[chromedp.Void]) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	if err := chromedp.Do(ctx, actions...); err != nil {
		b.t.Fatalf("browser: %s: %v", what, err)
	}
}

// eval evaluates a JavaScript expression in the page and returns its value.
// DevTools evaluation is not subject to the page's CSP.
func eval[T any](b *browser, expr string) T {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	v, err := chromedp.Run(ctx, chromedp.Evaluate[T](expr))
	if err != nil {
		b.t.Fatalf("browser: evaluate %s: %v", expr, err)
	}
	return v
}

func (b *browser) text(expr string) string {
	b.t.Helper()
	return eval[string](b, expr)
}

// problems returns the dialogs the page opened and the errors it logged.
func (b *browser) problems() (dialogs, errs []string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.dialogs...), append([]string(nil), b.errors...)
}

// screenshot saves a full-page PNG into dir and logs its path.
func (b *browser) screenshot(dir, name string) {
	b.t.Helper()
	ctx, cancel := context.WithTimeout(b.ctx, 30*time.Second)
	defer cancel()
	png, err := chromedp.Run(ctx, chromedp.FullScreenshot(100))
	if err != nil {
		b.t.Fatalf("browser: screenshot: %v", err)
	}
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, png, 0o644); err != nil {
		b.t.Fatal(err)
	}
	b.t.Logf("screenshot: %s", p)
}

// screenshotDir is where screenshots go: t.TempDir(), or
// $E2E_SCREENSHOT_DIR when set, for a person to look at them afterwards.
func screenshotDir(t *testing.T) string {
	if d := os.Getenv("E2E_SCREENSHOT_DIR"); d != "" {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
		return d
	}
	return t.TempDir()
}

// routesOf reads the routes /status reports for a resource.
func routesOf(t *testing.T, c *Connector, name string) []struct{ Name, Foreign, Weida string } {
	t.Helper()
	var all struct {
		Resources []struct {
			Name   string
			Routes []struct{ Name, Foreign, Weida string }
		}
	}
	if err := json.Unmarshal([]byte(c.StatusJSON()), &all); err != nil {
		t.Fatal(err)
	}
	for _, r := range all.Resources {
		if r.Name == name {
			return r.Routes
		}
	}
	t.Fatalf("resource %s is not in /status:\n%s", name, c.StatusJSON())
	return nil
}

// TestStatusPageLive loads the status page of a running inbound MQTT
// resource in headless Chromium: it shows the resource, its route and a
// drop reason, and its counters follow new traffic without a reload.
func TestStatusPageLive(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	br := newBrowser(t)
	u := unique()
	const name = "plant-telemetry"
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/plant", freePort(t, "udp"))
	res := mqttResource{
		Name: name, Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		Routes: []mqttRoute{{"readings", u + "/sensors/#"}, {"alarms", u + "/alarms/+"}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "in.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	sub := collectWeida(t, endpoint, weida.Limits{}, "#")
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	sub.Sync(20*time.Second, "probe-"+u, func() { pub.publish(t, 1, u+"/sensors/probe", "probe-"+u) })

	// A level with a dot has no exact weida form: dropped and counted.
	pub.publish(t, 1, u+"/sensors/line1/v1.2", "dotted")
	Eventually(t, 20*time.Second, "the dotted-level drop in /status", func() bool {
		st, _ := c.Status(name)
		return st.Counters.Dropped["mqtt-dotted-level"] == 1
	})
	routes := routesOf(t, c, name)
	if len(routes) != 2 {
		t.Fatalf("/status routes = %+v", routes)
	}

	base := "http://" + c.Admin
	resp, err := http.Get(base + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/html") {
		t.Fatalf("GET / = %d %s", resp.StatusCode, resp.Header.Get("Content-Type"))
	}

	br.do("load the page", chromedp.Navigate(base+"/"), chromedp.WaitVisible(chromedp.CSS("section.res")))
	if got := br.text(`document.querySelector("section.res .res-name").textContent`); got != name {
		t.Errorf("resource name shown = %q, want %q", got, name)
	}
	shownRoutes := br.text(`[...document.querySelectorAll("section.res .routes li")].map(li => li.innerText.replace(/\s+/g, " ")).join("\n")`)
	for _, r := range routes {
		if want := r.Foreign + " → " + r.Weida; !strings.Contains(shownRoutes, want) {
			t.Errorf("route %q is not shown; the routes read:\n%s", want, shownRoutes)
		}
	}
	if drops := br.text(`document.querySelector('[data-f="drops"]').innerText`); !strings.Contains(drops, "mqtt-dotted-level") {
		t.Errorf("the drop reason is not shown; drops read %q", drops)
	}

	// New traffic shows up in the same document: a marker set on it now
	// survives, so the page did not reload.
	c.Quiesce(name)
	st0, _ := c.Status(name)
	eval[bool](br, `window.__sameDocument = true`)
	Eventually(t, 10*time.Second, "the page to poll /status", func() bool {
		return br.text(`document.getElementById("live").textContent`) == "live"
	})
	const n = 25
	for i := range n {
		pub.publish(t, 1, fmt.Sprintf("%s/sensors/line1/m%d", u, i), "x")
	}
	pub.publish(t, 1, u+"/alarms/a.b", "dotted again")
	wantReceived := fmt.Sprint(st0.Counters.Received + n + 1)
	Eventually(t, 20*time.Second, "the received counter to reach "+wantReceived+" on the page", func() bool {
		return br.text(`document.querySelector('section.res [data-f="received"]').textContent`) == wantReceived
	})
	Eventually(t, 10*time.Second, "the bridged counter and the drop table to update on the page", func() bool {
		bridged := br.text(`document.querySelector('section.res [data-f="bridged"]').textContent`)
		drops := br.text(`document.querySelector('[data-f="drops"]').innerText`)
		return bridged == fmt.Sprint(st0.Counters.Bridged+n) && strings.Contains(drops, "mqtt-dotted-level\t2")
	})
	// The page shows the endpoint's fingerprint and subscriber URL, as
	// /status has them, each with a copy button, and each route's
	// counters follow the route's traffic.
	st1, _ := c.Status(name)
	if st1.Fingerprint == "" || st1.SubscriberURL == "" {
		t.Fatalf("/status has no fingerprint or subscriberURL:\n%s", c.StatusJSON())
	}
	if got := br.text(`document.querySelector('section.res [data-f="fingerprint"]').textContent`); got != st1.Fingerprint {
		t.Errorf("fingerprint shown = %q, want %q", got, st1.Fingerprint)
	}
	if got := br.text(`document.querySelector('section.res [data-f="subscriberURL"]').textContent`); got != st1.SubscriberURL {
		t.Errorf("subscriber URL shown = %q, want %q", got, st1.SubscriberURL)
	}
	if n := eval[int](br, `[...document.querySelectorAll('section.res .copyable')].filter(r => !r.hidden && r.querySelector("button.copy")).length`); n != 2 {
		t.Errorf("%d visible rows with a copy button, want 2 (fingerprint, subscriber URL)", n)
	}
	var routeDoc struct {
		Resources []struct {
			Name   string
			Routes []struct {
				Name             string
				Bridged, Dropped uint64
			}
		}
	}
	if err := json.Unmarshal([]byte(c.StatusJSON()), &routeDoc); err != nil {
		t.Fatal(err)
	}
	want := map[string][2]uint64{}
	for _, r := range routeDoc.Resources {
		for _, rt := range r.Routes {
			want[rt.Name] = [2]uint64{rt.Bridged, rt.Dropped}
		}
	}
	// Readings dropped its dotted topic and, when the probe arrived
	// before the subscription, a no-subscriber copy; alarms its dotted one.
	if w := want["readings"]; w[0] < n+1 || w[1] < 1 || want["alarms"] != [2]uint64{0, 1} {
		t.Errorf("/status route counters = %v; want readings to have bridged at least %d and dropped at least 1, alarms bridged 0 and dropped 1", want, n+1)
	}
	Eventually(t, 10*time.Second, "the per-route counters on the page", func() bool {
		got := br.text(`[...document.querySelectorAll("section.res .routes li[data-route]")].map(li => li.querySelector('[data-f="route.bridged"]').textContent + "/" + li.querySelector('[data-f="route.dropped"]').textContent).join(" ")`)
		return got == fmt.Sprintf("%d/%d %d/%d", want["readings"][0], want["readings"][1], want["alarms"][0], want["alarms"][1])
	})
	for _, id := range []string{"version", "instance", "uptime"} {
		if got := br.text(`document.getElementById("` + id + `").textContent`); got == "" {
			t.Errorf("the page shows no %s", id)
		}
	}
	if !eval[bool](br, `window.__sameDocument === true`) {
		t.Error("the page reloaded instead of updating in place")
	}
	// The rate of the burst stays in the sparkline's minute of history.
	if !eval[bool](br, `document.querySelector('[data-spark="received"]').getAttribute("points").split(" ").some(p => parseFloat(p.split(",")[1]) < 30)`) {
		t.Errorf("the received sparkline shows no burst: %s", br.text(`document.querySelector('[data-spark="received"]').getAttribute("points")`))
	}

	dir := screenshotDir(t)
	br.screenshot(dir, "statuspage.png")
	// A phone-width screen: nothing overflows sideways.
	br.do("narrow viewport", chromedp.EmulateViewport(390, 844, chromedp.EmulateMobile))
	if eval[bool](br, `document.documentElement.scrollWidth > window.innerWidth + 1`) {
		t.Errorf("the page is wider than a 390 px screen: %s px", br.text(`String(document.documentElement.scrollWidth)`))
	}
	br.screenshot(dir, "statuspage-narrow.png")

	if dialogs, errs := br.problems(); len(dialogs)+len(errs) > 0 {
		t.Errorf("dialogs %q, page errors %q", dialogs, errs)
	}
}

// TestStatusPageEscapesInBrowser gives a route a filter made of markup and
// checks, in a real browser, that the page shows it as text: no element is
// injected, no script runs, no dialog opens, also after the page's script
// has redrawn from /status.
func TestStatusPageEscapesInBrowser(t *testing.T) {
	requireTCP(t, "Mosquitto", mosquittoAddr)
	br := newBrowser(t)
	u := unique()
	const name = "hostile-routes"
	hostile := u + "/<script>alert(1)</script>/<img src=x onerror=alert(2)>/#"
	endpoint := fmt.Sprintf("weida://127.0.0.1:%d/h", freePort(t, "udp"))
	res := mqttResource{
		Name: name, Direction: policy.Inbound, QoS: 1, Endpoint: endpoint,
		Routes: []mqttRoute{{"", hostile}},
	}
	c := StartConnector(t, nil, "-f", writeFile(t, t.TempDir(), "in.yaml", res.YAML(t)))
	c.WaitReady(30 * time.Second)
	routes := routesOf(t, c, name)
	if len(routes) != 1 || routes[0].Foreign != hostile {
		t.Fatalf("/status routes = %+v", routes)
	}
	pub := mqttConnect(t, mosquittoAddr, "pub-"+u)
	pub.publish(t, 1, u+"/<script>alert(1)</script>/<img src=x onerror=alert(2)>/a.b", "dotted")

	br.do("load the page", chromedp.Navigate("http://"+c.Admin+"/"), chromedp.WaitVisible(chromedp.CSS("section.res")))
	check := func(when string) {
		t.Helper()
		scripts := eval[int](br, `document.querySelectorAll("script").length`)
		imgs := eval[int](br, `document.querySelectorAll("img").length`)
		injected := eval[int](br, `document.querySelectorAll(".routes script, .routes img, .routes b").length`)
		if scripts != 1 || imgs != 0 || injected != 0 {
			t.Errorf("%s: %d script elements (want the page's own only), %d img, %d elements inside the routes", when, scripts, imgs, injected)
		}
		shown := br.text(`document.querySelector("section.res .routes").innerText`)
		if !strings.Contains(shown, hostile) || !strings.Contains(shown, routes[0].Weida) {
			t.Errorf("%s: the routes read %q, want the literal filters %q and %q", when, shown, hostile, routes[0].Weida)
		}
		if dialogs, _ := br.problems(); len(dialogs) > 0 {
			t.Errorf("%s: the page opened dialogs %q", when, dialogs)
		}
	}
	check("as served")
	// Let the script redraw from /status a few times, then look again.
	Eventually(t, 10*time.Second, "the page to poll /status", func() bool {
		return br.text(`document.getElementById("live").textContent`) == "live" &&
			strings.Contains(br.text(`document.querySelector('[data-f="drops"]').innerText`), "mqtt-dotted-level")
	})
	time.Sleep(1500 * time.Millisecond)
	check("after live updates")
	if _, errs := br.problems(); len(errs) > 0 {
		t.Errorf("page errors: %q", errs)
	}
	br.screenshot(screenshotDir(t), "statuspage-hostile.png")
}
