package connectors

import (
	"context"
	"errors"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida"
)

// inboundBridge is the side of a bridge from a broker onto a hosted weida
// publisher path.
type inboundBridge struct {
	*core
	newSource SourceFactory
	lv        *lastValues // nil: the resource keeps no last-value cache

	// host is where the runtime's attempts get their publisher path; nil
	// for a bridge given one (NewInbound).
	host *hosting

	pubMu sync.Mutex
	pub   Publisher   // nil until a path is held
	held  *hostedPath // the path held on the runtime's listeners, if any

	// supersedes are the broker filters of the resource this one
	// replaced; given to each Source until one has started.
	supersedes []string
	retiring   atomic.Bool // the resource is being removed, not restarted

	// redelivers is the current attempt's Source's [Redelivering]
	// answer; only the attempt's goroutine uses it.
	redelivers bool
	// receipts settles the current attempt's messages once their copies
	// were received (Spec.AwaitReceipt); nil otherwise. Only the
	// attempt's goroutine uses the field.
	receipts *receiptSettler
}

// hosting is where an inbound unit of a runtime hosts its publisher path.
type hosting struct {
	listeners    *listeners
	listen, path string
	cfg          weida.ListenConfig
	scopes       weida.Scopes
}

func newInboundBridge(c *core, newSource SourceFactory, host *hosting) *inboundBridge {
	b := &inboundBridge{
		core:      c,
		newSource: newSource,
		host:      host,
		lv:        newLastValues(c.spec.LastValue, c.deps.Metrics, c.spec.Name, c.deps.Now),
	}
	if b.lv != nil {
		// b.lv, not the cache made here: supersede may replace it before
		// the first attempt.
		c.onBroker = func(up bool) { b.lv.sourceState(up) }
	}
	b.lv.persistIn(c.spec.LastValueDir, b.subscribed(), c.deps.Metrics, b.log)
	return b
}

func (b *inboundBridge) setPublisher(p Publisher) {
	b.pubMu.Lock()
	b.pub = p
	b.pubMu.Unlock()
	if p != nil {
		st := b.stats
		p.OnCopiesLost(st.copiesLost)
		p.CountCopiesUnconfirmed(st.copiesUnconfirmed)
		b.lv.restore() // a persisted cache is back before anything is replayed
		b.lv.install(p, b.fenced)
		if rp, ok := p.(receiptPublisher); ok && b.spec.AwaitReceipt {
			// Before the Source starts: every connection of the
			// listener records what its subscriber acknowledged from
			// now on; those accepted untracked (under a resource that
			// acknowledges once queued, before a reload) are closed
			// and reconnect tracked.
			rp.TrackReceipts()
		}
	}
}

func (b *inboundBridge) publisher() Publisher {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	return b.pub
}

func (b *inboundBridge) hosted() *hostedPath {
	b.pubMu.Lock()
	defer b.pubMu.Unlock()
	return b.held
}

// prepare hosts the publisher path, once: it is held across attempts.
func (b *inboundBridge) prepare(ctx context.Context) error {
	if b.host == nil || b.hosted() != nil {
		return nil
	}
	h, err := b.host.listeners.acquire(ctx, b.host.listen, b.host.path, b.host.cfg, b.host.scopes, b.spec.Name)
	if err != nil {
		return err
	}
	b.pubMu.Lock()
	b.held = h
	b.pubMu.Unlock()
	b.setPublisher(h.pub)
	return nil
}

// supersede takes over prev's accounting, its last-value cache when the
// configuration is unchanged, and the broker filters it subscribed, for
// the first Source to withdraw those this bridge does not subscribe.
func (b *inboundBridge) supersede(prev *Bridge, same bool) {
	b.carryOn(prev.core)
	if lv := prev.side.cache(); same && lv != nil && b.lv != nil {
		b.lv = lv
	}
	b.supersedes = prev.side.subscribed()
}

