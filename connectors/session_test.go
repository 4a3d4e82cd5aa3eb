package connectors

import (
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"weida.dev/connector/policy"
)

// TestSessionLost: an Up report whose session the broker did not resume
// is a loss only when an earlier connection was on the same session; it
// is then counted from a series present at 0 from the start, and named in
// the BrokerConnected condition. The first connection, one with another
// key (a reload changed the client ID) and a driver keeping no session
// are not losses; the count goes on across a reload.
func TestSessionLost(t *testing.T) {
	m := NewMetrics(prometheus.NewRegistry())
	spec := Spec{Name: "s", Protocol: policy.MQTT, Direction: policy.Inbound, Policy: policy.MQTTLevelsV1(),
		Routes: []Route{{Name: "r", Foreign: "a/#", Weida: "a/**"}}}
	b := newBridge(spec, Deps{Metrics: m})
	series := m.SessionsLost.WithLabelValues("s")
	if got := testutil.ToFloat64(series); got != 0 {
		t.Fatalf("sessions_lost_total = %v before any connection", got)
	}
	up := func(b *Bridge, s Session) Condition {
		b.reportBroker(ConnState{Up: true, Reason: "Connected", Detail: "1 subscriptions", Session: s})
		return b.conds.get(condBroker)
	}
	steps := []struct {
		what   string
		s      Session
		lost   float64
		reason string
		b      *Bridge
	}{
		{"first connection, no session yet", Session{Key: "k1"}, 0, "Connected", b},
		{"resumed", Session{Key: "k1", Resumed: true}, 0, "Connected", b},
		{"not resumed", Session{Key: "k1", Lost: "the held messages"}, 1, ReasonSessionLost, b},
		{"a driver keeping no session", Session{}, 1, "Connected", b},
		{"another key: a first connection", Session{Key: "k2"}, 1, "Connected", b},
		{"not resumed again", Session{Key: "k2"}, 2, ReasonSessionLost, b},
	}
	for _, st := range steps {
		c := up(st.b, st.s)
		if got := testutil.ToFloat64(series); got != st.lost {
			t.Errorf("%s: sessions_lost_total = %v, want %v", st.what, got, st.lost)
		}
		if c.Status != "True" || c.Reason != st.reason {
			t.Errorf("%s: BrokerConnected %s/%s, want True/%s (%s)", st.what, c.Status, c.Reason, st.reason, c.Message)
		}
	}
	if c := b.conds.get(condBroker); c.Message == "" {
		t.Error("the lost session's condition has no message")
	}
	if got := b.Status().Counters.SessionsLost; got != 2 {
		t.Errorf("status counts %d lost sessions, want 2", got)
	}

	// A reload carries the accounting on: the same key not resumed is
	// still a loss.
	next := newBridge(spec, Deps{Metrics: m})
	next.carryOn(b.core)
	if c := up(next, Session{Key: "k2"}); c.Reason != ReasonSessionLost || testutil.ToFloat64(series) != 3 {
		t.Errorf("after a reload: %s, sessions_lost_total %v; want SessionLost, 3", c.Reason, testutil.ToFloat64(series))
	}
}
