package amqp

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	amqp "github.com/rabbitmq/amqp091-go"

	"weida.dev/connector/connectors"
)

// Source consumes an inbound resource's queue: it declares the queue, binds
// it to the exchange once per route binding key, and consumes it with manual
// acknowledgements, at most Config.Prefetch of them outstanding.
//
// Settling: an AckFunc called with nil sends basic.ack; with an error it
// sends basic.nack with requeue, so the broker delivers the message again.
// Delivery tags belong to the channel that delivered them: after a
// reconnection, an AckFunc of a delivery from the lost channel does nothing
// (the broker has already requeued that message and will deliver it again),
// and is never sent on the new channel, where the same tag names another
// message.
//
// Read and the AckFuncs it returns may be called from any goroutine.
type Source struct {
	cfg    Config
	report connectors.StateFunc
	log    *slog.Logger

	lifecycle

	mu      sync.Mutex
	cur     *session      // nil while disconnected
	changed chan struct{} // closed and replaced whenever cur changes
	pending *session      // built by setup, published by up
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
// waiting, when Read has waited ackDelay for a delivery (the consumer is
// idle), and when the Source closes. A message settled but not yet acknowledged when
// the connection breaks is delivered again: at least once, as for a
// message in flight.
type ackWindow struct {
	mu         sync.Mutex
	flushEvery uint64
	upTo       uint64              // every tag ≤ upTo is settled
	sent       uint64              // every settled tag ≤ sent has been sent
	ahead      map[uint64]struct{} // settled tags above upTo+1
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
			w.ahead = make(map[uint64]struct{})
		}
		w.ahead[tag] = struct{}{}
		return err
	}
	w.upTo++
	for {
		if _, ok := w.ahead[w.upTo+1]; !ok {
			break
		}
		delete(w.ahead, w.upTo+1)
		w.upTo++
	}
	if w.upTo-w.sent >= w.flushEvery {
		if e := w.flushLocked(ch); err == nil {
			err = e
		}
	}
	return err
}

// holding reports whether settled tags wait to be acknowledged.
func (w *ackWindow) holding() bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.upTo > w.sent
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
	w.sent = w.upTo
	return ch.Ack(w.upTo, true)
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
		changed:   make(chan struct{}),
	}, nil
}

// Start connects, declares the exchange and the queue, binds the queue once
// per binding key in filters and starts consuming. It returns once that is
// done the first time, or when ctx ends; a failed attempt is reported and
// retried with backoff meanwhile. After Start, the Source reconnects, declares
// and binds again and resumes consuming by itself after every loss, until
// Close. Start may be called once.
func (s *Source) Start(ctx context.Context, filters []string) error {
	keys := append([]string(nil), filters...)
	return s.start(ctx, "Source", "consuming from", s.cfg.URL, &supervisor{
		cfg:    &s.cfg,
		report: s.report,
		log:    s.log,
		setup:  func(ctx context.Context, l *link) (string, error) { return s.setup(l, keys) },
		up:     s.up,
		down:   s.down,
		first:  make(chan struct{}),
		done:   make(chan struct{}),
	})
}

// setup declares and binds the queue and starts the consumer on a fresh
// link. The session it builds is handed over by up.
func (s *Source) setup(l *link, keys []string) (string, error) {
	cancels := l.ch.NotifyCancel(make(chan string, 1))
	l.watch(s.log, cancels, nil)
	if err := l.ch.Qos(s.cfg.prefetch(), 0, false); err != nil {
		return "", fmt.Errorf("amqp: basic.qos %d: %w", s.cfg.prefetch(), err)
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
		return "", fmt.Errorf("amqp: declare queue %q: %w", q.Name, err)
	}
	ex := s.cfg.exchange()
	for _, k := range keys {
		if err := l.ch.QueueBind(decl.Name, k, ex, false, nil); err != nil {
			return "", fmt.Errorf("amqp: bind queue %q to exchange %q with key %q: %w", decl.Name, ex, k, err)
		}
	}
	deliveries, err := l.ch.Consume(decl.Name, "", false, false, false, false, nil)
	if err != nil {
		return "", fmt.Errorf("amqp: consume queue %q: %w", decl.Name, err)
	}
	s.mu.Lock()
	s.pending = &session{link: l, deliveries: deliveries, queue: decl.Name,
		acks: ackWindow{flushEvery: uint64(max(1, s.cfg.prefetch()/4))}}
	s.mu.Unlock()
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

func (s *Source) up(l *link) {
	s.mu.Lock()
	sess := s.pending
	s.pending = nil
	s.setCurrentLocked(sess)
	s.mu.Unlock()
}

func (s *Source) down(*link) {
	s.mu.Lock()
	if sess := s.cur; sess != nil {
		if !sess.isLost() {
			// Closing on purpose: acknowledge what was settled, so that
			// the broker does not deliver it again.
			if err := sess.acks.flush(sess.ch); err != nil {
				s.log.Debug("amqp: acknowledging before closing failed", "err", err)
			}
		}
		// Settlements still under way for this channel's tags are
		// skipped from here on: the broker requeues whatever was not
		// acknowledged.
		sess.markLost("Closing", errStopping)
	}
	s.setCurrentLocked(nil)
	s.mu.Unlock()
}

func (s *Source) setCurrentLocked(sess *session) {
	s.cur = sess
	close(s.changed)
	s.changed = make(chan struct{})
}

func (s *Source) current() (*session, <-chan struct{}) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.cur, s.changed
}

