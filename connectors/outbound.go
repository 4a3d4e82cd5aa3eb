package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida"
)

// outboundBridge is the side of a bridge from a remote weida publisher
// endpoint onto a broker.
type outboundBridge struct {
	*core
	newSink      SinkFactory
	dial         DialFunc
	weidaFilters []string // distinct weida filters, the subscriptions
}

func newOutboundBridge(c *core, dial DialFunc, newSink SinkFactory) *outboundBridge {
	b := &outboundBridge{core: c, dial: dial, newSink: newSink}
	seen := make(map[string]bool)
	for _, r := range c.spec.Routes {
		if !seen[r.Weida] {
			seen[r.Weida] = true
			b.weidaFilters = append(b.weidaFilters, r.Weida)
		}
	}
	return b
}

// An outbound bridge holds nothing between attempts but its accounting:
// the weida endpoint is dialled by each attempt, and the broker keeps no
// subscription of its.
func (b *outboundBridge) prepare(context.Context) error               { return nil }
func (b *outboundBridge) supersede(prev *Bridge, _ bool)              { b.carryOn(prev.core) }
func (b *outboundBridge) subscribed() []string                        { return nil }
func (b *outboundBridge) cache() *lastValues                          { return nil }
func (b *outboundBridge) retire()                                     {}
func (b *outboundBridge) release(map[string]weida.ListenConfig, bool) {}
func (b *outboundBridge) addStatus(*Status)                           {}
func (b *outboundBridge) refreshGauges()                              {}

// outAttempt is one attempt of an outbound bridge: its Sink, and how the
// attempt ends early when the Sink fails.
type outAttempt struct {
	b    *outboundBridge
	sink Sink
	// cancel ends the attempt with a cause; the first *Failure wins.
	cancel context.CancelCauseFunc
	// endWrites ends the writes under way, and those the receive loop
	// still submits, at once.
	endWrites context.CancelFunc
	lost      atomic.Bool // the Sink failed: writes still under way are lost
	// closing is set before the runtime closes the Sink, so that the
	// ErrClosed it then returns is not taken for a failure.
	closing atomic.Bool
}

// fail ends the attempt because the Sink failed with err.
func (a *outAttempt) fail(err error) {
	a.lost.Store(true)
	a.endWrites()
	a.cancel(failure(err, FailConnectionLost))
}

// fence ends the attempt because the unit is fenced. Writes under way
// finish (each asks the fence again before any retry); nothing more is
// published.
func (a *outAttempt) fence() { a.cancel(errFenced) }

// write publishes it, unless the unit is fenced.
func (a *outAttempt) write(ctx context.Context, it outboundItem) error {
	if a.b.fenced() {
		return ErrFenced
	}
	return a.sink.Write(ctx, it.msg)
}

// lostReason is the drop reason of a message that could not be written
// because the attempt ended.
func (a *outAttempt) lostReason() string {
	if a.lost.Load() {
		return ReasonConnectionLost
	}
	return ReasonShutdown
}

// drainBounds are the timers that end a stopping attempt's work once the
// drain bound is over. The attempt stops them when it returns: a timer left
// running would keep the attempt's contexts, and what they hold, for the
// whole bound after the attempt ended.
//
// Stopping a timer is not enough for that: the runtime keeps a stopped
// timer, and the func it would have called, in its P's timer heap until it
// cleans the heap up, which it does lazily: when the timer comes to the top
// or the bottom of the heap, when stopped timers are over a quarter of it,
// and at the latest when the timer would have fired. Among many live
// timers, as in a busy process, a stopped timer of the drain bound can stay
// there long after the attempt returned, up to the whole bound. So a
// timer's func reaches the attempt only through d, and stop drops what the
// funcs hold.
type drainBounds struct {
	mu      sync.Mutex
	timers  []*time.Timer
	funcs   []func() // funcs[i] is what timers[i] calls
	stopped bool
}

// after calls f after d, unless stop comes first.
func (d *drainBounds) after(dur time.Duration, f func()) {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.stopped {
		return
	}
	i := len(d.funcs)
	d.funcs = append(d.funcs, f)
	d.timers = append(d.timers, time.AfterFunc(dur, func() { d.fire(i) }))
}

