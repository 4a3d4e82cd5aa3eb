package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// Unit is one resource ready to run: its Spec and how to build its two
// sides. Package cmd/connector builds Units from loaded resources and wires
// the broker drivers explicitly.
type Unit struct {
	Spec Spec
	// Revision is an opaque digest of the unit's configuration, computed
	// by the caller: equal revisions mean the same configuration. On
	// reload a running, healthy unit whose Revision is unchanged is left
	// running. Empty always restarts.
	Revision string

	// Inbound: the listen address (host:port) and path the connector hosts,
	// with the listener's settings. Resources sharing an address share one
	// listener; their ListenConfigs must then be equal.
	Listen       string
	Path         string
	ListenConfig weida.ListenConfig
	NewSource    SourceFactory

	// Outbound.
	Dial    DialFunc
	NewSink SinkFactory
}

// Runtime runs a set of resources and applies a new set on reload by
// difference. Every resource is a supervised unit: the runtime runs
// attempts of it (see [Bridge.Run]) one after another, with a jittered
// backoff after each failed one, for as long as the unit exists; only a
// permanent [Failure] stops the retries. Its methods are safe for
// concurrent use.
type Runtime struct {
	deps Deps

	apply sync.Mutex // serialises Apply and Stop

	mu        sync.Mutex // guards the maps; Alive checks it can be taken
	running   map[string]*runningUnit
	listeners map[string]*sharedListener
}

// runningUnit is a unit and its supervisor goroutine.
type runningUnit struct {
	unit   Unit
	bridge *Bridge
	cancel context.CancelFunc
	done   chan struct{} // closed when the supervisor has returned

	// streak counts the unit's failed attempts in a row; only its
	// supervisor (or startUnit before it) uses it.
	streak *Streak

	// pub is the publisher path the unit holds; written by the
	// supervisor goroutine (or startUnit before it), read by stopUnit
	// after done.
	pub *weida.Publisher
}

type sharedListener struct {
	l    *weida.Listener
	cfg  weida.ListenConfig
	refs int
}

// NewRuntime returns an empty runtime.
func NewRuntime(deps Deps) *Runtime {
	deps.fill()
	return &Runtime{
		deps:      deps,
		running:   make(map[string]*runningUnit),
		listeners: make(map[string]*sharedListener),
	}
}

