package connectors

import (
	"context"
	"encoding/json"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// AdminHandler serves the operator's view of a runtime:
//
//	/metrics  Prometheus exposition of g
//	/healthz  200 while the runtime answers within 2 s (see [Runtime.Alive]);
//	          never fails because a broker is down
//	/readyz   200 only when every resource's broker and weida sides are up
//	/status   JSON: every resource with its conditions and counters
func AdminHandler(rt *Runtime, g prometheus.Gatherer) http.Handler {
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
			Ready     bool     `json:"ready"`
			Resources []Status `json:"resources"`
		}{rt.Ready(), rt.Statuses()})
	})
	mux.Handle("GET /", newStatusPage(rt)) // the status page at / and its files under /ui/; see statuspage.go
	return mux
}
