package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/service/placement"
)

// Placement configures replicas that share the resources through leases
// on a coordination service ([Config.Placement]): every replica loads and
// checks every resource, and runs only those whose lease it holds. The
// zero value (no Backend) runs every resource, as a single process does.
type Placement struct {
	// Backend is "" (no placement), "etcd" or "kubernetes".
	Backend string
	// Identity names this replica among those sharing the backend (the
	// pod or host name); two live replicas must never share one.
	Identity string
	// EtcdEndpoints are the etcd members' client URLs (Backend "etcd").
	EtcdEndpoints []string
	// EtcdPrefix is where the leases' keys live; "" is "/weida-connector/".
	EtcdPrefix string
	// Namespace holds the Lease objects (Backend "kubernetes"); "" is the
	// pod's own.
	Namespace string
	// LeasePrefix starts the Lease objects' names; "" is "weida-connector.".
	LeasePrefix string
	// Timing is the leases' durations; zero fields take
	// [placement.DefaultTiming]'s. Every replica must use the same.
	Timing placement.Timing
}

// Enabled reports whether a backend is configured.
func (p Placement) Enabled() bool { return p.Backend != "" }

// backend connects to the configured coordination service.
func (p Placement) backend(log *slog.Logger) (placement.Backend, func(), error) {
	switch p.Backend {
	case "etcd":
		prefix := p.EtcdPrefix
		if prefix == "" {
			prefix = "/weida-connector/"
		}
		return placement.DialEtcd(p.EtcdEndpoints, prefix, p.Timing)
	case "kubernetes":
		prefix := p.LeasePrefix
		if prefix == "" {
			prefix = "weida-connector."
		}
		k, err := placement.InCluster(p.Namespace, prefix, p.Timing, log)
		if err != nil {
			return nil, nil, err
		}
		return k, k.Close, nil
	}
	return nil, nil, fmt.Errorf("placement backend %q: use etcd or kubernetes", p.Backend)
}

// Roles of a replica for one resource, in [connectors.PlacementStatus].
const (
	roleHolder  = "holder"
	roleStandby = "standby"
	roleUnheld  = "unheld"
)

// placed runs the resources of one replica among several: a Placer holds
// this replica's share of the leases, and the runtime is given exactly the
// units whose lease is held. When a holding ends for any reason the unit
// is stopped before the Placer gives the lease up (and, when the lease was
// lost, before another replica can take it: the Placer reports the end at
// least the lease's margin before it can expire).
type placed struct {
	rt      *connectors.Runtime
	cfg     Config
	log     *slog.Logger
	backend placement.Backend
	close   func()
	timing  placement.Timing
	metrics *placementMetrics

	apply sync.Mutex                 // serialises what is given to rt
	units map[string]connectors.Unit // every loaded resource, by name; under apply

	mu      sync.Mutex
	specs   map[string]connectors.Spec // every loaded resource, by name
	names   []string                   // sorted keys of specs
	held    map[string]uint64          // resource → epoch of this replica's holding
	fences  map[string]func() bool     // resource → its holding's fence (connectors.Unit.Fence)
	since   map[string]time.Time       // resource → when this replica's role changed
	ended   map[string]string          // resource → why this replica last stopped it
	view    placement.View
	viewErr error // the last failure to read the view, nil after a success
	closing bool  // no more starts: the process is stopping

	placer *placement.Placer
	cancel context.CancelFunc
	done   chan struct{} // closed when the placer and its poller have returned
}

// newPlaced connects to the backend; start starts placing units.
func newPlaced(cfg Config, rt *connectors.Runtime, units []connectors.Unit, reg prometheus.Registerer) (*placed, error) {
	b, closeBackend, err := cfg.Placement.backend(cfg.logger())
	if err != nil {
		return nil, err
	}
	p := &placed{
		rt: rt, cfg: cfg, log: cfg.logger(), backend: b, close: closeBackend,
		metrics: newPlacementMetrics(reg),
		held:    make(map[string]uint64), fences: make(map[string]func() bool), since: make(map[string]time.Time), ended: make(map[string]string),
	}
	p.setUnits(units)
	if p.timing, err = cfg.Placement.Timing.WithDefaults(); err != nil {
		closeBackend()
		return nil, err
	}
	return p, nil
}

