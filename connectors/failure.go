package connectors

// Failure says why a unit is down and whether another attempt can help.
//
// A driver returns one from Start, or, once its connection is gone for
// good, from Read (Source) and Write or WriteAsync's done (Sink), when it
// knows why. The runtime then closes the Source or Sink, shows Reason in
// /status and the metrics, and, unless Permanent, builds a fresh one after
// a backoff. Errors that are not a *Failure (plain network errors, say)
// are classified by the runtime. Find one with errors.As.
type Failure struct {
	// Reason is a CamelCase word for /status and metrics, from a closed
	// vocabulary: BrokerUnreachable, DNSFailure, TLSFailure,
	// CredentialsRefused, StreamMissing, ConsumerMissing,
	// DeclarationRefused, ConnectionLost, SubscribeFailed,
	// PermissionDenied.
	Reason string
	// Err is the underlying error, with the broker's own words.
	Err error
	// Permanent is set only for a configuration problem that no retry
	// can fix; operation problems (a missing stream, refused credentials)
	// are retried, since an operator may fix them meanwhile.
	Permanent bool
}

// Error returns the underlying error's text.
func (f *Failure) Error() string { return f.Err.Error() }

// Unwrap returns the underlying error, so that errors.Is and errors.As see
// through a Failure.
func (f *Failure) Unwrap() error { return f.Err }

// Retryable returns a *Failure that another attempt may fix.
func Retryable(reason string, err error) error { return &Failure{Reason: reason, Err: err} }

// Permanent returns a *Failure that no retry can fix.
func Permanent(reason string, err error) error {
	return &Failure{Reason: reason, Err: err, Permanent: true}
}