func (b *inboundBridge) subscribed() []string {
	filters := make([]string, 0, len(b.spec.Routes))
	for _, r := range b.spec.Routes {
		filters = append(filters, r.Foreign)
	}
	return filters
}

func (b *inboundBridge) cache() *lastValues { return b.lv }

func (b *inboundBridge) retire() { b.retiring.Store(true) }

// release closes the publisher path and gives up its listener. forget
// keeps copies still queued from bringing back the unit's series.
func (b *inboundBridge) release(keep map[string]weida.ListenConfig, forget bool) {
	b.pubMu.Lock()
	h := b.held
	b.held = nil
	b.pubMu.Unlock()
	if h == nil {
		return
	}
	if forget {
		h.pub.OnCopiesLost(nil)
		h.pub.CountCopiesUnconfirmed(nil)
	}
	b.host.listeners.release(h, keep, b.deps.drain())
}

func (b *inboundBridge) addStatus(st *Status) {
	if pub := b.publisher(); pub != nil {
		st.Counters.Subscribers = pub.Subscribers()
		b.deps.Metrics.Subscribers.WithLabelValues(b.spec.Name).Set(float64(st.Counters.Subscribers))
	}
	if b.lv != nil {
		st.Counters.LastValue = b.lv.snapshot()
	}
	if b.host == nil {
		return
	}
	var l *weida.Listener
	if h := b.hosted(); h != nil {
		l = h.l
	} else {
		l = b.host.listeners.lookup(b.host.listen)
	}
	if l != nil {
		st.Fingerprint = l.Fingerprint()
		st.SubscriberURL = subscriberURL(b.host.listen, b.host.path, l)
	}
}

func (b *inboundBridge) refreshGauges() {
	if b.lv != nil {
		b.lv.sweep() // the cache's gauges leave out what has expired
	}
	if pub := b.publisher(); pub != nil {
		b.deps.Metrics.Subscribers.WithLabelValues(b.spec.Name).Set(float64(pub.Subscribers()))
	}
}

// run is one attempt of an inbound bridge. Messages are read and settled
// one at a time, so when it returns none is left half handled: those the
// broker delivered and Read did not return stay with the broker.
func (b *inboundBridge) run(ctx context.Context) error {
	pub := b.publisher()
	if pub == nil {
		return &Failure{Reason: FailListen, Err: errors.New("connectors: no weida publisher path to publish on")}
	}
	report, retire := b.newAttempt(nil) // a Source's Read reports its loss
	defer retire()
	if b.lv != nil {
		// Between attempts nothing is connected; each attempt reports
		// up once its Source is.
		b.lv.sourceState(false)
		defer b.lv.sourceState(false)
	}
	src, err := b.newSource(report)
	if err != nil {
		return failure(err, FailSourceInvalid)
	}
	b.offer(src)
	if pl, ok := src.(Pipelining); ok && b.spec.AwaitReceipt {
		pl.Pipeline()
	}
	rd, ok := src.(Redelivering)
	b.redelivers = ok && rd.Redelivers()
	b.receipts = nil
	if b.spec.AwaitReceipt {
		if _, ok := pub.(receiptPublisher); ok {
			b.receipts = newReceiptSettler(b)
		} else {
			b.log.Warn("the weida publisher cannot report receipts; acknowledging once copies are queued")
		}
	}
	defer func() {
		retire()
		if b.receipts != nil {
			// Before the Source closes: what was received by now is
			// acknowledged, and the broker delivers the rest again.
			b.receipts.stop(b.receiptDrain())
		}
		b.closeSource(ctx, src)
		b.lv.flush() // a persisted cache is saved whenever an attempt ends, a stop included
	}()
	// The publisher path is registered before the broker subscription, so
	// the endpoint is ready as soon as messages can arrive.
	b.reportWeida(true, "Hosting", b.spec.Endpoint)
	filters := b.subscribed()
	if stopped, err := b.start(ctx, func(ctx context.Context) error { return src.Start(ctx, filters) }); stopped || err != nil {
		return err
	}
	b.supersedes = nil
	b.seedLastValues(ctx, src, filters)
	b.attemptStarted()
	return b.readLoop(ctx, src, pub)
}