// fire calls the func of timer i, unless stop came first.
func (d *drainBounds) fire(i int) {
	d.mu.Lock()
	var f func()
	if !d.stopped {
		f = d.funcs[i]
	}
	d.mu.Unlock()
	if f != nil {
		f()
	}
}

// stop stops every timer armed and those armed later, and drops their
// funcs, which the stopped timers may not release for long.
func (d *drainBounds) stop() {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.stopped = true
	for _, t := range d.timers {
		t.Stop()
	}
	d.timers = nil
	d.funcs = nil
}

// run is one attempt of an outbound bridge.
func (b *outboundBridge) run(ctx context.Context) error {
	b.stats.up("weida", false)
	actx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	// Writes outlive ctx by the drain bound, so that a stop finishes the
	// writes already taken from weida instead of dropping them. A failed
	// Sink ends them at once (fail): they are counted as lost.
	writeCtx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()
	// Receiving outlives the attempt by the drain bound too, whether it
	// ends by a stop or by a failed Sink: the weida subscription leaves
	// with Shutdown meanwhile (see leaveWhenDone).
	recvCtx, cancelRecv := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelRecv()
	var bounds drainBounds
	defer bounds.stop()
	stopDrain := context.AfterFunc(ctx, func() {
		bounds.after(b.deps.drain(), func() {
			// Receiving ends first: a copy taken once writes are cut
			// could only be dropped, while one left unread is counted
			// as connection-closed, the reason that says where it was.
			cancelRecv()
			cancelWrites()
		})
	})
	defer stopDrain()
	stopRecvDrain := context.AfterFunc(actx, func() {
		bounds.after(b.deps.drain(), cancelRecv)
	})
	defer stopRecvDrain()
	a := &outAttempt{b: b, cancel: cancel, endWrites: cancelWrites}
	report, retire := b.newAttempt(a.fail)
	defer retire()
	sink, err := b.newSink(report)
	if err != nil {
		return failure(err, FailSinkInvalid)
	}
	a.sink = sink
	closeSink := func() {
		retire()
		a.closing.Store(true)
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), brokerCloseTimeout)
		defer cancel()
		if err := sink.Close(cctx); err != nil {
			b.log.Warn("closing the broker connection", "err", err)
		}
	}
	defer closeSink()
	if stopped, err := b.start(ctx, sink.Start); stopped || err != nil {
		return err
	}
	b.attemptStarted()

	out := b.newWriter(writeCtx, a)
	b.dialLoop(actx, recvCtx, out, a)
	if a.lost.Load() {
		// A failed Sink may never settle what it holds; closing it
		// makes it give every write its outcome.
		closeSink()
	}
	out.wait()
	if ctx.Err() != nil {
		return nil
	}
	return b.ended(actx)
}

// newWriter returns what writes the attempt's messages to its Sink. The
// in-flight bound caps the broker writes under way; when it is reached the
// weida receive loop stops reading, and QUIC flow control pushes back on
// the remote publisher.
func (b *outboundBridge) newWriter(ctx context.Context, a *outAttempt) outboundWriter {
	limit := b.spec.inFlight()
	if w, ok := a.sink.(Windowed); ok {
		if n := w.Window(); n > 0 && n < limit {
			limit = n
		}
	}
	if aw, ok := a.sink.(AsyncWriter); ok {
		return newAsyncWrites(ctx, a, aw, limit)
	}
	return newWriterPool(ctx, a, limit)
}

// ended is the failure of an attempt whose Sink failed (actx's cause).
func (b *outboundBridge) ended(actx context.Context) error {
	// The subscription went with the attempt; the next one dials again.
	if b.tripped.Load() {
		b.reportWeida(false, FailFenced, "fenced: this replica no longer holds the resource's lease")
	} else {
		b.reportWeida(false, FailConnectionLost, "the broker side failed; the endpoint is dialled again by the next attempt")
	}
	if err := context.Cause(actx); err != nil {
		var f *Failure
		if errors.As(err, &f) {
			return f
		}
	}
	return &Failure{Reason: FailConnectionLost, Err: errors.New("connectors: the outbound attempt ended")}
}

