package connectors

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestHealthz: /healthz answers 200 while the runtime answers, whatever
// its resources' state, and 503 once the runtime is wedged (here: its
// lock held by someone who does not let go).
func TestHealthz(t *testing.T) {
	reg := prometheus.NewRegistry()
	rt := NewRuntime(Deps{Metrics: NewMetrics(reg)})
	h := AdminHandler(rt, reg)
	get := func() int {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", "/healthz", nil))
		return rec.Code
	}
	if code := get(); code != http.StatusOK {
		t.Fatalf("healthz = %d, want 200", code)
	}
	rt.mu.Lock()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	alive := rt.Alive(ctx)
	cancel()
	code := get()
	rt.mu.Unlock()
	if alive || code != http.StatusServiceUnavailable {
		t.Errorf("wedged runtime: Alive = %v, healthz = %d; want false, 503", alive, code)
	}
	if code := get(); code != http.StatusOK {
		t.Errorf("healthz after the lock is released = %d, want 200", code)
	}
}
