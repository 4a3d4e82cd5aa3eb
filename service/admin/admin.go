// Package admin serves the operator's view of a bridge runtime over HTTP:
// metrics, liveness, readiness, the /status JSON and the status page. It
// sits above the runtime it reports on and reads it only through [Runtime],
// so the runtime knows nothing of HTTP.
package admin

import (
	"context"
	"encoding/json"
	"net/http"
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

// Handler serves the operator's view of a runtime:
//
//	/metrics  Prometheus exposition of g
//	/healthz  200 while the runtime answers within 2 s (see [connectors.Runtime.Alive]);
//	          never fails because a broker is down
//	/readyz   200 only when every resource's broker and weida sides are up
//	/status   JSON: every resource with its conditions and counters
func Handler(rt Runtime, g prometheus.Gatherer) http.Handler {
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
		var notReady []string
		st := rt.Statuses()
		for _, s := range st {
			if !s.Ready() {
				notReady = append(notReady, s.Name)
			}
		}
		if len(st) == 0 || len(notReady) > 0 {
			w.WriteHeader(http.StatusServiceUnavailable)
			_, _ = w.Write([]byte("not ready:"))
			for _, n := range notReady {
				_, _ = w.Write([]byte(" " + n))
			}
			if len(st) == 0 {
				_, _ = w.Write([]byte(" no resources"))
			}
			_, _ = w.Write([]byte("\n"))
			return
		}
		_, _ = w.Write([]byte("ready\n"))
	})
	mux.HandleFunc("GET /status", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		enc := json.NewEncoder(w)
		enc.SetIndent("", "  ")
		_ = enc.Encode(struct {
			Ready     bool                `json:"ready"`
			Resources []connectors.Status `json:"resources"`
		}{rt.Ready(), rt.Statuses()})
	})
	mux.Handle("GET /", newStatusPage(rt)) // the status page at / and its files under /ui/; see statuspage.go
	return mux
}
