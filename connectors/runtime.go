package connectors

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"reflect"
	"slices"
	"sync"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida"
)

// Unit is one resource ready to run: its Spec and how to build its two
// sides. Package cmd/connector builds Units from loaded resources and wires
// the broker drivers explicitly.
type Unit struct {
	Spec Spec
	// Config is compared on reload: a unit whose Config is deeply equal to
	// the running one is left running. Put the resource's spec here.
	Config any

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
	for _, u := range units {
		want[u.Spec.Name] = u
	}
	r.mu.Lock()
	var stop []*runningUnit
	for name, ru := range r.running {
		if u, ok := want[name]; !ok || !reflect.DeepEqual(u.Config, ru.unit.Config) {
			stop = append(stop, ru)
			delete(r.running, name)
		}
	}
	clear(r.failed)
	r.mu.Unlock()

	for _, ru := range stop {
		r.stopUnit(ru)
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
		if err := r.startUnit(ctx, want[name]); err != nil {
			errs = append(errs, fmt.Errorf("resource %s: %w", name, err))
		}
	}
	return errors.Join(errs...)
}

func (r *Runtime) startUnit(ctx context.Context, u Unit) error {
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
	} else if !reflect.DeepEqual(listenIdentity(sl.cfg), listenIdentity(u.ListenConfig)) {
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

// listenIdentity is the part of a ListenConfig that must agree between
// resources sharing a listener.
func listenIdentity(c weida.ListenConfig) [3]any {
	return [3]any{c.CertFile, c.KeyFile, slices.Clone(c.ClientFingerprints)}
}

func (r *Runtime) stopUnit(ru *runningUnit) {
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
		wg.Go(func() { r.stopUnit(ru) })
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
