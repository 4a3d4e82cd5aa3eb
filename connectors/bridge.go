package connectors

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync/atomic"
	"time"

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
	// Hold (inbound) keeps each message unacknowledged until a live weida
	// subscriber's copy of it is queued: while nobody subscribes to its
	// topic the bridge waits and reads nothing more, and the broker keeps
	// the rest. False drops and counts such a message (no-subscriber) and
	// acknowledges it. Only sources whose broker keeps unacknowledged
	// messages should hold; package resources decides which.
	Hold bool
	// LastValue is the inbound resource's last-value cache; the zero
	// value keeps none. Outbound resources ignore it.
	LastValue LastValue
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
	// Backoff returns the wait after the n-th failure in a row (n ≥ 1):
	// between attempts of a unit, between re-dials of a weida endpoint and
	// between writes held while a broker is down. nil means
	// [Backoff]{}.Wait (jittered, 250 ms to 30 s). Tests inject a
	// deterministic one.
	Backoff func(n int) time.Duration
	// Drain bounds how long a stopping bridge keeps finishing the work it
	// already took; zero means 5 s.
	Drain time.Duration
	// StartTimeout bounds a Source's or Sink's Start: a driver whose
	// client library keeps retrying a broker it cannot reach would
	// otherwise hold the attempt open, and the failure would never show
	// in /status with its attempts. Zero means 10 s.
	StartTimeout time.Duration
}

func (d *Deps) startTimeout() time.Duration {
	if d.StartTimeout > 0 {
		return d.StartTimeout
	}
	return 10 * time.Second
}

// start runs a Source's or Sink's Start under the start timeout. It
// returns nil when ctx ended (a stop, not a failure), and the Start error
// as a *Failure otherwise.
func (b *Bridge) start(ctx context.Context, start func(context.Context) error) (stopped bool, err error) {
	sctx, cancel := context.WithTimeout(ctx, b.deps.startTimeout())
	defer cancel()
	if err := start(sctx); err != nil {
		if ctx.Err() != nil {
			return true, nil
		}
		return false, failure(err, FailStart)
	}
	return false, nil
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
		d.Backoff = Backoff{}.Wait
	}
}

// Publisher is the weida side of an inbound bridge: a publisher path the
// connector hosts. *weida.Publisher implements it; its documentation is
// the contract of each method.
type Publisher interface {
	Publish(ctx context.Context, m weida.Message) (weida.Result, error)
	Subscribers() int
	// Matches reports whether a live subscriber would get a copy of topic.
	Matches(topic string) bool
	// SubscriptionsChanged returns a channel closed at the next
	// subscription on the path.
	SubscriptionsChanged() <-chan struct{}
	// OnCopiesLost has fn called with the number of copies dropped after
	// Publish queued them (their connection closed first).
	OnCopiesLost(fn func(n int))
	// CountCopiesUnconfirmed has fn called with the number of copies
	// written to a subscriber connection that then vanished (no close
	// from either side): delivered or not, nobody can tell. Counting only,
	// so that the publisher keeps no frames for it.
	CountCopiesUnconfirmed(fn func(weida.UnconfirmedCopies))
}

// SourceFactory builds an inbound bridge's Source, which reports its
// connection state to report.
type SourceFactory func(report StateFunc) (Source, error)

// SinkFactory builds an outbound bridge's Sink.
type SinkFactory func(report StateFunc) (Sink, error)

// DialFunc dials the weida publisher endpoint of an outbound bridge.
type DialFunc func(ctx context.Context) (*weida.Subscriber, error)

// Bridge runs one resource. Create it with [NewInbound] or [NewOutbound],
// start an attempt with Run; Status may be called at any time from any
// goroutine. Its counters, metrics and conditions outlive an attempt: the
// runtime runs the attempts of one unit on one Bridge.
type Bridge struct {
	spec  Spec
	deps  Deps
	conds *conditions
	stats *stats
	log   *slog.Logger
	lv    *lastValues // inbound with a last-value cache; nil otherwise

	// gen numbers attempts; state reports of a Source or Sink from an
	// attempt that ended are ignored, so a failed attempt's last words
	// cannot overwrite the failure.
	gen atomic.Uint64

	routeByForeign map[string]Route // routes keyed by foreign filter
	// routeIndex, for a resource with routeIndexMin routes or more, holds
	// each route's position under its weida filter; nil: try each route.
	routeIndex *topic.Index[int]

	in  inbound
	out outbound
}