// offer gives src, before Start, what its optional interfaces ask for.
func (b *inboundBridge) offer(src Source) {
	if sp, ok := src.(Superseding); ok && len(b.supersedes) > 0 {
		sp.Supersede(b.supersedes)
	}
	if dr, ok := src.(DropReporter); ok {
		dr.ReportDrops(func(filter, reason string, n int) {
			b.stats.drop(b.routeByForeign[filter].Name, reason, n, slog.LevelWarn,
				"the broker client discarded messages before the bridge read them")
		})
	}
}

// closeSource closes src, withdrawing its subscriptions first when the
// resource is being removed.
func (b *inboundBridge) closeSource(ctx context.Context, src Source) {
	cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), brokerCloseTimeout)
	defer cancel()
	if rs, ok := src.(Retiring); ok && b.retiring.Load() {
		if err := rs.Retire(cctx); err != nil {
			b.log.Warn("the broker may keep this removed resource's subscriptions until its session expires", "err", err)
		}
	}
	if err := src.Close(cctx); err != nil {
		b.log.Warn("closing the broker connection", "err", err)
	}
}

// readLoop reads and handles messages until ctx ends or the Source ends
// the attempt.
func (b *inboundBridge) readLoop(ctx context.Context, src Source, pub Publisher) error {
	failedReads := 0
	for {
		m, ack, err := src.Read(ctx)
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if endsAttempt(err, false) {
				return failure(err, FailConnectionLost)
			}
			b.stats.rlog.Log(slog.LevelWarn, "read", "reading from the broker failed", slog.Any("err", err))
			// A Source that keeps failing the same way must not spin.
			failedReads++
			if !sleep(ctx, b.deps.Backoff(failedReads)) {
				return nil
			}
			continue
		}
		failedReads = 0
		b.handle(ctx, pub, m, ack)
		if b.tripped.Load() {
			return errFenced
		}
	}
}

// handle converts, guards and publishes one message, then settles it.
func (b *inboundBridge) handle(ctx context.Context, pub Publisher, m *Message, ack AckFunc) {
	start := b.deps.Now()
	if m.ReceivedUnixNano == 0 {
		m.ReceivedUnixNano = start.UnixNano()
	}
	b.stats.received()
	b.stats.taken()
	route, wm, ok := b.convert(m)
	if !ok {
		b.settle(ack, nil)
		return
	}
	var done func(weida.Receipt)
	if b.receipts != nil {
		done = b.receipts.receiptOf(ack)
	}
	queued, err := b.deliver(ctx, pub, route, m, wm, done)
	if queued && done != nil {
		return // its receipt settles it
	}
	b.settle(ack, err)
}

// settle settles one message read from the Source, at once or once its
// copies were received: a nil err acknowledges it, unless the unit is
// fenced by now.
func (b *inboundBridge) settle(ack AckFunc, err error) {
	if err == nil && b.fenced() {
		// Delivered or dropped, an acknowledgement now would act on a
		// lease that may be another replica's: the broker keeps the
		// message (for a dropped one, the new holder decides again; a
		// delivered one may arrive twice).
		err = ErrFenced
	}
	ack(err)
	b.stats.settled()
	if err == nil {
		b.stats.acked()
	}
}

