package service

import (
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/service/admin"
)

// reloads records the outcome of every reload, for /status, the page and
// the weida_connector_reload* series. Safe for concurrent use.
type reloads struct {
	total       *prometheus.CounterVec
	successful  prometheus.Gauge
	successTime prometheus.Gauge
	now         func() time.Time

	mu          sync.Mutex
	last        admin.Reload
	any         bool
	lastSuccess time.Time
}

// newReloads registers the reload series on reg, as of a start that
// loaded its files at started: the running set is then as good as after a
// successful reload, so the gauge starts at 1 and the timestamp at the
// start, and both result series exist at 0 for the alert that watches
// them.
func newReloads(reg prometheus.Registerer, started time.Time, now func() time.Time) *reloads {
	const ns = "weida_connector"
	r := &reloads{
		total: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reloads_total",
			Help: "Reloads of the resource files (SIGHUP, or a change under --watch), by result: success (applied) or refused (a file was invalid; the running set is unchanged)."}, []string{"result"}),
		successful: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "last_reload_successful",
			Help: "1 when the last reload was applied (or none was asked for since the start), 0 when it was refused."}),
		successTime: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Name: "last_reload_success_timestamp_seconds",
			Help: "Unix time at which the running set of resources was loaded: the last successful reload, or the start."}),
		now:         now,
		lastSuccess: started,
	}
	r.total.WithLabelValues(admin.ReloadSuccess)
	r.total.WithLabelValues(admin.ReloadRefused)
	r.successful.Set(1)
	r.successTime.Set(float64(started.UnixNano()) / 1e9)
	reg.MustRegister(r.total, r.successful, r.successTime)
	return r
}

// record counts a reload asked for at t by trigger: refused when refusal
// is non-empty (its diagnostics), applied otherwise, with startErrs the
// text of the resources of the new set that could not start.
func (r *reloads) record(t time.Time, trigger, refusal, startErrs string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rl := admin.Reload{Time: t.UTC(), Trigger: trigger, Result: admin.ReloadSuccess}
	if refusal != "" {
		rl.Result, rl.Errors = admin.ReloadRefused, lines(refusal)
		r.successful.Set(0)
	} else {
		rl.Errors = lines(startErrs)
		r.lastSuccess = t
		r.successful.Set(1)
		r.successTime.Set(float64(t.UnixNano()) / 1e9)
	}
	rl.LastSuccessTime = r.lastSuccess.UTC()
	r.total.WithLabelValues(rl.Result).Inc()
	r.last, r.any = rl, true
}

// Last is [admin.Options.LastReload].
func (r *reloads) Last() (admin.Reload, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rl := r.last
	rl.Errors = append([]string(nil), r.last.Errors...)
	return rl, r.any
}

// lines splits text into its non-empty lines; nil for none.
func lines(text string) []string {
	var out []string
	for l := range strings.SplitSeq(text, "\n") {
		if strings.TrimSpace(l) != "" {
			out = append(out, l)
		}
	}
	return out
}
