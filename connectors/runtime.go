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

	"weida.dev/connector/internal/filestamp"
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
	// Scopes restrict what each client may subscribe to on Path (see
	// weida.Listener.SetScopes); nil restricts nothing. Unlike
	// ListenConfig they belong to the path, so resources sharing a
	// listener may scope their clients differently.
	Scopes    weida.Scopes
	NewSource SourceFactory

	// Outbound.
	Dial    DialFunc
	NewSink SinkFactory

	// Files are the files the unit's factories read at every attempt
	// (its secret files): when one of them changes while the unit waits
	// to retry after a failed attempt, the next attempt starts at once,
	// so that a corrected credential is tried without waiting out the
	// backoff. A running attempt is left alone: what it reads again is
	// the driver's business (see resources.BrokerConfig.ReadCredentials).
	Files []string

	// Fence, when set, reports whether the unit may still act on the
	// outside world; nil means it always may. A replica among several
	// runs a resource only while it holds the resource's lease, and its
	// Fence reads the lease's deadline on the monotonic clock itself
	// (placement.Holding.Valid): a process resumed after a pause longer
	// than the lease sees false at once, before any goroutine of its own
	// has run to tell it. The bridge asks right before each step another
	// party sees (see [ReasonFenced]); once it has said false it must
	// never say true again. It must be cheap and safe for concurrent use.
	Fence func() bool
}

// filePoll is how often a unit waiting to retry looks at its Files.
const filePoll = 250 * time.Millisecond

// Runtime runs a set of resources and applies a new set on reload by
// difference. Every resource is a supervised unit: the runtime runs
// attempts of it (see [Bridge.Run]) one after another, with a jittered
// backoff after each failed one, for as long as the unit exists; only a
// permanent [Failure] stops the retries. Its methods are safe for
// concurrent use.
type Runtime struct {
	deps Deps

	apply sync.Mutex // serialises Apply and Stop

	mu      sync.Mutex // guards running; Alive checks it can be taken
	running map[string]*runningUnit

	listeners *listeners // the inbound units' weida listeners
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
}

// NewRuntime returns an empty runtime.
func NewRuntime(deps Deps) *Runtime {
	deps.fill()
	return &Runtime{
		deps:      deps,
		running:   make(map[string]*runningUnit),
		listeners: newListeners(deps.Logger),
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
	return r.ApplyKeeping(ctx, units, nil)
}

// ApplyKeeping is Apply, except that a resource left out of units for
// which elsewhere reports true is stopped as for a restart, not retired:
// it still exists and runs elsewhere next, so what its broker keeps for it
// (an MQTT session's subscriptions, see [Retiring]) must stay for the one
// that takes over. A replica among several passes the resources whose
// lease it no longer holds; elsewhere nil is Apply.
func (r *Runtime) ApplyKeeping(ctx context.Context, units []Unit, elsewhere func(name string) bool) error {
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
		if u.Listen != "" {
			keep[u.Listen] = u.ListenConfig
		}
	}
	r.mu.Lock()
	var stop []*runningUnit
	// Units the reload restarts carry on from the bridge they replace
	// (see side.supersede): their counters and series stay under their
	// name, changed or not, and only a removed unit loses them.
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
		if !ok && (elsewhere == nil || !elsewhere(name)) {
			ru.bridge.side.retire()
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
		if err := r.startUnit(ctx, want[name], carry[name]); err != nil {
			errs = append(errs, fmt.Errorf("resource %s: %w", name, err))
		}
	}
	r.listeners.closeUnused()
	return errors.Join(errs...)
}

// carried is what a restarted unit takes over from the one it replaces.
type carried struct {
	bridge *Bridge // nil: nothing, a new unit
	same   bool    // the configuration is unchanged (a retry, not a change)
}

// newBridge builds the bridge of u's direction, hosting an inbound one's
// publisher path on the runtime's listeners.
func (r *Runtime) newBridge(u Unit) *Bridge {
	c := newCore(u.Spec, r.deps)
	c.fence = u.Fence
	if u.Spec.Direction == policy.Outbound {
		return &Bridge{core: c, side: newOutboundBridge(c, u.Dial, u.NewSink)}
	}
	host := &hosting{listeners: r.listeners, listen: u.Listen, path: u.Path, cfg: u.ListenConfig, scopes: u.Scopes}
	return &Bridge{core: c, side: newInboundBridge(c, u.NewSource, host)}
}

