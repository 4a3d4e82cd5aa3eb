package weida

import (
	"errors"
	"fmt"
	"strconv"
)

// Code is a QUIC application error code of weida (PROTOCOL §7). It is what a
// connection is closed with (CONNECTION_CLOSE) and what a single stream is
// refused or abandoned with (STOP_SENDING, RESET_STREAM). The values are
// those of wire.Code; they are distinct from the codes of an ERROR frame.
type Code uint64

// The application error codes of PROTOCOL §7.
const (
	NoError           Code = 0 // orderly close
	Internal          Code = 1 // local failure the peer cannot act on
	ProtocolViolation Code = 2 // a condition of PROTOCOL §3.2, an illegal filter
	Canceled          Code = 3 // transfer abandoned by either side
	NegotiationFailed Code = 4 // HELLO negotiation failed, or hello_timeout expired
	LimitExceeded     Code = 5 // a local limit was reached (subscriptions, connections)
	Shutdown          Code = 6 // the listener or dialler is shutting down
	Rejected          Code = 7 // the receiver declines the inbound payload
	UnknownEndpoint   Code = 8 // the path is not registered
	Unsupported       Code = 9 // the path does not serve this stream kind
)

var codeNames = [...]string{
	"NO_ERROR", "INTERNAL", "PROTOCOL_VIOLATION", "CANCELED", "NEGOTIATION_FAILED",
	"LIMIT_EXCEEDED", "SHUTDOWN", "REJECTED", "UNKNOWN_ENDPOINT", "UNSUPPORTED",
}

// String returns the PROTOCOL §7 name of c, or "code(N)" for a code weida
// does not define.
func (c Code) String() string {
	if c < Code(len(codeNames)) {
		return codeNames[c]
	}
	return "code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// CloseError says why a weida connection ended. [Subscriber.Receive] and
// [Subscriber.Err] return it once the connection is gone.
//
// When the connection was closed by either side with an application code,
// Code and Reason carry it and Err is nil. When it ended below weida (an idle
// timeout, a failed TLS handshake, a transport error, a stateless reset), Code
// is [Internal], Reason describes it and Err holds quic-go's error, so that
// errors.As reaches *quic.IdleTimeoutError and the like.
type CloseError struct {
	Code   Code
	Reason string
	Remote bool  // the peer closed the connection (true) or this side did (false)
	Err    error // the transport-level cause, nil for an application close
}

func (e *CloseError) Error() string {
	who := "locally"
	if e.Remote {
		who = "by the peer"
	}
	if e.Err != nil {
		return fmt.Sprintf("weida: connection lost: %v", e.Err)
	}
	if e.Reason == "" {
		return fmt.Sprintf("weida: connection closed %s with %s", who, e.Code)
	}
	return fmt.Sprintf("weida: connection closed %s with %s: %s", who, e.Code, e.Reason)
}

// Unwrap returns the transport-level cause, if any.
func (e *CloseError) Unwrap() error { return e.Err }

// Errors returned by this package. Compare with errors.Is; most are wrapped
// with the path, filter or field they concern.
var (
	// ErrClosed is returned by operations on a Listener, Publisher or
	// Subscriber after its Close (or, for a Publisher, its Listener's Close).
	ErrClosed = errors.New("weida: closed")

	// ErrPathTaken is returned by [Listener.Publisher] when a publisher is
	// already registered at the path.
	ErrPathTaken = errors.New("weida: a publisher already holds the path")

	// ErrPayloadTooLarge is returned by [Publisher.Publish] for a payload
	// larger than the per-subscriber budget (Limits.SubscriberBufferBytes):
	// no subscriber could ever be sent it, so it fails before fan-out.
	ErrPayloadTooLarge = errors.New("weida: payload larger than subscriber_buffer_bytes")

	// ErrInvalidMessage is returned by [Publisher.Publish] when a field of the
	// message breaks a PROTOCOL §6.2 cap (topic over 256 bytes or not UTF-8,
	// content_type over 256, traceparent over 128, tracestate over 512).
	ErrInvalidMessage = errors.New("weida: invalid message")

	// ErrTooManySubscriptions is returned by [Subscriber.Subscribe] when the
	// connection already holds Limits.MaxSubscriptions filters: the publisher
	// would close the whole connection with LIMIT_EXCEEDED.
	ErrTooManySubscriptions = errors.New("weida: max_subscriptions reached")

	// ErrClientRefused is returned by [Dial] when the listener refused this
	// client in the TLS handshake, because it admits only the client
	// certificates it lists (ListenConfig.ClientFingerprints) and this
	// dialler presented none or another. The error also wraps the
	// [*CloseError] of the failed handshake and says which certificate, if
	// any, was presented.
	ErrClientRefused = errors.New("weida: the listener refused the client certificate")

	// ErrSubscriptionRefused is wrapped by the error of a
	// [Subscriber.Subscribe] whose SUBSCRIBE stream the publisher stopped
	// with REJECTED before it was sent whole: the publisher does not
	// grant this client that filter (its scopes do not cover it). The
	// refusal is one-way (PROTOCOL §9.4): when it arrives after the
	// stream was sent, Subscribe returns nil and the filter selects
	// nothing.
	ErrSubscriptionRefused = errors.New("weida: the publisher refused the subscription (REJECTED)")

	// ErrNoTrust is returned by [Dial] when the URL pins no fingerprint, no
	// CA file is configured and verification is not explicitly skipped.
	ErrNoTrust = errors.New("weida: no way to authenticate the publisher")

	// ErrFingerprintMismatch is wrapped by the error of a Dial whose
	// publisher presented a certificate other than the pinned one: the
	// endpoint's identity changed (a rotation, a lost state directory) or
	// another server answers on its address.
	ErrFingerprintMismatch = errors.New("weida: publisher fingerprint does not match the pin")
)
