// Package admin serves the operator's view of a bridge runtime over HTTP:
// metrics, liveness, readiness, the /status JSON and the status page. It
// sits above the runtime it reports on and reads it only through [Runtime],
// so the runtime knows nothing of HTTP.
package admin

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"weida.dev/connector/connectors"
)

// Runtime is what the admin listener reads from the bridge runtime;
// [*connectors.Runtime] is the one the service passes.
type Runtime interface {
	// Alive reports whether the runtime answers before ctx ends.
	Alive(ctx context.Context) bool
	// Ready reports whether every resource runs with both sides up.
	Ready() bool
	// Statuses returns every resource's status, sorted by name.
	Statuses() []connectors.Status
}

// Options describe the process around the runtime. The zero value serves
// a runtime with no process details: /readyz then answers ready as soon
// as the handler serves, and /status has no lastReload.
type Options struct {
	// Version is the running build's version and Instance the process's
	// loop marker (`connector run --instance`); both are shown on
	// /status and the page, empty ones as absent.
	Version, Instance string
	// Started is when the process started, for the uptime; zero means
	// when Handler was called.
	Started time.Time
	// Loaded reports whether the process has loaded its resources and
	// handed them to the runtime, and is not stopping; /readyz answers
	// 503 until it does. nil means always.
	Loaded func() bool
	// LastReload reports the last reload, false before the first; nil
	// means none is ever reported.
	LastReload func() (Reload, bool)
	// Now is the clock; nil means time.Now.
	Now func() time.Time
	// TokenRequired tells /status that the listener asks for a token
	// (see [RequireToken]); Handler itself does not check one.
	TokenRequired bool
}

func (o *Options) fill() {
	if o.Now == nil {
		o.Now = time.Now
	}
	if o.Started.IsZero() {
		o.Started = o.Now()
	}
}

// Reload results, as /status and the weida_connector_reloads_total
// series name them.
const (
	ReloadSuccess = "success" // the files were valid and the new set was applied
	ReloadRefused = "refused" // a file was invalid; the running set stayed as it was
)

// Reload is what /status says of the last reload.
type Reload struct {
	// Time is when the reload was asked for.
	Time time.Time `json:"time"`
	// Result is [ReloadSuccess] or [ReloadRefused].
	Result string `json:"result"`
	// Trigger is what asked for it: "signal" (SIGHUP) or "watch" (the
	// files changed under --watch).
	Trigger string `json:"trigger,omitempty"`
	// Errors are why it was refused, one diagnostic a line as `connector
	// check` prints them; after a success, the resources of the new set
	// that could not start (they are retried).
	Errors []string `json:"errors,omitempty"`
	// LastSuccessTime is when the running set was last loaded: the last
	// successful reload, or the start.
	LastSuccessTime time.Time `json:"lastSuccessTime"`
}

// Refused reports whether the reload was refused.
func (r Reload) Refused() bool { return r.Result == ReloadRefused }

