package admin

import (
	"bytes"
	"embed"
	"encoding/json"
	"html/template"
	"io/fs"
	"net/http"
	"path"
	"strconv"
	"time"

	"weida.dev/connector/connectors"
)

// The page's files are embedded so the admin listener depends on nothing
// outside the binary: operators often reach it through a port-forward with
// no Internet behind it, and a page that pulls scripts from elsewhere would
// be a way into the bridge.
//
//go:embed statuspage
var statusPageFiles embed.FS

// statusPageCSP allows only the page's own script, style and icon, and
// /status for polling. No inline script or style runs, so a resource name or
// error text that slipped past escaping still could not execute.
const statusPageCSP = "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
	"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

// statusPageAsset returns the content type of a file served under /ui/, or
// false when it is not one. The types are fixed here rather than guessed
// from the host's MIME tables, which differ between machines.
func statusPageAsset(name string) (string, bool) {
	switch name {
	case "page.css":
		return "text/css; charset=utf-8", true
	case "page.js":
		return "text/javascript; charset=utf-8", true
	case "favicon.svg":
		return "image/svg+xml", true
	}
	return "", false
}

// statusPage serves the human view of a runtime: GET / renders every
// resource's Status as HTML, and /ui/ serves the page's script, style sheet
// and icon. Safe for concurrent use.
type statusPage struct {
	rt    Runtime
	o     Options
	rates *rateTracker
	tmpl  *template.Template
}

