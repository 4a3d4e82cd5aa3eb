// Package drivers holds the one list of broker protocols the connector
// speaks. Both commands (connector and connector-demo) take it from here, so
// that a protocol is added in exactly one place (docs/DRIVERS.md) and no
// command package imports a protocol package itself. It is not under
// cmd/internal so that the tests of the packages it wires (resources,
// service, deploy, e2e) take the same list instead of keeping copies; only
// tests import it from below, which internal/archtest allows.
package drivers

import (
	"weida.dev/connector/connectors/amqp"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/connectors/nats"
	"weida.dev/connector/service"
)

// All returns the drivers of every protocol the connector speaks, in the
// order its messages and help name them. Each call returns a new slice, so
// the caller may keep or modify it.
func All() []service.Driver {
	return []service.Driver{mqtt.Driver, nats.Driver, amqp.Driver}
}