// convert finds m's route and converts it, or drops it and counts why.
func (b *inboundBridge) convert(m *Message) (Route, weida.Message, bool) {
	if m.Looped {
		b.dropMsg(m, "", ReasonLoop, slog.LevelDebug, "not bridging a message this connector published", slog.String("topic", m.Topic))
		return Route{}, weida.Message{}, false
	}
	wt, err := b.spec.Policy.TopicToWeida(m.Topic)
	route, ok := b.inboundRouteOf(wt, m.Topic, err == nil)
	switch {
	case !ok:
		b.dropMsg(m, "", ReasonNoRoute, slog.LevelWarn, "the broker delivered a topic no route selects", slog.String("topic", m.Topic))
		return Route{}, weida.Message{}, false
	case err != nil:
		b.dropMsg(m, route.Name, refusalRule(err), slog.LevelWarn, "topic has no exact weida form; dropped", slog.String("topic", m.Topic), slog.String("why", err.Error()))
		return Route{}, weida.Message{}, false
	case !b.guard(route, m.Topic, wt):
		return Route{}, weida.Message{}, false
	case b.spec.MaxMessageBytes > 0 && len(m.Payload) > b.spec.MaxMessageBytes:
		b.dropMsg(m, route.Name, ReasonTooLarge, slog.LevelWarn, "payload over spec.limits.maxMessageBytes; dropped",
			slog.String("topic", m.Topic), slog.Int("bytes", len(m.Payload)))
		b.uncache(m, wt, EvictTooLarge)
		return Route{}, weida.Message{}, false
	}
	return route, weida.Message{
		Topic:          wt,
		ContentType:    m.ContentType,
		Traceparent:    m.Traceparent,
		Tracestate:     m.Tracestate,
		SourceSequence: m.Sequence,
		Payload:        m.Payload,
	}, true
}

// dropMsg counts m as dropped under reason, or, when the broker delivered
// it again, under ReasonRedeliveryDropped with reason in the log line: an
// earlier delivery of it may have been bridged, and counting the drop as
// a loss would count the message twice.
func (b *inboundBridge) dropMsg(m *Message, route, reason string, level slog.Level, msg string, attrs ...slog.Attr) {
	if m.Redelivered {
		attrs = append(attrs, slog.String("dropped_for", reason))
		reason = ReasonRedeliveryDropped
		msg += "; the broker delivered it again, and an earlier delivery may have been bridged"
	}
	b.drop(route, reason, level, msg, attrs...)
}

// deliver publishes wm, the conversion of m, holding it while nobody
// subscribes when the resource holds, and returns how to settle m: nil
// when it was published or dropped and counted, an error to leave it with
// the broker (stopping). queued reports that copies were queued; done,
// when not nil, is then told of their receipt (see publish).
func (b *inboundBridge) deliver(ctx context.Context, pub Publisher, route Route, m *Message, wm weida.Message, done func(weida.Receipt)) (queued bool, err error) {
	for {
		if b.spec.Hold && !b.awaitSubscriber(ctx, pub, wm.Topic) {
			// Stopping: the message stays with the broker, which
			// delivers it again.
			return false, ctx.Err()
		}
		if b.fenced() {
			if !b.redelivers {
				b.dropMsg(m, route.Name, ReasonFenced, slog.LevelWarn, "fenced: this replica no longer holds the resource's lease; not delivered, and the broker does not deliver it again",
					slog.String("topic", m.Topic))
			}
			return false, ErrFenced
		}
		res, err := b.publish(ctx, pub, m, wm, done)
		if err != nil {
			if ctx.Err() != nil {
				// Shutting down: leave it to the broker to deliver again.
				return false, err
			}
			reason, evict := ReasonWeidaRefused, EvictWeidaRefused
			if errors.Is(err, weida.ErrPayloadTooLarge) {
				reason, evict = ReasonTooLarge, EvictTooLarge
			}
			b.dropMsg(m, route.Name, reason, slog.LevelWarn, "weida refused the message; dropped", slog.String("topic", m.Topic), slog.Any("err", err))
			b.uncache(m, wm.Topic, evict)
			return false, nil
		}
		b.stats.copies(route.Name, res.Queued, res.Dropped, res.Closing, res.OwnReplay, m.Redelivered)
		switch {
		case res.Queued > 0:
			b.stats.bridged(route.Name, m.ReceivedUnixNano, b.deps.Now())
			return true, nil
		case res.Dropped > res.Closing:
			// Live subscribers were there but could not take it: their
			// drops are counted (subscriber-buffer-full), as under
			// either choice; hold waits for a subscriber, not for a
			// slow one.
			return false, nil
		case !b.spec.Hold:
			b.dropMsg(m, route.Name, ReasonNoSubscriber, slog.LevelInfo, "no weida subscriber wants this topic; dropped (whenNoSubscriber: drop)",
				slog.String("topic", m.Topic), slog.String("weida_topic", wm.Topic))
			return false, nil
		}
		// Holding, and the subscriber left between the wait and the
		// publish: wait again.
	}
}

