package nats

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	natsgo "github.com/nats-io/nats.go"
	"github.com/nats-io/nkeys"

	"weida.dev/connector/connectors"
)

// Header names this driver reads and writes. NATS headers are
// case-sensitive on the wire; a Source also accepts any other spelling of
// these names (a publisher writing "content-type" is understood).
const (
	// LoopHeader marks a message an outbound bridge published; its value
	// is [Config.LoopMarker]. An inbound bridge with the same marker does
	// not bridge it again.
	LoopHeader = "x-weida-connector"
	// ContentTypeHeader carries weida's content_type. It is spelled as in
	// HTTP, which is what NATS tooling (the nats CLI, Synadia's services)
	// writes.
	ContentTypeHeader = "Content-Type"
	// TraceparentHeader and TracestateHeader carry W3C trace context, in
	// the spelling the W3C recommendation uses for HTTP.
	TraceparentHeader = "traceparent"
	TracestateHeader  = "tracestate"
)

// ReasonReconnectBuffer counts publishes nats.go refused because its
// reconnect buffer was full. They are not lost: the Sink returns an error
// wrapping [connectors.ErrNotConnected] and the runtime publishes them again
// once connected. The counter shows how often that happened.
const ReasonReconnectBuffer = "reconnect-buffer-full"

// Defaults for the zero values of [Config].
const (
	DefaultConnectTimeout       = 5 * time.Second
	DefaultFlushTimeout         = 10 * time.Second
	DefaultReconnectBufferBytes = 8 << 20
	DefaultPendingMessages      = 65536
	DefaultPendingBytes         = 64 << 20
	DefaultPullMessages         = 256
)

// JetStream selects JetStream instead of core NATS.
type JetStream struct {
	// Stream is the stream an inbound resource consumes from, or the stream
	// an outbound resource's publishes must land in (the server refuses a
	// publish another stream would capture). The stream must exist: its
	// subjects, retention and storage belong to the operator, not to the
	// connector.
	Stream string
	// Durable is the durable pull consumer an inbound resource consumes
	// with; required inbound, unused outbound.
	Durable string
}

// Config configures one connection to nats-server. The zero value of each
// optional field is the documented default. Secrets are passed already
// resolved; a Config must not be logged as a whole (its [Config.LogValue]
// redacts them, %v does not).
type Config struct {
	// Host is the server's host name or IP address (IPv6 without
	// brackets); required. Host, Port and TLS are the server address
	// already parsed (package resources parses a resource's URL): the
	// driver hands them to nats.go as they are. nats.go learns the other
	// members of a cluster from the server it connects to.
	Host string
	// Port is the server's client port; zero means 4222.
	Port int
	// TLS, when not nil, secures the connection: an empty tls.Config
	// means the system roots, and an empty ServerName means Host. Nil
	// means plain TCP.
	TLS *tls.Config
	// Name is the connection name the server shows in its monitoring.
	Name string

	// At most one of the following authentication methods is used:
	// User and Password; Token; NKeySeed (an "SU..." user seed); Creds
	// (the contents of a .creds file: a user JWT and its seed).
	User     string
	Password string
	Token    string
	NKeySeed string
	Creds    []byte

	// QueueGroup, when set, makes every core subscription a member of this
	// queue group: replicas of one resource split the messages, each going
	// to one of them. Unused with JetStream, where replicas sharing a
	// durable consumer split the messages anyway.
	QueueGroup string
	// JetStream is nil for core NATS.
	JetStream *JetStream

	// LoopMarker is the value of [LoopHeader] this connector writes and
	// recognises; empty disables loop marking.
	LoopMarker string
	Logger     *slog.Logger

	// Backoff is the wait before reconnect attempt n (n ≥ 1); nil means
	// exponential from 100 ms to 10 s. The connection is retried forever,
	// also when the first attempt fails.
	Backoff func(n int) time.Duration
	// ConnectTimeout bounds one connection attempt (TCP, TLS and the
	// CONNECT handshake); zero means [DefaultConnectTimeout].
	ConnectTimeout time.Duration
	// ReconnectBufferBytes bounds what nats.go buffers while reconnecting.
	// Zero means [DefaultReconnectBufferBytes]; negative disables the
	// buffer. A publish that does not fit is counted under
	// [ReasonReconnectBuffer] and handed back to the runtime as not
	// connected, never lost silently.
	ReconnectBufferBytes int
	// PendingMessages and PendingBytes bound, per core subscription, what
	// nats.go holds for the bridge to read. Beyond them nats.go drops
	// messages (a "slow consumer"): they are counted under
	// [connectors.ReasonBrokerDropped], logged and reported to OnDrop.
	// Zero means [DefaultPendingMessages] and [DefaultPendingBytes].
	PendingMessages int
	PendingBytes    int
	// FlushTimeout bounds how long a Sink waits for the server to confirm
	// a publish (a PONG for core NATS, a PubAck for JetStream); zero means
	// [DefaultFlushTimeout].
	FlushTimeout time.Duration
	// PullMessages is how many JetStream messages the Source asks for at a
	// time and buffers; zero means [DefaultPullMessages].
	PullMessages int
	// MaxAckPending is the consumer's limit of delivered, unacknowledged
	// messages when the Source creates the durable consumer; zero means
	// the server's default. An existing consumer keeps its own.
	MaxAckPending int

	// OnDrop, when set, is told about messages the client library dropped
	// before the bridge could see them: filter is the route's subscription,
	// reason is [connectors.ReasonBrokerDropped], n how many. It is called
	// from the Source's goroutines and must not block.
	OnDrop func(filter, reason string, n int)
}

