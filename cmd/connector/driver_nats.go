package main

import (
	"errors"

	"weida.dev/connector/connectors"
	"weida.dev/connector/resources"
)

// natsDriver is not built yet; its issue replaces this file.
var natsDriver = driver{
	source: func(*resources.Connector, resources.ResolvedCredentials, unitEnv) connectors.SourceFactory {
		return failingSource(errors.New("the NATS driver is not built yet"))
	},
	sink: func(*resources.Connector, resources.ResolvedCredentials, unitEnv) connectors.SinkFactory {
		return failingSink(errors.New("the NATS driver is not built yet"))
	},
}
