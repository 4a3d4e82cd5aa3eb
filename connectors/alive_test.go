package connectors

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestAlive: the runtime is alive whatever its resources' state, and not
// once it is wedged (here: its lock held by someone who does not let go).
// /healthz serves this; service/admin's TestHealthz shows the HTTP side.
func TestAlive(t *testing.T) {
	rt := NewRuntime(Deps{Metrics: NewMetrics(prometheus.NewRegistry())})
	alive := func() bool {
		ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
		defer cancel()
		return rt.Alive(ctx)
	}
	if !alive() {
		t.Fatal("an idle runtime is not alive")
	}
	rt.mu.Lock()
	wedged := alive()
	rt.mu.Unlock()
	if wedged {
		t.Error("a wedged runtime is alive")
	}
	if !alive() {
		t.Error("not alive after the lock is released")
	}
}
