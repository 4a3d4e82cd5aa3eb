package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"regexp"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
)

// UnroutableError is returned by [Sink.Write] when the broker accepted a
// message but no queue was bound to receive it (a mandatory publish came
// back with basic.return). It implements [connectors.Unroutable], so the
// runtime counts the message instead of retrying it.
type UnroutableError struct {
	Exchange   string
	RoutingKey string
	Code       uint16 // the AMQP reply code, 312 NO_ROUTE
	Reason     string // the broker's reply text
}

func (e *UnroutableError) Error() string {
	return fmt.Sprintf("amqp: exchange %q returned routing key %q: %d %s", e.Exchange, e.RoutingKey, e.Code, e.Reason)
}

// Unroutable implements [connectors.Unroutable].
func (e *UnroutableError) Unroutable() bool { return true }

// ErrNacked is wrapped by the error Write returns when the broker
// negatively confirmed a message (basic.nack): it could not take
// responsibility for it. The runtime retries it.
var ErrNacked = errors.New("amqp: the broker nacked the message")

// Sink publishes an outbound resource's messages to the topic exchange, with
// publisher confirms and the mandatory flag: Write returns once the broker
// has confirmed the message, which for a persistent message routed to a
// durable queue means it is on disk. Messages are published persistent
// (delivery mode 2).
//
// Write may be called from many goroutines at once; each waits for its own
// confirm, so the number of unconfirmed messages is the number of Writes
// under way, which the runtime bounds (spec.limits.inFlight). Publishes
// themselves are serialised on the one channel: confirms are matched to
// Writes by the channel's publish sequence number.
//
// A Sink has one connection for its life and does not reconnect: once the
// connection or its channel is lost, every Write (and every Write still
// waiting for a confirm) returns a [*connectors.Failure], and the runtime
// builds a new Sink after a backoff.
type Sink struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger

	lifecycle

	pub *publisher // set by Start before lifecycle.l; then read-only
}

// publisher is one confirming channel and the Writes waiting on it.
type publisher struct {
	*link
	sem chan struct{} // one token: serialises sequence number and publish

	mu      sync.Mutex
	waiting map[uint64]*waiter // by publish sequence number
}

type waiter struct {
	done     chan error // buffered 1; receives the outcome once
	returned *amqp.Return
	size     int // payload bytes, to tell which Writes a size refusal concerns
}

var _ connectors.Sink = (*Sink)(nil)

// NewSink returns a Sink for cfg; it connects on Start. report receives every
// change of the broker connection's state and must not block.
func NewSink(cfg Config, report connectors.StateFunc) (*Sink, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	return &Sink{cfg: cfg, report: report, log: cfg.logger(), lifecycle: newLifecycle()}, nil
}

// Start connects, declares the exchange (or checks it, with
// Config.ExchangePassive) and puts the channel in confirm mode, once. Its
// error is a [*connectors.Failure] when the reason is known, with the
// reasons of [Source.Start]. Start may be called once.
func (s *Sink) Start(ctx context.Context) error {
	cctx, done, err := s.begin(ctx, "Sink")
	if err != nil {
		return err
	}
	defer done()
	l, detail, err := s.cfg.connect(cctx, s.report, s.log, s.setup)
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return connectors.ErrClosed
		}
		err = fmt.Errorf("amqp: publishing to %s: %w", s.cfg.brokerURL(), err)
		reportStart(s.report, s.log, nil, "", err)
		return err
	}
	if err := s.install(ctx, l, s.cfg.connectTimeout()); err != nil {
		return err
	}
	reportStart(s.report, s.log, l, detail, nil)
	return nil
}

func (s *Sink) setup(l *link) (string, error) {
	p := &publisher{link: l, sem: make(chan struct{}, 1), waiting: make(map[uint64]*waiter)}
	// Listeners are registered before confirm mode, so that no confirm
	// or return can be missed.
	returns := l.ch.NotifyReturn(make(chan amqp.Return, 64))
	confirms := l.ch.NotifyPublish(make(chan amqp.Confirmation, 256))
	l.watch(s.log, nil, s.blocked)
	l.wg.Add(1)
	go p.settle(returns, confirms)
	if err := s.cfg.declareExchange(l.ch); err != nil {
		return "", err
	}
	if err := l.ch.Confirm(false); err != nil {
		return "", declareFailure(fmt.Errorf("amqp: confirm.select: %w", err))
	}
	s.pub = p
	return fmt.Sprintf("publishing to exchange %q with confirms", s.cfg.exchange()), nil
}

