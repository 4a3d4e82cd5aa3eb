package weida

import (
	"fmt"
	"log/slog"
	"time"

	"github.com/quic-go/quic-go"
)

// The defaults of PROTOCOL §10 and of this package, used for every zero
// field of [Limits].
const (
	DefaultMaxHeaderBytes           = 16384
	DefaultMaxSubscriptions         = 256
	DefaultSubscriberBufferBytes    = 8 << 20
	DefaultMaxConnections           = 1024
	DefaultMaxConnectionsPerPeer    = 64
	DefaultHelloTimeout             = 10 * time.Second
	DefaultIdleTimeout              = 30 * time.Second
	DefaultKeepAlive                = 10 * time.Second
	DefaultMaxPayloadBytes          = 16 << 20
	DefaultMaxConcurrentUniStreams  = 2048
	DefaultMaxConcurrentBidiStreams = 1024
	DefaultStreamReceiveWindow      = 1 << 20
	DefaultConnectionReceiveWindow  = 16 << 20
)

// Limits bounds what a peer can make this side hold, per connection unless
// the field says otherwise. A zero field means the default named beside it
// (the PROTOCOL §10 value where the spec has one); a negative field is an
// error at [Listen] or [Dial]. Limits is a plain value: copy it freely.
type Limits struct {
	// MaxHeaderBytes is the largest header this side accepts (a bigger
	// header_len closes the connection with PROTOCOL_VIOLATION before any
	// allocation) and is advertised in HELLO key 1. Default 16384.
	MaxHeaderBytes uint64

	// MaxSubscriptions is the number of distinct (path, filter) pairs one
	// connection may hold, summed over paths. A listener closes a
	// connection that would exceed it with LIMIT_EXCEEDED; a Subscriber
	// refuses the extra Subscribe locally. Default 256.
	MaxSubscriptions int

	// SubscriberBufferBytes is the payload a listener holds queued for one
	// subscriber connection; a copy that does not fit is dropped for that
	// subscriber alone and counted, and a payload larger than this fails
	// Publish. Default 8 MiB.
	SubscriberBufferBytes int64

	// MaxConnections is the number of connections one listener serves at
	// once; the excess is closed with LIMIT_EXCEEDED. Default 1024.
	MaxConnections int

	// MaxConnectionsPerPeer is the number of connections one client
	// fingerprint may hold on one listener; the excess is closed with
	// LIMIT_EXCEEDED. Connections without a client certificate are each
	// their own peer and bounded only by MaxConnections. Default 64.
	MaxConnectionsPerPeer int

	// HelloTimeout is how long a connection may exist without a processed
	// peer HELLO before it is closed with NEGOTIATION_FAILED. Default 10 s.
	HelloTimeout time.Duration

	// IdleTimeout is the QUIC idle timeout; QUIC uses the smaller of both
	// peers' values. Default 30 s.
	IdleTimeout time.Duration

	// KeepAlive is the QUIC keep-alive period of a dialled connection; a
	// listener sends none (PROTOCOL §2.4). Default 10 s.
	KeepAlive time.Duration

	// MaxPayloadBytes is the largest DATA payload a Subscriber reads; a
	// bigger copy is refused with STOP_SENDING(REJECTED), dropped and
	// counted. Default 16 MiB.
	MaxPayloadBytes int64

	// MaxConcurrentUniStreams and MaxConcurrentBidiStreams are the QUIC
	// stream limits granted to the peer. Defaults 2048 and 1024.
	//
	// On a Subscriber, MaxConcurrentUniStreams is also the bound on copies
	// waiting for Receive: a waiting copy stays unread in QUIC's buffers and
	// keeps its stream credit, so a slow reader pushes back on the
	// publisher (which then drops copies for it) instead of growing memory
	// here.
	MaxConcurrentUniStreams  int64
	MaxConcurrentBidiStreams int64

	// StreamReceiveWindow and ConnectionReceiveWindow are the QUIC
	// flow-control windows: unread bytes buffered per stream and per
	// connection. Defaults 1 MiB and 16 MiB.
	StreamReceiveWindow     uint64
	ConnectionReceiveWindow uint64
}