// Apply makes the running set equal to units: it stops the resources that
// are gone or changed, and those down after a failed attempt (a reload is
// the operator's "try again now"), then starts the new and stopped ones. A
// unit that keeps its name keeps its counters and metric series, whether
// its Revision changed or not; a removed one loses them.
// The first weida listen of an inbound unit is tried before Apply returns:
// the error joins every such failure, and each of those units stays
// visible in Statuses and is retried in the background like any failed
// attempt.
func (r *Runtime) Apply(ctx context.Context, units []Unit) error {
	r.apply.Lock()
	defer r.apply.Unlock()
	want := make(map[string]Unit, len(units))
	// Listeners the new set still uses with the same identity survive
	// the restart of their resources: their subscribers stay connected
	// (weida keeps their subscriptions for the next publisher of a path)
	// and a generated certificate keeps the fingerprint they pinned.
	keep := make(map[string]weida.ListenConfig)
	for _, u := range units {
		want[u.Spec.Name] = u
		if u.Spec.Direction != policy.Outbound && u.Listen != "" {
			keep[u.Listen] = u.ListenConfig
		}
	}
	r.mu.Lock()
	var stop []*runningUnit
	// The broker filters of inbound resources being replaced, for their
	// successors to withdraw what they no longer subscribe.
	previous := make(map[string][]string)
	// Units the reload restarts keep their counters and series under
	// their name, changed or not: only a removed unit loses them. Those
	// retried with their configuration unchanged keep their last-value
	// cache too.
	carry := make(map[string]carried)
	for name, ru := range r.running {
		u, ok := want[name]
		same := ok && u.Revision != "" && u.Revision == ru.unit.Revision
		if same && !ru.bridge.down() {
			continue
		}
		if ok {
			carry[name] = carried{bridge: ru.bridge, same: same}
		}
		stop = append(stop, ru)
		delete(r.running, name)
		if !ok {
			ru.bridge.in.retiring.Store(true)
		}
		if ok && u.Spec.Direction != policy.Outbound && ru.unit.Spec.Direction != policy.Outbound {
			for _, rt := range ru.unit.Spec.Routes {
				previous[name] = append(previous[name], rt.Foreign)
			}
		}
	}
	r.mu.Unlock()

	// Units stop in parallel, each within the drain bound, and the
	// series of the removed ones go in one pass once none can update
	// them any more.
	removed := make(map[string]bool)
	var wg sync.WaitGroup
	for _, ru := range stop {
		forget := carry[ru.unit.Spec.Name].bridge == nil
		if forget {
			removed[ru.unit.Spec.Name] = true
		}
		wg.Go(func() { r.stopUnit(ru, keep, forget) })
	}
	wg.Wait()
	r.deps.Metrics.forget(removed)

	var errs []error
	names := make([]string, 0, len(units))
	for _, u := range units {
		names = append(names, u.Spec.Name)
	}
	slices.Sort(names)
	for _, name := range names {
		r.mu.Lock()
		_, isRunning := r.running[name]
		r.mu.Unlock()
		if isRunning {
			continue
		}
		if err := r.startUnit(ctx, want[name], previous[name], carry[name]); err != nil {
			errs = append(errs, fmt.Errorf("resource %s: %w", name, err))
		}
	}
	// A listener kept for a unit that then failed to start serves nobody.
	r.mu.Lock()
	for addr, sl := range r.listeners {
		if sl.refs == 0 {
			sl.l.Close()
			delete(r.listeners, addr)
		}
	}
	r.mu.Unlock()
	return errors.Join(errs...)
}

// startUnit starts the supervisor of u; previous are the broker filters of
// the inbound unit it replaces, if any, and prev the stopped bridge of the
// same configuration whose accounting and last-value cache it carries on,
// if any. It returns the error of the first weida listen, which the
// supervisor then retries.
// carried is what a restarted unit takes over from the one it replaces.
type carried struct {
	bridge *Bridge // nil: nothing, a new unit
	same   bool    // the configuration is unchanged (a retry, not a change)
}

