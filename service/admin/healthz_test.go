package admin

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
)

// TestHealthz: /healthz answers 200 while the runtime answers, whatever
// its resources' state, and 503 once the runtime is wedged. connectors'
// TestAlive shows that a real runtime whose lock is held is not alive.
func TestHealthz(t *testing.T) {
	reg := prometheus.NewRegistry()
	get := func(h http.Handler) int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code
	}
	rt := connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(reg)})
	if code := get(Handler(rt, reg, Options{})); code != http.StatusOK {
		t.Fatalf("healthz of an idle runtime = %d, want 200", code)
	}
	wedged := fixedRuntime{alive: func(ctx context.Context) bool { <-ctx.Done(); return false }}
	if code := get(Handler(wedged, reg, Options{})); code != http.StatusServiceUnavailable {
		t.Errorf("healthz of a wedged runtime = %d, want 503", code)
	}
	if code := get(Handler(hostileRuntime(t), reg, Options{})); code != http.StatusOK {
		t.Errorf("healthz of a runtime whose resource is down = %d, want 200", code)
	}
}
