package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/weida"
)

// Unit is one resource ready to run: its Spec and how to build its two
// sides. Package cmd/connector builds Units from loaded resources and wires
// the broker drivers explicitly.
type Unit struct {
	Spec Spec
	// Resource is compared on reload: a running unit whose resource is
	// Equal to the new one is left running. nil always restarts.
	Resource *resources.Connector

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

// Runtime runs a set of resources, each in its own [Bridge], and applies a
// new set on reload by difference. Its methods are safe for concurrent use.
type Runtime struct {
	deps Deps

	mu        sync.Mutex
	running   map[string]*runningUnit
	listeners map[string]*sharedListener
	failed    map[string]Status // units that could not even start
}

type runningUnit struct {
	unit   Unit
	bridge *Bridge
	pub    *weida.Publisher
	cancel context.CancelFunc
	done   chan struct{}
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
		failed:    make(map[string]Status),
	}
}

// Apply makes the running set equal to units: it stops the resources that
// are gone or changed, then starts the new and changed ones. A unit that
// cannot start (its listen address is taken, say) stays visible in Statuses
// with the reason, and the others run; the error joins every such failure.
func (r *Runtime) Apply(ctx context.Context, units []Unit) error {
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
	for name, ru := range r.running {
		if u, ok := want[name]; !ok || u.Resource == nil || ru.unit.Resource == nil || !u.Resource.Equal(ru.unit.Resource) {
			stop = append(stop, ru)
			delete(r.running, name)
			if !ok {
				ru.bridge.retiring.Store(true)
			}
			if ok && u.Spec.Direction != policy.Outbound && ru.unit.Spec.Direction != policy.Outbound {
				for _, rt := range ru.unit.Spec.Routes {
					previous[name] = append(previous[name], rt.Foreign)
				}
			}
		}
	}
	clear(r.failed)
	r.mu.Unlock()

	for _, ru := range stop {
		r.stopUnit(ru, keep)
	}

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
		if err := r.startUnit(ctx, want[name], previous[name]); err != nil {
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

// startUnit starts u; previous are the broker filters of the inbound unit
// it replaces, if any.
func (r *Runtime) startUnit(ctx context.Context, u Unit, previous []string) error {
	var b *Bridge
	var pub *weida.Publisher
	if u.Spec.Direction == policy.Outbound {
		b = NewOutbound(u.Spec, u.Dial, u.NewSink, r.deps)
	} else {
		var err error
		pub, err = r.acquirePublisher(ctx, u)
		if err != nil {
			b = NewInbound(u.Spec, u.NewSource, nil, r.deps)
			b.Fail("ListenFailed", err)
			r.mu.Lock()
			r.failed[u.Spec.Name] = b.Status()
			r.mu.Unlock()
			return err
		}
		b = NewInbound(u.Spec, u.NewSource, pub, r.deps)
		b.supersedes = previous
	}
	bctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ru := &runningUnit{unit: u, bridge: b, pub: pub, cancel: cancel, done: make(chan struct{})}
	r.mu.Lock()
	r.running[u.Spec.Name] = ru
	r.mu.Unlock()
	go func() {
		defer close(ru.done)
		if err := b.Run(bctx); err != nil {
			r.deps.Logger.Error("resource stopped", "resource", u.Spec.Name, "err", err)
		}
	}()
	return nil
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
	return pub, nil
}

// sameListenIdentity reports whether two resources may share a listener:
// the settings weida makes per listener must agree. The resource loader
// checks this across one load; this check covers a reload that changes one
// resource on a shared address while another keeps running.
func sameListenIdentity(a, b weida.ListenConfig) bool {
	return a.CertFile == b.CertFile && a.KeyFile == b.KeyFile &&
		slices.Equal(a.ClientFingerprints, b.ClientFingerprints) &&
		a.Limits == b.Limits
}

// stopUnit stops a unit and releases its publisher path. Its listener is
// closed with its last path unless keep holds the address with the same
// identity (a reload restarting the resources on it).
func (r *Runtime) stopUnit(ru *runningUnit, keep map[string]weida.ListenConfig) {
	ru.cancel()
	<-ru.done
	r.deps.Metrics.forget(ru.unit.Spec.Name)
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
	out := make([]Status, 0, len(r.running)+len(r.failed))
	for _, ru := range r.running {
		out = append(out, ru.bridge.Status())
	}
	for _, st := range r.failed {
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
	r.mu.Lock()
	all := make([]*runningUnit, 0, len(r.running))
	for name, ru := range r.running {
		all = append(all, ru)
		delete(r.running, name)
	}
	r.mu.Unlock()
	var wg sync.WaitGroup
	for _, ru := range all {
		wg.Go(func() { r.stopUnit(ru, nil) })
	}
	wg.Wait()
	r.mu.Lock()
	for addr, sl := range r.listeners {
		sl.l.Close()
		delete(r.listeners, addr)
	}
	r.mu.Unlock()
	r.deps.Logger.Log(context.Background(), slog.LevelInfo, "all resources stopped")
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
		"Connection-level events on a hosted listener: refused connections, refused streams, protocol violations, failed negotiations.", []string{"listen", "event"}, nil)
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
	c.r.mu.Unlock()
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
			"stream-refused":      st.StreamsRefused,
			"protocol-violation":  st.ProtocolViolations,
			"negotiation-failure": st.NegotiationFailures,
		} {
			ch <- prometheus.MustNewConstMetric(descListenerEvents, prometheus.CounterValue, float64(n), addr, event)
		}
	}
}
