package wire

import (
	"errors"
	"strconv"
)

// Error is every violation this package detects, in a preamble or in a
// header. A weida peer answers it by closing the connection with
// PROTOCOL_VIOLATION ([CodeProtocolViolation], PROTOCOL §3.2).
//
// Errors that are not about the peer's bytes (a failing [io.Reader], a stream
// reset) are never an *Error, so errors.As(err, new(*wire.Error)) tells a
// violation from a transport failure.
type Error struct {
	// Frame is the frame kind being read. For [RuleBadMagic] no kind has been
	// read yet and Frame is 0.
	Frame Kind
	// Key is the header key at fault, -1 when the fault is not about one key
	// (a preamble rule, trailing bytes, a non-map header). For a fault inside
	// a HELLO guarantee set it is the HELLO key (5 or 6).
	Key int
	// Rule is one of the Rule constants of this package; compare with ==.
	Rule string
	// Detail adds what was found (a length, a value); it may be empty and is
	// meant for people, not for comparison.
	Detail string
	// Err is an underlying sentinel, for example [ErrHeaderTooLarge]; nil
	// otherwise.
	Err error
}

// Error formats the violation as "wire: <frame> header key <k>: <rule> (<detail>)".
func (e *Error) Error() string {
	b := make([]byte, 0, 96)
	b = append(b, "wire: "...)
	if isPreambleRule(e.Rule) {
		b = append(b, "preamble"...)
		if e.Rule != RuleBadMagic {
			b = append(b, " of "...)
			b = append(b, e.Frame.String()...)
		}
	} else {
		b = append(b, e.Frame.String()...)
		b = append(b, " header"...)
		if e.Key >= 0 {
			b = append(b, " key "...)
			b = strconv.AppendInt(b, int64(e.Key), 10)
		}
	}
	b = append(b, ": "...)
	b = append(b, e.Rule...)
	if e.Detail != "" {
		b = append(b, " ("...)
		b = append(b, e.Detail...)
		b = append(b, ')')
	}
	return string(b)
}

// Unwrap returns e.Err.
func (e *Error) Unwrap() error { return e.Err }

// ErrHeaderTooLarge is wrapped by the *Error [ReadPreamble] and
// [ParsePreamble] return when header_len exceeds the caller's maximum. The
// check happens before any buffer for the header exists.
var ErrHeaderTooLarge = errors.New("wire: header_len exceeds max_header_bytes")

// The rules an [*Error] can name. The strings are stable and may appear in
// logs and metrics.
const (
	// Preamble rules (PROTOCOL §3, §3.1, §4).
	RuleBadMagic          = "magic byte is not 0x57"
	RuleReservedKind      = "frame kind is reserved (8-255)"
	RuleHeaderTooLarge    = "header_len exceeds max_header_bytes"
	RuleTruncatedPreamble = "stream ends inside the preamble or header"

	// CBOR well-formedness and the restrictions of PROTOCOL §5.
	RuleTruncated     = "header ends inside a data item"
	RuleMalformed     = "reserved CBOR additional information"
	RuleNotMap        = "header is not a definite-length map"
	RuleIndefinite    = "indefinite-length item or break"
	RuleTag           = "CBOR tag"
	RuleHalfFloat     = "half-precision float"
	RuleSimpleValue   = "simple value other than false, true, null, undefined"
	RuleTrailingBytes = "bytes after the header map"
	RuleKeyNotUint    = "map key is not an unsigned integer"
	RuleDuplicateKey  = "duplicate map key"
	RuleKeyOrder      = "map keys not in ascending order"
	RuleSkipDepth     = "skipped value nests deeper than 8"
	RuleListTooLong   = "list declares more than 64 items"
	RuleMissingKey    = "required key missing"
	RuleType          = "value has the wrong CBOR type for its key"
	RuleTextTooLong   = "text longer than its cap"
	RuleUTF8          = "text is not valid UTF-8"

	// Value rules of the keys this package knows (PROTOCOL §6).
	RuleProducerLength       = "producer is not exactly 32 bytes"
	RuleAchieved             = "achieved is not a defined acknowledgement level"
	RuleReportPair           = "report_id and report must appear together"
	RuleReportTooLong        = "report orders more than 16 levels"
	RuleReportOrder          = "report levels not strictly ascending"
	RuleReportLevel          = "report level undefined below 16"
	RuleReportMode           = "report_mode is neither 0 nor 1"
	RuleLayerRange           = "layer above 15"
	RuleLayerWithoutSegment  = "layer without segment"
	RuleGuaranteeLevel       = "guarantee level not defined"
	RuleGuaranteeCombination = "guarantee set combination forbidden"
	RuleGuaranteeRequired    = "guarantees_required exceeds guarantees_offered"
	RuleExtensionKey         = "extension key below 64"
)

func isPreambleRule(r string) bool {
	switch r {
	case RuleBadMagic, RuleReservedKind, RuleHeaderTooLarge, RuleTruncatedPreamble:
		return true
	}
	return false
}

// Code is a QUIC application error code (PROTOCOL §7), carried by
// CONNECTION_CLOSE, RESET_STREAM and STOP_SENDING. It is distinct from the
// code of an ERROR frame ([ErrorFrame.Code]).
type Code uint64

// The application error codes of PROTOCOL §7.
const (
	CodeNoError           Code = 0 // orderly close
	CodeInternal          Code = 1 // local failure the peer cannot act on
	CodeProtocolViolation Code = 2 // any condition of §3.2, including every *Error
	CodeCanceled          Code = 3 // transfer abandoned by either side
	CodeNegotiationFailed Code = 4 // §2.3 failure or hello_timeout
	CodeLimitExceeded     Code = 5 // a local limit is reached
	CodeShutdown          Code = 6 // runtime shutting down
	CodeRejected          Code = 7 // receiver declines the inbound payload
	CodeUnknownEndpoint   Code = 8 // path not registered
	CodeUnsupported       Code = 9 // path does not serve this stream kind
)

var codeNames = [...]string{
	"NO_ERROR", "INTERNAL", "PROTOCOL_VIOLATION", "CANCELED", "NEGOTIATION_FAILED",
	"LIMIT_EXCEEDED", "SHUTDOWN", "REJECTED", "UNKNOWN_ENDPOINT", "UNSUPPORTED",
}

// String returns the PROTOCOL §7 name, or "code(N)" for a code it does not
// define.
func (c Code) String() string {
	if c < Code(len(codeNames)) {
		return codeNames[c]
	}
	return "code(" + strconv.FormatUint(uint64(c), 10) + ")"
}

// The codes of an ERROR frame (PROTOCOL §6.3). A receiver should read any
// other code as a generic failure of the exchange, not as a violation.
const (
	ErrorUnknownEndpoint uint64 = 1 // no endpoint registered for the path
	ErrorRejected        uint64 = 2 // the receiver declined the transfer
	ErrorUnsupported     uint64 = 3 // the endpoint does not serve this stream kind
	ErrorInternal        uint64 = 4 // the receiver failed internally
	ErrorNoReply         uint64 = 5 // accepted, but no reply will come
)
