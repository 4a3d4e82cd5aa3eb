package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/topic"
)

// Route is one validated route of a resource: the filter in the broker's
// grammar and its exact weida conversion.
type Route struct {
	Name    string // metric label; the foreign filter when the resource names none
	Foreign string
	Weida   string
}

// Spec is what the runtime needs to know of one resource, already loaded
// and validated by package resources.
type Spec struct {
	Name      string
	Protocol  policy.Protocol
	Direction policy.Direction
	Policy    policy.Policy
	Routes    []Route
	// Endpoint is the weida URL the resource hosts (inbound) or dials
	// (outbound), for status and logs.
	Endpoint string
	// Broker is the broker URL, for status. It must carry no credentials
	// (package resources refuses user information in broker URLs).
	Broker string
	// Losses are the declared losses of the resource's conversion, for
	// status. Nil means none.
	Losses []string
	// MaxMessageBytes drops larger payloads (counted). Zero means no
	// limit beyond the weida peer's own.
	MaxMessageBytes int
	// InFlight bounds messages read and not yet settled (outbound: broker
	// writes under way). Zero means 64.
	InFlight int
}

func (s Spec) inFlight() int {
	if s.InFlight > 0 {
		return s.InFlight
	}
	return 64
}

// Deps are the process-wide services a bridge reports to.
type Deps struct {
	Metrics *Metrics     // required
	Logger  *slog.Logger // nil: discard
	// Now is the clock; nil means time.Now. Tests inject one.
	Now func() time.Time
	// Backoff returns the wait before re-dial attempt n (n ≥ 1); nil
	// means exponential from 100 ms to 10 s.
	Backoff func(n int) time.Duration
	// Drain bounds how long a stopping bridge keeps finishing the work it
	// already took; zero means 5 s.
	Drain time.Duration
}

func (d *Deps) drain() time.Duration {
	if d.Drain > 0 {
		return d.Drain
	}
	return 5 * time.Second
}

func (d *Deps) fill() {
	if d.Logger == nil {
		d.Logger = slog.New(slog.DiscardHandler)
	}
	if d.Now == nil {
		d.Now = time.Now
	}
	if d.Backoff == nil {
		d.Backoff = ExponentialBackoff(100*time.Millisecond, 10*time.Second)
	}
}

// ExponentialBackoff doubles from min to max.
func ExponentialBackoff(min, max time.Duration) func(int) time.Duration {
	return func(n int) time.Duration {
		d := min
		for i := 1; i < n && d < max; i++ {
			d *= 2
		}
		return min2(d, max)
	}
}

func min2(a, b time.Duration) time.Duration {
	if a < b {
		return a
	}
	return b
}

// Publisher is the weida side of an inbound bridge: a publisher path the
// connector hosts. *weida.Publisher implements it.
type Publisher interface {
	Publish(ctx context.Context, m weida.Message) (weida.Result, error)
	Subscribers() int
}

// SourceFactory builds an inbound bridge's Source, which reports its
// connection state to report.
type SourceFactory func(report StateFunc) (Source, error)

// SinkFactory builds an outbound bridge's Sink.
type SinkFactory func(report StateFunc) (Sink, error)

// DialFunc dials the weida publisher endpoint of an outbound bridge.
type DialFunc func(ctx context.Context) (*weida.Subscriber, error)

// Bridge runs one resource. Create it with [NewInbound] or [NewOutbound],
// start it with Run; Status may be called at any time from any goroutine.
type Bridge struct {
	spec  Spec
	deps  Deps
	conds *conditions
	count counters
	rlog  *rateLogger
	log   *slog.Logger

	// inbound
	newSource  SourceFactory
	pub        Publisher
	supersedes []string    // broker filters of the resource this one replaced
	retiring   atomic.Bool // the resource is being removed, not restarted

	// outbound
	newSink SinkFactory
	dial    DialFunc

	routeByForeign map[string]Route // routes keyed by foreign filter
	weidaFilters   []string         // distinct weida filters, outbound subscriptions
	m              series
}

