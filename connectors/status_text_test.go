package connectors

import (
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
)

const (
	hostileName    = `<script>alert("name")</script>`
	hostileForeign = `sensors/<script>/x`
	hostileWeida   = `sensors.<script>.x`
	hostileError   = `dial: <img src=x onerror=alert(1)> & "quoted"`
	hostileReason  = `<b onmouseover=alert(2)>`
)

// hostileRuntime returns a runtime holding one resource whose name, route,
// drop reason and error text are all markup, with known counters.
func hostileRuntime(t *testing.T) *Runtime {
	t.Helper()
	deps := Deps{Metrics: NewMetrics(prometheus.NewRegistry())}
	rt := NewRuntime(deps)
	spec := Spec{
		Name:      hostileName,
		Protocol:  policy.MQTT,
		Direction: policy.Inbound,
		Broker:    "mqtt://127.0.0.1:1883",
		Endpoint:  "weida://127.0.0.1:7000/x",
		Routes:    []Route{{Name: hostileForeign, Foreign: hostileForeign, Weida: hostileWeida}},
		Losses:    []string{"dotted-levels", "ordering"},
	}
	b := NewInbound(spec, nil, nil, rt.deps)
	b.stats.count.received.Add(7)
	b.stats.count.bridged.Add(5)
	b.stats.count.drop("mqtt-dotted-level", 1)
	b.stats.count.drop(hostileReason, 1)
	b.failed(FailureStatus{Reason: FailListen, Message: hostileError, Attempts: 1, LastErrorTime: time.Now()}, condWeida)
	done := make(chan struct{})
	close(done)
	rt.mu.Lock()
	rt.running[spec.Name] = &runningUnit{unit: Unit{Spec: spec}, bridge: b, cancel: func() {}, done: done}
	rt.mu.Unlock()
	return rt
}

// The status page (service/admin) escapes what the runtime reports; this
// is the other half: the runtime reports a resource's text verbatim,
// markup and all, and the counters as counted. The page's own test
// renders the status this one shows.
func TestStatusesKeepHostileText(t *testing.T) {
	st := hostileRuntime(t).Statuses()
	if len(st) != 1 {
		t.Fatalf("%d statuses, want 1", len(st))
	}
	s := st[0]
	if s.Name != hostileName || len(s.Routes) != 1 || s.Routes[0] != (RouteStatus{Name: hostileForeign, Foreign: hostileForeign, Weida: hostileWeida}) {
		t.Errorf("name or routes changed: %q %+v", s.Name, s.Routes)
	}
	if s.Broker != "mqtt://127.0.0.1:1883" || s.Endpoint != "weida://127.0.0.1:7000/x" || strings.Join(s.Losses, ",") != "dotted-levels,ordering" {
		t.Errorf("broker, endpoint or losses changed: %q %q %v", s.Broker, s.Endpoint, s.Losses)
	}
	if s.Counters.Received != 7 || s.Counters.Bridged != 5 || s.Counters.Dropped["mqtt-dotted-level"] != 1 || s.Counters.Dropped[hostileReason] != 1 {
		t.Errorf("counters = %+v", s.Counters)
	}
	if s.Failure == nil || s.Failure.Reason != FailListen || s.Failure.Message != hostileError {
		t.Errorf("failure = %+v", s.Failure)
	}
	var weidaCond Condition
	for _, c := range s.Conditions {
		if c.Type == CondWeidaReady {
			weidaCond = c
		}
	}
	if weidaCond.Status != "False" || weidaCond.Reason != FailListen || weidaCond.Message != hostileError {
		t.Errorf("%s = %+v", CondWeidaReady, weidaCond)
	}
}