// withDefaults returns l with every zero field set to its default, or an
// error naming the first negative field.
func (l Limits) withDefaults() (Limits, error) {
	neg := func(name string, v int64) error {
		if v < 0 {
			return fmt.Errorf("weida: Limits.%s is negative (%d)", name, v)
		}
		return nil
	}
	for _, c := range []struct {
		name string
		v    int64
	}{
		{"MaxSubscriptions", int64(l.MaxSubscriptions)},
		{"SubscriberBufferBytes", l.SubscriberBufferBytes},
		{"MaxConnections", int64(l.MaxConnections)},
		{"MaxConnectionsPerPeer", int64(l.MaxConnectionsPerPeer)},
		{"HelloTimeout", int64(l.HelloTimeout)},
		{"IdleTimeout", int64(l.IdleTimeout)},
		{"KeepAlive", int64(l.KeepAlive)},
		{"MaxPayloadBytes", l.MaxPayloadBytes},
		{"MaxConcurrentUniStreams", l.MaxConcurrentUniStreams},
		{"MaxConcurrentBidiStreams", l.MaxConcurrentBidiStreams},
	} {
		if err := neg(c.name, c.v); err != nil {
			return Limits{}, err
		}
	}
	def := func(p *int64, d int64) {
		if *p == 0 {
			*p = d
		}
	}
	defInt := func(p *int, d int) {
		if *p == 0 {
			*p = d
		}
	}
	defDur := func(p *time.Duration, d time.Duration) {
		if *p == 0 {
			*p = d
		}
	}
	defU := func(p *uint64, d uint64) {
		if *p == 0 {
			*p = d
		}
	}
	defU(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	defInt(&l.MaxSubscriptions, DefaultMaxSubscriptions)
	def(&l.SubscriberBufferBytes, DefaultSubscriberBufferBytes)
	defInt(&l.MaxConnections, DefaultMaxConnections)
	defInt(&l.MaxConnectionsPerPeer, DefaultMaxConnectionsPerPeer)
	defDur(&l.HelloTimeout, DefaultHelloTimeout)
	defDur(&l.IdleTimeout, DefaultIdleTimeout)
	defDur(&l.KeepAlive, DefaultKeepAlive)
	def(&l.MaxPayloadBytes, DefaultMaxPayloadBytes)
	def(&l.MaxConcurrentUniStreams, DefaultMaxConcurrentUniStreams)
	def(&l.MaxConcurrentBidiStreams, DefaultMaxConcurrentBidiStreams)
	defU(&l.StreamReceiveWindow, DefaultStreamReceiveWindow)
	defU(&l.ConnectionReceiveWindow, DefaultConnectionReceiveWindow)
	return l, nil
}

// quicConfig is the QUIC configuration both roles share; dialling adds the
// keep-alive. Datagrams stay off: a v0 peer lists no capability, so it must
// not advertise max_datagram_frame_size (PROTOCOL §6.1).
func (l *Limits) quicConfig(dialling bool) *quic.Config {
	c := &quic.Config{
		MaxIdleTimeout:                 l.IdleTimeout,
		MaxIncomingUniStreams:          l.MaxConcurrentUniStreams,
		MaxIncomingStreams:             l.MaxConcurrentBidiStreams,
		InitialStreamReceiveWindow:     min(l.StreamReceiveWindow, 512<<10),
		MaxStreamReceiveWindow:         l.StreamReceiveWindow,
		InitialConnectionReceiveWindow: min(l.ConnectionReceiveWindow, 1<<20),
		MaxConnectionReceiveWindow:     l.ConnectionReceiveWindow,
		EnableDatagrams:                false,
	}
	if dialling {
		c.KeepAlivePeriod = l.KeepAlive
	}
	return c
}

// ListenConfig configures [Listen]. The zero value is usable: a generated
// self-signed certificate, no client authentication, the default limits and
// no logging.
type ListenConfig struct {
	// CertFile and KeyFile name a PEM certificate chain and its private key.
	// Both empty: a self-signed ECDSA P-256 certificate is generated at start
	// and its fingerprint logged (and returned by [Listener.Fingerprint]),
	// for subscribers to pin. One without the other is an error.
	CertFile, KeyFile string

	// ClientFingerprints, when non-empty, requires every client to present a
	// certificate and admits only those whose "sha256:<hex>" fingerprint is
	// listed (weida's peer authorization, decision 0015). Any other client,
	// with another certificate or none, fails the TLS handshake with the
	// alert bad_certificate, before any of its frames exist; every such
	// refusal is logged at Warn ("weida: refused client", with the reason,
	// the remote address and any fingerprint) and counted in
	// [ListenerStats].ClientsRefused. So is a client that presents a listed
	// certificate without holding its key: crypto/tls fails that handshake
	// (decrypt_error) after the allowlist admitted it, and the refusal is
	// logged once the handshake has not completed within 10 s. When empty,
	// a client certificate is requested but not required; one that is
	// presented still proves the peer's identity for MaxConnectionsPerPeer.
	ClientFingerprints []string

	Limits Limits

	// Logger receives the listener's events: the generated certificate's
	// fingerprint, refused clients, connections closed for a violation. nil
	// discards them.
	Logger *slog.Logger
}

// DialConfig configures [Dial]. The zero value is not enough on its own:
// unless the URL pins a fingerprint, set CAFile (or, in tests only,
// InsecureSkipVerifyForTesting).
type DialConfig struct {
	// CAFile names PEM trust anchors. The publisher's chain must reach one
	// of them and name the URL's host. A fingerprint pinned in the URL
	// overrides it (pins ignore names).
	CAFile string

	// CertFile and KeyFile name an optional client certificate, for
	// listeners that admit clients by fingerprint. Both or neither. A
	// listener that does not admit the certificate (or, with none, the
	// client) fails Dial with [ErrClientRefused].
	CertFile, KeyFile string

	// InsecureSkipVerifyForTesting accepts any publisher certificate. It
	// exists for tests only; a pinned fingerprint in the URL still wins.
	InsecureSkipVerifyForTesting bool

	Limits Limits

	// Logger receives the subscriber's events. nil discards them.
	Logger *slog.Logger
}

func loggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
