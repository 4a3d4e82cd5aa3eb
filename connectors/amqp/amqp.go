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
// The zero value of each field is the documented default; URL is required.
// A Config is copied by NewSource and NewSink and not modified afterwards.
type Config struct {
	// URL is amqp://host[:port][/vhost] or amqps://host[:port][/vhost].
	// The path is the virtual host, percent-encoded ("/" or no path: the
	// default vhost "/"). Credentials belong in Username and Password; when
	// Username is empty the URL's user information applies, and without
	// any the library's default (guest).
	URL      string
	Username string
	// Password is the resolved secret; it is sent with SASL PLAIN and
	// never logged.
	Password string
	// TLS is used for amqps://; nil means the system roots and the URL's
	// host as server name. It is cloned for every connection attempt.
	TLS *tls.Config

	// Exchange is the topic exchange routes bind to (Source) or publish to
	// (Sink); "" means amq.topic. It is declared, on every connection, as
	// a durable topic exchange: created when missing, accepted when it
	// exists so, refused by the broker (reported, and retried) when it
	// exists as another type or durability, or is a missing name under
	// the reserved prefix "amq.".
	Exchange string
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
	// Backoff is the wait before reconnect attempt n (n ≥ 1); nil means
	// exponential from 100 ms to 10 s.
	Backoff func(n int) time.Duration
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
	// it; Durable, Exclusive and Quorum are then ignored. A queue that does
	// not exist is reported as DeclareFailed until it does.
	Passive bool
}

