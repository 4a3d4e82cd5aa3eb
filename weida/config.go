package weida

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlogwriter"
)

// The defaults of PROTOCOL §10 and of this package, used for every zero
// field of [Limits].
const (
	DefaultMaxHeaderBytes           = 16384
	DefaultMaxSubscriptions         = 256
	DefaultSubscriberBufferBytes    = 8 << 20
	DefaultMaxConnections           = 1024
	DefaultMaxConnectionsPerPeer    = 64
	DefaultMaxConnectionsPerAddress = 64
	DefaultReplayBurst              = 32
	DefaultReplayInterval           = time.Second
	DefaultHelloTimeout             = 10 * time.Second
	DefaultIdleTimeout              = 30 * time.Second
	DefaultKeepAlive                = 10 * time.Second
	DefaultListenerIdleTimeout      = 2 * time.Second
	DefaultListenerKeepAlive        = 500 * time.Millisecond
	DefaultProbeAfter               = 750 * time.Millisecond
	DefaultMaxPayloadBytes          = 16 << 20
	DefaultMaxConcurrentUniStreams  = 2048
	DefaultMaxConcurrentBidiStreams = 1024
	DefaultStreamReceiveWindow      = 1 << 20
	DefaultConnectionReceiveWindow  = 16 << 20
	DefaultSlowConsumerAfter        = 10 * time.Second
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

	// SubscriberBufferBytes is the memory a listener spends on copies for
	// one subscriber connection: queued ones, charged their buffer as
	// allocated plus a fixed overhead, and those handed to QUIC and not
	// yet put into packets, charged quic-go's state for their stream
	// (about 3 KiB each, however small). A copy that does not fit is
	// dropped for that subscriber alone (the arriving copy, never a
	// queued one) and counted as BufferFull, and a message whose copy
	// could never fit fails Publish. Default 8 MiB.
	SubscriberBufferBytes int64

	// MaxConnections is the number of connections one listener serves at
	// once; the excess is closed with LIMIT_EXCEEDED. Default 1024.
	MaxConnections int

	// MaxConnectionsPerPeer is the number of connections one client
	// fingerprint may hold on one listener; the excess is closed with
	// LIMIT_EXCEEDED ("max_connections_per_peer"). Connections without a
	// client certificate are bounded by MaxConnectionsPerAddress instead.
	// Default 64.
	MaxConnectionsPerPeer int

	// MaxConnectionsPerAddress is the number of connections one source
	// address may hold on one listener, counted for every connection
	// whose peer is not proved by ClientFingerprints: anonymous ones, and
	// those presenting a certificate on a listener that admits anyone
	// (where a fingerprint costs nothing: a client can make a new one for
	// every connection). The excess is closed with LIMIT_EXCEEDED
	// ("max_connections_per_address"), so that one host cannot take
	// every one of MaxConnections. An IPv4 address counts alone; IPv6
	// addresses count per /64, the prefix a single host or site usually
	// gets whole and can pick addresses from at will. Subscribers behind
	// one NAT share the count. Default 64; it should stay well below
	// MaxConnections.
	MaxConnectionsPerAddress int

	// ReplayBurst and ReplayInterval bound the replays (see
	// [Publisher.SetReplayer]) one connection gets: a token bucket
	// holding ReplayBurst replays, one more every ReplayInterval. A
	// SUBSCRIBE that finds the bucket empty is applied without a replay,
	// logged (at most once per connection every 10 s) and counted in
	// [ListenerStats].ReplaysLimited. A subscriber that sets up its
	// filters once gets them all replayed; one that subscribes and
	// unsubscribes in a loop, which would make the endpoint encode and
	// queue the whole cache at every turn, gets one replay per interval.
	// Defaults 32 and 1 s.
	ReplayBurst    int
	ReplayInterval time.Duration

	// HelloTimeout is how long a connection may exist without a processed
	// peer HELLO before it is closed with NEGOTIATION_FAILED. Default 10 s.
	HelloTimeout time.Duration

	// IdleTimeout is the QUIC idle timeout: a connection that receives
	// nothing for that long is considered dead and closed without a
	// CONNECTION_CLOSE. QUIC uses the smaller of both peers' values.
	// Default 30 s when dialling (PROTOCOL §2.4) and
	// DefaultListenerIdleTimeout (2 s) on a listener, so that a subscriber
	// that vanished without closing (a killed process, a lost host) is
	// noticed within seconds and the copies queued for it are counted as
	// dropped at once; the listener's KeepAlive keeps every live connection
	// busy enough not to reach it. Since QUIC takes the smaller value, a
	// listener's IdleTimeout also bounds how long its subscribers take to
	// notice the listener is gone.
	IdleTimeout time.Duration

	// KeepAlive is the QUIC keep-alive period: after that long without
	// receiving a packet this side sends a PING, which the peer
	// acknowledges. Default 10 s when dialling (PROTOCOL §2.4). A listener
	// sends them too, every DefaultListenerKeepAlive (500 ms) by default,
	// which PROTOCOL §2.4 does not ask for: the PINGs are QUIC frames,
	// invisible to weida, and they are what lets a listener run a short
	// IdleTimeout without idle subscribers timing out. quic-go never waits
	// longer than half the negotiated idle timeout, whatever this says.
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

	// SlowConsumerAfter is the listener's slow-consumer policy: a
	// subscriber connection over its SubscriberBufferBytes (a copy was
	// just dropped for it) whose writer has waited that long on one copy
	// (for stream credit, flow-control credit or QUIC to send it) is
	// closed with LIMIT_EXCEEDED, logged at Warn ("weida: closing slow
	// consumer") and counted in [ListenerStats].SlowConsumersClosed. A
	// subscriber that keeps reading, however slowly a busy endpoint
	// serves it, hands the writer a copy now and then and only loses the
	// copies that do not fit, counted as BufferFull.
	//
	// On a connection that tracks receipts (see
	// [Publisher.TrackReceipts]) no refused copy is needed: a writer that
	// waited that long to open a stream or write a copy (the subscriber's
	// stream or flow-control credit) closes it the same way. There each
	// copy the subscriber holds back keeps a broker message
	// unacknowledged, and once the broker's flow control is used up by
	// them nothing more is published, so no copy would ever be refused.
	// Default 10 s.
	SlowConsumerAfter time.Duration
}

