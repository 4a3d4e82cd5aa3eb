package service

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/service/admin"
)

// TestReloads: the start counts as a good load; a refused reload sets the
// gauge to 0 and keeps the last success time; a good one restores both.
func TestReloads(t *testing.T) {
	reg := prometheus.NewRegistry()
	start := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	r := newReloads(reg, start, time.Now)
	if _, ok := r.Last(); ok {
		t.Error("a last reload before any")
	}
	check := func(when string, refused, success, ok float64, at time.Time) {
		t.Helper()
		if got := testutil.ToFloat64(r.total.WithLabelValues(admin.ReloadRefused)); got != refused {
			t.Errorf("%s: refused = %v, want %v", when, got, refused)
		}
		if got := testutil.ToFloat64(r.total.WithLabelValues(admin.ReloadSuccess)); got != success {
			t.Errorf("%s: success = %v, want %v", when, got, success)
		}
		if got := testutil.ToFloat64(r.successful); got != ok {
			t.Errorf("%s: last_reload_successful = %v, want %v", when, got, ok)
		}
		if got := testutil.ToFloat64(r.successTime); got != float64(at.Unix()) {
			t.Errorf("%s: last success timestamp = %v, want %v", when, got, at.Unix())
		}
	}
	check("at start", 0, 0, 1, start)

	bad := start.Add(time.Minute)
	r.record(bad, "signal", "a.yaml:3: bad\na.yaml:9: worse\n", "")
	check("after a refusal", 1, 0, 0, start)
	last, ok := r.Last()
	if !ok || !last.Refused() || len(last.Errors) != 2 || !last.LastSuccessTime.Equal(start) || last.Trigger != "signal" {
		t.Errorf("after a refusal: %+v", last)
	}

	good := start.Add(2 * time.Minute)
	r.record(good, "watch", "", "")
	check("after a good reload", 1, 1, 1, good)
	if last, _ := r.Last(); last.Refused() || len(last.Errors) != 0 || !last.LastSuccessTime.Equal(good) {
		t.Errorf("after a good reload: %+v", last)
	}
}