// LogValue describes c for a log without its secrets.
func (c Config) LogValue() slog.Value {
	attrs := []slog.Attr{slog.String("url", c.serverURL()), slog.String("name", c.Name), slog.String("auth", c.authMethod())}
	if c.QueueGroup != "" {
		attrs = append(attrs, slog.String("queue_group", c.QueueGroup))
	}
	if c.JetStream != nil {
		attrs = append(attrs, slog.String("stream", c.JetStream.Stream), slog.String("durable", c.JetStream.Durable))
	}
	return slog.GroupValue(attrs...)
}

func (c *Config) authMethod() string {
	switch {
	case c.Creds != nil:
		return "creds"
	case c.NKeySeed != "":
		return "nkey"
	case c.Token != "":
		return "token"
	case c.User != "" || c.Password != "":
		return "user-password"
	}
	return "none"
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

func (c *Config) connectTimeout() time.Duration {
	if c.ConnectTimeout > 0 {
		return c.ConnectTimeout
	}
	return DefaultConnectTimeout
}

func (c *Config) flushTimeout() time.Duration {
	if c.FlushTimeout > 0 {
		return c.FlushTimeout
	}
	return DefaultFlushTimeout
}

func (c *Config) pending() (msgs, bytes int) {
	msgs, bytes = c.PendingMessages, c.PendingBytes
	if msgs <= 0 {
		msgs = DefaultPendingMessages
	}
	if bytes <= 0 {
		bytes = DefaultPendingBytes
	}
	return msgs, bytes
}

func (c *Config) pullMessages() int {
	if c.PullMessages > 0 {
		return c.PullMessages
	}
	return DefaultPullMessages
}

// serverURL returns the server's address as a URL without credentials,
// nats://host:port or, with TLS, tls://host:port (the schemes and default
// port of [Driver]'s URL rules): what nats.go is given, and how logs and
// errors name the server.
func (c *Config) serverURL() string {
	return Driver.URL().Address(c.Host, c.Port, c.TLS != nil).String()
}

// validate checks what does not need a connection.
func (c *Config) validate(inbound bool) error {
	if c.Host == "" {
		return errors.New("nats: a server host is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("nats: server port %d out of range 1–65535", c.Port)
	}
	methods := 0
	for _, set := range []bool{c.User != "" || c.Password != "", c.Token != "", c.NKeySeed != "", c.Creds != nil} {
		if set {
			methods++
		}
	}
	if methods > 1 {
		return errors.New("nats: more than one authentication method is set (user/password, token, nkey seed, creds)")
	}
	if c.NKeySeed != "" {
		if _, err := nkeys.FromSeed([]byte(c.NKeySeed)); err != nil {
			return fmt.Errorf("nats: nkey seed: %w", err)
		}
	}
	if js := c.JetStream; js != nil {
		if js.Stream == "" {
			return errors.New("nats: jetstream: a stream name is required")
		}
		if inbound && js.Durable == "" {
			return errors.New("nats: jetstream: an inbound resource needs a durable consumer name")
		}
		if err := checkJSName("stream", js.Stream); err != nil {
			return err
		}
		if js.Durable != "" {
			if err := checkJSName("durable", js.Durable); err != nil {
				return err
			}
		}
	}
	return nil
}

// checkJSName applies the server's rule for stream and consumer names: they
// become tokens of API subjects.
func checkJSName(what, name string) error {
	if strings.ContainsAny(name, ".*> \t\r\n\f/\\") {
		return fmt.Errorf("nats: jetstream: %s name %q must not contain '.', '*', '>', '/', '\\' or whitespace", what, name)
	}
	return nil
}

// options builds nats.go's connection options. Every handler reports to
// report, or logs, and tells tr what it learns; the slow-consumer handler
// is onAsyncErr.
func (c *Config) options(report connectors.StateFunc, log *slog.Logger, tr *tracker, onAsyncErr natsgo.ErrHandler) ([]natsgo.Option, error) {
	backoff := c.Backoff
	if backoff == nil {
		backoff = connectors.ExponentialBackoff(100*time.Millisecond, 10*time.Second)
	}
	reconnectBuf := c.ReconnectBufferBytes
	if reconnectBuf == 0 {
		reconnectBuf = DefaultReconnectBufferBytes
	}
	opts := []natsgo.Option{
		natsgo.Name(c.Name),
		natsgo.Timeout(c.connectTimeout()),
		natsgo.MaxReconnects(-1),
		natsgo.RetryOnFailedConnect(true),
		natsgo.ReconnectBufSize(reconnectBuf),
		natsgo.CustomReconnectDelay(func(attempts int) time.Duration {
			if attempts < 1 {
				attempts = 1
			}
			return backoff(attempts)
		}),
		natsgo.DisconnectErrHandler(func(_ *natsgo.Conn, err error) {
			tr.note(err)
			detail := "reconnecting"
			if err != nil {
				detail = err.Error() + "; reconnecting"
			}
			report(connectors.ConnState{Reason: reasonLost, Detail: detail})
		}),
		natsgo.ReconnectErrHandler(func(_ *natsgo.Conn, err error) {
			tr.note(err)
			report(connectors.ConnState{Reason: connectReason(err), Detail: errString(err)})
		}),
		natsgo.ReconnectHandler(func(nc *natsgo.Conn) {
			report(connectors.ConnState{Up: true, Reason: "Connected", Detail: "reconnected to " + nc.ConnectedServerId()})
		}),
		natsgo.ClosedHandler(func(nc *natsgo.Conn) {
			tr.note(nc.LastError())
			if !tr.closing.Load() {
				f := tr.failure("the connection closed")
				report(connectors.ConnState{Reason: reasonOf(f), Detail: f.Error(), Lost: f})
			}
			close(tr.closed)
		}),
		natsgo.ErrorHandler(func(nc *natsgo.Conn, sub *natsgo.Subscription, err error) {
			if isAuthErr(err) {
				tr.note(err)
			}
			onAsyncErr(nc, sub, err)
		}),
		natsgo.LameDuckModeHandler(func(*natsgo.Conn) {
			log.Warn("nats server entered lame duck mode; it will close the connection soon")
		}),
	}
	switch {
	case c.User != "" || c.Password != "":
		opts = append(opts, natsgo.UserInfo(c.User, c.Password))
	case c.Token != "":
		opts = append(opts, natsgo.Token(c.Token))
	case c.NKeySeed != "":
		kp, err := nkeys.FromSeed([]byte(c.NKeySeed))
		if err != nil {
			return nil, fmt.Errorf("nats: nkey seed: %w", err)
		}
		pub, err := kp.PublicKey()
		if err != nil {
			return nil, fmt.Errorf("nats: nkey seed: %w", err)
		}
		opts = append(opts, natsgo.Nkey(pub, kp.Sign))
	case c.Creds != nil:
		opts = append(opts, natsgo.UserCredentialBytes(c.Creds))
	}
	if c.TLS != nil {
		opts = append(opts, natsgo.Secure(c.TLS))
	}
	return opts, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// Reasons this driver reports, in the vocabulary of [connectors.Failure].
const (
	reasonCredentials = "CredentialsRefused"
	reasonPermission  = "PermissionDenied"
	reasonStream      = "StreamMissing"
	reasonConsumer    = "ConsumerMissing"
	reasonLost        = "ConnectionLost"
	reasonSubscribe   = "SubscribeFailed"
)

// isAuthErr reports whether the server refused the connection's
// credentials, now or when they expired or were revoked.
func isAuthErr(err error) bool {
	return errors.Is(err, natsgo.ErrAuthorization) || errors.Is(err, natsgo.ErrAuthExpired) || errors.Is(err, natsgo.ErrAuthRevoked)
}

// connectReason names why a connection attempt failed: refused
// credentials, the network failures every driver shares, or, for anything
// else, ConnectionLost.
func connectReason(err error) string {
	if isAuthErr(err) {
		return reasonCredentials
	}
	if r := connectors.NetworkReason(err); r != "" {
		return r
	}
	return reasonLost
}

// reasonOf returns the reason of a *connectors.Failure in err, or "".
func reasonOf(err error) string {
	var f *connectors.Failure
	if errors.As(err, &f) {
		return f.Reason
	}
	return ""
}

// tracker follows one nats.go connection for the Source or Sink that owns
// it: the last error that says why it is, or was, down, and whether
// nats.go has given up on it (its ClosedHandler ran). nats.go closes a
// connection for good only when its owner closes it or when the server
// refused the credentials twice in a row (nats.go's default, kept: the
// runtime starts a new connection after its own backoff); the error kept
// here makes the failure say which.
type tracker struct {
	closed  chan struct{} // closed by nats.go's ClosedHandler
	closing atomic.Bool   // the owner is closing the connection

	mu   sync.Mutex
	last error
}

func newTracker() *tracker { return &tracker{closed: make(chan struct{})} }

// note records err as the latest reason the connection is down. A refusal
// of credentials is not replaced by the plain close that follows it.
func (t *tracker) note(err error) {
	if err == nil {
		return
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	if isAuthErr(t.last) && !isAuthErr(err) && errors.Is(err, natsgo.ErrConnectionClosed) {
		return
	}
	t.last = err
}

func (t *tracker) lastErr() error {
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.last
}

// gone reports whether nats.go has closed the connection for good.
func (t *tracker) gone() bool {
	select {
	case <-t.closed:
		return true
	default:
		return false
	}
}

// failure is the error of an operation the closed connection could not
// do: CredentialsRefused when the server last refused the credentials,
// ConnectionLost otherwise.
func (t *tracker) failure(what string) error {
	last := t.lastErr()
	if last == nil {
		last = natsgo.ErrConnectionClosed
	}
	reason := reasonLost
	if isAuthErr(last) {
		reason = reasonCredentials
	}
	return connectors.Retryable(reason, fmt.Errorf("nats: %s: %w", what, last))
}

// connect dials with retries in the background and waits until the first
// connection is up, the connection is closed for good (credentials refused
// twice), or ctx ends. Its error is a *connectors.Failure whose reason is
// the last real one (CredentialsRefused, BrokerUnreachable, DNSFailure,
// TLSFailure) when one is known.
func connect(ctx context.Context, c *Config, tr *tracker, opts []natsgo.Option) (*natsgo.Conn, error) {
	// nats.go takes its servers only as URL strings; this one is built
	// from the parsed address, and nats.go is the only one to parse it.
	server := c.serverURL()
	nc, err := natsgo.Connect(server, opts...)
	if err != nil {
		return nil, classify(fmt.Errorf("nats: connecting to %s: %w", server, err))
	}
	if nc.IsConnected() {
		return nc, nil
	}
	ch := nc.StatusChanged(natsgo.CONNECTED, natsgo.CLOSED)
	defer nc.RemoveStatusListener(ch)
	for {
		switch nc.Status() {
		case natsgo.CONNECTED:
			return nc, nil
		case natsgo.CLOSED:
			<-tr.closed // the handler has recorded the last error
			return nc, classify(fmt.Errorf("nats: connecting to %s: %w", server, closedErr(nc, tr)))
		}
		select {
		case <-ch:
		case <-ctx.Done():
			err := fmt.Errorf("nats: connecting to %s: %w", server, context.Cause(ctx))
			if last := tr.lastErr(); last != nil {
				return nc, connectors.Retryable(connectReason(last), fmt.Errorf("%w (last attempt: %w)", err, last))
			}
			return nc, err
		}
	}
}

// classify makes err a *connectors.Failure when its reason is known.
func classify(err error) error {
	if isAuthErr(err) {
		return connectors.Retryable(reasonCredentials, err)
	}
	return connectors.ClassifyNetwork(err)
}

func closedErr(nc *natsgo.Conn, tr *tracker) error {
	if err := tr.lastErr(); err != nil {
		return err
	}
	if err := nc.LastError(); err != nil {
		return err
	}
	return natsgo.ErrConnectionClosed
}

// headers is the metadata this driver maps from NATS headers.
type headers struct {
	contentType, traceparent, tracestate, loop string
}

// readHeaders extracts the mapped headers from h: the exact spelling
// first, then any spelling that differs only in case.
func readHeaders(h natsgo.Header) headers {
	var out headers
	if len(h) == 0 {
		return out
	}
	out.contentType = h.Get(ContentTypeHeader)
	out.traceparent = h.Get(TraceparentHeader)
	out.tracestate = h.Get(TracestateHeader)
	out.loop = h.Get(LoopHeader)
	if out.contentType != "" && out.traceparent != "" && out.tracestate != "" && out.loop != "" {
		return out
	}
	for k, v := range h {
		if len(v) == 0 {
			continue
		}
		switch {
		case out.contentType == "" && strings.EqualFold(k, ContentTypeHeader):
			out.contentType = v[0]
		case out.traceparent == "" && strings.EqualFold(k, TraceparentHeader):
			out.traceparent = v[0]
		case out.tracestate == "" && strings.EqualFold(k, TracestateHeader):
			out.tracestate = v[0]
		case out.loop == "" && strings.EqualFold(k, LoopHeader):
			out.loop = v[0]
		}
	}
	return out
}

// toMessage maps a received NATS message. The payload is not copied:
// nats.go gives every message its own buffer.
func toMessage(subject string, data []byte, h natsgo.Header, marker string) *connectors.Message {
	hs := readHeaders(h)
	return &connectors.Message{
		Topic:       subject,
		Payload:     data,
		ContentType: hs.contentType,
		Traceparent: hs.traceparent,
		Tracestate:  hs.tracestate,
		Looped:      marker != "" && hs.loop == marker,
	}
}

// fromMessage builds the NATS message for m, with only the headers that
// carry something.
func fromMessage(m *connectors.Message, marker string) *natsgo.Msg {
	out := &natsgo.Msg{Subject: m.Topic, Data: m.Payload}
	if m.ContentType == "" && m.Traceparent == "" && m.Tracestate == "" && marker == "" {
		return out
	}
	h := make(natsgo.Header, 4)
	if m.ContentType != "" {
		h[ContentTypeHeader] = []string{m.ContentType}
	}
	if m.Traceparent != "" {
		h[TraceparentHeader] = []string{m.Traceparent}
	}
	if m.Tracestate != "" {
		h[TracestateHeader] = []string{m.Tracestate}
	}
	if marker != "" {
		h[LoopHeader] = []string{marker}
	}
	out.Header = h
	return out
}
