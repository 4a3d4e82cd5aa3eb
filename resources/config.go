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
	// Credentials are Resource.Broker.Credentials with the secrets read.
	Credentials ResolvedCredentials
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
