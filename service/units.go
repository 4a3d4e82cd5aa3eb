package service

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"

	"weida.dev/connector/connectors"
	"weida.dev/connector/internal/safefile"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/weida"
)

// Env is what building runnable units needs besides the resources.
type Env struct {
	// Drivers are the program's broker protocols; a resource whose
	// protocol none of them has is an error.
	Drivers []Driver
	// Resolver reads the secrets; its zero value reads the process
	// environment and the operating system's files.
	Resolver resources.Resolver
	// LoopMarker marks what the connector publishes, so that it does not
	// bridge its own messages back (`connector run --instance`).
	LoopMarker string
	// Logger receives the units' logs; nil discards them.
	Logger *slog.Logger
	// StateDir is where every inbound resource's endpoint keeps what must
	// survive a restart (see [weida.ListenConfig].StateDir): the QUIC
	// stateless reset key, so that subscribers of a crashed process learn
	// at once that its connections are gone, and, for resources without
	// certFile and keyFile, the generated identity, whose fingerprint
	// subscribers pin. Empty: the reset key is random for each process and
	// such resources generate a new identity at every start.
	StateDir string
	// ResetKeyFile, when set, holds the QUIC stateless reset key of every
	// inbound resource's endpoint instead of StateDir (see
	// [weida.ListenConfig].ResetKeyFile): replicas sharing the resources
	// through leases read the same file, so that a subscriber whose
	// endpoint moved learns at once that its old connection is gone.
	ResetKeyFile string
	// InsecureWeidaForTesting skips weida certificate checks when
	// dialling. Only for endpoints the caller generated itself (the demo).
	InsecureWeidaForTesting bool
}

func (e Env) logger() *slog.Logger {
	if e.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return e.Logger
}

// ErrNoDriver is wrapped by the error of a resource whose protocol has no
// driver in [Env.Drivers].
var ErrNoDriver = errors.New("service: no driver for the protocol")

// Units turns loaded resources into runnable units, resolving every
// secret. It fails as a whole: nothing should run unless everything
// resolves. Each unit reads its secrets again at every attempt, and lists
// their files in [connectors.Unit].Files; a secret that cannot be read
// then fails the attempt with [connectors.FailSecretUnavailable], which is
// retried. The error lists each resource's problem on its own line,
// naming the resource and where it is written, never a secret's value.
func Units(cs []*resources.Connector, env Env) ([]connectors.Unit, error) {
	var units []connectors.Unit
	var fail UnitsError
	for _, c := range cs {
		u, err := unit(c, env)
		if err != nil {
			err = fmt.Errorf("%s: resource %q: %w", c.Source, c.Name, err)
			fail.Lines = append(fail.Lines, err.Error())
			fail.errs = append(fail.errs, err)
			continue
		}
		units = append(units, u)
	}
	if len(fail.errs) > 0 {
		return nil, &fail
	}
	return units, nil
}

// UnitsError is the error of [Units]: one line per resource that cannot
// be built. Each line's error stays reachable through [errors.Is] and
// [errors.As] (for example [ErrNoDriver]).
type UnitsError struct {
	Lines []string
	errs  []error // one per line, wrapping the resource's own error
}

func (e *UnitsError) Error() string { return strings.Join(e.Lines, "\n") }

// Unwrap returns each resource's error, in the order of Lines.
func (e *UnitsError) Unwrap() []error { return e.errs }

