package deploy

import (
	"net/http"
	"net/http/httptest"
	"reflect"
	"regexp"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"weida.dev/connector/connectors"
	serviceadmin "weida.dev/connector/service/admin"
)

// admin is the connector's admin side as `connector run` assembles it:
// the same collectors on one registry, served by the same handler. Tests
// read the real metric names and paths from it instead of keeping a list
// that could drift from the code.
type admin struct {
	handler http.Handler
	// metrics maps every exported metric name to its type; the Go and
	// process collectors' types are known once gathered, the connector's
	// own from the kind of collector that declares them.
	metrics map[string]metricType
}

type metricType int

const (
	untyped metricType = iota
	histogram
	summary
)

// newAdmin registers what runService registers: the Go and process
// collectors, connectors.NewMetrics and the runtime's listener collector.
func newAdmin(t *testing.T) *admin {
	t.Helper()
	reg := prometheus.NewRegistry()
	goc := collectors.NewGoCollector()
	proc := collectors.NewProcessCollector(collectors.ProcessCollectorOpts{})
	reg.MustRegister(goc, proc)
	m := connectors.NewMetrics(reg)
	rt := connectors.NewRuntime(connectors.Deps{Metrics: m})
	t.Cleanup(rt.Stop)
	lc := rt.Collector()
	reg.MustRegister(lc)

	a := &admin{handler: serviceadmin.Handler(rt, reg, serviceadmin.Options{}), metrics: make(map[string]metricType)}
	describe := func(c prometheus.Collector, typ metricType) {
		ch := make(chan *prometheus.Desc)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			a.metrics[descName(t, d)] = typ
		}
	}
	describe(goc, untyped)
	describe(proc, untyped)
	describe(lc, untyped)
	// Vectors with no children export nothing to Gather, but Describe
	// names them all; their Go type says which are histograms.
	v := reflect.ValueOf(m).Elem()
	for i := range v.NumField() {
		c, ok := v.Field(i).Interface().(prometheus.Collector)
		if !ok {
			continue
		}
		typ := untyped
		switch c.(type) {
		case *prometheus.HistogramVec:
			typ = histogram
		case *prometheus.SummaryVec:
			typ = summary
		}
		describe(c, typ)
	}
	// The Go and process collectors always have samples, so gathering
	// tells their types (go_gc_duration_seconds is a summary).
	fams, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, f := range fams {
		switch f.GetType().String() {
		case "HISTOGRAM", "GAUGE_HISTOGRAM":
			a.metrics[f.GetName()] = histogram
		case "SUMMARY":
			a.metrics[f.GetName()] = summary
		}
	}
	if len(a.metrics) == 0 {
		t.Fatal("no metric described")
	}
	return a
}

var descFQName = regexp.MustCompile(`fqName: "([^"]+)"`)

// descName reads the fully-qualified name from a Desc, which exposes it
// only through String.
func descName(t *testing.T, d *prometheus.Desc) string {
	t.Helper()
	m := descFQName.FindStringSubmatch(d.String())
	if m == nil {
		t.Fatalf("no fqName in %s", d)
	}
	return m[1]
}

// exports reports whether a query may name the series name: an exported
// metric, or a histogram's _bucket, _sum or _count, or a summary's _sum or
// _count.
func (a *admin) exports(name string) bool {
	if _, ok := a.metrics[name]; ok {
		return true
	}
	for suffix, types := range map[string][]metricType{
		"_bucket": {histogram},
		"_sum":    {histogram, summary},
		"_count":  {histogram, summary},
	} {
		base, ok := cutSuffix(name, suffix)
		if !ok {
			continue
		}
		if typ, ok := a.metrics[base]; ok {
			for _, want := range types {
				if typ == want {
					return true
				}
			}
		}
	}
	return false
}

func cutSuffix(s, suffix string) (string, bool) {
	if len(s) > len(suffix) && s[len(s)-len(suffix):] == suffix {
		return s[:len(s)-len(suffix)], true
	}
	return s, false
}

// get answers a GET of path as the admin listener would.
func (a *admin) get(path string) int {
	rec := httptest.NewRecorder()
	a.handler.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
	return rec.Code
}

// TestAdminKnowsItsMetrics keeps the helpers above honest: a name the
// connector exports is found, a made-up one is not, and the suffix rules
// follow the metric's type.
func TestAdminKnowsItsMetrics(t *testing.T) {
	a := newAdmin(t)
	for name, want := range map[string]bool{
		"weida_connector_messages_received_total":        true,
		"weida_connector_weida_listener_events_total":    true,
		"weida_connector_bridge_latency_seconds_bucket":  true,
		"weida_connector_bridge_latency_seconds_count":   true,
		"go_gc_duration_seconds_count":                   true,
		"go_gc_duration_seconds_bucket":                  false, // a summary
		"weida_connector_messages_received_total_bucket": false, // a counter
		"weida_connector_messages_received":              false,
		"process_resident_memory_bytes":                  true,
		"weida_connector_no_such_metric_total":           false,
	} {
		if got := a.exports(name); got != want {
			t.Errorf("exports(%q) = %v, want %v", name, got, want)
		}
	}
	if code := a.get("/no-such-path"); code != http.StatusNotFound {
		t.Errorf("GET /no-such-path: %d, want 404", code)
	}
}