func (s *Sink) blocked(active bool, reason string) {
	if active {
		// Still connected (the condition stays true, and unblocking is
		// not a reconnection), but nothing is published until then.
		s.report(connectors.ConnState{Up: true, Reason: "Blocked", Detail: "connected, but the broker blocks publishing: " + reason})
		s.log.Warn("amqp: the broker blocks publishing", "reason", reason)
		return
	}
	s.report(connectors.ConnState{Up: true, Reason: "Connected", Detail: "the broker unblocked publishing"})
	s.log.Info("amqp: the broker unblocked publishing")
}

// settle matches the channel's confirms and returns to the Writes waiting on
// them. It drains both notification channels until the library closes them,
// then fails every Write still waiting.
//
// RabbitMQ sends a mandatory message's basic.return before its basic.ack,
// and the library's one reader goroutine hands both over in that order. So
// when a confirm arrives, its return (if any) is already in the returns
// buffer: draining that buffer first attributes it correctly.
func (p *publisher) settle(returns <-chan amqp.Return, confirms <-chan amqp.Confirmation) {
	defer p.wg.Done()
	for returns != nil || confirms != nil {
		select {
		case r, ok := <-returns:
			if !ok {
				returns = nil
				continue
			}
			p.returned(r)
		case c, ok := <-confirms:
			if !ok {
				confirms = nil
				continue
			}
			for drained := false; !drained && returns != nil; {
				select {
				case r, ok := <-returns:
					if !ok {
						returns = nil
						break
					}
					p.returned(r)
				default:
					drained = true
				}
			}
			p.confirmed(c)
		}
	}
	p.mu.Lock()
	waiting := p.waiting
	p.waiting = nil
	p.mu.Unlock()
	// The library closes the notifications when the channel ends; the
	// link's watcher records why at the same time.
	<-p.lost
	for _, w := range waiting {
		if err := rejection(p.why.err, w.size); err != nil {
			w.done <- err
			continue
		}
		w.done <- p.failure("the connection was lost before the broker confirmed the message")
	}
}

// maxSizeRefusal is how RabbitMQ words the channel error for a message over
// its max_message_size.
var maxSizeRefusal = regexp.MustCompile(`message size \d+ is larger than configured max size (\d+)`)

// rejection returns the rejection a channel closed by the broker with err
// means for an unconfirmed Write of size bytes, or nil when sending it
// again may succeed. RabbitMQ closes the channel, and drops what followed on
// it, when a publish is refused: 403 ACCESS_REFUSED (the user may not write
// to the exchange; every Write on the channel was for that exchange) and
// 406 PRECONDITION_FAILED over max_message_size (only the Writes that are
// too large).
func rejection(err error, size int) error {
	var ae *amqp.Error
	if !errors.As(err, &ae) || !ae.Server {
		return nil
	}
	switch ae.Code {
	case amqp.AccessRefused:
		return &connectors.RejectedError{Reason: connectors.ReasonPublishDenied, Err: fmt.Errorf("amqp: the broker refused the publish: %w", ae)}
	case amqp.PreconditionFailed:
		m := maxSizeRefusal.FindStringSubmatch(ae.Reason)
		if m == nil {
			return nil
		}
		if limit, perr := strconv.Atoi(m[1]); perr == nil && size > limit {
			return &connectors.RejectedError{Reason: connectors.ReasonTooLarge, Err: fmt.Errorf("amqp: the broker refused the publish: %w", ae)}
		}
	}
	return nil
}

func (p *publisher) returned(r amqp.Return) {
	seq, ok := r.Headers[SeqHeader].(int64)
	if !ok || seq <= 0 {
		return
	}
	p.mu.Lock()
	if w := p.waiting[uint64(seq)]; w != nil {
		w.returned = &r
	}
	p.mu.Unlock()
}

func (p *publisher) confirmed(c amqp.Confirmation) {
	p.mu.Lock()
	w := p.waiting[c.DeliveryTag]
	delete(p.waiting, c.DeliveryTag)
	p.mu.Unlock()
	switch {
	case w == nil:
		// Its Write gave up (context ended).
	case !c.Ack:
		w.done <- ErrNacked
	case w.returned != nil:
		r := w.returned
		w.done <- &UnroutableError{Exchange: r.Exchange, RoutingKey: r.RoutingKey, Code: r.ReplyCode, Reason: r.ReplyText}
	default:
		w.done <- nil
	}
}

