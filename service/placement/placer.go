package placement

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// Lease names the Placer uses on its backend. Both parts stay valid
// Kubernetes object names when resource names and identities are DNS
// labels.
const (
	memberPrefix   = "member."
	resourcePrefix = "resource."
)

// Reasons a Placer gives [Config.OnStop] besides a Holding's own causes
// (ErrRenewDeadline, ErrLost).
var (
	// ErrRebalanced: another replica joined and this one held more than its
	// share; the resource was released for it.
	ErrRebalanced = fmt.Errorf("placement: released for a replica with room: %w", ErrReleased)
	// ErrClosed: the Placer's Run ended and released everything it held.
	ErrClosed = fmt.Errorf("placement: placer closed: %w", ErrReleased)
)

// Assignment is one resource this replica holds: act on it only until
// Context ends.
type Assignment struct {
	Resource string
	Epoch    uint64
	// Context ends, with the reason as its cause, when the replica must stop
	// the resource; it ends before the lease can be taken elsewhere.
	Context context.Context
	// Valid reports whether the replica may still act, reading the clock
	// itself (see [Holding.Valid]); check it before each irrevocable step.
	Valid func() bool
	// BeforeDeadline reports whether the renew deadline has not passed,
	// even once Context has ended (see [Holding.BeforeDeadline]): a
	// resource the Placer gives up itself may finish its work until
	// OnStop returns, within it.
	BeforeDeadline func() bool
}

// Config configures a Placer. Backend, Identity and Resources are
// required.
type Config struct {
	Backend Backend
	// Identity names this replica; unique among the replicas sharing the
	// backend (in Kubernetes, the pod name).
	Identity string
	// Resources are the names of every resource the replicas share; every
	// replica must be given the same list.
	Resources []string
	// Timing must match the Backend's. Zero fields take DefaultTiming's.
	Timing Timing
	// OnStart is called when this replica has acquired a resource. OnStart
	// and OnStop may run concurrently for different resources; for one
	// resource they alternate, OnStart first, and neither may block long.
	OnStart func(Assignment)
	// OnStop is called once an Assignment's Context has ended, with the
	// reason: ErrRenewDeadline, an error wrapping ErrLost, ErrRebalanced or
	// ErrClosed. When the Placer gives a resource up itself (ErrRebalanced,
	// ErrClosed) it releases the lease only after OnStop has returned, so
	// OnStop should return once the resource has stopped.
	OnStop func(resource string, epoch uint64, reason error)
	// Logger receives lease errors at debug level; nil discards them.
	Logger *slog.Logger
}

// Placer holds this replica's fair share of the resources. Create it with
// [NewPlacer] and run it with Run.
type Placer struct {
	cfg    Config
	member *Lease
	leases map[string]*Lease // by resource
	// gate, when set (tests only), pauses the placer's rounds and renewals
	// until closed, as a SIGSTOP would.
	gate atomic.Pointer[chan struct{}]

	mu         sync.Mutex
	held       map[string]*Holding // by resource, until its OnStop has returned
	membership *Holding
	wg         sync.WaitGroup // watchers of held
}

// NewPlacer checks cfg and returns a Placer that has contacted nobody yet.
func NewPlacer(cfg Config) (*Placer, error) {
	if cfg.Backend == nil || cfg.Identity == "" || len(cfg.Resources) == 0 {
		return nil, errors.New("placement: a placer needs a backend, an identity and resources")
	}
	t, err := cfg.Timing.withDefaults()
	if err != nil {
		return nil, err
	}
	cfg.Timing = t
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	cfg.Resources = slices.Clone(cfg.Resources)
	p := &Placer{cfg: cfg, leases: make(map[string]*Lease), held: make(map[string]*Holding)}
	if p.member, err = p.newLease(memberPrefix + cfg.Identity); err != nil {
		return nil, err
	}
	for _, r := range cfg.Resources {
		if _, dup := p.leases[r]; dup {
			return nil, fmt.Errorf("placement: resource %q is listed twice", r)
		}
		if p.leases[r], err = p.newLease(resourcePrefix + r); err != nil {
			return nil, err
		}
	}
	// Prefer resources in an order of this replica's own (rendezvous
	// hashing), so that replicas starting together reach for different
	// ones, and release the least preferred first.
	slices.SortFunc(p.cfg.Resources, func(a, b string) int { return compareScore(p.score(b), p.score(a)) })
	return p, nil
}

func (p *Placer) newLease(name string) (*Lease, error) {
	l, err := NewLease(p.cfg.Backend, name, p.cfg.Identity, p.cfg.Timing)
	if err != nil {
		return nil, err
	}
	l.beforeRenew = p.waitGate
	return l, nil
}

func (p *Placer) waitGate() {
	if g := p.gate.Load(); g != nil {
		<-*g
	}
}

func (p *Placer) score(resource string) uint64 {
	h := fnv.New64a()
	h.Write([]byte(p.cfg.Identity))
	h.Write([]byte{0})
	h.Write([]byte(resource))
	return h.Sum64()
}

func compareScore(a, b uint64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// Held returns the resources this replica holds now, sorted.
func (p *Placer) Held() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var held []string
	for r, h := range p.held {
		if h.Err() == nil {
			held = append(held, r)
		}
	}
	slices.Sort(held)
	return held
}