// series are the bridge's metric children, resolved once: a label lookup
// per message costs more than the count itself.
type series struct {
	received, acked, copiesQueued, copiesDropped prometheus.Counter
	inFlight                                     prometheus.Gauge
	latency                                      prometheus.Observer
	bridged                                      map[string]prometheus.Counter // by route name
}

func newSeries(m *Metrics, name string, routes []Route) series {
	s := series{
		received:      m.Received.WithLabelValues(name),
		acked:         m.Acknowledged.WithLabelValues(name),
		copiesQueued:  m.CopiesQueued.WithLabelValues(name, "queued"),
		copiesDropped: m.CopiesQueued.WithLabelValues(name, "dropped"),
		inFlight:      m.InFlight.WithLabelValues(name),
		latency:       m.Latency.WithLabelValues(name),
		bridged:       make(map[string]prometheus.Counter, len(routes)),
	}
	for _, r := range routes {
		s.bridged[r.Name] = m.Bridged.WithLabelValues(name, r.Name)
	}
	return s
}

// NewInbound returns a bridge from a broker (through the Source newSource
// builds) onto a hosted weida publisher path.
func NewInbound(spec Spec, newSource SourceFactory, pub Publisher, deps Deps) *Bridge {
	b := newBridge(spec, deps)
	b.newSource, b.pub = newSource, pub
	return b
}

// NewOutbound returns a bridge from a remote weida publisher endpoint
// (dialled with dial) onto a broker, through the Sink newSink builds.
func NewOutbound(spec Spec, dial DialFunc, newSink SinkFactory, deps Deps) *Bridge {
	b := newBridge(spec, deps)
	b.dial, b.newSink = dial, newSink
	return b
}

func newBridge(spec Spec, deps Deps) *Bridge {
	deps.fill()
	log := deps.Logger.With("resource", spec.Name, "protocol", string(spec.Protocol), "direction", string(spec.Direction))
	b := &Bridge{
		spec:           spec,
		deps:           deps,
		conds:          newConditions(deps.Now),
		rlog:           newRateLogger(log, 10*time.Second, deps.Now),
		log:            log,
		routeByForeign: make(map[string]Route, len(spec.Routes)),
	}
	b.m = newSeries(deps.Metrics, spec.Name, spec.Routes)
	seen := make(map[string]bool)
	for _, r := range spec.Routes {
		b.routeByForeign[r.Foreign] = r
		if !seen[r.Weida] {
			seen[r.Weida] = true
			b.weidaFilters = append(b.weidaFilters, r.Weida)
		}
	}
	return b
}

// Spec returns the resource the bridge runs.
func (b *Bridge) Spec() Spec { return b.spec }

// Status returns a snapshot of the bridge's conditions and counters.
func (b *Bridge) Status() Status {
	c := b.count.snapshot()
	if b.pub != nil {
		c.Subscribers = b.pub.Subscribers()
		b.deps.Metrics.Subscribers.WithLabelValues(b.spec.Name).Set(float64(c.Subscribers))
	}
	// Routes and Losses are copied: a Status is the caller's to keep.
	var routes []RouteStatus
	if len(b.spec.Routes) > 0 {
		routes = make([]RouteStatus, len(b.spec.Routes))
		for i, r := range b.spec.Routes {
			routes[i] = RouteStatus(r)
		}
	}
	return Status{
		Name:       b.spec.Name,
		Protocol:   string(b.spec.Protocol),
		Direction:  string(b.spec.Direction),
		Broker:     b.spec.Broker,
		Endpoint:   b.spec.Endpoint,
		Routes:     routes,
		Losses:     slices.Clone(b.spec.Losses),
		Conditions: b.conds.snapshot(),
		Counters:   c,
	}
}

// Fail marks the bridge as failed with a reason that stays visible in its
// status; used when it cannot even start.
func (b *Bridge) Fail(reason string, err error) {
	b.conds.fail(reason, err.Error())
	b.log.Error("resource failed", "reason", reason, "err", err)
}