func unit(c *resources.Connector, env Env) (connectors.Unit, error) {
	d := Lookup(env.Drivers, string(c.Protocol))
	if d == nil {
		return connectors.Unit{}, fmt.Errorf("%w %q", ErrNoDriver, c.Protocol)
	}
	creds, err := env.Resolver.Credentials(c.Broker.Credentials)
	if err != nil {
		return connectors.Unit{}, err
	}
	expanded, err := withClientID(c, env.Resolver)
	if err != nil {
		return connectors.Unit{}, err
	}
	u := connectors.Unit{Spec: unitSpec(c, env), Revision: expanded.Revision(), Files: c.Broker.Credentials.Files()}
	log := env.logger().With("resource", c.Name)
	// The secrets were read above, so that a resource whose secret is
	// missing refuses to start as a whole; each attempt reads them again
	// (and so may a driver before each of its connections), so that a
	// corrected or rotated secret is used at the next connection with
	// no reload.
	readCreds := func() (resources.ResolvedCredentials, error) { return env.Resolver.Credentials(c.Broker.Credentials) }
	bc := resources.BrokerConfig{
		Resource:        expanded,
		Credentials:     creds,
		ReadCredentials: readCreds,
		LoopMarker:      env.LoopMarker,
		Logger:          log.With("broker", c.Broker.URL),
	}
	// A TLS configuration that cannot be built is reported through the
	// runtime, which keeps the resource visible with its reason.
	var tlsErr error
	bc.TLS, tlsErr = brokerTLS(c.Broker, env.Resolver)
	// again is bc with the secrets as they are at a later attempt.
	again := func() (resources.BrokerConfig, error) {
		creds, err := readCreds()
		if err != nil {
			return bc, connectors.Retryable(connectors.FailSecretUnavailable, err)
		}
		at := bc
		at.Credentials = creds
		return at, nil
	}
	if c.Direction == policy.Outbound {
		cfg := weida.DialConfig{
			CAFile:                       c.Weida.CAFile,
			CertFile:                     c.Weida.CertFile,
			KeyFile:                      c.Weida.KeyFile,
			InsecureSkipVerifyForTesting: env.InsecureWeidaForTesting,
			Logger:                       log,
		}
		// One Failover per unit, so that its memory of the address that
		// last answered outlives each attempt; with one address it is a
		// plain Dial.
		f, err := weida.NewFailover(c.Weida.DialURLs(), cfg, 0)
		if err != nil {
			return connectors.Unit{}, fmt.Errorf("resource %s: spec.weida: %w", c.Name, err) // the loader refused such addresses already
		}
		u.Dial = f.Dial
		u.NewSink = perAttempt(tlsErr, bc, again, d.Sink)
		return u, nil
	}
	fps, ids := splitClients(c.Weida.AllowedClients)
	u.Listen = c.Weida.Endpoint.HostPort()
	u.Path = c.Weida.Endpoint.Path
	u.ListenConfig = weida.ListenConfig{
		CertFile:           c.Weida.CertFile,
		KeyFile:            c.Weida.KeyFile,
		ClientFingerprints: fps,
		ClientIdentities:   ids,
		ClientCAFile:       c.Weida.ClientCAFile,
		Limits: weida.Limits{
			SubscriberBufferBytes:    c.Limits.BufferBytes,
			MaxConnections:           c.Weida.MaxConnections,
			MaxConnectionsPerAddress: c.Weida.MaxConnectionsPerAddress,
			IdleTimeout:              c.Weida.IdleTimeout,
		},
		// With certFile and keyFile the directory holds only the reset
		// key: the certificate is the operator's to keep. Without it, a
		// restarted process could not reset its predecessor's connections,
		// and their subscribers would wait for their idle timeout.
		StateDir:     env.StateDir,
		ResetKeyFile: env.ResetKeyFile,
		// A resource sharing the address may have started the listener
		// without it; its Publisher's TrackReceipts covers that case.
		TrackReceipts: c.Delivery.AwaitReceipt(),
	}
	u.Scopes = endpointScopes(c.Weida)
	u.NewSource = perAttempt(tlsErr, bc, again, d.Source)
	return u, nil
}

// splitClients takes allowedClients, which lists fingerprints and
// CA-issued identities in one list, apart into the two weida admits
// differently (ListenConfig.ClientFingerprints, ClientIdentities).
func splitClients(names []string) (fps, ids []string) {
	for _, n := range names {
		if strings.HasPrefix(n, "sha256:") {
			fps = append(fps, n)
		} else {
			ids = append(ids, n)
		}
	}
	return fps, ids
}

// endpointScopes turns an endpoint's allowedClients into weida scopes: nil
// when no client has scopes (the allowlist alone decides, as before
// scopes existed); otherwise every allowed client, by fingerprint or
// identity, one without scopes with "#", everything, so that each listed
// client stays admitted to what the resource says (weida gives a client
// known under several names the union of their scopes).
func endpointScopes(w resources.Weida) weida.Scopes {
	if len(w.Scopes) == 0 {
		return nil
	}
	s := make(weida.Scopes, len(w.AllowedClients))
	for _, fp := range w.AllowedClients {
		if fs, ok := w.Scopes[fp]; ok {
			s[fp] = fs
		} else {
			s[fp] = []string{"#"}
		}
	}
	return s
}

// withClientID returns c, or a copy of it with the ${NAME} references of
// its broker client ID expanded: the drivers read the broker identity from
// the resource, while the unit keeps the resource as loaded, for reloads
// to compare.
func withClientID(c *resources.Connector, r resources.Resolver) (*resources.Connector, error) {
	id, err := r.ClientID(c.Broker.ClientID)
	if err != nil || id == c.Broker.ClientID {
		return c, err
	}
	cp := *c
	cp.Broker.ClientID = id
	return &cp, nil
}