// Run registers this replica, then every RetryPeriod rebalances: it takes
// free resources while below its share and releases extras above it. When
// ctx ends it releases every resource (OnStop with ErrClosed) and its
// membership, and returns once every OnStop has returned.
func (p *Placer) Run(ctx context.Context) error {
	tick := time.NewTicker(p.cfg.Timing.RetryPeriod)
	defer tick.Stop()
	for {
		p.waitGate()
		if ctx.Err() != nil {
			break
		}
		p.round(ctx)
		select {
		case <-ctx.Done():
		case <-tick.C:
		}
	}
	p.mu.Lock()
	held := make([]*Holding, 0, len(p.held))
	for _, h := range p.held {
		held = append(held, h)
	}
	membership := p.membership
	p.mu.Unlock()
	var releases sync.WaitGroup
	for _, h := range held {
		releases.Go(func() { h.end(ErrClosed) })
	}
	releases.Wait()
	if membership != nil {
		membership.Release()
	}
	p.wg.Wait()
	return nil
}

// round does one step of registration and balancing.
func (p *Placer) round(ctx context.Context) {
	p.register(ctx)
	share, ok := p.share(ctx)
	if !ok {
		return // keep what is held: each holding fences itself
	}
	held := p.heldLive()
	if extra := len(held) - share; extra > 0 {
		// held is in preference order: release from the end.
		for _, r := range held[len(held)-extra:] {
			p.mu.Lock()
			h := p.held[r]
			p.mu.Unlock()
			h.end(ErrRebalanced)
		}
		return
	}
	room := share - len(held)
	for _, r := range p.cfg.Resources {
		if room == 0 || ctx.Err() != nil {
			return
		}
		p.mu.Lock()
		_, mine := p.held[r]
		p.mu.Unlock()
		if mine {
			continue
		}
		started := make(chan struct{})
		h, err := p.leases[r].tryAcquire(ctx, func(h *Holding) {
			<-started
			p.stopped(r, h)
		})
		if err != nil {
			var held *HeldError
			if !errors.As(err, &held) {
				p.cfg.Logger.Debug("placement: acquiring", "resource", r, "err", err)
			}
			continue
		}
		room--
		p.started(r, h)
		close(started)
	}
}

// register holds this replica's membership lease, taking it again after
// losing it.
func (p *Placer) register(ctx context.Context) {
	p.mu.Lock()
	m := p.membership
	p.mu.Unlock()
	if m != nil && m.Err() == nil {
		return
	}
	h, err := p.member.TryAcquire(ctx)
	if err != nil {
		// A membership left over from an earlier run of this identity
		// counts it in already; it expires on its own.
		p.cfg.Logger.Debug("placement: registering", "identity", p.cfg.Identity, "err", err)
		return
	}
	p.mu.Lock()
	p.membership = h
	p.mu.Unlock()
}

// share returns ceil(resources / live replicas), counting this one even if
// its registration has not landed yet.
func (p *Placer) share(ctx context.Context) (int, bool) {
	ctx, cancel := context.WithTimeout(ctx, p.cfg.Timing.RetryPeriod)
	defer cancel()
	members, err := p.cfg.Backend.Holders(ctx, memberPrefix)
	if err != nil {
		p.cfg.Logger.Debug("placement: listing replicas", "err", err)
		return 0, false
	}
	live := 0
	self := false
	for _, id := range members {
		live++
		self = self || id == p.cfg.Identity
	}
	if !self {
		live++
	}
	n := len(p.cfg.Resources)
	return (n + live - 1) / live, true
}

// heldLive returns the resources held and not ended, in preference order.
func (p *Placer) heldLive() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var held []string
	for _, r := range p.cfg.Resources {
		if h, ok := p.held[r]; ok && h.Err() == nil {
			held = append(held, r)
		}
	}
	return held
}

// started reports a new holding; its end is reported by stopped.
func (p *Placer) started(r string, h *Holding) {
	p.mu.Lock()
	p.held[r] = h
	p.mu.Unlock()
	p.wg.Go(func() { <-h.Stopped() })
	if p.cfg.OnStart != nil {
		p.cfg.OnStart(Assignment{Resource: r, Epoch: h.Epoch(), Context: h.Context(), Valid: h.Valid, BeforeDeadline: h.BeforeDeadline})
	}
}

// stopped reports the end of a holding. The Holding releases its claim
// only after stopped has returned, so a replica's resource is stopped
// before another can take it over.
func (p *Placer) stopped(r string, h *Holding) {
	if p.cfg.OnStop != nil {
		p.cfg.OnStop(r, h.Epoch(), h.Err())
	}
	// Forget it only after OnStop, so that a new holding of r cannot be
	// reported before the end of this one.
	p.mu.Lock()
	if p.held[r] == h {
		delete(p.held, r)
	}
	p.mu.Unlock()
}

// View is who holds what, as the backend sees it at one moment.
type View struct {
	// Holders maps each resource of the Placer's list that is held to
	// its holder's identity; a resource missing from it has no holder.
	Holders map[string]string
	// Members are the identities of the live replicas, sorted.
	Members []string
}

// View reads the holders of the Placer's resources and the live replicas
// from the backend: two list requests.
func (p *Placer) View(ctx context.Context) (View, error) {
	members, err := p.cfg.Backend.Holders(ctx, memberPrefix)
	if err != nil {
		return View{}, err
	}
	leases, err := p.cfg.Backend.Holders(ctx, resourcePrefix)
	if err != nil {
		return View{}, err
	}
	v := View{Holders: make(map[string]string)}
	for _, id := range members {
		v.Members = append(v.Members, id)
	}
	slices.Sort(v.Members)
	v.Members = slices.Compact(v.Members)
	for _, r := range p.cfg.Resources {
		if id, ok := leases[resourcePrefix+r]; ok {
			v.Holders[r] = id
		}
	}
	return v, nil
}

// Timing returns the Placer's timing, with defaults filled in.
func (p *Placer) Timing() Timing { return p.cfg.Timing }
