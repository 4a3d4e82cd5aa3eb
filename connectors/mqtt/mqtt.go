// Package mqtt is the MQTT 5 driver of the bridge runtime: a
// [connectors.Source] for inbound resources and a [connectors.Sink] for
// outbound ones, on paho.golang's autopaho, which reconnects with backoff by
// itself. The runtime owns conversion, routing, counting and retries; this
// package owns only the broker connection and the mapping of MQTT metadata.
//
// Retries: autopaho keeps reconnecting within an attempt and the Source
// subscribes again on every connection; the driver retries nothing else.
// The waits follow the runtime's model (see [connectors.Streak]): Config.Backoff
// by the failures in a row, where a connection that stayed up for
// [connectors.StableAfter] starts the count again, so that connections that
// keep dropping soon after they come up are slowed down as failing attempts
// are.
// Every failed attempt is reported through the [connectors.StateFunc] with
// a [connectors.Failure] reason, so that /status shows the real one while
// autopaho retries: CredentialsRefused (CONNACK 0x86 bad user name or
// password, 0x87 not authorized, 0x8C bad authentication method),
// PermissionDenied (0x8A banned), BrokerUnreachable (a refused or timed out
// TCP connection, or CONNACK 0x88, 0x89, 0x9C, 0x9D), DNSFailure,
// TLSFailure, SecretUnavailable (the password file could not be read
// again before a connection), and ConnectionLost for anything else and for
// a connection that dropped. The password is read again before every
// connection (Config.Credentials), so a corrected or rotated one is used
// at the next reconnection. Start, when its context ends before the first connection
// is up, returns a *connectors.Failure with the last attempt's reason;
// SubscribeFailed is reported when the broker refuses a subscription.
//
// One failure is permanent: QoSNotSupported, a broker whose CONNACK caps
// the QoS (Maximum QoS) below the resource's. No retry meets another
// broker, so the runtime stops retrying until the resource's qos or the
// broker's configuration changes and the connector reloads.
//
// Metadata: the payload is carried unchanged; the MQTT 5 Content Type
// property maps to weida's content_type; W3C trace context travels in the
// user properties "traceparent" and "tracestate". A Source reports the
// retain flag in Message.Retained (it subscribes with Retain As Published,
// so a retained message published later keeps it), for a resource's
// last-value cache; a Sink sets it when Config.Retain asks. Everything else
// (message expiry, response topic, correlation data, other user
// properties, payload format), and retain on a resource without a
// last-value cache, is a loss the resource declares.
package mqtt

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/url"
	"sync"
	"sync/atomic"
	"time"

	"github.com/eclipse/paho.golang/autopaho"
	"github.com/eclipse/paho.golang/paho"

	"weida.dev/connector/connectors"
)

// LoopProperty is the MQTT user property that marks a message an outbound
// bridge published. An inbound bridge with the same marker value drops it,
// so that a message does not travel broker → weida → broker forever.
const LoopProperty = "x-weida-connector"

// Config configures one MQTT connection. The zero value of each field is
// the documented default.
type Config struct {
	// Host is the broker's host name or IP address (IPv6 without
	// brackets); required. Host, Port and TLS are the broker address
	// already parsed (package resources parses a resource's URL): the
	// driver connects to them as they are and parses no URL.
	Host string
	// Port is the broker's TCP port; zero means 1883, or 8883 with TLS.
	Port int
	// TLS, when not nil, secures the connection (mqtts): an empty
	// tls.Config means the system roots, and an empty ServerName means
	// Host. Nil means plain TCP.
	TLS      *tls.Config
	ClientID string // required: a persistent session is keyed by it
	Username string
	Password []byte
	// Credentials, when not nil, is called before every connection
	// autopaho makes, and its user name and password replace Username
	// and Password: a rotated or corrected secret is then used at the
	// next reconnection within the attempt, not only at the next
	// attempt. An error fails that connection with the reason
	// [connectors.FailSecretUnavailable], and autopaho tries again.
	Credentials func() (username string, password []byte, err error)
	// QoS is the subscription (inbound) or publish (outbound) QoS: 0 or 1.
	QoS byte
	// CleanStart discards the broker's session on the first connection.
	// Inbound bridges keep it false so that QoS 1 messages the broker held
	// while the connector was away are delivered.
	CleanStart bool
	// SessionExpiry is how long the broker keeps the session after a
	// disconnect; zero ends it with the connection.
	SessionExpiry time.Duration
	// SharedGroup, when set, subscribes $share/<group>/<filter> so that
	// replicas of one resource split the messages.
	SharedGroup string
	// Retain (a Sink's) publishes with the retain flag: the broker keeps
	// the last message of each topic for later subscribers.
	Retain bool
	// KeepAlive defaults to 30 s; ConnectTimeout to 10 s.
	KeepAlive      time.Duration
	ConnectTimeout time.Duration
	// Backoff is the wait before reconnect attempt n; nil means
	// exponential from 100 ms to 10 s.
	Backoff func(n int) time.Duration
	// LoopMarker is the value of [LoopProperty] this connector writes and
	// recognises; empty disables loop marking.
	LoopMarker string
	Logger     *slog.Logger
	// Now is the clock that paces reconnections (see
	// [connectors.Streak]); nil means time.Now.
	Now func() time.Time
}

