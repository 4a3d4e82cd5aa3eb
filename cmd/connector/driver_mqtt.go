package main

import (
	"net"
	"strconv"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/resources"
)

var mqttDriver = driver{
	source: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SourceFactory {
		cfg, err := mqttConfig(c, creds, env)
		if err != nil {
			return failingSource(err)
		}
		return func(report connectors.StateFunc) (connectors.Source, error) { return mqtt.NewSource(cfg, report) }
	},
	sink: func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SinkFactory {
		cfg, err := mqttConfig(c, creds, env)
		if err != nil {
			return failingSink(err)
		}
		return func(report connectors.StateFunc) (connectors.Sink, error) { return mqtt.NewSink(cfg, report) }
	},
}

func mqttConfig(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) (mqtt.Config, error) {
	tlsCfg, err := brokerTLS(c.Broker)
	if err != nil {
		return mqtt.Config{}, err
	}
	scheme := "mqtt"
	if c.Broker.TLS.Enabled {
		scheme = "mqtts"
	}
	o := c.Broker.MQTT
	cfg := mqtt.Config{
		URL:           scheme + "://" + net.JoinHostPort(c.Broker.Host, strconv.Itoa(c.Broker.Port)),
		ClientID:      c.Broker.ClientID,
		Username:      creds.Username,
		TLS:           tlsCfg,
		QoS:           o.QoS,
		CleanStart:    o.CleanStart,
		SessionExpiry: o.SessionExpiry,
		SharedGroup:   o.SharedGroup,
		LoopMarker:    env.marker,
		Logger:        env.log.With("resource", c.Name, "broker", c.Broker.URL),
	}
	if !creds.Password.IsZero() {
		cfg.Password = []byte(creds.Password.Reveal())
	}
	return cfg, nil
}