// dialLoop dials the weida endpoint, subscribes and receives until ctx
// ends, re-dialling after every loss with a backoff. The subscription
// then held leaves the endpoint with Shutdown, received from until that
// is over or recvCtx ends.
func (b *outboundBridge) dialLoop(ctx, recvCtx context.Context, out outboundWriter, a *outAttempt) {
	attempt := 0
	for ctx.Err() == nil {
		sub, err := b.dial(ctx)
		if err == nil {
			err = b.subscribeAll(ctx, sub)
			if err != nil {
				sub.Close()
			}
		}
		if err != nil {
			if ctx.Err() != nil {
				return
			}
			attempt++
			b.reportWeida(false, dialReason(err), err.Error())
			b.stats.rlog.Log(slog.LevelWarn, "dial", "dialling the weida endpoint failed; retrying", slog.String("endpoint", b.spec.Endpoint), slog.Any("err", err), slog.Int("attempt", attempt))
			if !sleep(ctx, b.deps.Backoff(attempt)) {
				return
			}
			continue
		}
		if attempt > 0 || b.stats.count.received.Load() > 0 {
			b.stats.reconnected("weida")
		}
		attempt = 0
		b.stats.weidaSubscribed(b.deps.Now())
		// The URL dialled, not the configured one: with failover
		// addresses, /status says which replica answered.
		b.reportWeida(true, "Subscribed", fmt.Sprintf("%d filters on %s", len(b.weidaFilters), sub.URL()))
		left := leaveWhenDone(ctx, recvCtx, sub)
		err = b.receiveLoop(recvCtx, sub, out, a)
		left()
		sub.Close()
		if n := sub.Stats().DroppedUnread; n > 0 {
			// Copies that had arrived and were never read: the
			// endpoint counted them as written.
			b.stats.drop("", ReasonConnectionClosed, int(n), slog.LevelWarn, "the weida connection closed with copies not yet read; they are lost")
		}
		// weida keeps nothing for a subscriber that is away: from now
		// until the next subscription, what the endpoint publishes is
		// lost. A stop opens a gap too; a reload's successor closes it.
		b.stats.weidaLost(b.deps.Now())
		if ctx.Err() != nil {
			return
		}
		b.reportWeida(false, FailConnectionLost, err.Error())
		b.log.Warn("weida connection lost; re-dialling", "err", err)
	}
}

// leaveWhenDone has sub leave the endpoint with Shutdown, bounded by
// bound, once ctx ends; the receive loop keeps taking what arrives until
// Shutdown closes sub. The returned func waits for a Shutdown that began.
//
// Close would lose, counted nowhere, the copies the publisher had already
// written and that were still between the two QUIC stacks: weida has no
// acknowledgement, so the publisher counted them as delivered. Shutdown
// receives them, and they are then written or dropped under a reason.
//
// It does so when the Sink failed too, although nothing received then can
// be written: every copy Shutdown receives is counted (connection-lost)
// where Close would have lost some without a trace. The cost is the
// quiet period Shutdown waits for (about 100 ms on a near endpoint, never
// more than the drain bound), added to the backoff before the next
// attempt, whose shortest wait is of the same order. A stop or failure
// while dialling has nothing to leave.
func leaveWhenDone(ctx, bound context.Context, sub *weida.Subscriber) (wait func()) {
	done := make(chan struct{})
	stop := context.AfterFunc(ctx, func() {
		defer close(done)
		_ = sub.Shutdown(bound)
	})
	return func() {
		if !stop() {
			<-done
		}
	}
}

// dialReason names a failed dial of the weida endpoint: a [*Failure] from
// the DialFunc names itself, a certificate that is not the pinned one is
// [weida.ErrFingerprintMismatch], failover addresses that answered without
// publishing the path are [weida.ErrPathNotServed] (the endpoint is not
// up on any of them yet, or the URL's path is wrong), and anything else is
// FailWeidaDial (with failover addresses, weida.Failover's error says what
// each one answered).
func dialReason(err error) string {
	var f *Failure
	switch {
	case errors.As(err, &f) && f.Reason != "":
		return f.Reason
	case errors.Is(err, weida.ErrFingerprintMismatch):
		return FailFingerprintMismatch
	case errors.Is(err, weida.ErrPathNotServed):
		return FailPathNotServed
	}
	return FailWeidaDial
}

