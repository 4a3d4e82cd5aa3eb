package demo

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

// TestDemo runs the embedded demo end to end: it must succeed with no
// broker running and show the conversions, the drop and the refusal.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	if err := Run(context.Background(), Options{Out: &out}); err != nil {
		t.Fatalf("demo: %v\noutput:\n%s", err, out.String())
	}
	for _, want := range []string{
		"REFUSED  demo-nats-all-orders",
		"[nats-one-or-more]",
		"-> weida sensors.kitchen.temperature",
		"-> weida sensors.attic.temperature    {\"c\":30.1}  (retained before the subscriber came: replayed)",
		"last value: retained messages are kept and replayed to new weida subscribers",
		"last values kept 1, replayed 1",
		"-> weida sensors..temperature",
		"-> weida factory ",
		`mount "orders." (broker) <-> "shop.orders." (weida)`,
		"orders.eu.>              -> weida shop.orders.eu.*.#",
		"-> weida shop.orders.us.created",
		"-> weida shop.orders.eu.fr.shipped",
		"mqtt-dotted-level",
		"-> MQTT  alerts/fire/hall-2",
		"Everything behaved as the resources state.",
	} {
		if !strings.Contains(out.String(), want) {
			t.Errorf("demo output lacks %q:\n%s", want, out.String())
		}
	}
}