// start starts the Placer; on failure the backend is closed.
func (p *placed) start() error {
	cfg := p.cfg
	if err := p.startPlacer(); err != nil {
		p.close()
		return err
	}
	p.log.Info("placement by lease", "backend", cfg.Placement.Backend, "replica", cfg.Placement.Identity,
		"lease", p.timing.LeaseDuration.String(), "renew_deadline", p.timing.RenewDeadline.String(),
		"retry", p.timing.RetryPeriod.String(), "margin", p.timing.Margin().String())
	return nil
}

// setUnits records the loaded resources.
func (p *placed) setUnits(units []connectors.Unit) {
	byName := make(map[string]connectors.Unit, len(units))
	specs := make(map[string]connectors.Spec, len(units))
	names := make([]string, 0, len(units))
	for _, u := range units {
		byName[u.Spec.Name] = u
		specs[u.Spec.Name] = u.Spec
		names = append(names, u.Spec.Name)
	}
	slices.Sort(names)
	p.apply.Lock()
	p.units = byName
	p.apply.Unlock()
	p.mu.Lock()
	p.specs, p.names = specs, names
	p.mu.Unlock()
}

// startPlacer starts a Placer over the current names, and its poller.
func (p *placed) startPlacer() error {
	p.mu.Lock()
	names := slices.Clone(p.names)
	p.mu.Unlock()
	pl, err := placement.NewPlacer(placement.Config{
		Backend:   p.backend,
		Identity:  p.cfg.Placement.Identity,
		Resources: names,
		Timing:    p.cfg.Placement.Timing,
		OnStart:   p.onStart,
		OnStop:    p.onStop,
		Logger:    p.log,
	})
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.Background())
	p.placer, p.cancel, p.done, p.timing = pl, cancel, make(chan struct{}), pl.Timing()
	var wg sync.WaitGroup
	wg.Go(func() { _ = pl.Run(ctx) })
	wg.Go(func() { p.poll(ctx, pl) })
	go func() { wg.Wait(); close(p.done) }()
	return nil
}

// stopPlacer ends the Placer, which stops every held resource and then
// releases its lease, and waits for it.
func (p *placed) stopPlacer() {
	p.cancel()
	<-p.done
}

func (p *placed) onStart(a placement.Assignment) {
	p.mu.Lock()
	closing := p.closing
	if !closing {
		p.held[a.Resource] = a.Epoch
		p.fences[a.Resource] = fence(a)
		p.since[a.Resource] = time.Now()
		delete(p.ended, a.Resource)
	}
	p.mu.Unlock()
	if closing {
		return // the lease goes back when the placer closes
	}
	p.metrics.acquired.WithLabelValues(a.Resource).Inc()
	p.metrics.held.WithLabelValues(a.Resource).Set(1)
	p.log.Info("lease acquired; starting the resource", "resource", a.Resource, "epoch", a.Epoch, "replica", p.cfg.Placement.Identity)
	p.applyHeld()
}

func (p *placed) onStop(resource string, epoch uint64, reason error) {
	p.mu.Lock()
	_, was := p.held[resource]
	delete(p.held, resource)
	delete(p.fences, resource)
	p.since[resource] = time.Now()
	p.ended[resource] = fmt.Sprintf("stopped here at epoch %d: %v", epoch, reason)
	p.mu.Unlock()
	if !was {
		return
	}
	p.metrics.held.WithLabelValues(resource).Set(0)
	start := time.Now()
	p.applyHeld()
	took := time.Since(start).Round(time.Millisecond).String()
	switch {
	case errors.Is(reason, placement.ErrRebalanced):
		p.metrics.released.WithLabelValues(resource, "rebalanced").Inc()
		p.log.Info("resource stopped and its lease released for a replica with room", "resource", resource, "epoch", epoch, "took", took)
	case errors.Is(reason, placement.ErrReleased):
		p.metrics.released.WithLabelValues(resource, "closed").Inc()
		p.log.Info("resource stopped and its lease released", "resource", resource, "epoch", epoch, "took", took)
	default:
		why := "lost"
		if errors.Is(reason, placement.ErrRenewDeadline) {
			why = "renew-deadline"
		}
		p.metrics.lost.WithLabelValues(resource, why).Inc()
		p.log.Warn("lease lost: resource stopped (fenced); another replica may take it over", "resource", resource, "epoch", epoch, "reason", reason.Error(), "took", took)
	}
}