// clientConfig builds autopaho's configuration. onConn, when not nil, is
// told about every new network connection; fails, when not nil, keeps why
// the last connection attempt failed.
//
// It fills autopaho's one configuration struct group by group (address,
// session, TLS, credentials, callbacks); the callbacks close over the same
// connection state, so it stays one function.
func (c *Config) clientConfig(report connectors.StateFunc, log *slog.Logger, onConn func(net.Conn), fails *lastFailure) (autopaho.ClientConfig, error) {
	if err := c.validate(); err != nil {
		return autopaho.ClientConfig{}, err
	}
	// autopaho wants a URL per server; AttemptConnection below reads only
	// its Host, so this one is built, never parsed.
	u := c.serverURL()
	keepAlive, connectTimeout, backoff := c.withDefaults()
	// The runtime's rule of stability paces autopaho's reconnections as
	// it paces attempts: see [connectors.Streak].
	streak := connectors.NewStreak(c.Now)
	var takenOver atomic.Bool // the broker said so (DISCONNECT 0x8E)
	cfg := autopaho.ClientConfig{
		ServerUrls:                    []*url.URL{u},
		KeepAlive:                     uint16(keepAlive / time.Second),
		CleanStartOnInitialConnection: c.CleanStart,
		SessionExpiryInterval:         uint32(c.SessionExpiry / time.Second),
		ConnectTimeout:                connectTimeout,
		// autopaho calls the backoff with 0 before the very first attempt.
		ReconnectBackoff: func(n int) time.Duration {
			d := time.Duration(0)
			if n > 0 {
				d = backoff(n)
			}
			return max(d, streak.Wait(backoff))
		},
		// Source and Sink wrap OnConnectionUp with their own work, which
		// they skip when the broker refused the configuration.
		OnConnectionUp: func(_ *autopaho.ConnectionManager, ca *paho.Connack) {
			streak.Up()
			err := c.refusedByConnack(ca)
			if fails != nil {
				fails.connected(err)
			}
			if err != nil {
				report(connectors.ConnState{Reason: reasonQoS, Detail: err.Error(), Lost: err})
			}
		},
		OnConnectionDown: func() bool {
			streak.Down()
			report(c.lostState(streak.Flaps(), takenOver.Swap(false), streak.Wait(backoff)))
			return true
		},
		AttemptConnection: func(ctx context.Context, _ autopaho.ClientConfig, u *url.URL) (net.Conn, error) {
			conn, err := dial(ctx, u.Host, c.TLS)
			if err == nil && onConn != nil {
				onConn(conn)
			}
			return conn, err
		},
		OnConnectError: func(err error) {
			f := connectFailure(err)
			if fails != nil {
				fails.set(f)
			}
			report(connectors.ConnState{Reason: f.Reason, Detail: err.Error()})
		},
		ConnectUsername: c.Username,
		ConnectPassword: c.Password,
		ConnectPacketBuilder: func(cp *paho.Connect, _ *url.URL) (*paho.Connect, error) {
			if c.Credentials == nil {
				return cp, nil
			}
			user, pw, err := c.Credentials()
			if err != nil {
				return nil, connectors.Retryable(connectors.FailSecretUnavailable, err)
			}
			cp.Username, cp.UsernameFlag = user, user != ""
			cp.Password, cp.PasswordFlag = pw, len(pw) > 0
			return cp, nil
		},
		ClientConfig: paho.ClientConfig{
			ClientID: c.ClientID,
			OnClientError: func(err error) {
				log.Warn("mqtt client error", "err", err)
			},
			OnServerDisconnect: func(d *paho.Disconnect) {
				if d.ReasonCode == sessionTakenOver {
					takenOver.Store(true)
				}
				report(connectors.ConnState{Reason: disconnectReason(d.ReasonCode), Detail: fmt.Sprintf("the broker disconnected: reason code 0x%02x %s", d.ReasonCode, reasonString(d))})
			},
		},
	}
	return cfg, nil
}