// NewInbound returns a bridge from a broker (through the Source newSource
// builds) onto a hosted weida publisher path. pub may be nil when the
// runtime sets it before each attempt.
func NewInbound(spec Spec, newSource SourceFactory, pub Publisher, deps Deps) *Bridge {
	b := newBridge(spec, deps)
	b.in.newSource = newSource
	b.setPublisher(pub)
	return b
}

// NewOutbound returns a bridge from a remote weida publisher endpoint
// (dialled with dial) onto a broker, through the Sink newSink builds.
func NewOutbound(spec Spec, dial DialFunc, newSink SinkFactory, deps Deps) *Bridge {
	b := newBridge(spec, deps)
	b.out.dial, b.out.newSink = dial, newSink
	seen := make(map[string]bool)
	for _, r := range spec.Routes {
		if !seen[r.Weida] {
			seen[r.Weida] = true
			b.out.weidaFilters = append(b.out.weidaFilters, r.Weida)
		}
	}
	return b
}

func newBridge(spec Spec, deps Deps) *Bridge {
	deps.fill()
	log := deps.Logger.With("resource", spec.Name, "protocol", string(spec.Protocol), "direction", string(spec.Direction))
	b := &Bridge{
		spec:           spec,
		deps:           deps,
		conds:          newConditions(deps.Now),
		log:            log,
		routeByForeign: make(map[string]Route, len(spec.Routes)),
	}
	b.stats = newStats(deps.Metrics, spec.Name, spec.Routes, NewRateLogger(log, 10*time.Second, deps.Now))
	if spec.Direction != policy.Outbound {
		b.lv = newLastValues(spec.LastValue, deps.Metrics, spec.Name)
	}
	for _, r := range spec.Routes {
		b.routeByForeign[r.Foreign] = r
	}
	if len(spec.Routes) >= routeIndexMin {
		b.routeIndex = topic.NewIndex[int]()
		for i, r := range spec.Routes {
			if b.routeIndex.Insert(r.Weida, i) != nil {
				b.routeIndex = nil // not a weida filter: keep trying each route
				break
			}
		}
	}
	return b
}

// routeIndexMin is the number of routes from which a bridge finds a
// message's route through an index of the routes' weida filters rather than
// by trying each route in turn. A scan costs one match per route before
// the one that selects the topic (10,000 routes: hundreds of µs per
// message); the index walks only the trie nodes the topic can reach, and
// costs about as much as a dozen matches.
const routeIndexMin = 16

// indexedRoute returns the first route, in the resource's order, whose weida
// filter matches wt and whose foreign filter admits ft, where wt and ft are
// one topic in its weida and foreign forms. By the policies' exactness
// contract (see package policy) that is the first route whose foreign filter
// selects ft, which a scan would find.
func (b *Bridge) indexedRoute(wt, ft string) (Route, bool) {
	best := -1
	b.routeIndex.Match(wt, func(i int) bool {
		if (best < 0 || i < best) && b.spec.Policy.Admit(b.spec.Routes[i].Foreign, ft) {
			best = i
		}
		return true
	})
	if best < 0 {
		return Route{}, false
	}
	return b.spec.Routes[best], true
}

// guard is the exactness guard, the last check before a message crosses:
// the route that was selected for it, by the index or by the scan, must
// select both of its forms, the foreign topic ft by the grammar's own
// matcher (and the protocol's own exclusions) and the weida topic wt by
// weida's. It re-checks what selected the route with other code, so that a
// defect in a policy's conversion or in the route index drops a message
// instead of delivering it where no route says. A miss is counted as
// guard-mismatch and logged, rate-limited.
func (b *Bridge) guard(r Route, ft, wt string) bool {
	p := b.spec.Policy
	if p.Grammar().Match(r.Foreign, ft) && p.Admit(r.Foreign, ft) && topic.Match(r.Weida, wt) {
		return true
	}
	b.drop(r.Name, ReasonGuardMismatch, slog.LevelError, "DEFECT: the converted topic escapes the route that selected it; dropped",
		slog.String("topic", ft), slog.String("weida_topic", wt), slog.String("filter", r.Foreign), slog.String("weida_filter", r.Weida))
	return false
}

// Spec returns the resource the bridge runs.
func (b *Bridge) Spec() Spec { return b.spec }

