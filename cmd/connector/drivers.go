package main

import (
	"weida.dev/connector/connectors/amqp"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/connectors/nats"
	"weida.dev/connector/service"
)

// drivers lists the broker protocols the connector speaks, in the order
// its messages and help name them. It is the one place that names them:
// adding a protocol is adding its driver here (docs/DRIVERS.md).
func drivers() []service.Driver {
	return []service.Driver{mqtt.Driver, nats.Driver, amqp.Driver}
}
