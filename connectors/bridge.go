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
	// AwaitReceipt (inbound) acknowledges a message to the broker only
	// once every weida copy queued for it was received by its
	// subscriber's QUIC stack or lost and counted, rather than once they
	// are queued: copies that die with the process leave the message
	// with the broker, which delivers it again. The acknowledgement
	// comes from another goroutine, after later messages were read; the
	// broker's own flow control bounds how many wait. Only sources whose
	// broker keeps unacknowledged messages should await; package
	// resources decides which.
	AwaitReceipt bool
	// LastValue is the inbound resource's last-value cache; the zero
	// value keeps none. Outbound resources ignore it.
	LastValue LastValue
	// LastValueDir is the directory the last-value cache is kept in
	// across restarts (see lastvalue_store.go); "" keeps it in memory only.
	LastValueDir string
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
	// [Backoff]{}.Wait (jittered, 250 ms to 10 s). Tests inject a
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
func (b *core) start(ctx context.Context, start func(context.Context) error) (stopped bool, err error) {
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

// brokerCloseTimeout bounds closing a broker connection as a bridge
// stops: withdrawing a removed resource's subscriptions, then the client's
// own close. A broker that does not answer in time is left with a
// warning, so that no stop waits on it for longer.
const brokerCloseTimeout = 5 * time.Second

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
//
// A Bridge is the shared core of every resource (its spec, dependencies,
// counters, conditions and routes) and the side its direction adds: an
// [inboundBridge] or an [outboundBridge]. Only construction looks at the
// direction; the runtime drives either through the [side] methods.
type Bridge struct {
	*core
	side side
}

// side is what a direction adds to the core. The runtime calls these
// methods, and never writes a side's fields.
type side interface {
	// run is one attempt (see [Bridge.Run]).
	run(ctx context.Context) error
	// prepare readies what the attempts need beyond the broker, before
	// each one: an inbound bridge's publisher path. Only the unit's
	// supervisor calls it (or the runtime before starting it).
	prepare(ctx context.Context) error
	// supersede carries on from prev, the stopped bridge of the same
	// resource this one replaces; same is true when the configuration is
	// unchanged (a retry, not a change). Called before the first attempt.
	supersede(prev *Bridge, same bool)
	// subscribed returns the broker filters the bridge subscribes, for a
	// successor to withdraw those it does not (nil: it subscribes none).
	subscribed() []string
	// cache is the last-value cache a successor of the same
	// configuration carries on (nil: none).
	cache() *lastValues
	// retire marks the resource as removed, not restarted: the attempt
	// that stops withdraws what the broker would keep for it.
	retire()
	// release gives up what prepare acquired, once no attempt runs; keep
	// and forget are those of [Runtime.stopUnit].
	release(keep map[string]weida.ListenConfig, forget bool)
	// addStatus adds the side's part to st; refreshGauges sets the
	// gauges read at each scrape.
	addStatus(st *Status)
	refreshGauges()
}

// core is what every bridge has, whatever its direction.
type core struct {
	spec  Spec
	deps  Deps
	conds *conditions
	stats *stats
	log   *slog.Logger

	// onBroker, when set, is told of every broker state report of the
	// current attempt (an inbound last-value cache marks what it replays
	// while the source is down).
	onBroker func(up bool)

	// fence is the unit's [Unit].Fence (nil: always may act); tripped
	// is set the first time it says no.
	fence   func() bool
	tripped atomic.Bool

	// gen numbers attempts; state reports of a Source or Sink from an
	// attempt that ended are ignored, so a failed attempt's last words
	// cannot overwrite the failure.
	gen atomic.Uint64

	routeTable
}

// NewInbound returns a bridge from a broker (through the Source newSource
// builds) onto a hosted weida publisher path pub.
func NewInbound(spec Spec, newSource SourceFactory, pub Publisher, deps Deps) *Bridge {
	in := newInboundBridge(newCore(spec, deps), newSource, nil)
	in.setPublisher(pub)
	return &Bridge{core: in.core, side: in}
}

// NewOutbound returns a bridge from a remote weida publisher endpoint
// (dialled with dial) onto a broker, through the Sink newSink builds.
func NewOutbound(spec Spec, dial DialFunc, newSink SinkFactory, deps Deps) *Bridge {
	out := newOutboundBridge(newCore(spec, deps), dial, newSink)
	return &Bridge{core: out.core, side: out}
}

// newBridge returns the bridge of spec's direction with nothing to run,
// for the tests of what the core does.
func newBridge(spec Spec, deps Deps) *Bridge {
	if spec.Direction == policy.Outbound {
		return NewOutbound(spec, nil, nil, deps)
	}
	return NewInbound(spec, nil, nil, deps)
}

func newCore(spec Spec, deps Deps) *core {
	deps.fill()
	log := deps.Logger.With("resource", spec.Name, "protocol", string(spec.Protocol), "direction", string(spec.Direction))
	c := &core{
		spec:       spec,
		deps:       deps,
		conds:      newConditions(deps.Now),
		log:        log,
		routeTable: newRouteTable(spec.Policy, spec.Routes),
	}
	c.stats = newStats(deps.Metrics, spec.Name, spec.Routes, NewRateLogger(log, 10*time.Second, deps.Now))
	return c
}

// carryOn takes over the accounting of prev, the bridge of the same
// resource this one replaces, so that its counters and series go on.
func (b *core) carryOn(prev *core) {
	prev.stats.addRoutes(b.spec.Routes)
	b.stats = prev.stats
}

// Spec returns the resource the bridge runs.
func (b *core) Spec() Spec { return b.spec }

// Status returns a snapshot of the bridge's conditions and counters, and of
// its failure while it is down.
func (b *Bridge) Status() Status {
	st := b.core.status()
	b.side.addStatus(&st)
	return st
}

// status is the core's part of a Status.
func (b *core) status() Status {
	c := b.stats.count.snapshot(b.deps.Now())
	conds, failure := b.conds.snapshot()
	// Routes and Losses are copied: a Status is the caller's to keep.
	routes := b.stats.routeCounts(b.spec.Routes)
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
func (b *core) down() bool {
	_, f := b.conds.snapshot()
	return f != nil
}

// failed records a failed attempt: it stays in Status until an attempt
// starts. side is the condition to blame (condBroker, condWeida) or -1.
func (b *core) failed(f FailureStatus, side int) {
	b.conds.setFailure(&f, side)
	b.stats.attemptFailed(f.Reason)
	switch side {
	case condBroker:
		b.stats.up("broker", false)
	case condWeida:
		b.stats.up("weida", false)
	}
}

// fenced reports whether the unit may no longer act: its fence says so.
// Without a fence it is a nil check. It is asked right before each step
// another party sees (a weida copy, a broker acknowledgement, a broker
// publish), so that a holder resumed after a pause past its lease does
// none of them, whatever its other goroutines have not yet noticed.
func (b *core) fenced() bool {
	if b.fence == nil || b.fence() {
		return false
	}
	if !b.tripped.Swap(true) {
		b.log.Warn("fenced: this replica no longer holds the resource's lease; it stops acting at once (messages in hand are left with the broker or counted as fenced)")
	}
	return true
}

// attemptStarted clears the failure once an attempt is up.
func (b *core) attemptStarted() { b.conds.setFailure(nil, -1) }

// newAttempt starts counting a new attempt and returns the StateFunc its
// Source or Sink reports to, and a func that retires it. A reported
// ConnState.Lost is handed to onLost (nil: the attempt learns of the loss
// through Read instead).
func (b *core) newAttempt(onLost func(error)) (StateFunc, func()) {
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

func (b *core) reportBroker(s ConnState) {
	if s.Up && s.Session.Key != "" && b.stats.count.session(s.Session, b.deps.Now()) {
		lost := s.Session.Lost
		if lost == "" {
			lost = "what the broker held for the connector while it was disconnected"
		}
		b.stats.m.sessionsLost.Inc()
		b.log.Warn("the broker did not resume the connector's session; messages may be lost",
			"session", s.Session.Key, "lost", lost)
		s.Reason = ReasonSessionLost
		s.Detail = "the broker had no session to resume (it expired, the broker lost it, or another client with the same client ID connected with clean start); lost: " + lost + "; " + s.Detail
	}
	was := b.conds.get(condBroker)
	b.conds.set(condBroker, s.Up, s.Reason, s.Detail)
	if s.Up && was.Reason != "Starting" && was.Status != "True" {
		b.stats.reconnected("broker")
	}
	b.stats.up("broker", s.Up)
	if b.onBroker != nil {
		b.onBroker(s.Up)
	}
	if s.Up {
		b.log.Info("broker connected", "reason", s.Reason)
	} else {
		b.stats.rlog.Log(slog.LevelWarn, "broker-down", "broker not connected", slog.String("reason", s.Reason), slog.String("detail", s.Detail))
	}
}

// ReasonSessionLost is the BrokerConnected condition's reason on a
// connection that did not resume the session the connector expected (see
// [Session]); the connection is up, and its message says what may be lost.
const ReasonSessionLost = "SessionLost"

func (b *core) reportWeida(up bool, reason, detail string) {
	b.conds.set(condWeida, up, reason, detail)
	b.stats.up("weida", up)
}

// drop counts one message not delivered and logs it at a rate-limited level.
func (b *core) drop(route, reason string, level slog.Level, msg string, attrs ...slog.Attr) {
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
	return b.side.run(ctx)
}

// attempt is one of the runtime's attempts: what the side prepares (see
// [side]), then Run.
func (b *Bridge) attempt(ctx context.Context) error {
	if err := b.side.prepare(ctx); err != nil {
		return &Failure{Reason: FailListen, Err: err}
	}
	return b.Run(ctx)
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
