package main

import (
	"strings"
	"testing"
)

// TestDemo runs the embedded demo end to end: it must succeed with no
// broker running and show the conversions, the drop and the refusal.
func TestDemo(t *testing.T) {
	code, out, errOut := runCLI(t, "", "demo")
	if code != exitOK {
		t.Fatalf("demo exit %d\nstdout:\n%s\nstderr:\n%s", code, out, errOut)
	}
	for _, want := range []string{
		"REFUSED  demo-nats-all-orders",
		"[nats-one-or-more]",
		"-> weida sensors.kitchen.temperature",
		"-> weida sensors..temperature",
		"-> weida factory ",
		"-> weida orders.eu.created",
		"mqtt-dotted-level",
		"-> MQTT  alerts/fire/hall-2",
		"Everything behaved as the resources state.",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("demo output lacks %q:\n%s", want, out)
		}
	}
}