// validate refuses a Config no connection can be made with.
func (c *Config) validate() error {
	switch {
	case c.Host == "":
		return errors.New("mqtt: a broker host is required")
	case c.Port < 0 || c.Port > 65535:
		return fmt.Errorf("mqtt: broker port %d out of range 1–65535", c.Port)
	case c.ClientID == "":
		return errors.New("mqtt: a client id is required")
	case c.QoS > 1:
		return fmt.Errorf("mqtt: qos %d is not supported (0 or 1)", c.QoS)
	}
	return nil
}

// withDefaults returns the keep alive, connect timeout and backoff, their
// zero values replaced by the documented defaults.
func (c *Config) withDefaults() (keepAlive, connectTimeout time.Duration, backoff func(int) time.Duration) {
	keepAlive, connectTimeout, backoff = c.KeepAlive, c.ConnectTimeout, c.Backoff
	if keepAlive == 0 {
		keepAlive = 30 * time.Second
	}
	if connectTimeout == 0 {
		connectTimeout = 10 * time.Second
	}
	if backoff == nil {
		backoff = connectors.ExponentialBackoff(100*time.Millisecond, 10*time.Second)
	}
	return keepAlive, connectTimeout, backoff
}

// serverURL returns the broker's address as a URL without credentials,
// mqtt://host:port or mqtts://host:port (the schemes and default ports of
// [Driver]'s URL rules): what autopaho is given, and how logs and errors
// name the broker.
func (c *Config) serverURL() *url.URL {
	return Driver.URL().Address(c.Host, c.Port, c.TLS != nil)
}

// Reasons this driver reports, in the vocabulary of [connectors.Failure].
const (
	reasonCredentials = "CredentialsRefused"
	reasonPermission  = "PermissionDenied"
	reasonLost        = "ConnectionLost"
	reasonUnreachable = "BrokerUnreachable"
	reasonTLS         = "TLSFailure"
	reasonQoS         = "QoSNotSupported"
)

// refusedByConnack returns the permanent failure of a connection whose
// CONNACK says the broker cannot serve the resource as configured: its
// Maximum QoS (MQTT 5 §3.2.2.3.4) is below the resource's QoS. The broker
// would grant QoS 1 subscriptions at QoS 0, an at-most-once loss the
// resource did not declare, and disconnect at the first QoS 1 PUBLISH.
// Another attempt meets the same broker: only the resource's file (qos: 0,
// with its declared loss) or the broker's own configuration can change it,
// and a reload then tries again.
func (c *Config) refusedByConnack(ca *paho.Connack) error {
	if ca == nil || ca.Properties == nil || ca.Properties.MaximumQoS == nil || c.QoS <= *ca.Properties.MaximumQoS {
		return nil
	}
	most := *ca.Properties.MaximumQoS
	return connectors.Permanent(reasonQoS, fmt.Errorf(
		"mqtt: the broker %s takes at most QoS %d (its CONNACK's Maximum QoS) and the resource asks for QoS %d: set spec.broker.mqtt.qos: %d and declare the at-most-once loss, or raise the broker's maximum QoS, then reload",
		c.serverURL(), most, c.QoS, most))
}