func (r *Runtime) startUnit(ctx context.Context, u Unit, previous []string, prev carried) error {
	var b *Bridge
	if u.Spec.Direction == policy.Outbound {
		b = NewOutbound(u.Spec, u.Dial, u.NewSink, r.deps)
	} else {
		b = NewInbound(u.Spec, u.NewSource, nil, r.deps)
		b.in.supersedes = previous
	}
	if prev.bridge != nil {
		prev.bridge.stats.addRoutes(u.Spec.Routes)
		b.stats = prev.bridge.stats
		if prev.same && b.lv != nil && prev.bridge.lv != nil {
			b.lv = prev.bridge.lv
		}
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ru := &runningUnit{unit: u, bridge: b, cancel: cancel, done: make(chan struct{}), streak: NewStreak(r.deps.Now)}
	var first error
	if u.Spec.Direction != policy.Outbound {
		ru.pub, first = r.acquirePublisher(sctx, u)
		if first == nil {
			b.setPublisher(ru.pub)
		}
	}
	// The first failure is on record before Apply returns.
	failures, wait, permanent := 0, time.Duration(0), false
	if first != nil {
		failures = ru.streak.Down()
		wait, permanent = r.recordFailure(b, &Failure{Reason: FailListen, Err: first}, failures)
	}
	r.mu.Lock()
	r.running[u.Spec.Name] = ru
	r.mu.Unlock()
	go func() {
		defer close(ru.done)
		r.supervise(sctx, ru, failures, wait, permanent)
	}()
	return first
}

// supervise runs attempts of ru until ctx ends or one fails for good.
// failures, wait and permanent describe a failure already recorded.
func (r *Runtime) supervise(ctx context.Context, ru *runningUnit, failures int, wait time.Duration, permanent bool) {
	for {
		if failures > 0 {
			if permanent {
				<-ctx.Done()
				return
			}
			if !sleep(ctx, wait) {
				return
			}
		}
		ru.streak.Up()
		err := r.attempt(ctx, ru)
		if ctx.Err() != nil {
			return
		}
		if err == nil {
			err = errors.New("connectors: the attempt ended by itself")
		}
		failures = ru.streak.Down()
		wait, permanent = r.recordFailure(ru.bridge, failure(err, FailConnectionLost), failures)
	}
}

// recordFailure records the failures-th failure in a row of b's unit and
// returns the wait before the next attempt, or permanent.
func (r *Runtime) recordFailure(b *Bridge, fail *Failure, failures int) (wait time.Duration, permanent bool) {
	now := r.deps.Now()
	st := FailureStatus{
		Reason:        fail.Reason,
		Message:       fail.Error(),
		Attempts:      failures,
		Permanent:     fail.Permanent,
		LastErrorTime: now,
	}
	if !fail.Permanent {
		wait = r.deps.Backoff(failures)
		st.NextRetryTime = now.Add(wait)
	}
	b.failed(st, failureSide(fail))
	if fail.Permanent {
		b.log.Error("resource failed for good; fix its configuration and reload", "reason", fail.Reason, "err", fail.Err)
	} else {
		b.log.Warn("resource attempt failed; retrying", "reason", fail.Reason, "err", fail.Err,
			"attempts", failures, "retry_in", wait.Round(time.Millisecond).String())
	}
	return wait, fail.Permanent
}

// failureSide is the condition a failure of b is blamed on.
func failureSide(f *Failure) int {
	switch f.Reason {
	case FailListen, FailWeidaDial, FailFingerprintMismatch:
		return condWeida
	}
	return condBroker
}

// attempt is one attempt of ru: the weida side (the publisher path, held
// across attempts once acquired) and one run of its bridge.
func (r *Runtime) attempt(ctx context.Context, ru *runningUnit) error {
	if ru.unit.Spec.Direction != policy.Outbound && ru.pub == nil {
		pub, err := r.acquirePublisher(ctx, ru.unit)
		if err != nil {
			return &Failure{Reason: FailListen, Err: err}
		}
		ru.pub = pub
		ru.bridge.setPublisher(pub)
	}
	return ru.bridge.Run(ctx)
}

func (r *Runtime) acquirePublisher(ctx context.Context, u Unit) (*weida.Publisher, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	sl := r.listeners[u.Listen]
	if sl == nil {
		cfg := u.ListenConfig
		if cfg.Logger == nil {
			cfg.Logger = r.deps.Logger.With("listen", u.Listen)
		}
		l, err := weida.Listen(ctx, u.Listen, cfg)
		if err != nil {
			return nil, fmt.Errorf("weida listen %s: %w", u.Listen, err)
		}
		r.deps.Logger.Info("weida listener up", "listen", l.Addr().String(), "fingerprint", l.Fingerprint())
		sl = &sharedListener{l: l, cfg: u.ListenConfig}
		r.listeners[u.Listen] = sl
	} else if !sameListenIdentity(sl.cfg, u.ListenConfig) {
		return nil, fmt.Errorf("weida listen %s: already serving other resources with a different certificate or client allowlist", u.Listen)
	}
	pub, err := sl.l.Publisher(u.Path)
	if err != nil {
		if sl.refs == 0 {
			sl.l.Close()
			delete(r.listeners, u.Listen)
		}
		return nil, fmt.Errorf("weida publisher %s%s: %w", u.Listen, u.Path, err)
	}
	sl.refs++
	r.deps.Logger.Info("weida endpoint hosted", "resource", u.Spec.Name,
		"subscriberURL", subscriberURL(u.Listen, u.Path, sl.l))
	return pub, nil
}

// sameListenIdentity reports whether two resources may share a listener:
// the settings weida makes per listener must agree. The resource loader
// checks this across one load; this check covers a reload that changes one
// resource on a shared address while another keeps running.
func sameListenIdentity(a, b weida.ListenConfig) bool {
	return a.CertFile == b.CertFile && a.KeyFile == b.KeyFile && a.StateDir == b.StateDir &&
		slices.Equal(a.ClientFingerprints, b.ClientFingerprints) &&
		a.Limits == b.Limits
}

// stopUnit stops a unit and releases its publisher path. Its listener is
// closed with its last path unless keep holds the address with the same
// identity (a reload restarting the resources on it). forget means the
// unit's metric series are about to be removed (by the caller, in one pass
// for every unit it stops): nothing of the unit may update them after
// stopUnit returns.
func (r *Runtime) stopUnit(ru *runningUnit, keep map[string]weida.ListenConfig, forget bool) {
	ru.cancel()
	<-ru.done
	if forget && ru.pub != nil {
		// Copies still queued must not bring back its series.
		ru.pub.OnCopiesLost(nil)
		ru.pub.CountCopiesUnconfirmed(nil)
	}
	if ru.pub == nil {
		return
	}
	ru.pub.Close()
	r.mu.Lock()
	defer r.mu.Unlock()
	if sl := r.listeners[ru.unit.Listen]; sl != nil {
		sl.refs--
		if cfg, ok := keep[ru.unit.Listen]; ok && sameListenIdentity(sl.cfg, cfg) {
			return
		}
		if sl.refs == 0 {
			sl.l.Close()
			delete(r.listeners, ru.unit.Listen)
		}
	}
}

// Statuses returns every resource's status, sorted by name.
func (r *Runtime) Statuses() []Status {
	r.mu.Lock()
	out := make([]Status, 0, len(r.running))
	for _, ru := range r.running {
		st := ru.bridge.Status()
		if sl := r.listeners[ru.unit.Listen]; sl != nil && ru.unit.Spec.Direction != policy.Outbound {
			st.Fingerprint = sl.l.Fingerprint()
			st.SubscriberURL = subscriberURL(ru.unit.Listen, ru.unit.Path, sl.l)
		}
		out = append(out, st)
	}
	r.mu.Unlock()
	slices.SortFunc(out, func(a, b Status) int {
		switch {
		case a.Name < b.Name:
			return -1
		case a.Name > b.Name:
			return 1
		}
		return 0
	})
	return out
}

// Ready reports whether every resource is running with both sides up.
func (r *Runtime) Ready() bool {
	st := r.Statuses()
	if len(st) == 0 {
		return false
	}
	for _, s := range st {
		if !s.Ready() {
			return false
		}
	}
	return true
}

// Stop stops every resource, draining each within Deps.Drain, and closes
// the listeners. The runtime can be given a new set with Apply afterwards.
func (r *Runtime) Stop() {
	r.apply.Lock()
	defer r.apply.Unlock()
	r.mu.Lock()
	all := make([]*runningUnit, 0, len(r.running))
	for name, ru := range r.running {
		all = append(all, ru)
		delete(r.running, name)
	}
	r.mu.Unlock()
	names := make(map[string]bool, len(all))
	var wg sync.WaitGroup
	for _, ru := range all {
		names[ru.unit.Spec.Name] = true
		wg.Go(func() { r.stopUnit(ru, nil, true) })
	}
	wg.Wait()
	r.deps.Metrics.forget(names)
	r.mu.Lock()
	listeners := make(map[string]*sharedListener, len(r.listeners))
	for addr, sl := range r.listeners {
		listeners[addr] = sl
		delete(r.listeners, addr)
	}
	r.mu.Unlock()
	// The copies still queued for subscribers were acknowledged to their
	// brokers: give them the drain bound to be written, and say how many
	// were not, since no series is left to count them once the process
	// ends.
	for addr, sl := range listeners {
		wg.Go(func() {
			before := sl.l.Stats().Dropped.ConnectionClosed
			ctx, cancel := context.WithTimeout(context.Background(), r.deps.drain())
			defer cancel()
			err := sl.l.Shutdown(ctx)
			if lost := sl.l.Stats().Dropped.ConnectionClosed - before; lost > 0 || err != nil {
				r.deps.Logger.Warn("copies still queued for weida subscribers when the drain bound ran out were dropped",
					"listen", addr, "copies", lost, "reason", ReasonConnectionClosed)
			}
		})
	}
	wg.Wait()
	r.deps.Logger.Log(context.Background(), slog.LevelInfo, "all resources stopped")
}

// Alive reports whether the runtime answers: its lock can be taken before
// ctx ends. It fails only when the process is wedged, never because a
// broker or endpoint is down; /healthz serves it.
func (r *Runtime) Alive(ctx context.Context) bool {
	t := time.NewTicker(10 * time.Millisecond)
	defer t.Stop()
	for {
		if r.mu.TryLock() {
			r.mu.Unlock()
			return true
		}
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
	}
}

// Collector exports the weida listeners' own counters: copies a listener
// dropped after Publish returned (a subscriber's stream failed, its
// connection went away), refusals and protocol violations. Register it
// next to the Metrics.
func (r *Runtime) Collector() prometheus.Collector { return listenerCollector{r} }

type listenerCollector struct{ r *Runtime }

var (
	descListenerConns = prometheus.NewDesc("weida_connector_weida_connections",
		"Open weida connections on a hosted listener.", []string{"listen"}, nil)
	descListenerSubs = prometheus.NewDesc("weida_connector_weida_subscriptions",
		"Weida subscriptions (path, filter) held by a hosted listener.", []string{"listen"}, nil)
	descListenerDropped = prometheus.NewDesc("weida_connector_weida_listener_copies_dropped_total",
		"Weida copies a hosted listener dropped, by reason (including after Publish returned).", []string{"listen", "reason"}, nil)
	descListenerEvents = prometheus.NewDesc("weida_connector_weida_listener_events_total",
		"Connection-level events on a hosted listener: refused connections, clients refused by the allowlist, refused streams, protocol violations, failed negotiations.", []string{"listen", "event"}, nil)
)

func (c listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descListenerConns
	ch <- descListenerSubs
	ch <- descListenerDropped
	ch <- descListenerEvents
}

func (c listenerCollector) Collect(ch chan<- prometheus.Metric) {
	c.r.mu.Lock()
	stats := make(map[string]weida.ListenerStats, len(c.r.listeners))
	for addr, sl := range c.r.listeners {
		stats[addr] = sl.l.Stats()
	}
	bridges := make([]*Bridge, 0, len(c.r.running))
	for _, ru := range c.r.running {
		bridges = append(bridges, ru.bridge)
	}
	c.r.mu.Unlock()
	// The subscriber gauges are read from the publishers at each scrape,
	// not only when /status is: the registry gathers collectors side by
	// side, so a scrape may still show the previous scrape's values.
	for _, b := range bridges {
		if pub := b.publisher(); pub != nil {
			b.deps.Metrics.Subscribers.WithLabelValues(b.spec.Name).Set(float64(pub.Subscribers()))
		}
	}
	for addr, st := range stats {
		ch <- prometheus.MustNewConstMetric(descListenerConns, prometheus.GaugeValue, float64(st.Connections), addr)
		ch <- prometheus.MustNewConstMetric(descListenerSubs, prometheus.GaugeValue, float64(st.Subscriptions), addr)
		for reason, n := range map[string]uint64{
			ReasonSubscriberBuf: st.Dropped.BufferFull,
			"header-too-large":  st.Dropped.HeaderTooLarge,
			"connection-closed": st.Dropped.ConnectionClosed,
		} {
			ch <- prometheus.MustNewConstMetric(descListenerDropped, prometheus.CounterValue, float64(n), addr, reason)
		}
		for event, n := range map[string]uint64{
			"connection-refused":  st.ConnectionsRefused,
			"client-refused":      st.ClientsRefused,
			"stream-refused":      st.StreamsRefused,
			"protocol-violation":  st.ProtocolViolations,
			"negotiation-failure": st.NegotiationFailures,
		} {
			ch <- prometheus.MustNewConstMetric(descListenerEvents, prometheus.CounterValue, float64(n), addr, event)
		}
	}
}
