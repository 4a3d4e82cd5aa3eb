// Package netfail names why a connection to a broker could not be made,
// in the reason vocabulary of [connectors.Failure], for the failures every
// driver meets the same way: name resolution, the TCP connect, and TLS.
// What a broker refuses in its own protocol (credentials, declarations)
// each driver classifies itself.
package netfail

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"net"
	"syscall"

	"weida.dev/connector/connectors"
)

// Reasons this package returns.
const (
	BrokerUnreachable = "BrokerUnreachable"
	DNSFailure        = "DNSFailure"
	TLSFailure        = "TLSFailure"
)

// Reason returns the reason err shows a connection attempt failed for, or
// "" when err is none of the failures this package knows.
func Reason(err error) string {
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
		return DNSFailure
	case errors.As(err, &recErr), errors.As(err, &verErr), errors.As(err, &alert),
		errors.As(err, &unknown), errors.As(err, &hostErr), errors.As(err, &invalid), errors.As(err, &echErr):
		return TLSFailure
	case errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.EHOSTUNREACH),
		errors.Is(err, syscall.ENETUNREACH), errors.Is(err, syscall.ECONNRESET) && errors.As(err, &opErr) && opErr.Op == "dial":
		return BrokerUnreachable
	case errors.As(err, &opErr) && opErr.Op == "dial":
		return BrokerUnreachable
	case errors.As(err, &netError) && netError.Timeout():
		return BrokerUnreachable
	}
	return ""
}

// Classify returns err as a retryable [connectors.Failure] when [Reason]
// knows it, and err unchanged otherwise (the runtime classifies it then).
// An error that already holds a Failure is returned unchanged.
func Classify(err error) error {
	var f *connectors.Failure
	if err == nil || errors.As(err, &f) {
		return err
	}
	if r := Reason(err); r != "" {
		return connectors.Retryable(r, err)
	}
	return err
}