func (b *outboundBridge) subscribeAll(ctx context.Context, sub *weida.Subscriber) error {
	for _, f := range b.weidaFilters {
		if err := sub.Subscribe(ctx, f); err != nil {
			return fmt.Errorf("subscribe %q: %w", f, err)
		}
	}
	return nil
}

type outboundItem struct {
	route Route
	msg   *Message
}

func (b *outboundBridge) receiveLoop(ctx context.Context, sub *weida.Subscriber, out outboundWriter, a *outAttempt) error {
	for {
		// Receive returns a copy that has arrived even after ctx ended.
		if err := ctx.Err(); err != nil {
			return err
		}
		wm, err := sub.Receive(ctx)
		if err != nil {
			return err
		}
		now := b.deps.Now()
		b.stats.received()
		ft, err := b.spec.Policy.TopicFromWeida(wm.Topic)
		if err != nil {
			b.drop("", refusalRule(err), slog.LevelWarn, "weida topic has no exact broker form; dropped", slog.String("weida_topic", wm.Topic), slog.String("why", err.Error()))
			continue
		}
		route, reason := b.outboundRouteOf(wm.Topic, ft)
		if reason != "" {
			b.drop("", reason, slog.LevelInfo, "no route may produce this topic; dropped", slog.String("topic", ft))
			continue
		}
		if !b.guard(route, ft, wm.Topic) {
			continue
		}
		if b.spec.MaxMessageBytes > 0 && len(wm.Payload) > b.spec.MaxMessageBytes {
			b.drop(route.Name, ReasonTooLarge, slog.LevelWarn, "payload over spec.limits.maxMessageBytes; dropped", slog.String("topic", ft), slog.Int("bytes", len(wm.Payload)))
			continue
		}
		m := &Message{
			Topic:            ft,
			Payload:          wm.Payload,
			ContentType:      wm.ContentType,
			Traceparent:      wm.Traceparent,
			Tracestate:       wm.Tracestate,
			ReceivedUnixNano: now.UnixNano(),
		}
		if a.lost.Load() {
			// Received while leaving after the Sink failed: there is
			// nothing to write it to.
			b.drop(route.Name, ReasonConnectionLost, slog.LevelWarn, "the broker connection failed; message not published", slog.String("topic", ft))
			continue
		}
		if b.fenced() {
			// Another replica may hold the lease, and subscribes to
			// the endpoint itself: its copy is the one to publish.
			b.drop(route.Name, ReasonFenced, slog.LevelWarn, "fenced: this replica no longer holds the resource's lease; message not published", slog.String("topic", ft))
			a.fence()
			continue
		}
		b.stats.taken()
		if err := out.submit(ctx, outboundItem{route: route, msg: m}); err != nil {
			b.stats.settled()
			b.drop(route.Name, a.lostReason(), slog.LevelWarn, "stopping; message not published", slog.String("topic", ft))
			return err
		}
	}
}

// outboundWriter takes converted messages from the receive loop to the
// Sink, at most the in-flight bound at a time.
type outboundWriter interface {
	// submit waits for room and starts writing it; it fails only when
	// ctx ends first.
	submit(ctx context.Context, it outboundItem) error
	// wait returns once every submitted message is settled.
	wait()
}

// writerPool drives a Sink that only has the blocking Write: a fixed pool
// of goroutines, each writing one message at a time.
type writerPool struct {
	work chan outboundItem
	wg   sync.WaitGroup
}

func newWriterPool(ctx context.Context, a *outAttempt, writers int) *writerPool {
	p := &writerPool{work: make(chan outboundItem, writers)}
	for range writers {
		p.wg.Go(func() {
			for it := range p.work {
				a.finishWrite(ctx, it, a.write(ctx, it))
				a.b.stats.settled()
			}
		})
	}
	return p
}