// withDefaults returns l with every zero field set to its default for the
// role (listening or dialling), or an error naming the first negative
// field.
func (l Limits) withDefaults(listening bool) (Limits, error) {
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
		{"MaxConnectionsPerAddress", int64(l.MaxConnectionsPerAddress)},
		{"ReplayBurst", int64(l.ReplayBurst)},
		{"ReplayInterval", int64(l.ReplayInterval)},
		{"HelloTimeout", int64(l.HelloTimeout)},
		{"IdleTimeout", int64(l.IdleTimeout)},
		{"KeepAlive", int64(l.KeepAlive)},
		{"MaxPayloadBytes", l.MaxPayloadBytes},
		{"MaxConcurrentUniStreams", l.MaxConcurrentUniStreams},
		{"MaxConcurrentBidiStreams", l.MaxConcurrentBidiStreams},
		{"SlowConsumerAfter", int64(l.SlowConsumerAfter)},
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
	defInt(&l.MaxConnectionsPerAddress, DefaultMaxConnectionsPerAddress)
	defInt(&l.ReplayBurst, DefaultReplayBurst)
	defDur(&l.ReplayInterval, DefaultReplayInterval)
	defDur(&l.HelloTimeout, DefaultHelloTimeout)
	if listening {
		defDur(&l.IdleTimeout, DefaultListenerIdleTimeout)
		defDur(&l.KeepAlive, DefaultListenerKeepAlive)
	} else {
		defDur(&l.IdleTimeout, DefaultIdleTimeout)
		defDur(&l.KeepAlive, DefaultKeepAlive)
	}
	def(&l.MaxPayloadBytes, DefaultMaxPayloadBytes)
	def(&l.MaxConcurrentUniStreams, DefaultMaxConcurrentUniStreams)
	def(&l.MaxConcurrentBidiStreams, DefaultMaxConcurrentBidiStreams)
	defU(&l.StreamReceiveWindow, DefaultStreamReceiveWindow)
	defU(&l.ConnectionReceiveWindow, DefaultConnectionReceiveWindow)
	defDur(&l.SlowConsumerAfter, DefaultSlowConsumerAfter)
	return l, nil
}

