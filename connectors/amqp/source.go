package amqp

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
)

// Source consumes an inbound resource's queue: it declares the queue, binds
// it to the exchange once per route binding key, and consumes it with manual
// acknowledgements, at most Config.Prefetch of them outstanding.
//
// A Source has one connection for its life and does not reconnect: when
// the connection or its channel is lost, or the broker cancels the consumer
// (the queue was deleted), Read returns a [*connectors.Failure] and the
// runtime builds a new Source after a backoff.
//
// Settling: an AckFunc called with nil sends basic.ack; with an error it
// sends basic.nack with requeue, so the broker delivers the message again.
// An AckFunc of a delivery whose channel is lost does nothing: the broker
// has requeued the message and delivers it again, to the next Source.
//
// Read and the AckFuncs it returns may be called from any goroutine.
type Source struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger

	lifecycle

	sess *session // set by Start before lifecycle.l; then read-only
}

// session is one consuming channel.
type session struct {
	*link
	deliveries <-chan amqp.Delivery
	queue      string
	acks       ackWindow
}

// ackWindow coalesces the acknowledgements of one channel into
// basic.ack(multiple) frames. Delivery tags on a channel are consecutive
// from 1, so "every tag up to N is settled" is one number; a basic.ack with
// multiple set acknowledges every outstanding delivery up to its tag, which
// costs the broker one operation instead of N.
//
// A negative settlement is sent at once (basic.nack, requeue), so that the
// broker no longer counts it as outstanding when a later multiple ack
// covers its tag. Positive ones are sent when flushEvery of them are
// waiting, at the latest delay after the settlement that first left one
// waiting, and when the Source closes. The delay is a timer the settling
// goroutine arms, not the reader: the bridge may settle long after Read
// returned (acknowledge: received), while Read waits for a delivery that
// may not come, or is not called at all. A message settled but not yet
// acknowledged when the connection breaks is delivered again: at least
// once, as for a message in flight.
//
// A multiple ack names its highest tag, which must be outstanding: RabbitMQ
// closes the channel with 406 "unknown delivery tag" otherwise. So the ack
// names the highest positively settled tag, never a nacked one.
type ackWindow struct {
	mu         sync.Mutex
	flushEvery uint64
	upTo       uint64          // every tag ≤ upTo is settled
	positive   uint64          // the highest tag ≤ upTo settled positively
	sent       uint64          // every settled tag ≤ sent has been sent
	ahead      map[uint64]bool // settled tags above upTo+1: positive or not

	// delay bounds how long a settled tag waits unsent; zero sends only
	// on flushEvery and flush. lost, when closed, stops the timer from
	// sending on a channel that is gone (nil: never).
	delay time.Duration
	lost  <-chan struct{}
	timer *time.Timer // made by the first settle that needs it
	armed bool        // timer pending for the tags waiting now
	// failed, when set, is told of an ack the timer could not send.
	failed func(error)
}

// acknowledger is the part of *amqp.Channel an ackWindow sends with.
type acknowledger interface {
	Ack(tag uint64, multiple bool) error
	Nack(tag uint64, multiple, requeue bool) error
}

// settle records tag as settled (nack: ok false) and sends what is due. It
// must not be called for a lost session.
func (w *ackWindow) settle(ch acknowledger, tag uint64, ok bool) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	var err error
	if !ok {
		err = ch.Nack(tag, false, true)
	}
	if tag != w.upTo+1 {
		if w.ahead == nil {
			w.ahead = make(map[uint64]bool)
		}
		w.ahead[tag] = ok
		return err
	}
	w.advance(ok)
	for {
		next, found := w.ahead[w.upTo+1]
		if !found {
			break
		}
		delete(w.ahead, w.upTo+1)
		w.advance(next)
	}
	if w.upTo-w.sent >= w.flushEvery {
		if e := w.flushLocked(ch); err == nil {
			err = e
		}
	} else if !w.armed && w.delay > 0 && w.upTo > w.sent {
		// Arming once per batch, not per settlement: the timer covers
		// every tag settled until it fires or a flush disarms it.
		w.armed = true
		if w.timer == nil {
			w.timer = time.AfterFunc(w.delay, func() { w.expire(ch) })
		} else {
			w.timer.Reset(w.delay)
		}
	}
	return err
}

// expire sends what waits once the delay has passed, on the timer's
// goroutine. The lock keeps its ack in order with the settlements.
func (w *ackWindow) expire(ch acknowledger) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.armed = false
	select {
	case <-w.lost:
		// The broker requeues what was not acknowledged.
		return
	default:
	}
	if err := w.flushLocked(ch); err != nil && w.failed != nil {
		w.failed(err)
	}
}

// advance moves upTo over the next tag, settled positively or not.
func (w *ackWindow) advance(ok bool) {
	w.upTo++
	if ok {
		w.positive = w.upTo
	}
}

