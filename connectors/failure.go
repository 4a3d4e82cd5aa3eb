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
	FailPathNotServed       = "PathNotServed"       // the weida addresses answered, and one or more publishes nothing at the path
	FailSourceInvalid       = "SourceInvalid"       // the Source factory refused the resource
	FailSinkInvalid         = "SinkInvalid"         // the Sink factory refused the resource
	FailStart               = "StartFailed"         // Start returned an error no driver classified
	FailConnectionLost      = "ConnectionLost"      // a started Source or Sink ended the attempt
	FailDNS                 = "DNSFailure"          // the broker's host name did not resolve
	FailBrokerUnreachable   = "BrokerUnreachable"   // connection refused, no route, or a timeout
	FailTLS                 = "TLSFailure"          // the TLS handshake with the broker failed
	FailSecretUnavailable   = "SecretUnavailable"   // a secret file or variable could not be read at an attempt; retried
	FailFenced              = "Fenced"              // the unit's fence said it may no longer act (its lease is gone): not retried, it waits to be stopped
)

// ErrFenced is the error of an attempt that ended because its unit's
// fence ([Unit].Fence) said it may no longer act, and the error an
// inbound bridge settles a message with when it leaves it with the broker
// for that reason (an AckFunc never acknowledges it).
var ErrFenced = errors.New("connectors: fenced: this replica no longer holds the resource's lease")

// errFenced ends a fenced attempt.
var errFenced = &Failure{Reason: FailFenced, Err: ErrFenced}

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
// chain decides. Otherwise the error is classified by [NetworkReason],
// always as retryable, and anything it does not know is fallback.
func Classify(err error, fallback string) (reason string, permanent bool) {
	var f *Failure
	if errors.As(err, &f) {
		if f.Reason == "" {
			return fallback, f.Permanent
		}
		return f.Reason, f.Permanent
	}
	if r := NetworkReason(err); r != "" {
		return r, false
	}
	return fallback, false
}

// NetworkReason names why a connection could not be made, for the failures
// every driver meets the same way: [FailDNS] for a name that does not
// resolve, [FailTLS] for a failed handshake or an untrusted certificate,
// [FailBrokerUnreachable] for a refused or unroutable dial and for a
// timeout. It returns "" for anything else; what a broker refuses in its
// own protocol (credentials, declarations) each driver names itself.
func NetworkReason(err error) string {
	if err == nil {
		return ""
	}
	var (
		dnsErr   *net.DNSError
		recErr   tls.RecordHeaderError
		verErr   *tls.CertificateVerificationError
		alert    tls.AlertError
		unknown  x509.UnknownAuthorityError
		hostErr  x509.HostnameError
		invalid  x509.CertificateInvalidError
		echErr   *tls.ECHRejectionError
		opErr    *net.OpError
		netError net.Error
	)
	switch {
	case errors.As(err, &dnsErr):
		return FailDNS
	case errors.As(err, &recErr), errors.As(err, &verErr), errors.As(err, &alert),
		errors.As(err, &unknown), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &echErr):
		return FailTLS
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH), errors.Is(err, syscall.ENETUNREACH):
		return FailBrokerUnreachable
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return FailBrokerUnreachable
	case errors.As(err, &netError) && netError.Timeout():
		return FailBrokerUnreachable
	}
	return ""
}

// ClassifyNetwork returns err as a retryable [*Failure] when
// [NetworkReason] knows it, and err unchanged otherwise (the runtime
// classifies it then, with its own fallback). An error that already holds
// a Failure is returned unchanged.
func ClassifyNetwork(err error) error {
	var f *Failure
	if err == nil || errors.As(err, &f) {
		return err
	}
	if r := NetworkReason(err); r != "" {
		return Retryable(r, err)
	}
	return err
}