// unitSpec is what the runtime needs to know of c.
func unitSpec(c *resources.Connector, env Env) connectors.Spec {
	routes := make([]connectors.Route, len(c.Routes))
	for i, r := range c.Routes {
		routes[i] = connectors.Route{Name: r.Name, Foreign: r.Foreign, Weida: r.Weida}
	}
	var losses []string
	for _, l := range c.Losses {
		losses = append(losses, string(l))
	}
	return connectors.Spec{
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
		Hold:            c.Delivery.Hold(),
		AwaitReceipt:    c.Delivery.AwaitReceipt(),
		LastValue: connectors.LastValue{
			Mode:           connectors.LastValueMode(c.LastValue.Mode),
			MaxTopics:      c.LastValue.MaxTopics,
			MaxBytes:       c.LastValue.MaxBytes,
			MaxAge:         c.LastValue.MaxAge,
			WhenSourceDown: connectors.LastValueWhenDown(c.LastValue.WhenSourceDown),
			OrphanAfter:    c.LastValue.OrphanAfter,
		},
		LastValueDir: lastValueDir(c, env),
	}
}

// perAttempt is the factory of a unit's broker side: the first attempt,
// which Apply starts at once, gets the driver's factory for bc with the
// secrets read at load; every later one reads them again (again) and gets
// a factory for what it read. With tlsErr set every attempt fails with it.
func perAttempt[T any, F ~func(connectors.StateFunc) (T, error)](tlsErr error, bc resources.BrokerConfig,
	again func() (resources.BrokerConfig, error), factory func(resources.BrokerConfig) F) F {
	if tlsErr != nil {
		return func(connectors.StateFunc) (T, error) { var none T; return none, tlsErr }
	}
	first := factory(bc)
	var firstUsed atomic.Bool
	return func(report connectors.StateFunc) (T, error) {
		if !firstUsed.Swap(true) {
			return first(report)
		}
		at, err := again()
		if err != nil {
			var none T
			return none, err
		}
		return factory(at)(report)
	}
}

// maxTLSFileBytes bounds a CA, certificate or key file: a PEM bundle of
// every public CA is about 200 KiB.
const maxTLSFileBytes = 1 << 20

// readTLSFile reads a CA, certificate or key file: only a regular file, at
// most maxTLSFileBytes of it, so that a pipe or a device named by mistake
// fails at once instead of blocking or filling memory. A Resolver's
// ReadFile, when set (tests), reads instead, under the same size cap.
// lastValueDir is where c's last-value cache persists: the state
// directory, when c asks for persistence (lastValue.persist) and there is
// one. Without a state directory the cache is kept in memory only, and
// the unit's log says so.
func lastValueDir(c *resources.Connector, env Env) string {
	if !c.LastValue.Persist {
		return ""
	}
	if env.StateDir == "" {
		env.logger().Warn("spec.lastValue.persist is set, but the connector has no state directory (--state-dir); the last-value cache is kept in memory only",
			"resource", c.Name)
		return ""
	}
	return env.StateDir
}

func readTLSFile(r resources.Resolver, path string) ([]byte, error) {
	if r.ReadFile == nil {
		return safefile.ReadFile(path, maxTLSFileBytes)
	}
	b, err := r.ReadFile(path)
	if err == nil && len(b) > maxTLSFileBytes {
		return nil, &safefile.TooLargeError{Path: path, Limit: maxTLSFileBytes}
	}
	return b, err
}

// brokerTLS builds the TLS configuration of a broker connection, or nil
// when the resource's URL is not a TLS one.
func brokerTLS(b resources.Broker, r resources.Resolver) (*tls.Config, error) {
	t := b.TLS
	if !t.Enabled {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	if cfg.ServerName == "" {
		cfg.ServerName = b.Host
	}
	if t.CAFile != "" {
		pem, err := readTLSFile(r, t.CAFile)
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
		certPEM, err := readTLSFile(r, t.CertFile)
		if err != nil {
			return nil, fmt.Errorf("broker TLS client certificate: %w", err)
		}
		keyPEM, err := readTLSFile(r, t.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("broker TLS client key: %w", err)
		}
		cert, err := tls.X509KeyPair(certPEM, keyPEM)
		if err != nil {
			return nil, fmt.Errorf("broker TLS client certificate %s and key %s: %w", t.CertFile, t.KeyFile, err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
