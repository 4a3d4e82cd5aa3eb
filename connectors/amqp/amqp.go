package amqp

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
)

// LoopHeader is the message header that marks a message an outbound bridge
// published. An inbound bridge whose marker has the same value reports the
// message as looped, so that it does not travel broker → weida → broker
// forever.
const LoopHeader = "x-weida-connector"

// SeqHeader is the header a [Sink] writes on every message: the publish
// sequence number on its channel. A returned (unroutable) message carries its
// headers back, and this one says which publish it was; RabbitMQ sends
// basic.return without a delivery tag. Consumers may ignore it.
const SeqHeader = "x-weida-seq"

// Trace context headers, as the W3C names them.
const (
	headerTraceparent = "traceparent"
	headerTracestate  = "tracestate"
)

// DefaultExchange is the exchange used when Config.Exchange is empty.
const DefaultExchange = "amq.topic"

// DefaultPrefetch is the prefetch used when Config.Prefetch is zero.
const DefaultPrefetch = 256

// Config configures one AMQP 0-9-1 connection, for a [Source] or a [Sink].
// The zero value of each field is the documented default; Host is required.
// A Config is copied by NewSource and NewSink and not modified afterwards.
type Config struct {
	// Host is the broker's host name or IP address (IPv6 without
	// brackets); required. Host, Port, VHost and TLS are the broker
	// address already parsed (package resources parses a resource's URL):
	// the driver connects to them as they are and parses no URL.
	Host string
	// Port is the broker's TCP port; zero means 5672, or 5671 with TLS.
	Port int
	// VHost is the virtual host, as RabbitMQ names it (not escaped); ""
	// means the default virtual host "/".
	VHost string
	// TLS, when not nil, secures the connection (amqps): an empty
	// tls.Config means the system roots, and an empty ServerName means
	// Host. Nil means plain TCP. It is cloned for every connection attempt.
	TLS *tls.Config
	// Username and Password are sent with SASL PLAIN; an empty Username
	// means the library's default user (guest). The password is the
	// resolved secret and is never logged.
	Username string
	Password string

	// Exchange is the topic exchange routes bind to (Source) or publish to
	// (Sink); "" means amq.topic. Start declares it as a durable topic
	// exchange: created when missing, accepted when it exists so, refused
	// by the broker (Start fails with DeclarationRefused) when it exists as
	// another type or durability, or is a missing name under the reserved
	// prefix "amq.".
	Exchange string
	// ExchangePassive uses Exchange as it was declared instead of
	// declaring it (exchange.declare passive): it must exist, whatever its
	// properties, and Start fails with DeclarationRefused when it does not.
	// For an exchange that the operator owns and the connector's user may
	// not declare.
	ExchangePassive bool
	// Queue is the queue a Source consumes; a Sink ignores it.
	Queue Queue
	// Prefetch bounds the deliveries a Source holds unacknowledged (AMQP
	// basic.qos): the backpressure bound of an inbound bridge. Zero means
	// [DefaultPrefetch]; at most 65535.
	Prefetch int

	// ConnectionName is the connection_name client property, which
	// RabbitMQ shows in its management UI and `rabbitmqctl
	// list_connections`.
	ConnectionName string
	// LoopMarker is the value of [LoopHeader] a Sink writes and a Source
	// recognises; empty disables loop marking.
	LoopMarker string

	// Heartbeat is the AMQP heartbeat interval; zero means 10 s. A silent
	// peer is declared lost after about three intervals.
	Heartbeat time.Duration
	// ConnectTimeout bounds the TCP, TLS and AMQP handshakes of one
	// attempt, and closing a connection; zero means 10 s.
	ConnectTimeout time.Duration
	// Logger receives the driver's logs; nil discards them.
	Logger *slog.Logger

	// dialed, when set (tests only), is told about every new network
	// connection, so that a test can cut it.
	dialed func(net.Conn)
}