func (p *writerPool) submit(ctx context.Context, it outboundItem) error {
	select {
	case p.work <- it:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *writerPool) wait() {
	close(p.work)
	p.wg.Wait()
}

// asyncWrites drives an [AsyncWriter]: the receive loop starts each write
// and the Sink reports its outcome. Only a failed write gets a goroutine,
// which retries it with Write as the pool would.
type asyncWrites struct {
	a       *outAttempt
	ctx     context.Context // bounds retries, as the pool's writers
	aw      AsyncWriter
	slots   chan struct{} // one token per write under way
	pending sync.WaitGroup
}

func newAsyncWrites(ctx context.Context, a *outAttempt, aw AsyncWriter, limit int) *asyncWrites {
	return &asyncWrites{a: a, ctx: ctx, aw: aw, slots: make(chan struct{}, limit)}
}

func (w *asyncWrites) submit(ctx context.Context, it outboundItem) error {
	select {
	case w.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	case <-w.ctx.Done():
		// The writes were ended (a failed Sink): its window may never
		// free a slot until it is closed, which waits for this loop.
		return w.ctx.Err()
	}
	w.pending.Add(1)
	if w.a.b.fenced() {
		w.a.finishWrite(w.ctx, it, ErrFenced)
		w.release()
		return nil
	}
	w.aw.WriteAsync(it.msg, func(err error) {
		if err == nil {
			w.a.written(it)
			w.release()
			return
		}
		go func() {
			defer w.release()
			w.a.finishWrite(w.ctx, it, err)
		}()
	})
	return nil
}

func (w *asyncWrites) release() {
	w.a.b.stats.settled()
	<-w.slots
	w.pending.Done()
}

func (w *asyncWrites) wait() { w.pending.Wait() }

// written counts a message the broker accepted.
func (a *outAttempt) written(it outboundItem) {
	a.b.stats.bridged(it.route.Name, it.msg.ReceivedUnixNano, a.b.deps.Now())
}

// finishWrite settles a message whose first write returned err: it counts
// it, or writes it again with Write while the broker is unreachable (or,
// a few times, when it failed otherwise and not for good), until it is
// published or dropped and counted. An error that ends the attempt (see
// endsAttempt) fails the attempt, and the message is counted as lost.
func (a *outAttempt) finishWrite(ctx context.Context, it outboundItem, err error) {
	const maxAttempts = 5
	b := a.b
	waits := 0 // waits in a row for the driver to reconnect: they lengthen
	for attempt := 1; ; attempt++ {
		if err == nil {
			a.written(it)
			return
		}
		var u Unroutable
		var rj Rejected
		switch {
		case errors.Is(err, ErrFenced):
			a.fence()
			b.drop(it.route.Name, ReasonFenced, slog.LevelWarn, "fenced: this replica no longer holds the resource's lease; message not published", slog.String("topic", it.msg.Topic))
			return
		case errors.As(err, &u) && u.Unroutable():
			b.drop(it.route.Name, ReasonUnroutable, slog.LevelInfo, "the broker had nowhere to route the message", slog.String("topic", it.msg.Topic))
			return
		case errors.As(err, &rj):
			b.drop(it.route.Name, rj.RejectReason(), slog.LevelError, "the broker rejected the message; dropped without retrying",
				slog.String("topic", it.msg.Topic), slog.Int("bytes", len(it.msg.Payload)), slog.Any("err", err))
			return
		case endsAttempt(err, a.closing.Load()):
			a.fail(err)
			b.drop(it.route.Name, ReasonConnectionLost, slog.LevelWarn, "the broker connection failed with the message in flight; not published",
				slog.String("topic", it.msg.Topic), slog.Any("err", err))
			return
		case ctx.Err() != nil, errors.Is(err, ErrClosed):
			b.drop(it.route.Name, a.lostReason(), slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
			return
		case errors.Is(err, ErrNotConnected):
			// Wait for the driver to reconnect; the message is held, and
			// the receive loop stalls once the in-flight bound is reached.
			waits++
			if !sleep(ctx, b.deps.Backoff(waits)) {
				b.drop(it.route.Name, a.lostReason(), slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
				return
			}
			// Waiting for a reconnect is not a failed write.
			attempt = 0
		case attempt >= maxAttempts:
			b.drop(it.route.Name, ReasonPublishFailed, slog.LevelError, "the broker refused the message; dropped",
				slog.String("topic", it.msg.Topic), slog.Any("err", err))
			return
		default:
			b.stats.rlog.Log(slog.LevelWarn, "write-retry", "publishing failed; retrying", slog.String("topic", it.msg.Topic), slog.Any("err", err), slog.Int("attempt", attempt))
			if !sleep(ctx, b.deps.Backoff(attempt)) {
				b.drop(it.route.Name, a.lostReason(), slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
				return
			}
		}
		err = a.write(ctx, it)
	}
}
