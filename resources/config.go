package resources

import (
	"crypto/tls"
	"log/slog"
)

// BrokerConfig is what a driver builds a resource's broker connection
// from, once its secrets are read: the one input of a driver's Source
// and Sink constructors. Package service fills it in when it turns a
// resource into a runnable unit.
type BrokerConfig struct {
	// Resource is the loaded resource, with the ${NAME} references of
	// Broker.ClientID expanded. Read-only.
	Resource *Connector
	// Credentials are Resource.Broker.Credentials with the secrets read
	// for this attempt: package service reads them again before every
	// attempt of the resource, so that a corrected or rotated secret is
	// used at the next connection.
	Credentials ResolvedCredentials
	// ReadCredentials reads the secrets again, as their files and
	// variables hold them now. A driver whose client library reconnects
	// by itself within an attempt calls it before each connection, so
	// that a rotated secret does not wait for the attempt to end; its
	// error wraps [ErrSecret] and names the reference, never a value.
	// nil: Credentials are all there is.
	ReadCredentials func() (ResolvedCredentials, error)
	// TLS is the broker connection's TLS configuration (CA, client
	// certificate, server name already loaded), or nil when the URL is a
	// plaintext one. The driver may keep it but not change it.
	TLS *tls.Config
	// LoopMarker marks what this connector publishes, so that it does not
	// bridge its own messages back.
	LoopMarker string
	// Logger is the resource's logger (it names the resource); never nil.
	Logger *slog.Logger
}

// BrokerTLS returns the TLS configuration of the broker connection: TLS as
// package service built it, or, should a TLS resource come without one,
// the system roots for the configured server name; nil for a plaintext
// broker.
func (bc BrokerConfig) BrokerTLS() *tls.Config {
	if !bc.Resource.Broker.TLS.Enabled {
		return nil
	}
	if bc.TLS != nil {
		return bc.TLS
	}
	return &tls.Config{ServerName: bc.Resource.Broker.TLS.ServerName}
}