// quicConfig is the QUIC configuration of both roles (withDefaults gave
// them different timers). Datagrams stay off: a v0 peer lists no
// capability, so it must not advertise max_datagram_frame_size (PROTOCOL
// §6.1).
func (l *Limits) quicConfig() *quic.Config {
	c := &quic.Config{
		MaxIdleTimeout:                 l.IdleTimeout,
		MaxIncomingUniStreams:          l.MaxConcurrentUniStreams,
		MaxIncomingStreams:             l.MaxConcurrentBidiStreams,
		InitialStreamReceiveWindow:     min(l.StreamReceiveWindow, 512<<10),
		MaxStreamReceiveWindow:         l.StreamReceiveWindow,
		InitialConnectionReceiveWindow: min(l.ConnectionReceiveWindow, 1<<20),
		MaxConnectionReceiveWindow:     l.ConnectionReceiveWindow,
		KeepAlivePeriod:                l.KeepAlive,
		EnableDatagrams:                false,
	}
	return c
}

// QUICTracer is quic-go's per-connection tracer ([quic.Config].Tracer):
// it returns the trace that receives the connection's qlog events, or nil
// for none. It is there for diagnosis and for measurements that count
// packets by what they carry (package weida/bench does). A connection with
// a trace costs quic-go an event for every packet it sends and receives;
// without one it costs nothing. quic-go records the events on the
// connection's own goroutines, so a recorder must not block, and one trace
// returned for several connections must be safe for concurrent use.
type QUICTracer = func(ctx context.Context, isClient bool, connID quic.ConnectionID) qlogwriter.Trace