// startUnit starts the supervisor of u, which carries on from prev's
// bridge, if any. It returns the error of the first weida listen, which
// the supervisor then retries.
func (r *Runtime) startUnit(ctx context.Context, u Unit, prev carried) error {
	b := r.newBridge(u)
	if prev.bridge != nil {
		b.side.supersede(prev.bridge, prev.same)
	}
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	ru := &runningUnit{unit: u, bridge: b, cancel: cancel, done: make(chan struct{}), streak: NewStreak(r.deps.Now)}
	// The first failure is on record before Apply returns.
	first := b.side.prepare(sctx)
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
	files := filestamp.All(ru.unit.Files) // as the first attempt reads them
	for {
		if failures > 0 {
			if permanent {
				<-ctx.Done()
				return
			}
			if !r.retryWait(ctx, ru, wait, files) {
				return
			}
		}
		files = filestamp.All(ru.unit.Files)
		var err error
		if ru.bridge.fenced() {
			// Not even a connection: an MQTT client ID would take
			// the session back from the replica that now holds it.
			err = errFenced
		} else {
			ru.streak.Up()
			err = ru.bridge.attempt(ctx)
		}
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

// retryWait waits d before ru's next attempt, or less when one of its
// Files no longer has the stamp it had when the failed attempt began. It
// returns false when ctx ended.
func (r *Runtime) retryWait(ctx context.Context, ru *runningUnit, d time.Duration, files filestamp.Set) bool {
	if len(ru.unit.Files) == 0 {
		return sleep(ctx, d)
	}
	wait := time.NewTimer(d)
	defer wait.Stop()
	poll := time.NewTicker(filePoll)
	defer poll.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-wait.C:
			return true
		case <-poll.C:
			if !filestamp.All(ru.unit.Files).Equal(files) {
				ru.bridge.log.Info("a file the resource reads at each attempt changed; trying again now",
					"files", ru.unit.Files)
				return true
			}
		}
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
	// A fenced unit makes no more attempts: it waits to be stopped by
	// whoever set its fence, which learns of the lost lease on its own.
	fenced := fail.Reason == FailFenced
	if !fail.Permanent && !fenced {
		wait = r.deps.Backoff(failures)
		st.NextRetryTime = now.Add(wait)
	}
	b.failed(st, failureSide(fail))
	switch {
	case fenced:
		b.log.Warn("the resource's lease is no longer held here: it stopped acting and waits to be stopped", "reason", fail.Reason)
	case fail.Permanent:
		b.log.Error("resource failed for good; fix its configuration and reload", "reason", fail.Reason, "err", fail.Err)
	default:
		b.log.Warn("resource attempt failed; retrying", "reason", fail.Reason, "err", fail.Err,
			"attempts", failures, "retry_in", wait.Round(time.Millisecond).String())
	}
	return wait, fail.Permanent || fenced
}

// failureSide is the condition a failure of b is blamed on.
func failureSide(f *Failure) int {
	switch f.Reason {
	case FailListen, FailWeidaDial, FailFingerprintMismatch, FailPathNotServed:
		return condWeida
	}
	return condBroker
}

// stopUnit stops a unit and has its bridge release what it holds (see
// side.release): its listener is closed with its last path unless keep
// holds the address with the same identity (a reload restarting the
// resources on it). forget means the unit's metric series are about to be
// removed (by the caller, in one pass for every unit it stops): nothing of
// the unit may update them after stopUnit returns.
func (r *Runtime) stopUnit(ru *runningUnit, keep map[string]weida.ListenConfig, forget bool) {
	ru.cancel()
	<-ru.done
	ru.bridge.side.release(keep, forget)
}

// Statuses returns every resource's status, sorted by name.
func (r *Runtime) Statuses() []Status {
	r.mu.Lock()
	out := make([]Status, 0, len(r.running))
	for _, ru := range r.running {
		out = append(out, ru.bridge.Status())
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
	r.listeners.shutdown(r.deps.drain())
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
		"Connection-level events on a hosted listener: refused connections (also by limit), clients refused by the allowlist, refused streams, protocol violations, failed negotiations, SUBSCRIBEs not replayed for the connection's replay limit, subscribers closed as slow consumers.", []string{"listen", "event"}, nil)
	descScopeRefusals = prometheus.NewDesc("weida_connector_weida_scope_refusals_total",
		"Subscriptions a resource's client scopes (spec.weida.allowedClients[].scopes) refused (not-covered, unlisted) or dropped on a reload that narrowed them (revoked); the client's fingerprint is in the log line.", []string{"resource", "reason"}, nil)
)

func (c listenerCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descListenerConns
	ch <- descListenerSubs
	ch <- descListenerDropped
	ch <- descListenerEvents
	ch <- descScopeRefusals
}

func (c listenerCollector) Collect(ch chan<- prometheus.Metric) {
	stats, held := c.r.listeners.stats()
	c.r.mu.Lock()
	bridges := make([]*Bridge, 0, len(c.r.running))
	for _, ru := range c.r.running {
		bridges = append(bridges, ru.bridge)
	}
	c.r.mu.Unlock()
	// The subscriber gauges are read from the publishers at each scrape,
	// not only when /status is: the registry gathers collectors side by
	// side, so a scrape may still show the previous scrape's values.
	for _, b := range bridges {
		b.side.refreshGauges()
	}
	for addr, st := range stats {
		ch <- prometheus.MustNewConstMetric(descListenerConns, prometheus.GaugeValue, float64(st.Connections), addr)
		ch <- prometheus.MustNewConstMetric(descListenerSubs, prometheus.GaugeValue, float64(st.Subscriptions), addr)
		for reason, n := range map[string]uint64{
			ReasonSubscriberBuf: st.Dropped.BufferFull,
			"header-too-large":  st.Dropped.HeaderTooLarge,
			"connection-closed": st.Dropped.ConnectionClosed,
			ReasonOwnReplay:     st.Dropped.OwnReplay,
		} {
			ch <- prometheus.MustNewConstMetric(descListenerDropped, prometheus.CounterValue, float64(n), addr, reason)
		}
		for event, n := range map[string]uint64{
			"connection-refused": st.ConnectionsRefused,
			"client-refused":     st.ClientsRefused,
			// connection-refused again, by the limit that refused it.
			"refused-max-connections":             st.RefusedBy.MaxConnections,
			"refused-max-connections-per-peer":    st.RefusedBy.MaxConnectionsPerPeer,
			"refused-max-connections-per-address": st.RefusedBy.MaxConnectionsPerAddr,
			// SUBSCRIBEs applied without their replay (weida's
			// Limits.ReplayBurst).
			"replay-limited":      st.ReplaysLimited,
			"stream-refused":      st.StreamsRefused,
			"protocol-violation":  st.ProtocolViolations,
			"negotiation-failure": st.NegotiationFailures,
			// Subscribers closed by the slow-consumer policy
			// (Limits.SlowConsumerAfter); their lost copies are
			// in copies_dropped_total.
			"slow-consumer-closed": st.SlowConsumersClosed,
		} {
			ch <- prometheus.MustNewConstMetric(descListenerEvents, prometheus.CounterValue, float64(n), addr, event)
		}
		// Labelled by resource and reason only: the clients are bounded
		// by the configuration, but a series per client would still
		// multiply every resource's; the log line names the client.
		for path, ss := range st.Scopes {
			resource, ok := held[addr][path]
			if !ok {
				continue // no resource holds the path now
			}
			for reason, n := range map[string]uint64{
				weida.ScopeNotCovered: ss.NotCovered,
				weida.ScopeUnlisted:   ss.Unlisted,
				weida.ScopeRevoked:    ss.Revoked,
			} {
				ch <- prometheus.MustNewConstMetric(descScopeRefusals, prometheus.CounterValue, float64(n), resource, reason)
			}
		}
	}
}