func (b *Bridge) reportBroker(s ConnState) {
	was := b.conds.snapshot()[0]
	b.conds.set(0, s.Up, s.Reason, s.Detail)
	up := 0.0
	if s.Up {
		up = 1
		if was.Reason != "Starting" && was.Status != "True" {
			b.count.reconnects.Add(1)
			b.deps.Metrics.Reconnects.WithLabelValues(b.spec.Name, "broker").Inc()
		}
	}
	b.deps.Metrics.Up.WithLabelValues(b.spec.Name, "broker").Set(up)
	if s.Up {
		b.log.Info("broker connected", "reason", s.Reason)
	} else {
		b.rlog.Log(slog.LevelWarn, "broker-down", "broker not connected", slog.String("reason", s.Reason), slog.String("detail", s.Detail))
	}
}

func (b *Bridge) reportWeida(up bool, reason, detail string) {
	b.conds.set(1, up, reason, detail)
	v := 0.0
	if up {
		v = 1
	}
	b.deps.Metrics.Up.WithLabelValues(b.spec.Name, "weida").Set(v)
}

// drop counts one message not delivered and logs it at a rate-limited level.
func (b *Bridge) drop(route, reason string, level slog.Level, msg string, attrs ...slog.Attr) {
	b.count.drop(reason, 1)
	b.deps.Metrics.Dropped.WithLabelValues(b.spec.Name, route, reason).Inc()
	attrs = append(attrs, slog.String("reason", reason), slog.String("route", route))
	b.rlog.Log(level, "drop:"+reason, msg, attrs...)
}

func refusalRule(err error) string {
	var r *policy.Refusal
	if errors.As(err, &r) && r.Rule != "" {
		return r.Rule
	}
	return "conversion-failed"
}

// Run bridges until ctx ends, then drains: in-flight work is given until
// the context's cause... it returns after every goroutine it started has
// stopped. It returns nil on a clean stop and an error when the bridge
// could not start.
func (b *Bridge) Run(ctx context.Context) error {
	b.deps.Metrics.Up.WithLabelValues(b.spec.Name, "broker").Set(0)
	b.deps.Metrics.Up.WithLabelValues(b.spec.Name, "weida").Set(0)
	if b.spec.Direction == policy.Outbound {
		return b.runOutbound(ctx)
	}
	return b.runInbound(ctx)
}

// ---- inbound ----

func (b *Bridge) runInbound(ctx context.Context) error {
	src, err := b.newSource(b.reportBroker)
	if err != nil {
		b.Fail("SourceInvalid", err)
		return err
	}
	if sp, ok := src.(Superseding); ok && len(b.supersedes) > 0 {
		sp.Supersede(b.supersedes)
	}
	if dr, ok := src.(DropReporter); ok {
		dr.ReportDrops(func(filter, reason string, n int) {
			route := b.routeByForeign[filter].Name
			b.count.drop(reason, uint64(n))
			b.deps.Metrics.Dropped.WithLabelValues(b.spec.Name, route, reason).Add(float64(n))
			b.rlog.Log(slog.LevelWarn, "drop:"+reason, "the broker client discarded messages before the bridge read them",
				slog.String("reason", reason), slog.String("route", route), slog.Int("messages", n))
		})
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if rs, ok := src.(Retiring); ok && b.retiring.Load() {
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
	if err := src.Start(ctx, filters); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		b.Fail("SubscribeFailed", err)
		return err
	}
	for {
		m, ack, err := src.Read(ctx)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, ErrClosed) {
				return nil
			}
			b.rlog.Log(slog.LevelWarn, "read", "reading from the broker failed", slog.Any("err", err))
			continue
		}
		b.handleInbound(ctx, m, ack)
	}
}

