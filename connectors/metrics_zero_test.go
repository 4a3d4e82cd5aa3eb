package connectors

import (
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// TestDashboardSeriesStartAtZero: the series a dashboard graphs per
// resource exist, at 0, as soon as the resource does, not from their first
// event (a Grafana panel over an absent series shows "No data").
func TestDashboardSeriesStartAtZero(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg)
	newStats(m, "fresh", []Route{{Name: "r", Foreign: "a/#", Weida: "a.#"}}, NewRateLogger(slog.New(slog.DiscardHandler), time.Second, time.Now))
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]int{
		"weida_connector_reconnects_total":        2, // broker and weida
		"weida_connector_up":                      2,
		"weida_connector_weida_subscribers":       1,
		"weida_connector_messages_bridged_total":  1, // the route
		"weida_connector_messages_received_total": 1,
	}
	for _, mf := range mfs {
		n, ok := want[mf.GetName()]
		if !ok {
			continue
		}
		delete(want, mf.GetName())
		if len(mf.GetMetric()) != n {
			t.Errorf("%s has %d series, want %d", mf.GetName(), len(mf.GetMetric()), n)
		}
		for _, s := range mf.GetMetric() {
			v := s.GetCounter().GetValue() + s.GetGauge().GetValue()
			if v != 0 {
				t.Errorf("%s %v = %v, want 0", mf.GetName(), s.GetLabel(), v)
			}
		}
	}
	for name := range want {
		t.Errorf("%s is absent before any event", name)
	}
}