// connectFailure classifies a failed connection attempt. The broker's
// CONNACK refusals: 0x86 bad user name or password, 0x87 not authorized
// and 0x8C bad authentication method are refused credentials; 0x8A banned
// is a permission; 0x88 server unavailable, 0x89 server busy and 0x9C/0x9D
// use or moved to another server mean this broker does not serve now.
// Otherwise the network failures every driver shares, and ConnectionLost
// for anything else.
func connectFailure(err error) *connectors.Failure {
	var f *connectors.Failure
	if errors.As(err, &f) {
		return f
	}
	var ce *autopaho.ConnackError
	if errors.As(err, &ce) {
		switch ce.ReasonCode {
		case 0x86, 0x87, 0x8C:
			return &connectors.Failure{Reason: reasonCredentials, Err: err}
		case 0x8A:
			return &connectors.Failure{Reason: reasonPermission, Err: err}
		case 0x88, 0x89, 0x9C, 0x9D:
			return &connectors.Failure{Reason: reasonUnreachable, Err: err}
		}
		return &connectors.Failure{Reason: reasonLost, Err: err}
	}
	if r := connectors.NetworkReason(err); r != "" {
		return &connectors.Failure{Reason: r, Err: err}
	}
	return &connectors.Failure{Reason: reasonLost, Err: err}
}

// disconnectReason names a DISCONNECT the broker sent: 0x87 not authorized
// and 0x8A banned say the connector may no longer be there; anything else
// (shutting down, session taken over, keep alive timeout) is a lost
// connection autopaho reconnects.
func disconnectReason(code byte) string {
	switch code {
	case 0x87, 0x8A:
		return reasonPermission
	}
	return reasonLost
}

// lastFailure keeps why the last connection attempt failed, for Start to
// return when its context ends before a connection is up, and whether the
// broker refused the configuration on the first connection that came up.
type lastFailure struct {
	mu      sync.Mutex
	f       *connectors.Failure
	up      chan struct{} // closed once the first connection's CONNACK is checked
	refused error         // the permanent failure of the first connection, if any
}

func newLastFailure() *lastFailure { return &lastFailure{up: make(chan struct{})} }

// connected records the check of a connection's CONNACK.
func (l *lastFailure) connected(refused error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	select {
	case <-l.up:
		return
	default:
	}
	l.refused = refused
	close(l.up)
}

