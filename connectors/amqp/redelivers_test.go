package amqp

import (
	"testing"

	"weida.dev/connector/connectors"
)

// TestRedelivers: a named queue requeues what a fenced bridge leaves
// unsettled, for the next consumer; an exclusive one goes with the
// connection.
func TestRedelivers(t *testing.T) {
	var _ connectors.Redelivering = (*Source)(nil)
	if (&Source{cfg: Config{Queue: Queue{Exclusive: true}}}).Redelivers() {
		t.Error("a Source on an exclusive queue says it redelivers")
	}
	if !(&Source{cfg: Config{Queue: Queue{Name: "q", Durable: true}}}).Redelivers() {
		t.Error("a Source on a named queue says it does not redeliver")
	}
}