// fence is the data-path check of a's holding ([connectors.Unit].Fence):
// the unit may act while the renew deadline has not passed, read on the
// monotonic clock at each call, and the holding has not been lost. It
// does not wait for the holding's goroutines: after a pause past the
// deadline (SIGSTOP, a stalled VM) the first message handled sees false,
// before the end of the holding is even reported. A holding the Placer
// gives up itself (a rebalance, a shutdown) keeps the lease until the
// unit has stopped, so its drain goes on, still within the deadline.
func fence(a placement.Assignment) func() bool {
	done := a.Context.Done()
	return func() bool {
		select {
		case <-done:
			if !errors.Is(context.Cause(a.Context), placement.ErrReleased) {
				return false
			}
		default:
		}
		return a.BeforeDeadline()
	}
}

// applyHeld gives the runtime the units whose lease this replica holds.
func (p *placed) applyHeld() {
	p.apply.Lock()
	defer p.apply.Unlock()
	p.mu.Lock()
	var units []connectors.Unit
	if !p.closing {
		for r := range p.held {
			if u, ok := p.units[r]; ok {
				u.Fence = p.fences[r]
				units = append(units, u)
			}
		}
	}
	p.mu.Unlock()
	// A resource stopped here is still loaded and runs on the next
	// holder: it must not withdraw its broker subscriptions on the way
	// out (an MQTT session shared by every replica's client ID would
	// then drop what is published until the next holder subscribes).
	loaded := func(name string) bool { _, ok := p.units[name]; return ok }
	if err := p.rt.ApplyKeeping(context.Background(), units, loaded); err != nil {
		p.log.Error("some held resources could not start; they are retried", "err", err)
	}
}