// handleInbound converts, guards and publishes one message, then settles it.
func (b *Bridge) handleInbound(ctx context.Context, m *Message, ack AckFunc) {
	name := b.spec.Name
	start := b.deps.Now()
	if m.ReceivedUnixNano == 0 {
		m.ReceivedUnixNano = start.UnixNano()
	}
	b.count.received.Add(1)
	b.count.inFlight.Add(1)
	b.m.received.Inc()
	b.m.inFlight.Inc()
	settle := func(err error) {
		ack(err)
		b.count.inFlight.Add(-1)
		b.m.inFlight.Dec()
		if err == nil {
			b.count.acked.Add(1)
			b.m.acked.Inc()
		}
	}
	if m.Looped {
		b.drop("", ReasonLoop, slog.LevelDebug, "not bridging a message this connector published", slog.String("topic", m.Topic))
		settle(nil)
		return
	}
	route, ok := b.inboundRoute(m.Topic)
	if !ok {
		b.drop("", ReasonNoRoute, slog.LevelWarn, "the broker delivered a topic no route selects", slog.String("topic", m.Topic))
		settle(nil)
		return
	}
	wt, err := b.spec.Policy.TopicToWeida(m.Topic)
	if err != nil {
		b.drop(route.Name, refusalRule(err), slog.LevelWarn, "topic has no exact weida form; dropped", slog.String("topic", m.Topic), slog.String("why", err.Error()))
		settle(nil)
		return
	}
	if !topic.Match(route.Weida, wt) {
		b.drop(route.Name, ReasonGuardMismatch, slog.LevelError, "DEFECT: converted topic escapes the route's converted filter; dropped",
			slog.String("topic", m.Topic), slog.String("weida_topic", wt), slog.String("weida_filter", route.Weida))
		settle(nil)
		return
	}
	if b.spec.MaxMessageBytes > 0 && len(m.Payload) > b.spec.MaxMessageBytes {
		b.drop(route.Name, ReasonTooLarge, slog.LevelWarn, "payload over spec.limits.maxMessageBytes; dropped",
			slog.String("topic", m.Topic), slog.Int("bytes", len(m.Payload)))
		settle(nil)
		return
	}
	res, err := b.pub.Publish(ctx, weida.Message{
		Topic:       wt,
		ContentType: m.ContentType,
		Traceparent: m.Traceparent,
		Tracestate:  m.Tracestate,
		Payload:     m.Payload,
	})
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
	if res.Dropped > 0 {
		b.m.copiesDropped.Add(float64(res.Dropped))
		b.count.drop(ReasonSubscriberBuf, uint64(res.Dropped))
		b.deps.Metrics.Dropped.WithLabelValues(name, route.Name, ReasonSubscriberBuf).Add(float64(res.Dropped))
		b.rlog.Log(slog.LevelWarn, "drop:"+ReasonSubscriberBuf, "a weida subscriber is too slow; its copies are dropped",
			slog.String("route", route.Name), slog.Int("copies", res.Dropped))
	}
	if res.Queued > 0 {
		b.m.copiesQueued.Add(float64(res.Queued))
	}
	b.count.bridged.Add(1)
	b.m.bridged[route.Name].Inc()
	b.m.latency.Observe(b.deps.Now().Sub(time.Unix(0, m.ReceivedUnixNano)).Seconds())
	settle(nil)
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

// ---- outbound ----

func (b *Bridge) runOutbound(ctx context.Context) error {
	sink, err := b.newSink(b.reportBroker)
	if err != nil {
		b.Fail("SinkInvalid", err)
		return err
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := sink.Close(cctx); err != nil {
			b.log.Warn("closing the broker connection", "err", err)
		}
	}()
	if err := sink.Start(ctx); err != nil {
		if ctx.Err() != nil {
			return nil
		}
		b.Fail("ConnectFailed", err)
		return err
	}

	// The in-flight bound caps the broker writes under way; when it is
	// reached the weida receive loop stops reading, and QUIC flow control
	// pushes back on the remote publisher.
	// Writes outlive ctx by the drain bound, so that a stop finishes the
	// writes already taken from weida instead of dropping them.
	writeCtx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	stopDrain := context.AfterFunc(ctx, func() {
		time.AfterFunc(b.deps.drain(), cancelWrites)
	})
	limit := b.spec.inFlight()
	if w, ok := sink.(Windowed); ok {
		if n := w.Window(); n > 0 && n < limit {
			limit = n
		}
	}
	var out outboundWriter
	if aw, ok := sink.(AsyncWriter); ok {
		out = b.newAsyncWrites(writeCtx, sink, aw, limit)
	} else {
		out = b.newWriterPool(writeCtx, sink, limit)
	}
	defer func() {
		out.wait()
		stopDrain()
		cancelWrites()
	}()

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
				return nil
			}
			attempt++
			b.reportWeida(false, "DialFailed", err.Error())
			b.rlog.Log(slog.LevelWarn, "dial", "dialling the weida endpoint failed; retrying", slog.String("endpoint", b.spec.Endpoint), slog.Any("err", err), slog.Int("attempt", attempt))
			if !sleep(ctx, b.deps.Backoff(attempt)) {
				return nil
			}
			continue
		}
		if attempt > 0 || b.count.received.Load() > 0 {
			b.count.reconnects.Add(1)
			b.deps.Metrics.Reconnects.WithLabelValues(b.spec.Name, "weida").Inc()
		}
		attempt = 0
		b.reportWeida(true, "Subscribed", fmt.Sprintf("%d filters on %s", len(b.weidaFilters), b.spec.Endpoint))
		err = b.receiveLoop(ctx, sub, out)
		sub.Close()
		if ctx.Err() != nil {
			return nil
		}
		b.reportWeida(false, "ConnectionLost", err.Error())
		b.log.Warn("weida connection lost; re-dialling", "err", err)
	}
	return nil
}