// Handler serves the operator's view of a runtime:
//
//	/metrics           Prometheus exposition of g
//	/healthz           200 while the runtime answers within 2 s (see [connectors.Runtime.Alive]);
//	                   never fails because a broker is down
//	/readyz            200 once the process has loaded its resources and runs them
//	                   ([Options.Loaded]); never fails because one resource is down
//	/readyz/{resource} 200 only when that resource's broker and weida sides are up;
//	                   503 too for a name the process does not run (now)
//	/status            JSON: the process, the last reload, the names of the ready and
//	                   not ready resources, and every resource with its readiness,
//	                   conditions, counters and rates
func Handler(rt Runtime, g prometheus.Gatherer, o Options) http.Handler {
	o.fill()
	rates := newRateTracker()
	mux := http.NewServeMux()
	mux.Handle("GET /metrics", promhttp.HandlerFor(g, promhttp.HandlerOpts{}))
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		ctx, cancel := context.WithTimeout(req.Context(), 2*time.Second)
		defer cancel()
		if !rt.Alive(ctx) {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("the runtime does not answer\n"))
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		if o.Loaded != nil && !o.Loaded() {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready: the resources are not loaded yet, or the process is stopping\n"))
			return
		}
		// The resources that are down are named, for `connector health`
		// and `docker inspect`, but they do not make the process unready:
		// one broken broker must not take the healthy endpoints out of a
		// Service. /readyz/{resource} is the probe of one resource.
		_, notReady := readiness(rt.Statuses())
		if len(notReady) > 0 {
			_, _ = w.Write([]byte("ready; resources not ready: " + strings.Join(notReady, " ") + "\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /readyz/{resource}", func(w http.ResponseWriter, req *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		name := req.PathValue("resource")
		for _, s := range rt.Statuses() {
			if s.Name != name {
				continue
			}
			if !s.Ready() {
				w.WriteHeader(http.StatusServiceUnavailable)
				_, _ = w.Write([]byte("not ready: " + readyReason(s) + "\n"))
				return
			}
			_, _ = w.Write([]byte("ready\n"))
			return
		}
		// Not 404: a reload that restarts the resource removes it for a
		// moment, and a probe must read that as not ready, not as an
		// error in the probe.
		w.WriteHeader(http.StatusServiceUnavailable)
		_, _ = w.Write([]byte("not ready: no resource of that name runs here (check the name in /status)\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(statusDoc(rt, o, rates))
	})
	mux.Handle("GET /", newStatusPage(rt, o, rates)) // the status page at / and its files under /ui/; see statuspage.go
	return mux
}

// readyReason is the reason and message of s's Ready condition.
func readyReason(s connectors.Status) string {
	for _, c := range s.Conditions {
		if c.Type == connectors.CondReady {
			if c.Message != "" {
				return c.Reason + ": " + c.Message
			}
			return c.Reason
		}
	}
	return "no Ready condition"
}

// readiness splits the names of st into the ready and the not ready; both
// are non-nil, so that /status shows empty lists as [].
func readiness(st []connectors.Status) (ready, notReady []string) {
	ready, notReady = []string{}, []string{}
	for _, s := range st {
		if s.Ready() {
			ready = append(ready, s.Name)
		} else {
			notReady = append(notReady, s.Name)
		}
	}
	return ready, notReady
}

// Process is what /status says of the process.
type Process struct {
	// Ready is what /readyz answers: the resources are loaded and run.
	Ready         bool      `json:"ready"`
	Version       string    `json:"version,omitempty"`
	Instance      string    `json:"instance,omitempty"`
	StartTime     time.Time `json:"startTime"`
	UptimeSeconds float64   `json:"uptimeSeconds"`
	// AdminTokenRequired is whether the admin listener asks for its
	// token on every path but the probes ([Options.TokenRequired]).
	AdminTokenRequired bool `json:"adminTokenRequired"`
}

// resourceDoc is one resource in /status: its Status, whether it is ready
// (what /readyz/{resource} answers), and its message rates.
type resourceDoc struct {
	connectors.Status
	Ready bool   `json:"ready"`
	Rates *Rates `json:"rates,omitempty"`
}

// document is the JSON of /status.
type document struct {
	// Ready is true when every resource is Ready (and there is one); it
	// is not what /readyz answers, which is Process.Ready.
	Ready bool `json:"ready"`
	// ReadyResources and NotReady name the resources by readiness.
	ReadyResources []string      `json:"readyResources"`
	NotReady       []string      `json:"notReady"`
	Process        Process       `json:"process"`
	LastReload     *Reload       `json:"lastReload,omitempty"`
	Resources      []resourceDoc `json:"resources"`
}

func statusDoc(rt Runtime, o Options, rates *rateTracker) document {
	st := rt.Statuses()
	now := o.Now()
	d := document{
		Process: Process{
			Ready:         o.Loaded == nil || o.Loaded(),
			Version:       o.Version,
			Instance:      o.Instance,
			StartTime:     o.Started.UTC(),
			UptimeSeconds: now.Sub(o.Started).Seconds(),

			AdminTokenRequired: o.TokenRequired,
		},
		Resources: make([]resourceDoc, len(st)),
	}
	d.ReadyResources, d.NotReady = readiness(st)
	d.Ready = len(st) > 0 && len(d.NotReady) == 0
	if o.LastReload != nil {
		if r, ok := o.LastReload(); ok {
			d.LastReload = &r
		}
	}
	rs := rates.observe(now, st)
	for i, s := range st {
		d.Resources[i] = resourceDoc{Status: s, Ready: s.Ready(), Rates: rs[s.Name]}
	}
	return d
}