// Read returns the next delivery and the function that settles it. It
// blocks while the Source is reconnecting.
func (s *Source) Read(ctx context.Context) (*connectors.Message, connectors.AckFunc, error) {
	for {
		select {
		case <-s.closed:
			return nil, nil, connectors.ErrClosed
		default:
		}
		sess, changed := s.current()
		if sess == nil {
			select {
			case <-changed:
				continue
			case <-s.closed:
				return nil, nil, connectors.ErrClosed
			case <-ctx.Done():
				return nil, nil, ctx.Err()
			}
		}
		d, ok, err := s.next(ctx, sess, changed)
		switch {
		case err != nil:
			return nil, nil, err
		case !ok:
			// The consumer ended with its channel, or the session
			// changed; look again.
			continue
		case sess.isLost():
			// Buffered from a channel that is gone: the broker has
			// requeued it and delivers it again.
			continue
		}
		return s.message(&d), s.acker(sess, d.DeliveryTag), nil
	}
}

// ackDelay is how long the consumer may sit idle before the acknowledgements
// it holds back are sent. A consumer faster than the broker is idle between
// most deliveries; flushing at once would send one ack per message again.
const ackDelay = time.Millisecond

// next receives sess's next delivery. When none arrives within ackDelay, it
// sends the acknowledgements the session holds back, and waits on. ok is
// false when the consumer ended (next then waits for the supervisor to
// replace the session) or the session changed.
func (s *Source) next(ctx context.Context, sess *session, changed <-chan struct{}) (d amqp.Delivery, ok bool, err error) {
	received := false
	select {
	case d, ok = <-sess.deliveries:
		received = true
	default:
	}
	if !received {
		var idle <-chan time.Time
		if sess.acks.holding() {
			t := time.NewTimer(ackDelay)
			defer t.Stop()
			idle = t.C
		}
		for !received {
			select {
			case d, ok = <-sess.deliveries:
				received = true
			case <-idle:
				idle = nil
				if !sess.isLost() {
					if err := sess.acks.flush(sess.ch); err != nil {
						s.log.Debug("amqp: acknowledging failed; the broker delivers again", "err", err)
					}
				}
			case <-changed:
				return d, false, nil
			case <-s.closed:
				return d, false, connectors.ErrClosed
			case <-ctx.Done():
				return d, false, ctx.Err()
			}
		}
	}
	if !ok {
		select {
		case <-changed:
		case <-s.closed:
			return d, false, connectors.ErrClosed
		case <-ctx.Done():
			return d, false, ctx.Err()
		}
	}
	return d, ok, nil
}

// message maps a delivery onto a connectors.Message. The payload is not
// copied: the delivery is not used again.
func (s *Source) message(d *amqp.Delivery) *connectors.Message {
	m := &connectors.Message{
		Topic:       d.RoutingKey,
		Payload:     d.Body,
		ContentType: d.ContentType,
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

// Close stops consuming and closes the connection, waiting up to ctx for the
// close handshake and the Source's goroutines. Deliveries read and not
// settled are requeued by the broker. Close may be called more than once.
func (s *Source) Close(ctx context.Context) error { return s.close(ctx) }
