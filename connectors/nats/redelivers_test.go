package nats

import (
	"testing"

	"weida.dev/connector/connectors"
)

// TestRedelivers: a JetStream durable consumer delivers again what a
// fenced bridge leaves unsettled; core NATS does not.
func TestRedelivers(t *testing.T) {
	var _ connectors.Redelivering = (*Source)(nil)
	if (&Source{}).Redelivers() {
		t.Error("a core NATS Source says it redelivers")
	}
	if !(&Source{cfg: Config{JetStream: &JetStream{Stream: "s", Durable: "d"}}}).Redelivers() {
		t.Error("a JetStream Source says it does not redeliver")
	}
}