// ListenConfig configures [Listen]. The zero value is usable: a generated
// self-signed certificate, no client authentication, the default limits and
// no logging.
type ListenConfig struct {
	// CertFile and KeyFile name a PEM certificate chain and its private key.
	// Both empty: the listener uses a self-signed ECDSA P-256 certificate,
	// kept in StateDir or, without one, generated at every start, and logs
	// its fingerprint (also returned by [Listener.Fingerprint]) for
	// subscribers to pin. One without the other is an error.
	CertFile, KeyFile string

	// StateDir is a directory where the listener keeps what must survive a
	// restart; created (mode 0700) when missing. Empty: nothing is kept, so
	// a generated certificate, and with it the fingerprint subscribers pin,
	// changes at every start.
	//
	// With CertFile and KeyFile empty, the listener's certificate and key
	// are the files [StateFiles] names for the listen address: loaded when
	// they exist, else generated and written (the key with mode 0600). A
	// file that exists but cannot be read or parsed, or a certificate
	// without its key, fails [Listen]: replacing it silently would break
	// every subscriber's pin.
	//
	// Whatever the certificate, StateDir also holds the QUIC stateless
	// reset key ("stateless-reset.key", 32 random bytes, mode 0600),
	// shared by every listener using the directory. A listener restarted
	// with the same key answers packets of its previous process's
	// connections with a stateless reset (RFC 9000 §10.3), so that their
	// subscribers learn at once that the connection is gone. Without
	// StateDir the key is random for each process.
	StateDir string

	// ResetKeyFile, when set, names the file holding the QUIC stateless
	// reset key, which then does not come from StateDir: exactly 32 bytes,
	// or 64 hex digits with at most one trailing newline (anything else,
	// or a key of zeros, fails Listen with a *[ResetKeyError]; see
	// [CheckResetKeyFile]). Replicas that take over one another's endpoints
	// (placement by lease) read the same file, so that a packet of a
	// connection to the replica that held the endpoint before, arriving at
	// the one that holds it now, is answered with a reset its subscriber
	// accepts, and the subscriber dials again at once.
	ResetKeyFile string

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
	// presented still counts for MaxConnectionsPerPeer, but proves
	// nothing that would spare it MaxConnectionsPerAddress.
	ClientFingerprints []string

	// ClientIdentities and ClientCAFile admit clients by a name their
	// certificate carries instead of by its key, so that a new client
	// needs a certificate from the CA rather than an edit of this list.
	// Each identity is "dns:<name>", "uri:<uri>" or "email:<address>", a
	// subject alternative name of that type, or "cn:<name>", the
	// subject's CommonName (see address.ValidateIdentity). A client is
	// admitted under an identity when its certificate chains to a
	// certificate of ClientCAFile (PEM, CA certificates only) for client
	// authentication (extended key usage clientAuth, or none) at the time
	// of the handshake, and carries the identity exactly, byte for byte:
	// no wildcard, no case folding. Revocation is not checked.
	//
	// The two are set together, or neither. With ClientFingerprints, a
	// client listed by either is admitted; one refused by both is refused
	// as ClientFingerprints refuses it, with the reason logged. The names
	// a client is admitted under (its listed fingerprint, each listed
	// identity it carries) are all keys of [Scopes] that apply to it.
	//
	// ClientCAFile is read again when it changes, as CertFile is (see
	// [CertCheckInterval]): new handshakes are verified against the new
	// anchors, connections already open stay. A file that does not load
	// is logged, and the previous anchors kept.
	ClientIdentities []string
	ClientCAFile     string

	Limits Limits

	// TrackReceipts makes the listener record, on every connection it
	// accepts, which stream data the subscriber acknowledged, as
	// [Publisher.TrackReceipts] does from the moment it is called: set it
	// when a publisher of the listener will publish with
	// [Publisher.PublishWithReceipt], so that no subscriber connects
	// untracked before that publisher exists, and none has to be closed
	// when it calls Publisher.TrackReceipts. It costs every connection of
	// the listener a trace of each packet; false costs nothing.
	TrackReceipts bool

	// QUICTracer, when set, is given the qlog events of every connection
	// the listener accepts, beside the receipts trace (see QUICTracer).
	QUICTracer QUICTracer

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

	// ProbeAfter is how long the subscriber's connection may receive
	// nothing at all (no copy, no QUIC packet) before the subscriber sends
	// a liveness probe, and again after each further ProbeAfter of
	// silence: a re-SUBSCRIBE of a filter it holds, which a conforming
	// publisher treats as a no-op (PROTOCOL §6.4), padded with an
	// extension key so that its packet is large enough for a stateless
	// reset. A publisher restarted with the stateless reset key of the
	// process that died answers it with a reset, so the subscriber learns
	// within about ProbeAfter of the restart that its connection is gone,
	// instead of at its idle timeout. Probes stop while anything arrives
	// (a weida Listener sends keep-alive PINGs every 500 ms, so a live one
	// is never probed) and are not sent while no filter is held.
	// Zero means DefaultProbeAfter (750 ms); negative sends no probes.
	ProbeAfter time.Duration

	Limits Limits

	// QUICTracer, when set, is given the qlog events of the subscriber's
	// connection (see QUICTracer).
	QUICTracer QUICTracer

	// Logger receives the subscriber's events. nil discards them.
	Logger *slog.Logger
}

func loggerOrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