// Queue is the queue a [Source] consumes.
//
// A named durable queue outlives the connector and RabbitMQ restarts: what
// arrives while no connector consumes it waits there. An empty Name asks
// RabbitMQ to name the queue; such a queue is exclusive to one connection
// and deleted with it, so whatever is published while the connector is
// disconnected is lost.
type Queue struct {
	// Name is the queue's name; "" asks the broker for a fresh exclusive
	// queue on every connection.
	Name string
	// Durable makes the queue (and its bindings) survive a broker
	// restart. It needs a Name and excludes Exclusive.
	Durable bool
	// Exclusive makes the queue private to the connector's connection and
	// deletes it when the connection ends. Always true when Name is "".
	Exclusive bool
	// Quorum declares a quorum queue (x-queue-type: quorum), which
	// RabbitMQ replicates across a cluster's nodes. It needs a Name and
	// Durable, and excludes Exclusive.
	Quorum bool
	// Passive uses the existing queue Name as it was declared, whatever
	// its type and arguments (queue.declare passive), instead of declaring
	// it; Durable, Exclusive and Quorum are then ignored. When the queue
	// does not exist, Start fails with DeclarationRefused.
	Passive bool
}

func (c *Config) validate() error {
	if c.Host == "" {
		return errors.New("amqp: a broker host is required")
	}
	if c.Port < 0 || c.Port > 65535 {
		return fmt.Errorf("amqp: broker port %d out of range 1–65535", c.Port)
	}
	if c.Queue.Name == "" && c.Queue.Durable {
		return errors.New("amqp: a durable queue needs a name")
	}
	if c.Queue.Durable && c.Queue.Exclusive {
		return fmt.Errorf("amqp: queue %q cannot be both durable and exclusive: an exclusive queue is deleted with its connection", c.Queue.Name)
	}
	if c.Queue.Passive && c.Queue.Name == "" {
		return fmt.Errorf("amqp: a passive queue needs a name")
	}
	if c.Queue.Quorum && !c.Queue.Passive && (c.Queue.Name == "" || !c.Queue.Durable || c.Queue.Exclusive) {
		return fmt.Errorf("amqp: a quorum queue must be named, durable and not exclusive")
	}
	if strings.HasPrefix(c.Queue.Name, "amq.") {
		return fmt.Errorf("amqp: queue %q: the prefix amq. is reserved by the broker", c.Queue.Name)
	}
	if c.Prefetch < 0 || c.Prefetch > 65535 {
		return fmt.Errorf("amqp: prefetch %d out of range 0–65535", c.Prefetch)
	}
	if len(c.exchange()) > 255 {
		return fmt.Errorf("amqp: exchange name longer than 255 bytes")
	}
	return nil
}

func (c *Config) exchange() string {
	if c.Exchange == "" {
		return DefaultExchange
	}
	return c.Exchange
}

func (c *Config) prefetch() int {
	if c.Prefetch == 0 {
		return DefaultPrefetch
	}
	return c.Prefetch
}

func (c *Config) connectTimeout() time.Duration {
	if c.ConnectTimeout > 0 {
		return c.ConnectTimeout
	}
	return 10 * time.Second
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// declareExchange declares the configured exchange. By default it declares
// a durable topic exchange: RabbitMQ answers declare-ok when it exists with
// those properties (amq.topic does), creates it when it does not (except
// names under the reserved prefix amq.: 403 ACCESS_REFUSED), and refuses
// with 406 PRECONDITION_FAILED when it exists as another type or
// durability, which a passive declaration would not notice: topic binding
// keys on a direct exchange would silently match only themselves. With
// ExchangePassive it only checks that the exchange exists (404 NOT_FOUND
// otherwise), whatever it was declared as.
func (c *Config) declareExchange(ch *amqp.Channel) error {
	name := c.exchange()
	if c.ExchangePassive {
		if err := ch.ExchangeDeclarePassive(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
			return declareFailure(fmt.Errorf("amqp: exchange %q (passive: it must exist): %w", name, err))
		}
		return nil
	}
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return declareFailure(fmt.Errorf("amqp: declare topic exchange %q: %w", name, err))
	}
	return nil
}

// Reasons this driver reports, in the vocabulary of [connectors.Failure].
const (
	reasonCredentials = "CredentialsRefused"
	reasonPermission  = "PermissionDenied"
	reasonDeclaration = "DeclarationRefused"
	reasonLost        = "ConnectionLost"
	reasonConsumer    = "ConsumerMissing"
)

