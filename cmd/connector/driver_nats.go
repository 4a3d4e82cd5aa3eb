package main

import (
	"net"
	"strconv"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/nats"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

var natsDriver = driver{
	source: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SourceFactory {
		cfg, err := natsConfig(c, creds, env)
		if err != nil {
			return failingSource(err)
		}
		return func(report connectors.StateFunc) (connectors.Source, error) { return nats.NewSource(cfg, report) }
	},
	sink: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SinkFactory {
		cfg, err := natsConfig(c, creds, env)
		if err != nil {
			return failingSink(err)
		}
		return func(report connectors.StateFunc) (connectors.Sink, error) { return nats.NewSink(cfg, report) }
	},
}

func natsConfig(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) (nats.Config, error) {
	tlsCfg, err := brokerTLS(c.Broker)
	if err != nil {
		return nats.Config{}, err
	}
	scheme := "nats"
	if c.Broker.TLS.Enabled {
		scheme = "tls"
	}
	log := env.log.With("resource", c.Name, "broker", c.Broker.URL)
	cfg := nats.Config{
		URL:        scheme + "://" + net.JoinHostPort(c.Broker.Host, strconv.Itoa(c.Broker.Port)),
		Name:       c.Broker.ClientID,
		User:       creds.Username,
		Password:   creds.Password.Reveal(),
		Token:      creds.Token.Reveal(),
		NKeySeed:   creds.NKeySeed.Reveal(),
		TLS:        tlsCfg,
		LoopMarker: env.marker,
		Logger:     log,
	}
	if !creds.Creds.IsZero() {
		cfg.Creds = []byte(creds.Creds.Reveal())
	}
	if o := c.Broker.NATS; o != nil {
		cfg.QueueGroup = o.QueueGroup
		if js := o.JetStream; js != nil {
			cfg.JetStream = &nats.JetStream{Stream: js.Stream, Durable: js.Durable}
		}
	}
	if c.Direction == policy.Inbound && c.Limits.InFlight > 0 {
		// A new durable consumer delivers no more than the runtime may
		// hold unsettled.
		cfg.MaxAckPending = c.Limits.InFlight
	}
	// Slow-consumer drops are counted and logged by the Source until the
	// runtime offers a hook to count them per resource (see Config.OnDrop).
	return cfg, nil
}