// Status returns a snapshot of the bridge's conditions and counters, and of
// its failure while it is down.
func (b *Bridge) Status() Status {
	c := b.stats.count.snapshot(b.deps.Now())
	if pub := b.publisher(); pub != nil {
		c.Subscribers = pub.Subscribers()
		b.deps.Metrics.Subscribers.WithLabelValues(b.spec.Name).Set(float64(c.Subscribers))
	}
	if b.lv != nil {
		c.LastValue = b.lv.snapshot()
	}
	conds, failure := b.conds.snapshot()
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
		Conditions: conds,
		Counters:   c,
		Failure:    failure,
	}
}

// down reports whether the bridge is down after a failed attempt.
func (b *Bridge) down() bool {
	_, f := b.conds.snapshot()
	return f != nil
}

// failed records a failed attempt: it stays in Status until an attempt
// starts. side is the condition to blame (condBroker, condWeida) or -1.
func (b *Bridge) failed(f FailureStatus, side int) {
	b.conds.setFailure(&f, side)
	b.stats.attemptFailed(f.Reason)
	switch side {
	case condBroker:
		b.stats.up("broker", false)
	case condWeida:
		b.stats.up("weida", false)
	}
}

// attemptStarted clears the failure once an attempt is up.
func (b *Bridge) attemptStarted() { b.conds.setFailure(nil, -1) }

// newAttempt starts counting a new attempt and returns the StateFunc its
// Source or Sink reports to, and a func that retires it. A reported
// ConnState.Lost is handed to onLost (nil: the attempt learns of the loss
// through Read instead).
func (b *Bridge) newAttempt(onLost func(error)) (StateFunc, func()) {
	gen := b.gen.Add(1)
	report := func(s ConnState) {
		if b.gen.Load() != gen {
			return
		}
		b.reportBroker(s)
		if s.Lost != nil && onLost != nil {
			onLost(s.Lost)
		}
	}
	return report, func() { b.gen.CompareAndSwap(gen, gen+1) }
}

func (b *Bridge) reportBroker(s ConnState) {
	was := b.conds.get(condBroker)
	b.conds.set(condBroker, s.Up, s.Reason, s.Detail)
	if s.Up && was.Reason != "Starting" && was.Status != "True" {
		b.stats.reconnected("broker")
	}
	b.stats.up("broker", s.Up)
	if s.Up {
		b.log.Info("broker connected", "reason", s.Reason)
	} else {
		b.stats.rlog.Log(slog.LevelWarn, "broker-down", "broker not connected", slog.String("reason", s.Reason), slog.String("detail", s.Detail))
	}
}

func (b *Bridge) reportWeida(up bool, reason, detail string) {
	b.conds.set(condWeida, up, reason, detail)
	b.stats.up("weida", up)
}

// drop counts one message not delivered and logs it at a rate-limited level.
func (b *Bridge) drop(route, reason string, level slog.Level, msg string, attrs ...slog.Attr) {
	b.stats.drop(route, reason, 1, level, msg, attrs...)
}

func refusalRule(err error) string {
	var r *policy.Refusal
	if errors.As(err, &r) && r.Rule != "" {
		return r.Rule
	}
	return "conversion-failed"
}

// Run runs one attempt of the bridge: it builds the Source or Sink from its
// factory, starts it and bridges until ctx ends or the attempt fails. It
// returns after every goroutine it started has stopped and the Source or
// Sink is closed. It returns nil when ctx ended (a clean stop), and
// otherwise a [*Failure] saying why the attempt ended; the runtime then
// records it and, unless it is permanent, runs another attempt on the same
// Bridge after a backoff.
func (b *Bridge) Run(ctx context.Context) error {
	b.stats.up("broker", false)
	if b.spec.Direction == policy.Outbound {
		b.stats.up("weida", false)
		return b.runOutbound(ctx)
	}
	return b.runInbound(ctx)
}

// failure classifies err, which ended an attempt, as a [*Failure] with
// fallback as its reason when nothing more precise is known.
func failure(err error, fallback string) *Failure {
	var f *Failure
	if errors.As(err, &f) {
		if f.Reason == "" {
			return &Failure{Reason: fallback, Err: f.Err, Permanent: f.Permanent}
		}
		return f
	}
	reason, permanent := Classify(err, fallback)
	return &Failure{Reason: reason, Err: err, Permanent: permanent}
}

// endsAttempt reports whether err, returned by a started Source or Sink,
// ends the attempt: a [*Failure], or [ErrClosed] the runtime did not ask
// for by closing.
func endsAttempt(err error, closing bool) bool {
	var f *Failure
	return errors.As(err, &f) || (!closing && errors.Is(err, ErrClosed))
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