// flush sends a multiple ack for every settled tag not yet sent.
func (w *ackWindow) flush(ch acknowledger) error {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.flushLocked(ch)
}

func (w *ackWindow) flushLocked(ch acknowledger) error {
	if w.upTo == w.sent {
		return nil
	}
	if w.armed {
		// Nothing waits once this returns; the next settlement that
		// leaves a tag waiting arms the timer afresh.
		w.armed = false
		w.timer.Stop()
	}
	// Tags above positive and up to upTo were nacked, each at once.
	send := w.positive > w.sent
	w.sent = w.upTo
	if !send {
		return nil
	}
	return ch.Ack(w.positive, true)
}

var _ connectors.Source = (*Source)(nil)

// NewSource returns a Source for cfg; it connects on Start. report receives
// every change of the broker connection's state and must not block.
func NewSource(cfg Config, report connectors.StateFunc) (*Source, error) {
	if err := cfg.validate(); err != nil {
		return nil, err
	}
	if report == nil {
		report = func(connectors.ConnState) {}
	}
	return &Source{
		cfg:       cfg,
		report:    report,
		log:       cfg.logger(),
		lifecycle: newLifecycle(),
	}, nil
}

// Start connects, declares the exchange and the queue, binds the queue once
// per binding key in filters and starts consuming, once. Its error is a
// [*connectors.Failure] when the reason is known: CredentialsRefused,
// PermissionDenied (the virtual host), DeclarationRefused (the broker
// refused a declaration or binding: a queue or exchange that exists with
// other properties, a passive one that does not exist, no permission),
// BrokerUnreachable, DNSFailure, TLSFailure, ConnectionLost. Start may be
// called once.
func (s *Source) Start(ctx context.Context, filters []string) error {
	cctx, done, err := s.begin(ctx, "Source")
	if err != nil {
		return err
	}
	defer done()
	keys := slices.Clone(filters)
	l, detail, err := s.cfg.connect(cctx, s.report, s.log, func(l *link) (string, error) { return s.setup(l, keys) })
	if err != nil {
		if cctx.Err() != nil && ctx.Err() == nil {
			return connectors.ErrClosed
		}
		err = fmt.Errorf("amqp: consuming from %s: %w", s.cfg.brokerURL(), err)
		reportStart(s.report, s.log, nil, "", err)
		return err
	}
	if err := s.install(ctx, l, s.cfg.connectTimeout()); err != nil {
		return err
	}
	reportStart(s.report, s.log, l, detail, nil)
	return nil
}

// setup declares and binds the queue and starts the consumer on a fresh
// link.
func (s *Source) setup(l *link, keys []string) (string, error) {
	cancels := l.ch.NotifyCancel(make(chan string, 1))
	l.watch(s.log, cancels, nil)
	if err := l.ch.Qos(s.cfg.prefetch(), 0, false); err != nil {
		return "", declareFailure(fmt.Errorf("amqp: basic.qos %d: %w", s.cfg.prefetch(), err))
	}
	if err := s.cfg.declareExchange(l.ch); err != nil {
		return "", err
	}
	q := s.cfg.Queue
	exclusive := q.Exclusive || q.Name == ""
	var args amqp.Table
	if q.Quorum {
		args = amqp.Table{"x-queue-type": "quorum"}
	}
	declare := l.ch.QueueDeclare
	if q.Passive {
		declare, exclusive = l.ch.QueueDeclarePassive, false
	}
	decl, err := declare(q.Name, q.Durable, false, exclusive, false, args)
	if err != nil {
		return "", declareFailure(fmt.Errorf("amqp: declare queue %q: %w", q.Name, err))
	}
	ex := s.cfg.exchange()
	for _, k := range keys {
		if err := l.ch.QueueBind(decl.Name, k, ex, false, nil); err != nil {
			return "", declareFailure(fmt.Errorf("amqp: bind queue %q to exchange %q with key %q: %w", decl.Name, ex, k, err))
		}
	}
	deliveries, err := l.ch.Consume(decl.Name, "", false, false, false, false, nil)
	if err != nil {
		return "", declareFailure(fmt.Errorf("amqp: consume queue %q: %w", decl.Name, err))
	}
	s.sess = &session{link: l, deliveries: deliveries, queue: decl.Name,
		acks: ackWindow{flushEvery: uint64(max(1, s.cfg.prefetch()/4)), delay: ackDelay, lost: l.lost,
			failed: func(err error) {
				s.log.Debug("amqp: acknowledging failed; the broker delivers again", "err", err)
			}}}
	kind := "server-named exclusive"
	switch {
	case q.Name != "" && q.Durable:
		kind = "durable"
	case q.Name != "" && exclusive:
		kind = "exclusive"
	case q.Name != "":
		kind = "transient"
	}
	return fmt.Sprintf("consuming %s queue %q, %d bindings on exchange %q, prefetch %d, %d messages waiting",
		kind, decl.Name, len(keys), ex, s.cfg.prefetch(), decl.Messages), nil
}