// dialFailure classifies an error of connecting: the broker refusing the
// login (403 ACCESS_REFUSED, or the socket closed during the handshake,
// which amqp091 reports as the same code) or the virtual host (530
// NOT_ALLOWED), and the network failures every driver shares.
func dialFailure(err error) error {
	var ae *amqp.Error
	switch {
	case errors.Is(err, amqp.ErrVhost):
		return connectors.Retryable(reasonPermission, err)
	case errors.As(err, &ae) && ae.Code == amqp.AccessRefused:
		return connectors.Retryable(reasonCredentials, err)
	case errors.As(err, &ae) && ae.Code == amqp.NotAllowed:
		return connectors.Retryable(reasonPermission, err)
	}
	return connectors.ClassifyNetwork(err)
}

// declareFailure classifies an error of a declaration, binding, basic.qos,
// basic.consume or confirm.select. The broker refusing it (404 NOT_FOUND
// for a passive declaration of a missing name, 403 ACCESS_REFUSED, 405
// RESOURCE_LOCKED for another connection's exclusive queue, 406
// PRECONDITION_FAILED for different properties) is DeclarationRefused:
// retried, since the fix is on the broker. Anything else means the
// connection went away meanwhile.
func declareFailure(err error) error {
	var ae *amqp.Error
	if errors.As(err, &ae) && ae.Server {
		switch ae.Code {
		case amqp.NotFound, amqp.AccessRefused, amqp.ResourceLocked, amqp.PreconditionFailed:
			return connectors.Retryable(reasonDeclaration, err)
		}
	}
	return connectors.Retryable(reasonLost, err)
}

// ---- one connection and its channel ----

// link is one AMQP connection with the one channel the driver uses on it,
// for the whole life of a Source or Sink: the driver does not reconnect.
// It is lost at most once: when the connection or the channel closes, the
// consumer is cancelled by the broker, or the owner tears it down.
type link struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	// onLost, when set before watch, is told once why the link was lost,
	// unless its owner tore it down. It must not block.
	onLost func(reason string, err error)

	lostOnce sync.Once
	lost     chan struct{} // closed when the link is lost
	why      lossReason    // written once, before lost is closed

	blocked atomic.Bool // connection.blocked received and not yet unblocked
	wg      sync.WaitGroup
}

// lossReason says why a link ended.
type lossReason struct {
	reason string // a connectors.Failure reason
	err    error
}

// errStopping ends a link its owner tears down on purpose.
var errStopping = errors.New("amqp: closing")

func (l *link) markLost(reason string, err error) {
	l.lostOnce.Do(func() {
		l.why = lossReason{reason: reason, err: err}
		// Reported first, so that the state is in place when Read or
		// Write return the failure.
		if err != errStopping && l.onLost != nil {
			l.onLost(reason, err)
		}
		close(l.lost)
	})
}

func (l *link) isLost() bool {
	select {
	case <-l.lost:
		return true
	default:
		return false
	}
}

// failure is the error of an operation the lost link could not do; valid
// once lost is closed. what says what did not happen.
func (l *link) failure(what string) error {
	if l.why.err == errStopping {
		return connectors.ErrClosed
	}
	return connectors.Retryable(l.why.reason, fmt.Errorf("amqp: %s: %w", what, l.why.err))
}

// dial opens a connection and a channel. A cancelled ctx aborts the TCP
// connect and the handshake.
func (c *Config) dial(ctx context.Context) (*link, error) {
	timeout := c.connectTimeout()
	var stopAbort func() bool
	acfg := amqp.Config{
		Heartbeat:  c.Heartbeat,
		Properties: amqp.NewConnectionProperties(),
		Dial: func(network, addr string) (net.Conn, error) {
			d := net.Dialer{Timeout: timeout}
			conn, err := d.DialContext(ctx, network, addr)
			if err != nil {
				return nil, err
			}
			// The library clears this deadline once the AMQP handshake is
			// done; until then it bounds TLS and AMQP negotiation.
			if err := conn.SetDeadline(time.Now().Add(timeout)); err != nil {
				conn.Close()
				return nil, err
			}
			if c.dialed != nil {
				c.dialed(conn)
			}
			cc := newCoalescingConn(conn)
			stopAbort = context.AfterFunc(ctx, func() { cc.Close() })
			return cc, nil
		},
	}
	if c.ConnectionName != "" {
		acfg.Properties.SetClientConnectionName(c.ConnectionName)
	}
	if c.TLS != nil {
		acfg.TLSClientConfig = c.TLS.Clone()
	}
	if c.Username != "" {
		acfg.SASL = []amqp.Authentication{&amqp.PlainAuth{Username: c.Username, Password: c.Password}}
	}
	// The library dials only a URL string. This one carries the address
	// alone, built from the parsed fields: the virtual host goes in
	// acfg.Vhost, so that no escaping stands between it and the broker.
	acfg.Vhost = c.vhost()
	conn, err := amqp.DialConfig(c.brokerURL(), acfg)
	if err != nil {
		if stopAbort != nil {
			stopAbort()
		}
		return nil, fmt.Errorf("amqp: connect to %s: %w", c.brokerURL(), err)
	}
	// Opening the channel takes no context either: ctx still closes the
	// socket under it until it is open.
	ch, err := conn.Channel()
	if stopAbort != nil {
		stopAbort()
	}
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("amqp: open channel: %w", err)
	}
	return &link{conn: conn, ch: ch, lost: make(chan struct{})}, nil
}