// newStatusPage returns the handler of the status page for rt. Its patterns
// are / (exactly) and /ui/; everything else under / is not found.
func newStatusPage(rt Runtime, o Options, rates *rateTracker) http.Handler {
	o.fill()
	p := &statusPage{
		rt:    rt,
		o:     o,
		rates: rates,
		tmpl:  mustStatusTemplate(),
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /{$}", p.serveIndex)
	mux.HandleFunc("GET /ui/{file}", p.serveAsset)
	return mux
}

// mustStatusTemplate parses the embedded page. It panics only if the
// embedded file is broken, which the package's tests catch.
func mustStatusTemplate() *template.Template {
	return template.Must(template.New("page.html").Funcs(statusPageFuncs()).ParseFS(statusPageFiles, "statuspage/page.html"))
}

// pageData is what the template renders.
type pageData struct {
	Ready      bool
	NotReady   []string
	Process    Process
	LastReload *Reload
	Resources  []pageResource
	Generated  time.Time
}

// pageResource is one Status as the page sees it: decoded from the same
// JSON /status sends, so the two never differ, plus the fields the page
// shows when a newer runtime reports them and ignores while it does not.
type pageResource struct {
	connectors.Status
	// Failure is the supervisor's account of why a resource is down.
	Failure *pageFailure `json:"failure,omitempty"`
	// Rates are the server's message rates (see [Rates]).
	Rates *Rates `json:"rates,omitempty"`
}

// Failing is what the page's "Failing" box shows: the supervisor's
// failure while there is one, else the first side whose condition is False
// (an outbound resource retrying its weida dial inside one attempt, a
// broker connection lost and being re-established), else nothing.
type Failing struct {
	Reason, Message string
	// Side is the condition type that says so; empty for a failure.
	Side    string
	Failure *pageFailure
}

// Failing returns the resource's failing box, or nil.
func (r pageResource) Failing() *Failing {
	if r.Failure != nil {
		return &Failing{Reason: r.Failure.Reason, Message: r.Failure.Message, Failure: r.Failure}
	}
	for _, t := range []string{connectors.CondWeidaReady, connectors.CondBrokerConnected} {
		if c, ok := r.Condition(t); ok && c.Status == "False" {
			return &Failing{Reason: c.Reason, Message: c.Message, Side: t}
		}
	}
	return nil
}

// pageFailure is the optional "failure" object of a resource's status.
type pageFailure struct {
	Reason        string    `json:"reason"`
	Message       string    `json:"message"`
	Attempts      int       `json:"attempts"`
	LastErrorTime time.Time `json:"lastErrorTime"`
	NextRetryTime time.Time `json:"nextRetryTime"`
}

// Condition returns the condition of type t, or false.
func (r pageResource) Condition(t string) (connectors.Condition, bool) {
	for _, c := range r.Conditions {
		if c.Type == t {
			return c, true
		}
	}
	return connectors.Condition{}, false
}

// DroppedTotal is the sum of the resource's drops over every reason.
func (r pageResource) DroppedTotal() uint64 {
	var n uint64
	for _, v := range r.Counters.Dropped {
		n += v
	}
	return n
}

func (p *statusPage) data() (pageData, error) {
	doc := statusDoc(p.rt, p.o, p.rates)
	d := pageData{
		Ready: doc.Ready, NotReady: doc.NotReady, Process: doc.Process,
		LastReload: doc.LastReload, Generated: p.o.Now(),
	}
	// The JSON round trip is deliberate: the page renders exactly what
	// /status encodes, including fields this file does not know yet.
	raw, err := json.Marshal(doc.Resources)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(raw, &d.Resources); err != nil {
		return d, err
	}
	return d, nil
}

func (p *statusPage) serveIndex(w http.ResponseWriter, _ *http.Request) {
	d, err := p.data()
	if err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	// Render to a buffer so a template fault becomes a 500, not half a page.
	var buf bytes.Buffer
	if err := p.tmpl.Execute(&buf, d); err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	setPageHeaders(h)
	h.Set("Content-Type", "text/html; charset=utf-8")
	h.Set("Cache-Control", "no-store")
	h.Set("Content-Length", strconv.Itoa(buf.Len()))
	_, _ = w.Write(buf.Bytes())
}

func (p *statusPage) serveAsset(w http.ResponseWriter, r *http.Request) {
	name := r.PathValue("file")
	ctype, ok := statusPageAsset(name)
	if !ok {
		http.NotFound(w, r)
		return
	}
	b, err := fs.ReadFile(statusPageFiles, path.Join("statuspage", name))
	if err != nil {
		http.Error(w, "status page: "+err.Error(), http.StatusInternalServerError)
		return
	}
	h := w.Header()
	setPageHeaders(h)
	h.Set("Content-Type", ctype)
	h.Set("Cache-Control", "no-cache")
	h.Set("Content-Length", strconv.Itoa(len(b)))
	_, _ = w.Write(b)
}

func setPageHeaders(h http.Header) {
	h.Set("Content-Security-Policy", statusPageCSP)
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("Referrer-Policy", "no-referrer")
	h.Set("X-Frame-Options", "DENY")
}

// statusPageFuncs returns the template's helpers. They return plain
// strings; html/template escapes them where they land.
func statusPageFuncs() template.FuncMap {
	return template.FuncMap{
		"rfc3339": func(t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return t.UTC().Format(time.RFC3339)
		},
		"clock": func(t time.Time) string {
			if t.IsZero() {
				return "—"
			}
			return t.UTC().Format("2006-01-02 15:04:05 UTC")
		},
		"since": func(now, t time.Time) string {
			if t.IsZero() {
				return ""
			}
			return humanDuration(now.Sub(t))
		},
		"seconds": func(s float64) string { return humanDuration(time.Duration(s * float64(time.Second))) },
		"rate": func(r *Rates, kind string) string {
			if r == nil {
				return "—"
			}
			v := map[string]float64{"received": r.Received, "bridged": r.Bridged, "dropped": r.Dropped}[kind]
			switch {
			case v == 0:
				return "0"
			case v < 10:
				return strconv.FormatFloat(v, 'f', 1, 64)
			}
			return strconv.FormatFloat(v, 'f', 0, 64)
		},
		"condClass": func(status string) string {
			switch status {
			case "True":
				return "ok"
			case "False":
				return "bad"
			}
			return "unknown"
		},
	}
}

// humanDuration renders d coarsely, the way an operator reads an age.
func humanDuration(d time.Duration) string {
	if d < 0 {
		d = 0
	}
	switch {
	case d < time.Minute:
		return strconv.Itoa(int(d/time.Second)) + "s"
	case d < time.Hour:
		return strconv.Itoa(int(d/time.Minute)) + "m"
	case d < 48*time.Hour:
		return strconv.Itoa(int(d/time.Hour)) + "h" + strconv.Itoa(int(d%time.Hour/time.Minute)) + "m"
	}
	return strconv.Itoa(int(d/(24*time.Hour))) + "d"
}
