package connectors

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"
)

// Reasons the runtime gives a failed attempt of a unit, in /status (the
// failure and the Ready condition) and in the reason label of
// weida_connector_attempts_failed_total. Drivers may return their own
// CamelCase reasons in a [*Failure].
const (
	FailListen              = "ListenFailed"        // the weida listener could not bind (address in use, bad certificate)
	FailWeidaDial           = "WeidaDialFailed"     // dialling the outbound weida endpoint failed
	FailFingerprintMismatch = "FingerprintMismatch" // the weida endpoint's certificate is not the pinned one
	FailSourceInvalid       = "SourceInvalid"       // the Source factory refused the resource
	FailSinkInvalid         = "SinkInvalid"         // the Sink factory refused the resource
	FailStart               = "StartFailed"         // Start returned an error no driver classified
	FailConnectionLost      = "ConnectionLost"      // a started Source or Sink ended the attempt
	FailDNS                 = "DNSFailure"          // the broker's host name did not resolve
	FailBrokerUnreachable   = "BrokerUnreachable"   // connection refused, no route, or a timeout
	FailTLS                 = "TLSFailure"          // the TLS handshake with the broker failed
)

// Failure says why a unit is down and whether another attempt can help.
//
// A driver ends an attempt by returning a *Failure (wrapped or not) from
// Start, Read, Write, or through WriteAsync's done. The runtime then closes
// the Source or Sink, waits a jittered backoff and builds a fresh one from
// its factory, unless Permanent is set.
type Failure struct {
	Reason    string // CamelCase reason for /status and metrics
	Err       error
	Permanent bool // only a configuration problem no retry can fix
}

// Error returns Err's text.
func (f *Failure) Error() string {
	if f.Err == nil {
		return f.Reason
	}
	return f.Err.Error()
}

// Unwrap returns Err.
func (f *Failure) Unwrap() error { return f.Err }

// Retryable returns a [*Failure] that another attempt may cure.
func Retryable(reason string, err error) error { return &Failure{Reason: reason, Err: err} }

// Permanent returns a [*Failure] that stops the unit's retries: a
// configuration problem only a changed resource (and a reload) can fix.
func Permanent(reason string, err error) error {
	return &Failure{Reason: reason, Err: err, Permanent: true}
}

// Classify returns the reason and permanence of err. A [*Failure] in err's
// chain decides. Otherwise the error is classified generically, always as
// retryable: a [*net.DNSError] is [FailDNS]; a refused connection, an
// unreachable host or network and a timeout are [FailBrokerUnreachable];
// TLS and certificate errors are [FailTLS]; anything else is fallback.
func Classify(err error, fallback string) (reason string, permanent bool) {
	var f *Failure
	if errors.As(err, &f) {
		if f.Reason == "" {
			return fallback, f.Permanent
		}
		return f.Reason, f.Permanent
	}
	var (
		dns     *net.DNSError
		netErr  net.Error
		rec     tls.RecordHeaderError
		alert   tls.AlertError
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
	)
	switch {
	case errors.As(err, &dns):
		return FailDNS, false
	case errors.As(err, &rec), errors.As(err, &alert), errors.As(err, &verify),
		errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return FailTLS, false
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.As(err, &netErr) && netErr.Timeout():
		return FailBrokerUnreachable, false
	}
	return fallback, false
}