// brokerURL returns the broker's address as a URL without credentials or
// virtual host, amqp://host:port or amqps://host:port (the schemes and
// default ports of [Driver]'s URL rules): what the library dials, and how
// logs and errors name the broker.
func (c *Config) brokerURL() string {
	return Driver.URL().Address(c.Host, c.Port, c.TLS != nil).String()
}

// vhost returns the virtual host to open.
func (c *Config) vhost() string {
	if c.VHost == "" {
		return "/"
	}
	return c.VHost
}

// closeReason names the loss of a channel or connection the broker (or the
// network) closed: a 403 means the user may not do what it just tried.
func closeReason(err *amqp.Error) string {
	if err != nil && err.Server && err.Code == amqp.AccessRefused {
		return reasonPermission
	}
	return reasonLost
}

// watch starts the goroutine that drains the connection's and channel's
// notifications for as long as the library keeps them open: a notify
// channel nobody reads can wedge the library's reader. The first close,
// consumer cancellation (cancels may be nil) or teardown marks the link
// lost; blocked is called when the broker blocks or unblocks publishing
// (nil: ignored).
func (l *link) watch(log *slog.Logger, cancels chan string, blocked func(bool, string)) {
	connClose := l.conn.NotifyClose(make(chan *amqp.Error, 1))
	chClose := l.ch.NotifyClose(make(chan *amqp.Error, 1))
	blocks := l.conn.NotifyBlocked(make(chan amqp.Blocking, 4))
	lose := func(what string, err *amqp.Error) {
		if err == nil {
			l.markLost(reasonLost, errors.New(what+" closed"))
			return
		}
		l.markLost(closeReason(err), fmt.Errorf("%s closed: %w", what, err))
	}
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for connClose != nil || chClose != nil || blocks != nil || cancels != nil {
			select {
			case err, ok := <-connClose:
				if !ok {
					connClose = nil
				}
				lose("connection", err)
			case err, ok := <-chClose:
				if !ok {
					chClose = nil
				}
				lose("channel", err)
			case tag, ok := <-cancels:
				if !ok {
					cancels = nil
					continue
				}
				log.Warn("amqp: the broker cancelled the consumer (was the queue deleted?)", "consumer", tag)
				l.markLost(reasonConsumer, fmt.Errorf("the broker cancelled consumer %q; the queue may have been deleted", tag))
			case b, ok := <-blocks:
				if !ok {
					blocks = nil
					continue
				}
				l.blocked.Store(b.Active)
				if blocked != nil {
					blocked(b.Active, b.Reason)
				}
			}
		}
	}()
}

// close tears the link down, waiting for the close handshake up to timeout
// or ctx's deadline, whichever is first, and then for its watchers.
func (l *link) close(ctx context.Context, timeout time.Duration) error {
	l.markLost("Closing", errStopping)
	deadline := time.Now().Add(timeout)
	if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
		deadline = d
	}
	if !l.conn.IsClosed() {
		_ = l.conn.CloseDeadline(deadline)
	}
	// The watchers end once the library closes their notifications,
	// which it does when the connection is gone.
	l.wg.Wait()
	return nil
}