// poll reads who holds what every retry period, for /status and the
// time-without-holder counter.
func (p *placed) poll(ctx context.Context, pl *placement.Placer) {
	t := time.NewTicker(p.timing.RetryPeriod)
	defer t.Stop()
	last := time.Now()
	for {
		vctx, cancel := context.WithTimeout(ctx, p.timing.RetryPeriod)
		v, err := pl.View(vctx)
		cancel()
		now := time.Now()
		p.mu.Lock()
		if err == nil {
			p.view, p.viewErr = v, nil
			for _, r := range p.names {
				if _, ok := v.Holders[r]; !ok {
					p.metrics.unheld.WithLabelValues(r).Add(now.Sub(last).Seconds())
				}
			}
		} else if ctx.Err() == nil {
			p.viewErr = err
		}
		p.mu.Unlock()
		last = now
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Reload loads the files again. When every resource is valid the units
// are replaced; the held ones whose configuration changed restart. When
// the list of names changed, every lease is handed back and the new list
// placed afresh.
func (p *placed) Reload(history *reloads, trigger string) {
	log := p.log
	t := time.Now()
	log.Info("reloading resources", "paths", strings.Join(p.cfg.Paths, ","), "trigger", trigger)
	units, cs, err := Load(p.cfg.Paths, p.cfg.Env, p.cfg.Describe)
	if err != nil {
		log.Error("reload refused; the running resources are unchanged: correct the files (connector check -f lists every fault) and reload again",
			"errors", err.Error())
		history.record(t, trigger, err.Error(), "")
		return
	}
	// Applied: the held resources that then fail to start are retried by
	// the runtime and shown in /status like any other.
	history.record(t, trigger, "", "")
	names := make([]string, 0, len(units))
	for _, u := range units {
		names = append(names, u.Spec.Name)
	}
	slices.Sort(names)
	p.mu.Lock()
	same := slices.Equal(names, p.names)
	p.mu.Unlock()
	if same {
		p.setUnits(units)
		p.applyHeld()
		log.Info("reload applied", "resources", len(cs))
		return
	}
	log.Warn("the list of resources changed: handing back every lease and placing the new list")
	p.stopPlacer()
	p.setUnits(units)
	if err := p.startPlacer(); err != nil {
		log.Error("placing the reloaded resources", "err", err)
		return
	}
	log.Info("reload applied", "resources", len(cs))
}

// Close stops every held resource (in parallel, each within the drain
// bound), then releases every lease at once so that the other replicas
// take them over without waiting for them to expire.
func (p *placed) Close() {
	p.mu.Lock()
	p.closing = true
	p.mu.Unlock()
	p.apply.Lock()
	p.rt.Stop()
	p.apply.Unlock()
	p.stopPlacer()
	p.close()
}

// The admin listener reads the replica through placed: the resources it
// holds as the runtime reports them, the others as standbys.

// Alive implements admin.Runtime.
func (p *placed) Alive(ctx context.Context) bool { return p.rt.Alive(ctx) }

// Ready reports whether every resource this replica holds runs with both
// sides up; resources held elsewhere, or by nobody, do not count.
func (p *placed) Ready() bool {
	for _, s := range p.Statuses() {
		if !s.Ready() {
			return false
		}
	}
	return true
}

// Statuses implements admin.Runtime: every loaded resource, with its
// placement.
func (p *placed) Statuses() []connectors.Status {
	running := make(map[string]connectors.Status)
	for _, s := range p.rt.Statuses() {
		running[s.Name] = s
	}
	self := p.cfg.Placement.Identity
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]connectors.Status, 0, len(p.names))
	for _, name := range p.names {
		epoch, mine := p.held[name]
		holder := p.view.Holders[name]
		if mine {
			holder = self
		}
		pst := &connectors.PlacementStatus{Holder: holder, Epoch: epoch, Since: p.since[name]}
		for _, m := range p.view.Members {
			if m != holder {
				pst.Standbys = append(pst.Standbys, m)
			}
		}
		st, ok := running[name]
		if mine && ok {
			pst.Role = roleHolder
			st.Placement = pst
			out = append(out, st)
			continue
		}
		spec := p.specs[name]
		st = connectors.Status{
			Name: spec.Name, Protocol: string(spec.Protocol), Direction: string(spec.Direction),
			Broker: spec.Broker, Endpoint: spec.Endpoint, Placement: pst,
		}
		cond := connectors.Condition{Type: connectors.CondReady, Status: "True", LastTransitionTime: p.since[name]}
		switch {
		case mine: // acquired a moment ago, not yet given to the runtime
			pst.Role = roleHolder
			cond.Status, cond.Reason, cond.Message = "False", "Starting", "lease acquired; the resource is starting"
		case holder != "":
			pst.Role = roleStandby
			cond.Reason, cond.Message = "Standby", fmt.Sprintf("replica %s runs it; this one stands by with it loaded and checked", holder)
		default:
			pst.Role = roleUnheld
			cond.Reason, cond.Message = "Unheld", "no replica holds its lease now; one with room takes it within a retry period"
		}
		var notes []string
		if why := p.ended[name]; why != "" {
			notes = append(notes, why)
		}
		if p.viewErr != nil {
			cond.Reason = "CoordinationUnreachable"
			notes = append(notes, "the coordination service does not answer: "+p.viewErr.Error())
		}
		if len(notes) > 0 {
			cond.Message += " (" + strings.Join(notes, "; ") + ")"
		}
		st.Conditions = []connectors.Condition{cond}
		out = append(out, st)
	}
	return out
}

// placementMetrics are the lease series of /metrics.
type placementMetrics struct {
	held     *prometheus.GaugeVec
	acquired *prometheus.CounterVec
	lost     *prometheus.CounterVec
	released *prometheus.CounterVec
	unheld   *prometheus.CounterVec
}

func newPlacementMetrics(reg prometheus.Registerer) *placementMetrics {
	m := &placementMetrics{
		held: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: "weida_connector", Name: "lease_held",
			Help: "1 while this replica holds the resource's lease and runs it, else 0."}, []string{"resource"}),
		acquired: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weida_connector", Name: "lease_acquisitions_total",
			Help: "Leases this replica acquired (each starts the resource with a new epoch)."}, []string{"resource"}),
		lost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weida_connector", Name: "lease_losses_total",
			Help: "Leases this replica lost and whose resource it stopped (fenced), by reason: renew-deadline (no renewal in time) or lost (the service says it is gone)."}, []string{"resource", "reason"}),
		released: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weida_connector", Name: "lease_releases_total",
			Help: "Leases this replica gave back after stopping the resource, by reason: rebalanced (a replica with room joined) or closed (shutdown, reload of a changed list)."}, []string{"resource", "reason"}),
		unheld: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: "weida_connector", Name: "lease_unheld_seconds_total",
			Help: "Seconds this replica saw the resource's lease held by no replica (every replica counts what it sees: take the max across replicas, not the sum)."}, []string{"resource"}),
	}
	reg.MustRegister(m.held, m.acquired, m.lost, m.released, m.unheld)
	return m
}