// Write publishes m to the exchange with m.Topic as routing key and waits for
// the broker's confirm. It returns nil once the broker confirmed the message,
// an *[UnroutableError] when no queue was bound for it, an error wrapping
// [ErrNacked] when the broker refused it, a [connectors.Rejected] error when
// the broker closed the channel over it for good (403: the user may not
// write to the exchange; 406: over max_message_size), and an error wrapping
// [connectors.ErrNotConnected] while the broker blocks publishing (a memory
// or disk alarm; the connection stays). Once the connection or channel is
// lost it returns a [*connectors.Failure] (ConnectionLost, or
// PermissionDenied after a 403), also for a Write whose confirm had not
// arrived: the message may then have been delivered, and the runtime's
// retry makes delivery at least once. After Close it returns
// [connectors.ErrClosed].
func (s *Sink) Write(ctx context.Context, m *connectors.Message) error {
	select {
	case <-s.closed:
		return connectors.ErrClosed
	default:
	}
	if s.link() == nil {
		return fmt.Errorf("amqp: the Sink has not started: %w", connectors.ErrNotConnected)
	}
	p := s.pub
	lost := func() error { return p.failure("publish " + strconv.Quote(m.Topic)) }
	if p.isLost() {
		return lost()
	}
	if p.blocked.Load() {
		return fmt.Errorf("amqp: the broker blocks publishing: %w", connectors.ErrNotConnected)
	}
	select {
	case p.sem <- struct{}{}:
	case <-p.lost:
		return lost()
	case <-ctx.Done():
		return ctx.Err()
	}
	seq := p.ch.GetNextPublishSeqNo()
	w := &waiter{done: make(chan error, 1), size: len(m.Payload)}
	p.mu.Lock()
	if p.waiting == nil { // settle has ended: the channel is gone
		p.mu.Unlock()
		<-p.sem
		return p.waitLost(ctx, lost)
	}
	p.waiting[seq] = w
	p.mu.Unlock()
	err := p.ch.Publish(s.cfg.exchange(), m.Topic, true, false, s.publishing(m, seq))
	<-p.sem
	if err != nil {
		p.forget(seq)
		// amqp091 fails a publish when the channel is closed or the
		// connection cannot be written, which also ends the connection;
		// the watcher learns why a moment later.
		t := time.NewTimer(s.cfg.connectTimeout())
		defer t.Stop()
		select {
		case <-p.lost:
			return lost()
		case <-t.C:
			return fmt.Errorf("amqp: publish %q: %w", m.Topic, err)
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	select {
	case err := <-w.done:
		if errors.Is(err, ErrNacked) {
			return fmt.Errorf("amqp: publish %q: %w", m.Topic, err)
		}
		return err
	case <-ctx.Done():
		p.forget(seq)
		return ctx.Err()
	}
}

// waitLost returns lost's failure once the watcher has recorded why the
// channel is gone (the library reports a closed channel to a publish a
// moment before it tells the watcher).
func (p *publisher) waitLost(ctx context.Context, lost func() error) error {
	select {
	case <-p.lost:
		return lost()
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *publisher) forget(seq uint64) {
	p.mu.Lock()
	delete(p.waiting, seq)
	p.mu.Unlock()
}

// publishing maps m onto an AMQP message.
func (s *Sink) publishing(m *connectors.Message, seq uint64) amqp.Publishing {
	h := amqp.Table{SeqHeader: int64(seq)}
	if m.Traceparent != "" {
		h[headerTraceparent] = m.Traceparent
	}
	if m.Tracestate != "" {
		h[headerTracestate] = m.Tracestate
	}
	if s.cfg.LoopMarker != "" {
		h[LoopHeader] = s.cfg.LoopMarker
	}
	return amqp.Publishing{
		Headers:      h,
		ContentType:  m.ContentType,
		DeliveryMode: amqp.Persistent,
		Body:         m.Payload,
	}
}

// Close closes the connection, waiting up to ctx (and at most
// Config.ConnectTimeout) for the close handshake and the Sink's goroutines.
// Writes still waiting for a confirm return [connectors.ErrClosed]. Close
// may be called more than once.
func (s *Sink) Close(ctx context.Context) error { return s.close(ctx, s.cfg.connectTimeout(), nil) }