// refusal is the permanent failure of the first connection once it is up
// (autopaho ends the wait for a connection before it reports the CONNACK),
// or nil; or ctx's error.
func (l *lastFailure) refusal(ctx context.Context) error {
	select {
	case <-l.up:
	case <-ctx.Done():
		return ctx.Err()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.refused
}

func (l *lastFailure) set(f *connectors.Failure) {
	l.mu.Lock()
	l.f = f
	l.mu.Unlock()
}

// startError is Start's error when waiting for the first connection ended
// with err: a *connectors.Failure with the last attempt's reason when one
// failed, err alone otherwise.
func (l *lastFailure) startError(url string, err error) error {
	l.mu.Lock()
	f := l.f
	l.mu.Unlock()
	err = fmt.Errorf("mqtt: connecting to %s: %w", url, err)
	if f == nil {
		return err
	}
	return connectors.Retryable(f.Reason, fmt.Errorf("%w; last attempt: %w", err, f.Err))
}

// sessionTakenOver is the DISCONNECT reason code a broker sends when another
// connection with the same client ID takes the session (MQTT 5 §3.14.2.1).
// Mosquitto 2.0 closes the older connection without sending it.
const sessionTakenOver = 0x8E

// lostState is the state to report when a connection is lost: flaps
// connections in a row came up and dropped within the runtime's
// [connectors.StableAfter], takenOver says whether the broker said another
// connection took the session, and wait is the pause before the next
// attempt. Both most often mean another client with the same client ID:
// autopaho reconnects at once after a connection that came up, so two
// clients with one ID would take the session from each other hundreds of
// times a second, were the reconnections not paced by the streak.
func (c *Config) lostState(flaps int, takenOver bool, wait time.Duration) connectors.ConnState {
	if flaps < 2 && !takenOver {
		return connectors.ConnState{Reason: reasonLost, Detail: "reconnecting"}
	}
	why := fmt.Sprintf("the connection dropped %d times in a row within %s of coming up", flaps, connectors.StableAfter)
	if takenOver {
		why = "the broker says another connection took the session"
	}
	return connectors.ConnState{Reason: reasonLost, Detail: fmt.Sprintf(
		"%s; if another client uses client ID %q (replicas sharing one file), give each its own clientID, e.g. name-${HOSTNAME}; reconnecting in %s",
		why, c.ClientID, wait.Round(time.Millisecond))}
}

func reasonString(d *paho.Disconnect) string {
	if d.Properties != nil {
		return d.Properties.ReasonString
	}
	return ""
}

// dial opens the TCP connection (TLS when tlsCfg is not nil) and puts a read buffer in front of
// it: paho reads packets a few bytes at a time, and without a buffer every
// read is a system call (measured in ../shared/reference/broker-baselines.md:
// about 15 % of QoS 1 throughput).
func dial(ctx context.Context, addr string, tlsCfg *tls.Config) (net.Conn, error) {
	var d net.Dialer
	var conn net.Conn
	var err error
	if tlsCfg != nil {
		td := tls.Dialer{NetDialer: &d, Config: tlsCfg}
		conn, err = td.DialContext(ctx, "tcp", addr)
	} else {
		conn, err = d.DialContext(ctx, "tcp", addr)
	}
	if err != nil {
		return nil, err
	}
	br := bufio.NewReaderSize(conn, 64<<10)
	if tc, ok := conn.(*tls.Conn); ok && tc.ConnectionState().Version == tls.VersionTLS13 {
		if err := tlsRefusal(tc, br); err != nil {
			conn.Close()
			return nil, err
		}
	}
	return &bufferedConn{Conn: conn, r: br}, nil
}

// tlsAlertWait is how long dial waits for a TLS 1.3 server to refuse the
// client's certificate.
const tlsAlertWait = 100 * time.Millisecond

// tlsRefusal reports the alert of a TLS 1.3 server that refused the
// session after the handshake. Such a server checks the client certificate
// (or its absence) only once the client has finished its side, and its
// alert shows only on the client's next read; without this wait paho would
// report merely that the connection closed. An MQTT broker sends nothing
// before CONNECT, so a read that times out means the session stands (a
// timeout does not spoil a tls.Conn), and Peek keeps anything it read.
func tlsRefusal(c *tls.Conn, br *bufio.Reader) error {
	if err := c.SetReadDeadline(time.Now().Add(tlsAlertWait)); err != nil {
		return err
	}
	_, err := br.Peek(1)
	if derr := c.SetReadDeadline(time.Time{}); derr != nil {
		return derr
	}
	var ne net.Error
	if err == nil || errors.As(err, &ne) && ne.Timeout() {
		return nil
	}
	return connectors.Retryable(reasonTLS, fmt.Errorf("the broker ended the TLS session after the handshake (a refused or missing client certificate?): %w", err))
}

// bufferedConn reads through a buffer and writes each MQTT packet whole.
//
// paho writes one packet as several slices (net.Buffers) and, when the
// connection implements sync.Locker, holds the lock around them
// (packets.ControlPacket.WriteTo). net.Buffers is written in one writev
// only on the net package's own connection types; on any wrapper it
// becomes one Write per slice, so without the lock the packets of
// concurrent writers (Sink writes, PUBACKs, PINGREQ) interleave and the
// broker closes the connection as malformed (0x81) or in error (0x82).
// Lock starts gathering a packet and Unlock sends it in one Write, which
// also saves the system calls the slices would cost.
//
// All of paho's writes go through ControlPacket.WriteTo, so Write is only
// ever called with the lock held.
type bufferedConn struct {
	net.Conn
	r *bufio.Reader

	mu  sync.Mutex
	pkt []byte // the packet being gathered; guarded by mu
	err error  // the first write error; guarded by mu
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// Lock starts a packet.
func (c *bufferedConn) Lock() { c.mu.Lock() }

// Write appends to the packet being gathered.
func (c *bufferedConn) Write(p []byte) (int, error) {
	if c.err != nil {
		return 0, c.err
	}
	c.pkt = append(c.pkt, p...)
	return len(p), nil
}

// Unlock sends the gathered packet. A failed write closes the connection,
// so that paho's reader fails and the connection is reported lost: Unlock
// has no way to return the error to the packet's writer.
func (c *bufferedConn) Unlock() {
	if len(c.pkt) > 0 && c.err == nil {
		if _, err := c.Conn.Write(c.pkt); err != nil {
			c.err = err
			c.Conn.Close()
		}
	}
	if cap(c.pkt) > 64<<10 {
		c.pkt = nil // do not keep a large payload's buffer
	} else {
		c.pkt = c.pkt[:0]
	}
	c.mu.Unlock()
}

func logger(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}

// userProperty returns the first value of key.
func userProperty(props *paho.PublishProperties, key string) string {
	if props == nil {
		return ""
	}
	for _, p := range props.User {
		if p.Key == key {
			return p.Value
		}
	}
	return ""
}