func (c *Config) validate() error {
	if c.URL == "" {
		return errors.New("amqp: a broker URL is required")
	}
	uri, err := amqp.ParseURI(c.URL)
	if err != nil {
		return fmt.Errorf("amqp: broker url: %w", err)
	}
	if uri.Scheme != "amqp" && uri.Scheme != "amqps" {
		return fmt.Errorf("amqp: broker url: scheme %q, want amqp or amqps", uri.Scheme)
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

func (c *Config) backoff(n int) time.Duration {
	if c.Backoff != nil {
		return c.Backoff(n)
	}
	return connectors.ExponentialBackoff(100*time.Millisecond, 10*time.Second)(n)
}

func (c *Config) logger() *slog.Logger {
	if c.Logger == nil {
		return slog.New(slog.DiscardHandler)
	}
	return c.Logger
}

// declareExchange declares the configured exchange as a durable topic
// exchange. RabbitMQ answers declare-ok when it exists with those
// properties (amq.topic does), creates it when it does not (except names
// under the reserved prefix amq.: 403 ACCESS_REFUSED), and refuses with 406
// PRECONDITION_FAILED when it exists as another type or durability, which
// a passive declaration would not notice: topic binding keys on a direct
// exchange would silently match only themselves.
func (c *Config) declareExchange(ch *amqp.Channel) error {
	name := c.exchange()
	if err := ch.ExchangeDeclare(name, amqp.ExchangeTopic, true, false, false, false, nil); err != nil {
		return fmt.Errorf("amqp: declare topic exchange %q: %w", name, err)
	}
	return nil
}

// ---- one connection and its channel ----

// link is one AMQP connection with the one channel the driver uses on it.
// It is lost at most once: when the connection or the channel closes, the
// consumer is cancelled by the broker, or the owner tears it down.
type link struct {
	conn *amqp.Connection
	ch   *amqp.Channel

	lostOnce sync.Once
	lost     chan struct{} // closed when the link is lost
	why      lossReason    // written once, before lost is closed

	blocked atomic.Bool // connection.blocked received and not yet unblocked
	wg      sync.WaitGroup
}

// lossReason says why a link ended, for status and logs.
type lossReason struct {
	reason string // ConnState.Reason
	err    error
}

// errStopping ends a link its owner tears down on purpose.
var errStopping = errors.New("amqp: closing")

func (l *link) markLost(reason string, err error) {
	l.lostOnce.Do(func() {
		l.why = lossReason{reason: reason, err: err}
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
	conn, err := amqp.DialConfig(c.URL, acfg)
	if stopAbort != nil {
		stopAbort()
	}
	if err != nil {
		return nil, fmt.Errorf("amqp: connect to %s: %w", redactURL(c.URL), err)
	}
	ch, err := conn.Channel()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("amqp: open channel: %w", err)
	}
	return &link{conn: conn, ch: ch, lost: make(chan struct{})}, nil
}

// redactURL removes user information from u for messages.
func redactURL(u string) string {
	uri, err := amqp.ParseURI(u)
	if err != nil {
		return "the broker"
	}
	return fmt.Sprintf("%s://%s", uri.Scheme, net.JoinHostPort(uri.Host, fmt.Sprint(uri.Port)))
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
	l.wg.Add(1)
	go func() {
		defer l.wg.Done()
		for connClose != nil || chClose != nil || blocks != nil || cancels != nil {
			select {
			case err, ok := <-connClose:
				if !ok {
					connClose = nil
					l.markLost("ConnectionLost", errors.New("connection closed"))
					continue
				}
				l.markLost("ConnectionLost", err)
			case err, ok := <-chClose:
				if !ok {
					chClose = nil
					l.markLost("ChannelClosed", errors.New("channel closed"))
					continue
				}
				l.markLost("ChannelClosed", err)
			case tag, ok := <-cancels:
				if !ok {
					cancels = nil
					continue
				}
				log.Warn("amqp: the broker cancelled the consumer (was the queue deleted?); reconnecting", "consumer", tag)
				l.markLost("ConsumerCancelled", fmt.Errorf("the broker cancelled consumer %q; the queue may have been deleted", tag))
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

// close tears the link down within timeout and waits for its watchers.
func (l *link) close(timeout time.Duration) {
	l.markLost("Closing", errStopping)
	if !l.conn.IsClosed() {
		_ = l.conn.CloseDeadline(time.Now().Add(timeout))
	}
	l.wg.Wait()
}

// ---- supervision ----

// supervisor keeps one link up: it connects, lets its owner declare and
// subscribe, waits until the link is lost, and starts over with backoff,
// until its context ends. It reports every change through report.
type supervisor struct {
	cfg    *Config
	report connectors.StateFunc
	log    *slog.Logger

	// setup declares what the owner needs on a fresh link and starts its
	// watchers; it returns the detail for the Connected state.
	setup func(ctx context.Context, l *link) (detail string, err error)
	// up publishes a ready link to the owner; down withdraws it (called
	// before the link is closed).
	up, down func(l *link)

	first chan struct{} // closed at the first successful setup
	done  chan struct{} // closed when run returns
}

func (sv *supervisor) run(ctx context.Context) {
	defer close(sv.done)
	firstUp := false
	for attempt := 0; ; attempt++ {
		if attempt > 0 && !sleep(ctx, sv.cfg.backoff(attempt)) {
			return
		}
		l, err := sv.cfg.dial(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			sv.report(connectors.ConnState{Reason: "ConnectFailed", Detail: err.Error()})
			sv.log.Warn("amqp: connecting failed; retrying", "err", err, "attempt", attempt+1)
			continue
		}
		detail, err := sv.setup(ctx, l)
		if err != nil {
			l.close(sv.cfg.connectTimeout())
			if ctx.Err() != nil {
				return
			}
			sv.report(connectors.ConnState{Reason: "DeclareFailed", Detail: err.Error()})
			sv.log.Warn("amqp: declaring on the broker failed; retrying", "err", err, "attempt", attempt+1)
			continue
		}
		sv.up(l)
		if l.blocked.Load() {
			// connection.blocked arrived during setup; the watcher
			// reports the unblocking.
			sv.report(connectors.ConnState{Up: true, Reason: "Blocked", Detail: "connected, but the broker blocks publishing"})
		} else {
			sv.report(connectors.ConnState{Up: true, Reason: "Connected", Detail: detail})
		}
		sv.log.Info("amqp: connected", "detail", detail)
		if !firstUp {
			firstUp = true
			close(sv.first)
		}
		select {
		case <-l.lost:
		case <-ctx.Done():
		}
		sv.down(l)
		l.close(sv.cfg.connectTimeout())
		if ctx.Err() != nil {
			return
		}
		why := l.why
		sv.report(connectors.ConnState{Reason: why.reason, Detail: fmt.Sprint(why.err)})
		sv.log.Warn("amqp: connection lost; reconnecting", "reason", why.reason, "err", why.err)
		attempt = 0 // the next pass waits backoff(1)
	}
}

func sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
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
// once, and Close stops the supervisor Start began and waits for it.
type lifecycle struct {
	closed    chan struct{} // closed by Close
	closeOnce sync.Once

	startMu sync.Mutex // guards started, cancel and sv
	started bool
	cancel  context.CancelFunc // ends the supervisor; nil before start
	sv      *supervisor
}

func newLifecycle() lifecycle { return lifecycle{closed: make(chan struct{})} }

// start runs sv until close, and waits for its first connection, for the
// lifecycle to close, or for ctx. what names the side in errors ("Source",
// "consuming from") and url is redacted.
func (l *lifecycle) start(ctx context.Context, side, doing, url string, sv *supervisor) error {
	l.startMu.Lock()
	if l.started {
		l.startMu.Unlock()
		return fmt.Errorf("amqp: %s started twice", side)
	}
	select {
	case <-l.closed:
		l.startMu.Unlock()
		return connectors.ErrClosed
	default:
	}
	l.started = true
	runCtx, cancel := context.WithCancel(context.Background())
	l.cancel, l.sv = cancel, sv
	// Started under the lock, so that a concurrent close either stops
	// start here or finds the supervisor to wait for.
	go sv.run(runCtx)
	l.startMu.Unlock()
	select {
	case <-sv.first:
		return nil
	case <-l.closed:
		return connectors.ErrClosed
	case <-ctx.Done():
		return fmt.Errorf("amqp: %s %s: %w", doing, redactURL(url), ctx.Err())
	}
}

// close closes the lifecycle and waits up to ctx for the supervisor.
func (l *lifecycle) close(ctx context.Context) error {
	var err error
	l.closeOnce.Do(func() {
		close(l.closed)
		l.startMu.Lock()
		cancel, sv := l.cancel, l.sv
		l.startMu.Unlock()
		if cancel == nil {
			return
		}
		cancel()
		select {
		case <-sv.done:
		case <-ctx.Done():
			err = fmt.Errorf("amqp: closing: %w", ctx.Err())
		}
	})
	return err
}
