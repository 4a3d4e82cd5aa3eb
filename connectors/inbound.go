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

// inbound is the state of a bridge from a broker onto a hosted weida
// publisher path.
type inbound struct {
	newSource SourceFactory

	pubMu sync.Mutex
	pub   Publisher // nil until the runtime holds the path

	// supersedes are the broker filters of the resource this one
	// replaced; given to each Source until one has started.
	supersedes []string
	retiring   atomic.Bool // the resource is being removed, not restarted
}

func (b *Bridge) setPublisher(p Publisher) {
	b.in.pubMu.Lock()
	b.in.pub = p
	b.in.pubMu.Unlock()
	if p != nil {
		st := b.stats
		p.OnCopiesLost(st.copiesLost)
		p.CountCopiesUnconfirmed(st.copiesUnconfirmed)
		b.installReplayer(p)
	}
}

func (b *Bridge) publisher() Publisher {
	b.in.pubMu.Lock()
	defer b.in.pubMu.Unlock()
	return b.in.pub
}

// runInbound is one attempt of an inbound bridge. Messages are read and
// settled one at a time, so when it returns none is left half handled:
// those the broker delivered and Read did not return stay with the broker.
func (b *Bridge) runInbound(ctx context.Context) error {
	pub := b.publisher()
	if pub == nil {
		return &Failure{Reason: FailListen, Err: errors.New("connectors: no weida publisher path to publish on")}
	}
	report, retire := b.newAttempt(nil) // a Source's Read reports its loss
	defer retire()
	src, err := b.in.newSource(report)
	if err != nil {
		return failure(err, FailSourceInvalid)
	}
	if sp, ok := src.(Superseding); ok && len(b.in.supersedes) > 0 {
		sp.Supersede(b.in.supersedes)
	}
	if dr, ok := src.(DropReporter); ok {
		dr.ReportDrops(func(filter, reason string, n int) {
			b.stats.drop(b.routeByForeign[filter].Name, reason, n, slog.LevelWarn,
				"the broker client discarded messages before the bridge read them")
		})
	}
	defer func() {
		retire()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rs, ok := src.(Retiring); ok && b.in.retiring.Load() {
			if err := rs.Retire(cctx); err != nil {
				b.log.Warn("the broker may keep this removed resource's subscriptions until its session expires", "err", err)
			}
		}
		if err := src.Close(cctx); err != nil {
			b.log.Warn("closing the broker connection", "err", err)
		}
	}()
	// The publisher path is registered before the broker subscription, so
	// the endpoint is ready as soon as messages can arrive.
	b.reportWeida(true, "Hosting", b.spec.Endpoint)
	filters := make([]string, 0, len(b.spec.Routes))
	for _, r := range b.spec.Routes {
		filters = append(filters, r.Foreign)
	}
	if stopped, err := b.start(ctx, func(ctx context.Context) error { return src.Start(ctx, filters) }); stopped || err != nil {
		return err
	}
	b.in.supersedes = nil
	b.seedLastValues(ctx, src, filters)
	b.attemptStarted()
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
		b.handleInbound(ctx, pub, m, ack)
	}
}

// handleInbound converts, guards and publishes one message, then settles it.
func (b *Bridge) handleInbound(ctx context.Context, pub Publisher, m *Message, ack AckFunc) {
	start := b.deps.Now()
	if m.ReceivedUnixNano == 0 {
		m.ReceivedUnixNano = start.UnixNano()
	}
	b.stats.received()
	b.stats.taken()
	settle := func(err error) {
		ack(err)
		b.stats.settled()
		if err == nil {
			b.stats.acked()
		}
	}
	if m.Looped {
		b.drop("", ReasonLoop, slog.LevelDebug, "not bridging a message this connector published", slog.String("topic", m.Topic))
		settle(nil)
		return
	}
	wt, err := b.spec.Policy.TopicToWeida(m.Topic)
	var route Route
	var ok bool
	if b.routeIndex != nil && err == nil {
		route, ok = b.indexedRoute(wt, m.Topic)
	} else {
		route, ok = b.inboundRoute(m.Topic)
	}
	if !ok {
		b.drop("", ReasonNoRoute, slog.LevelWarn, "the broker delivered a topic no route selects", slog.String("topic", m.Topic))
		settle(nil)
		return
	}
	if err != nil {
		b.drop(route.Name, refusalRule(err), slog.LevelWarn, "topic has no exact weida form; dropped", slog.String("topic", m.Topic), slog.String("why", err.Error()))
		settle(nil)
		return
	}
	if !b.guard(route, m.Topic, wt) {
		settle(nil)
		return
	}
	if b.spec.MaxMessageBytes > 0 && len(m.Payload) > b.spec.MaxMessageBytes {
		b.drop(route.Name, ReasonTooLarge, slog.LevelWarn, "payload over spec.limits.maxMessageBytes; dropped",
			slog.String("topic", m.Topic), slog.Int("bytes", len(m.Payload)))
		settle(nil)
		return
	}
	wm := weida.Message{
		Topic:       wt,
		ContentType: m.ContentType,
		Traceparent: m.Traceparent,
		Tracestate:  m.Tracestate,
		Payload:     m.Payload,
	}
	for {
		if b.spec.Hold && !b.awaitSubscriber(ctx, pub, wt) {
			// Stopping: the message stays with the broker, which
			// delivers it again.
			settle(ctx.Err())
			return
		}
		res, err := b.publish(ctx, pub, m, wm)
		if err != nil {
			if ctx.Err() != nil {
				// Shutting down: leave it to the broker to deliver again.
				settle(err)
				return
			}
			reason := ReasonWeidaRefused
			if errors.Is(err, weida.ErrPayloadTooLarge) {
				reason = ReasonTooLarge
			}
			b.drop(route.Name, reason, slog.LevelWarn, "weida refused the message; dropped", slog.String("topic", m.Topic), slog.Any("err", err))
			settle(nil)
			return
		}
		b.stats.copies(route.Name, res.Queued, res.Dropped, res.Closing)
		switch {
		case res.Queued > 0:
			b.stats.bridged(route.Name, m.ReceivedUnixNano, b.deps.Now())
			settle(nil)
			return
		case res.Dropped > res.Closing:
			// Live subscribers were there but could not take it: their
			// drops are counted (subscriber-buffer-full), as under
			// either choice; hold waits for a subscriber, not for a
			// slow one.
			settle(nil)
			return
		case !b.spec.Hold:
			b.drop(route.Name, ReasonNoSubscriber, slog.LevelInfo, "no weida subscriber wants this topic; dropped (whenNoSubscriber: drop)",
				slog.String("topic", m.Topic), slog.String("weida_topic", wt))
			settle(nil)
			return
		}
		// Holding, and the subscriber left between the wait and the
		// publish: wait again.
	}
}

// awaitSubscriber waits until a live weida subscriber would get a copy of
// topic. It reports false when ctx ended first. The wait blocks the read
// loop, so the Source takes nothing more from the broker meanwhile and the
// broker's own flow control (prefetch, max ack pending, receive maximum)
// holds the rest.
func (b *Bridge) awaitSubscriber(ctx context.Context, pub Publisher, topic string) bool {
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

// inboundRoute finds the first route whose foreign filter selects t.
func (b *Bridge) inboundRoute(t string) (Route, bool) {
	g := b.spec.Policy.Grammar()
	for _, r := range b.spec.Routes {
		if g.Match(r.Foreign, t) && b.spec.Policy.Admit(r.Foreign, t) {
			return r, true
		}
	}
	return Route{}, false
}