func (b *Bridge) subscribeAll(ctx context.Context, sub *weida.Subscriber) error {
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

func (b *Bridge) receiveLoop(ctx context.Context, sub *weida.Subscriber, out outboundWriter) error {
	for {
		wm, err := sub.Receive(ctx)
		if err != nil {
			return err
		}
		now := b.deps.Now()
		b.count.received.Add(1)
		b.m.received.Inc()
		ft, err := b.spec.Policy.TopicFromWeida(wm.Topic)
		if err != nil {
			b.drop("", refusalRule(err), slog.LevelWarn, "weida topic has no exact broker form; dropped", slog.String("weida_topic", wm.Topic), slog.String("why", err.Error()))
			continue
		}
		route, reason := b.outboundRoute(ft)
		if reason != "" {
			b.drop("", reason, slog.LevelInfo, "no route may produce this topic; dropped", slog.String("topic", ft))
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
		b.count.inFlight.Add(1)
		b.m.inFlight.Inc()
		if err := out.submit(ctx, outboundItem{route: route, msg: m}); err != nil {
			b.outboundSettled()
			b.drop(route.Name, ReasonShutdown, slog.LevelWarn, "stopping; message not published", slog.String("topic", ft))
			return err
		}
	}
}

// outboundRoute finds the first route that may produce foreign topic t, or
// the reason none may. A topic kept from a route only by the foreign
// protocol's own exclusion (MQTT: '$' topics under a leading wildcard) is
// counted apart, under the policy's AdmitRule.
func (b *Bridge) outboundRoute(t string) (Route, string) {
	g := b.spec.Policy.Grammar()
	excluded := false
	for _, r := range b.spec.Routes {
		if !b.spec.Policy.Admit(r.Foreign, t) {
			excluded = true
			continue
		}
		if g.Match(r.Foreign, t) {
			return r, ""
		}
	}
	if rule := b.spec.Policy.AdmitRule(); excluded && rule != "" {
		return Route{}, rule
	}
	return Route{}, ReasonNoRoute
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

func (b *Bridge) newWriterPool(ctx context.Context, sink Sink, writers int) *writerPool {
	p := &writerPool{work: make(chan outboundItem, writers)}
	for range writers {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			for it := range p.work {
				b.finishWrite(ctx, sink, it, sink.Write(ctx, it.msg))
				b.outboundSettled()
			}
		}()
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
	b       *Bridge
	ctx     context.Context // bounds retries, as the pool's writers
	sink    Sink
	aw      AsyncWriter
	slots   chan struct{} // one token per write under way
	pending sync.WaitGroup
}

func (b *Bridge) newAsyncWrites(ctx context.Context, sink Sink, aw AsyncWriter, limit int) *asyncWrites {
	return &asyncWrites{b: b, ctx: ctx, sink: sink, aw: aw, slots: make(chan struct{}, limit)}
}

func (a *asyncWrites) submit(ctx context.Context, it outboundItem) error {
	select {
	case a.slots <- struct{}{}:
	case <-ctx.Done():
		return ctx.Err()
	}
	a.pending.Add(1)
	a.aw.WriteAsync(it.msg, func(err error) {
		if err == nil {
			a.b.written(it)
			a.release()
			return
		}
		go func() {
			defer a.release()
			a.b.finishWrite(a.ctx, a.sink, it, err)
		}()
	})
	return nil
}

func (a *asyncWrites) release() {
	a.b.outboundSettled()
	<-a.slots
	a.pending.Done()
}

func (a *asyncWrites) wait() { a.pending.Wait() }

func (b *Bridge) outboundSettled() {
	b.count.inFlight.Add(-1)
	b.m.inFlight.Dec()
}

// written counts a message the broker accepted.
func (b *Bridge) written(it outboundItem) {
	b.count.bridged.Add(1)
	b.m.bridged[it.route.Name].Inc()
	b.m.latency.Observe(b.deps.Now().Sub(time.Unix(0, it.msg.ReceivedUnixNano)).Seconds())
}

// finishWrite settles a message whose first write returned err: it counts
// it, or writes it again with Write while the broker is unreachable (or,
// a few times, when it failed otherwise and not for good), until it is
// published or dropped and counted.
func (b *Bridge) finishWrite(ctx context.Context, sink Sink, it outboundItem, err error) {
	const maxAttempts = 5
	for attempt := 1; ; attempt++ {
		if err == nil {
			b.written(it)
			return
		}
		var u Unroutable
		var rj Rejected
		switch {
		case errors.As(err, &u) && u.Unroutable():
			b.drop(it.route.Name, ReasonUnroutable, slog.LevelInfo, "the broker had nowhere to route the message", slog.String("topic", it.msg.Topic))
			return
		case errors.As(err, &rj):
			b.drop(it.route.Name, rj.RejectReason(), slog.LevelError, "the broker rejected the message; dropped without retrying",
				slog.String("topic", it.msg.Topic), slog.Int("bytes", len(it.msg.Payload)), slog.Any("err", err))
			return
		case ctx.Err() != nil:
			b.drop(it.route.Name, ReasonShutdown, slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
			return
		case errors.Is(err, ErrNotConnected):
			// Wait for the driver to reconnect; the message is held, and
			// the receive loop stalls once the in-flight bound is reached.
			if !sleep(ctx, b.deps.Backoff(min(attempt, 8))) {
				b.drop(it.route.Name, ReasonShutdown, slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
				return
			}
			attempt = 0
		case attempt >= maxAttempts:
			b.drop(it.route.Name, ReasonPublishFailed, slog.LevelError, "the broker refused the message; dropped",
				slog.String("topic", it.msg.Topic), slog.Any("err", err))
			return
		default:
			b.rlog.Log(slog.LevelWarn, "write-retry", "publishing failed; retrying", slog.String("topic", it.msg.Topic), slog.Any("err", err), slog.Int("attempt", attempt))
			if !sleep(ctx, b.deps.Backoff(attempt)) {
				b.drop(it.route.Name, ReasonShutdown, slog.LevelWarn, "stopping; message not published", slog.String("topic", it.msg.Topic))
				return
			}
		}
		err = sink.Write(ctx, it.msg)
	}
}

// ErrNotConnected is returned (wrapped) by a Sink's Write while its broker
// connection is down; the runtime holds the message and tries again.
var ErrNotConnected = errors.New("connectors: broker not connected")

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
