package nats

import (
	"testing"
	"time"
)

// TestMessageTTL reads Nats-TTL values as nats-server does.
func TestMessageTTL(t *testing.T) {
	for _, c := range []struct {
		in   string
		want time.Duration
		ok   bool
	}{
		{"", 0, false},
		{"never", 0, false},
		{"NEVER", 0, false},
		{"1s", time.Second, true},
		{"1m30s", 90 * time.Second, true},
		{"5", 5 * time.Second, true},
		{"0", 0, false},
		{"-3s", 0, false},
		{"soon", 0, false},
		{"99999999999999999999", 0, false},
	} {
		if got, ok := messageTTL(c.in); got != c.want || ok != c.ok {
			t.Errorf("messageTTL(%q) = %v, %v; want %v, %v", c.in, got, ok, c.want, c.ok)
		}
	}
}
