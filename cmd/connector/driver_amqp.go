package main

import (
	"net/url"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/amqp"
	"weida.dev/connector/resources"
)

var amqpDriver = driver{
	source: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SourceFactory {
		cfg, err := amqpConfig(c, creds, env)
		if err != nil {
			return failingSource(err)
		}
		return func(report connectors.StateFunc) (connectors.Source, error) { return amqp.NewSource(cfg, report) }
	},
	sink: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SinkFactory {
		cfg, err := amqpConfig(c, creds, env)
		if err != nil {
			return failingSink(err)
		}
		return func(report connectors.StateFunc) (connectors.Sink, error) { return amqp.NewSink(cfg, report) }
	},
}

// amqpConfig maps an AMQP resource onto the driver's Config. The URL is
// rebuilt from the parsed broker address so that the virtual host is
// percent-encoded the way amqp091-go reads it.
func amqpConfig(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) (amqp.Config, error) {
	tlsCfg, err := brokerTLS(c.Broker)
	if err != nil {
		return amqp.Config{}, err
	}
	scheme := "amqp"
	if c.Broker.TLS.Enabled {
		scheme = "amqps"
	}
	path := "/"
	if c.Broker.VHost != "" && c.Broker.VHost != "/" {
		path += url.PathEscape(c.Broker.VHost)
	}
	o := c.Broker.AMQP
	cfg := amqp.Config{
		URL:            scheme + "://" + c.Broker.Addr() + path,
		Username:       creds.Username,
		Password:       creds.Password.Reveal(),
		TLS:            tlsCfg,
		Exchange:       o.Exchange,
		Queue:          amqp.Queue{Name: o.Queue.Name, Quorum: o.Queue.Quorum, Passive: o.Queue.Passive, Durable: o.Queue.Durable, Exclusive: o.Queue.Exclusive},
		Prefetch:       o.Prefetch,
		ConnectionName: c.Broker.ClientID,
		LoopMarker:     env.marker,
		Logger:         env.log.With("resource", c.Name, "broker", c.Broker.URL),
	}
	return cfg, nil
}
