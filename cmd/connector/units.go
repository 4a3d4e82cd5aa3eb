package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/weida"
)

// unitEnv is what building a runnable unit needs besides the resource.
type unitEnv struct {
	resolver resources.Resolver
	marker   string // loop marker value (--instance)
	log      *slog.Logger
	// insecureWeidaForTesting skips weida certificate checks when dialling;
	// only the demo sets it, for endpoints it generated itself.
	insecureWeidaForTesting bool
}

// drivers builds the broker side of a resource. Each protocol's file
// (driver_mqtt.go, driver_nats.go, driver_amqp.go) provides one; they are
// wired here explicitly, with no registration side effects.
type driver struct {
	source func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SourceFactory
	sink   func(c *resources.Connector, creds resources.ResolvedCredentials, env unitEnv) connectors.SinkFactory
}

func driverFor(p policy.Protocol) (driver, bool) {
	switch p {
	case policy.MQTT:
		return mqttDriver, true
	case policy.NATS:
		return natsDriver, true
	case policy.AMQP:
		return amqpDriver, true
	}
	return driver{}, false
}

// buildUnits turns loaded resources into runnable units, resolving every
// secret. It fails as a whole: nothing runs unless everything resolves.
func buildUnits(cs []*resources.Connector, env unitEnv) ([]connectors.Unit, error) {
	var units []connectors.Unit
	var errs []error
	for _, c := range cs {
		u, err := buildUnit(c, env)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: resource %q: %w", c.Source, c.Name, err))
			continue
		}
		units = append(units, u)
	}
	if len(errs) > 0 {
		return nil, joinLines(errs)
	}
	return units, nil
}

func buildUnit(c *resources.Connector, env unitEnv) (connectors.Unit, error) {
	d, ok := driverFor(c.Protocol)
	if !ok {
		return connectors.Unit{}, fmt.Errorf("no driver for protocol %q", c.Protocol)
	}
	creds, err := env.resolver.Credentials(c.Broker.Credentials)
	if err != nil {
		return connectors.Unit{}, err
	}
	// The drivers read the broker identity from the resource; give them
	// a copy with its ${NAME} references expanded.
	id, err := env.resolver.ClientID(c.Broker.ClientID)
	if err != nil {
		return connectors.Unit{}, err
	}
	if id != c.Broker.ClientID {
		expanded := *c
		expanded.Broker.ClientID = id
		c = &expanded
	}
	routes := make([]connectors.Route, len(c.Routes))
	for i, r := range c.Routes {
		routes[i] = connectors.Route{Name: r.Name, Foreign: r.Foreign, Weida: r.Weida}
	}
	var losses []string
	for _, l := range c.Losses {
		losses = append(losses, string(l))
	}
	spec := connectors.Spec{
		Name:            c.Name,
		Protocol:        c.Protocol,
		Direction:       c.Direction,
		Policy:          c.Policy,
		Routes:          routes,
		Endpoint:        c.Weida.Endpoint.String(),
		Broker:          c.Broker.URL,
		Losses:          losses,
		MaxMessageBytes: int(c.Limits.MaxMessageBytes),
		InFlight:        c.Limits.InFlight,
	}
	u := connectors.Unit{Spec: spec, Resource: c}
	log := env.log.With("resource", c.Name)
	if c.Direction == policy.Outbound {
		url := c.Weida.Endpoint.String()
		cfg := weida.DialConfig{
			CAFile:                       c.Weida.CAFile,
			CertFile:                     c.Weida.CertFile,
			KeyFile:                      c.Weida.KeyFile,
			InsecureSkipVerifyForTesting: env.insecureWeidaForTesting,
			Logger:                       log,
		}
		u.Dial = func(ctx context.Context) (*weida.Subscriber, error) { return weida.Dial(ctx, url, cfg) }
		u.NewSink = d.sink(c, creds, env)
		return u, nil
	}
	u.Listen = c.Weida.Endpoint.HostPort()
	u.Path = c.Weida.Endpoint.Path
	u.ListenConfig = weida.ListenConfig{
		CertFile:           c.Weida.CertFile,
		KeyFile:            c.Weida.KeyFile,
		ClientFingerprints: c.Weida.AllowedClients,
		Limits:             weida.Limits{SubscriberBufferBytes: c.Limits.BufferBytes},
	}
	u.NewSource = d.source(c, creds, env)
	return u, nil
}

// brokerTLS builds the TLS configuration of a broker connection, or nil
// when the resource's URL is not a TLS one.
func brokerTLS(b resources.Broker) (*tls.Config, error) {
	t := b.TLS
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if cfg.ServerName == "" {
		cfg.ServerName = b.Host
	}
	if t.CAFile != "" {
		pem, err := os.ReadFile(t.CAFile)
		if err != nil {
			return nil, fmt.Errorf("broker TLS CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("broker TLS CA %s: no PEM certificate in it", t.CAFile)
		}
		cfg.RootCAs = pool
	}
	if t.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}

// failingSource and failingSink report a construction error through the
// runtime, which keeps the resource visible with its reason.
func failingSource(err error) connectors.SourceFactory {
	return func(connectors.StateFunc) (connectors.Source, error) { return nil, err }
}

func failingSink(err error) connectors.SinkFactory {
	return func(connectors.StateFunc) (connectors.Sink, error) { return nil, err }
}

// joinLines joins errors one per line.
func joinLines(errs []error) error {
	msg := ""
	for i, e := range errs {
		if i > 0 {
			msg += "\n"
		}
		msg += e.Error()
	}
	return fmt.Errorf("%s", msg)
}
