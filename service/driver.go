// Package service turns loaded resources into runnable units and runs
// them: the part of `connector run` that is neither flag parsing nor
// signal handling. The broker protocols come from the [Driver] list the
// program passes; nothing here names a protocol.
package service

import (
	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

// Driver is one broker protocol, everything about it in one value: how
// resources write it ([resources.Protocol]), how `connector explain` and
// `check` describe it, and how the connector builds its broker side.
// Packages connectors/mqtt, /nats and /amqp each export one (mqtt.Driver,
// ...), implementing this interface without importing this package.
//
// A Driver is stateless and safe for concurrent use.
type Driver interface {
	resources.Protocol

	// Settings are the broker settings that change the protocol's losses,
	// as `connector explain` offers them as flags; nil when none.
	Settings() []policy.Setting
	// Summary describes, in one line for `connector check`, how a valid
	// resource of the protocol reads or writes the broker ("qos 1, session
	// kept 1h0m0s"). It names no secret.
	Summary(c *resources.Connector) string
	// Source returns the factory of an inbound resource's broker side.
	// It does no I/O: connecting is the Source's Start.
	Source(cfg resources.BrokerConfig) connectors.SourceFactory
	// Sink returns the factory of an outbound resource's broker side.
	Sink(cfg resources.BrokerConfig) connectors.SinkFactory
}

// Protocols returns the resources side of ds, in the same order, for
// [resources.Loader].
func Protocols(ds []Driver) []resources.Protocol {
	out := make([]resources.Protocol, len(ds))
	for i, d := range ds {
		out[i] = d
	}
	return out
}

// Lookup returns the driver of ds named name, or nil.
func Lookup(ds []Driver, name string) Driver {
	for _, d := range ds {
		if string(d.Name()) == name {
			return d
		}
	}
	return nil
}

// Policies returns every conversion policy of ds, each driver's default
// first, in the order of ds.
func Policies(ds []Driver) []policy.Policy {
	var out []policy.Policy
	for _, d := range ds {
		out = append(out, d.Policies()...)
	}
	return out
}
