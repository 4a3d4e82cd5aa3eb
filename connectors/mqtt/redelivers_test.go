package mqtt

import (
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestRedelivers: a Source says its broker delivers again what it leaves
// unsettled exactly when the resource could hold (QoS 1 in a session that
// outlives the connection), so that a fenced bridge counts as lost only
// what is.
func TestRedelivers(t *testing.T) {
	var _ connectors.Redelivering = (*Source)(nil)
	cases := []struct {
		cfg  Config
		want bool
	}{
		{Config{QoS: 1, SessionExpiry: time.Hour}, true},
		{Config{QoS: 0, SessionExpiry: time.Hour}, false},
		{Config{QoS: 1, SessionExpiry: time.Hour, CleanStart: true}, false},
		{Config{QoS: 1}, false},
	}
	for _, tc := range cases {
		if got := (&Source{cfg: tc.cfg}).Redelivers(); got != tc.want {
			t.Errorf("Redelivers() with %+v = %v; want %v", tc.cfg, got, tc.want)
		}
	}
}