// connect dials, lets setup declare what the owner needs on the fresh
// link, and returns the link with setup's detail for the Connected state.
// The link's losses are reported through report. Errors are
// *connectors.Failure values where the reason is known.
func (c *Config) connect(ctx context.Context, report connectors.StateFunc, log *slog.Logger,
	setup func(l *link) (string, error)) (*link, string, error) {
	l, err := c.dial(ctx)
	if err != nil {
		return nil, "", dialFailure(err)
	}
	l.onLost = func(reason string, err error) {
		report(connectors.ConnState{Reason: reason, Detail: err.Error(), Lost: connectors.Retryable(reason, err)})
		log.Warn("amqp: connection lost; the runtime starts a new one", "reason", reason, "err", err)
	}
	// The declarations, bindings and consume of setup take no context
	// either, and a broker may leave one unanswered (a quorum queue without
	// its majority): closing the connection is how ctx, the runtime's bound
	// on Start, cuts them short.
	stop := context.AfterFunc(ctx, func() { _ = l.conn.Close() })
	detail, err := setup(l)
	if !stop() && err == nil {
		err = fmt.Errorf("amqp: setting up: %w", context.Cause(ctx))
	}
	if err != nil {
		l.close(context.WithoutCancel(ctx), c.connectTimeout())
		return nil, "", err
	}
	return l, detail, nil
}

// reportStart reports the outcome of Start: the failure's reason, or
// Connected (Blocked when the broker blocked publishing meanwhile).
func reportStart(report connectors.StateFunc, log *slog.Logger, l *link, detail string, err error) {
	if err != nil {
		reason := "ConnectFailed"
		var f *connectors.Failure
		if errors.As(err, &f) {
			reason = f.Reason
		}
		report(connectors.ConnState{Reason: reason, Detail: err.Error()})
		return
	}
	if l.blocked.Load() {
		// connection.blocked arrived during setup; the watcher reports
		// the unblocking.
		report(connectors.ConnState{Up: true, Reason: "Blocked", Detail: "connected, but the broker blocks publishing"})
	} else {
		report(connectors.ConnState{Up: true, Reason: "Connected", Detail: detail})
	}
	log.Info("amqp: connected", "detail", detail)
}

// ---- metadata ----

// headerString returns the header key as a string when it holds one (AMQP
// long strings decode as string; byte arrays as []byte).
func headerString(h amqp.Table, key string) string {
	switch v := h[key].(type) {
	case string:
		return v
	case []byte:
		return string(v)
	}
	return ""
}

// lifecycle is what a Source and a Sink share: Start runs once, Close runs
// once, and Close tears down the link Start made.
type lifecycle struct {
	closed    chan struct{} // closed by Close
	closeOnce sync.Once
	stopCtx   context.Context // ends when Close starts; aborts a Start under way
	stop      context.CancelFunc

	mu      sync.Mutex // guards started and l
	started bool
	l       *link // nil until Start succeeds
}

func newLifecycle() lifecycle {
	ctx, cancel := context.WithCancel(context.Background())
	return lifecycle{closed: make(chan struct{}), stopCtx: ctx, stop: cancel}
}

// begin marks the lifecycle started and returns the context Start connects
// with: ctx, also ended by Close. side names the Source or Sink in errors.
func (lc *lifecycle) begin(ctx context.Context, side string) (context.Context, context.CancelFunc, error) {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	if lc.started {
		return nil, nil, fmt.Errorf("amqp: %s started twice", side)
	}
	select {
	case <-lc.closed:
		return nil, nil, connectors.ErrClosed
	default:
	}
	lc.started = true
	cctx, cancel := context.WithCancel(ctx)
	stop := context.AfterFunc(lc.stopCtx, cancel)
	return cctx, func() { stop(); cancel() }, nil
}

// install makes l the lifecycle's link, or tears it down when Close ran
// meanwhile (Close then found no link to close).
func (lc *lifecycle) install(ctx context.Context, l *link, timeout time.Duration) error {
	lc.mu.Lock()
	select {
	case <-lc.closed:
		lc.mu.Unlock()
		l.close(context.WithoutCancel(ctx), timeout)
		return connectors.ErrClosed
	default:
	}
	lc.l = l
	lc.mu.Unlock()
	return nil
}

func (lc *lifecycle) link() *link {
	lc.mu.Lock()
	defer lc.mu.Unlock()
	return lc.l
}

// close closes the lifecycle once; before tears down its link (if any) runs
// first while the link is still up.
func (lc *lifecycle) close(ctx context.Context, timeout time.Duration, before func(*link)) error {
	var err error
	lc.closeOnce.Do(func() {
		close(lc.closed)
		lc.stop()
		l := lc.link()
		if l == nil {
			return
		}
		if before != nil && !l.isLost() {
			before(l)
		}
		err = l.close(ctx, timeout)
	})
	return err
}