// uncache removes the cached value of weida topic wt when m, which would
// have updated it, was dropped: the broker holds m (or, for an MQTT
// message that is not retained, still holds the older value, which the
// cache keeps).
func (b *inboundBridge) uncache(m *Message, wt, reason string) {
	if b.lv != nil && b.lv.takes(m) {
		b.lv.remove(wt, reason)
	}
}

// publish hands wm, the conversion of m, to pub, updating the last-value
// cache with it when the resource keeps one and m is for it. With done
// (the attempt awaits receipts, and pub can report them), done is called
// once, when the copies queued are all received or lost: at once with a
// zero Receipt when none was queued, never when publish fails.
func (b *inboundBridge) publish(ctx context.Context, pub Publisher, m *Message, wm weida.Message, done func(weida.Receipt)) (weida.Result, error) {
	lv := b.lv
	// done is set only when the attempt awaits receipts, which it does
	// only with a publisher that reports them: test it first, so that an
	// ordinary message pays no type assertion.
	if rp, ok := receiptsOf(pub, done); ok {
		var record func()
		if lv != nil && lv.takes(m) {
			record = func() { lv.record(m, &wm) }
		}
		b.receipts.begin()
		res, err := rp.PublishWithReceipt(ctx, wm, record, done)
		if err != nil {
			b.receipts.end() // done is never called
		}
		return res, err
	}
	if lv == nil || !lv.takes(m) {
		return pub.Publish(ctx, wm)
	}
	if rp, ok := pub.(recordingPublisher); ok {
		return rp.PublishWith(ctx, wm, func() { lv.record(m, &wm) })
	}
	// A Publisher without the power (a test's) gets the cache updated
	// first; nothing replays it anyway.
	lv.record(m, &wm)
	return pub.Publish(ctx, wm)
}

// awaitSubscriber waits until a live weida subscriber would get a copy of
// topic. It reports false when ctx ended first. The wait blocks the read
// loop, so the Source takes nothing more from the broker meanwhile and the
// broker's own flow control (prefetch, max ack pending, receive maximum)
// holds the rest.
func (b *inboundBridge) awaitSubscriber(ctx context.Context, pub Publisher, topic string) bool {
	// The channel is taken before the test, so a subscription between
	// the two still wakes the wait.
	changed := pub.SubscriptionsChanged()
	if pub.Matches(topic) {
		return true
	}
	since := b.deps.Now()
	b.stats.holdStarted(since)
	defer b.stats.holdEnded()
	b.stats.rlog.Log(slog.LevelInfo, "hold", "no weida subscriber wants this topic; holding it with the broker until one subscribes",
		slog.String("weida_topic", topic))
	for {
		select {
		case <-changed:
		case <-ctx.Done():
			return false
		}
		changed = pub.SubscriptionsChanged()
		if pub.Matches(topic) {
			b.log.Info("a weida subscriber arrived; bridging again", "weida_topic", topic,
				"held_for", b.deps.Now().Sub(since).Round(time.Millisecond).String())
			return true
		}
	}
}

// receiptsOf returns pub as a receiptPublisher when done asks for a
// receipt and pub can give one.
func receiptsOf(pub Publisher, done func(weida.Receipt)) (receiptPublisher, bool) {
	if done == nil {
		return nil, false
	}
	rp, ok := pub.(receiptPublisher)
	return rp, ok
}