// current returns the session once Start has succeeded, else nil.
func (s *Source) current() *session {
	if s.link() == nil {
		return nil
	}
	return s.sess
}

// Read returns the next delivery and the function that settles it. Once the
// connection, the channel or the consumer is lost, it returns a
// [*connectors.Failure] (ConnectionLost; ConsumerMissing when the broker
// cancelled the consumer; PermissionDenied when it closed the channel over
// a 403), for good; deliveries that were buffered from the lost channel
// are not returned, since the broker delivers them again. After Close it
// returns [connectors.ErrClosed].
func (s *Source) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	select {
	case <-s.closed:
		return nil, nil, connectors.ErrClosed
	default:
	}
	sess := s.current()
	if sess == nil {
		return nil, nil, errors.New("amqp: Read before a successful Start")
	}
	d, ok, err := s.next(ctx, sess)
	switch {
	case err != nil:
		return nil, nil, err
	case !ok || sess.isLost():
		return nil, nil, s.lost(ctx, sess)
	}
	return s.message(&d), s.acker(sess, d.DeliveryTag), nil
}

// lost waits until the watcher has recorded why sess ended (the library
// closes the deliveries a moment before it tells the watcher) and returns
// the failure.
func (s *Source) lost(ctx context.Context, sess *session) error {
	select {
	case <-sess.lost:
	case <-s.closed:
		return connectors.ErrClosed
	case <-ctx.Done():
		return ctx.Err()
	}
	return sess.failure("consuming queue " + strconv.Quote(sess.queue))
}

// ackDelay is how long a positive settlement may wait to be sent, for
// later ones to join its multiple ack. A consumer faster than the broker
// settles many messages within it; sending each at once would cost one ack
// per message again.
const ackDelay = time.Millisecond

// next receives sess's next delivery. ok is false when the consumer ended
// or the session was lost. A delivery already buffered is returned even
// when ctx has ended. Acknowledgements do not depend on it: settle arms
// their timer.
func (s *Source) next(ctx context.Context, sess *session) (d amqp.Delivery, ok bool, err error) {
	select {
	case d, ok = <-sess.deliveries:
		return d, ok, nil
	default:
	}
	select {
	case d, ok = <-sess.deliveries:
		return d, ok, nil
	case <-sess.lost:
		return d, false, nil
	case <-s.closed:
		return d, false, connectors.ErrClosed
	case <-ctx.Done():
		return d, false, ctx.Err()
	}
}

// message maps a delivery onto a connectors.Message. The payload is not
// copied: the delivery is not used again.
func (s *Source) message(d *amqp.Delivery) *connectors.Message {
	m := &connectors.Message{
		Topic:       d.RoutingKey,
		Payload:     d.Body,
		ContentType: d.ContentType,
		// RabbitMQ sets redelivered on a message it delivered before
		// without seeing it acknowledged (a consumer's channel closed).
		Redelivered: d.Redelivered,
	}
	if d.Headers != nil {
		m.Traceparent = headerString(d.Headers, headerTraceparent)
		m.Tracestate = headerString(d.Headers, headerTracestate)
		if s.cfg.LoopMarker != "" && headerString(d.Headers, LoopHeader) == s.cfg.LoopMarker {
			m.Looped = true
		}
	}
	return m
}

// acker returns the AckFunc of delivery tag on sess's channel.
func (s *Source) acker(sess *session, tag uint64) connectors.AckFunc {
	return func(err error) {
		if sess.isLost() {
			s.log.Debug("amqp: not settling a delivery of a lost channel; the broker delivers it again", "tag", tag)
			return
		}
		if e := sess.acks.settle(sess.ch, tag, err == nil); e != nil {
			s.log.Debug("amqp: settling a delivery failed; the broker delivers it again", "tag", tag, "err", e)
		}
	}
}

// Close acknowledges what was settled, stops consuming and closes the
// connection, waiting up to ctx (and at most Config.ConnectTimeout) for the
// close handshake and the Source's goroutines. Deliveries read and not
// settled are requeued by the broker. Close may be called more than once.
// Redelivers implements [connectors.Redelivering]: a queue that outlives
// the connection requeues what was not acknowledged, for the next
// consumer; an exclusive one goes with the connection.
func (s *Source) Redelivers() bool { return hold(s.cfg.Queue).OK }

func (s *Source) Close(ctx context.Context) error {
	return s.close(ctx, s.cfg.connectTimeout(), func(*link) {
		sess := s.sess
		// Closing on purpose: acknowledge what was settled, so that the
		// broker does not deliver it again. Settlements still under way
		// are skipped once close marks the link lost: the broker requeues
		// whatever was not acknowledged.
		if err := sess.acks.flush(sess.ch); err != nil {
			s.log.Debug("amqp: acknowledging before closing failed", "err", err)
		}
	})
}
