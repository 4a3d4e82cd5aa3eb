// Package placement decides which replica runs which resource, through
// leases held on an existing coordination service (etcd, or a Kubernetes
// Lease object), never through a consensus of its own.
//
// A [Lease] is one named resource's lease. [Lease.TryAcquire] returns a
// [Holding] when nobody else holds it; the Holding renews itself every
// [Timing.RetryPeriod] and its context ends, with a cause, as soon as the
// holder may no longer act: when a renewal has not succeeded within
// [Timing.RenewDeadline] of the last one sent, when the backend says the
// lease is gone, or on [Holding.Release]. Nobody else takes the lease until
// [Timing.LeaseDuration] after the last renewal was received or seen (by
// the service, or by the standby that judges expiry on its own clock), and
// that renewal was sent no earlier than the one the deadline counts from,
// so the holder learns it must stop at least LeaseDuration - RenewDeadline
// (the margin) before anybody else can take the lease. Every Holding
// carries an epoch, a fencing token that strictly increases with every
// change of holder.
//
// A [Placer] spreads a list of resources over the live replicas: each holds
// at most its fair share, releases extras when a replica joins and takes
// over the leases of one that left or died.
//
// Backends: [Etcd] (go.etcd.io/etcd/client/v3) and [Kubernetes]
// (coordination.k8s.io/v1 through client-go), which can also label its own
// pod with the resources it holds ([Kubernetes.LabelPod]) for Services
// that must reach the holder only. The service runs a Placer
// when `connector run` is given --placement (service/placed.go).
package placement

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"
)

// Timing holds a lease's three durations. The zero value is [DefaultTiming].
type Timing struct {
	// LeaseDuration is how long a lease lasts after its last renewal: a
	// standby takes it over only once it has seen no renewal for this long,
	// counting on its own clock from when it first saw the last one (both
	// backends), or once etcd has expired it, a TTL after the last
	// keep-alive etcd received. Backends round it up to whole seconds (etcd
	// TTLs and Kubernetes' leaseDurationSeconds are whole seconds). Zero
	// means 4 s.
	LeaseDuration time.Duration
	// RenewDeadline is how long after sending the last renewal that
	// succeeded a holder may go on acting; past it, the Holding's context
	// ends. It must be shorter than LeaseDuration: the difference is the
	// margin in which the holder stops its resource and in which clocks may
	// run at different rates. Zero means 2.5 s.
	RenewDeadline time.Duration
	// RetryPeriod is how often a holder renews and a standby tries to
	// acquire. It must be shorter than RenewDeadline so that a renewal can
	// fail and be retried before the deadline. Zero means 0.5 s.
	RetryPeriod time.Duration
}

// DefaultTiming is a 4 s lease renewed every half second, with a 2.5 s
// renew deadline: a holder cut off from the coordination service stops
// within 2.5 s, at least 1.5 s (the margin) before its lease can move.
//
// Why these numbers. A crashed holder's resource runs elsewhere once a
// standby has seen its last renewal (up to a RetryPeriod after it landed,
// which was up to a RetryPeriod before the crash), has seen no other for
// LeaseDuration (checked every RetryPeriod) and has started the resource:
// about LeaseDuration + RetryPeriod after the crash, at most
// LeaseDuration + 2 RetryPeriods, for a goal of 5 s (measured in
// docs/PERFORMANCE.md, Failover). An election of a new etcd leader does
// not lengthen it (the standby does not wait for etcd's TTL). The renew
// deadline is not in that sum, so it is kept long: two and a half election
// timeouts of an etcd cluster with its default timers (1 s), since a 2 s
// deadline fenced every holder when the leader was killed on a loaded
// machine (etcd_test.go); on a busy cluster raise the deadline and the
// lease together. The margin is the time a holder has to stop its resource;
// clocks need only run at the same rate, which they do to parts per
// million. A --drain longer than the renew deadline minus a retry period
// is warned about at start (cmd/connector, drainWarning).
var DefaultTiming = Timing{LeaseDuration: 4 * time.Second, RenewDeadline: 2500 * time.Millisecond, RetryPeriod: 500 * time.Millisecond}

// withDefaults fills zero fields from DefaultTiming and checks the order
// RetryPeriod < RenewDeadline < LeaseDuration. RenewDeadline <
// LeaseDuration is what keeps two holders from acting at once: the holder
// stops RenewDeadline after it sent its last renewal that succeeded, a
// standby takes over no earlier than LeaseDuration after it saw that
// renewal (which landed after it was sent), and the difference, the
// margin, covers the holder's stopping and any difference in the rates of
// the two monotonic clocks (parts per million).
func (t Timing) withDefaults() (Timing, error) {
	if t.LeaseDuration == 0 {
		t.LeaseDuration = DefaultTiming.LeaseDuration
	}
	if t.RenewDeadline == 0 {
		t.RenewDeadline = DefaultTiming.RenewDeadline
	}
	if t.RetryPeriod == 0 {
		t.RetryPeriod = DefaultTiming.RetryPeriod
	}
	if t.RetryPeriod <= 0 || t.RenewDeadline <= t.RetryPeriod || t.LeaseDuration <= t.RenewDeadline {
		return t, fmt.Errorf("placement: timing needs 0 < retry period (%v) < renew deadline (%v) < lease duration (%v)", t.RetryPeriod, t.RenewDeadline, t.LeaseDuration)
	}
	return t, nil
}

// WithDefaults returns t with its zero fields taken from DefaultTiming, or
// an error when the order RetryPeriod < RenewDeadline < LeaseDuration does
// not hold.
func (t Timing) WithDefaults() (Timing, error) { return t.withDefaults() }

// Margin is LeaseDuration - RenewDeadline: the least time between a holder
// learning it must stop and another replica being able to take its lease.
func (t Timing) Margin() time.Duration { return t.LeaseDuration - t.RenewDeadline }

// wholeSeconds rounds d up to whole seconds, at least one.
func wholeSeconds(d time.Duration) int64 {
	s := int64((d + time.Second - 1) / time.Second)
	return max(s, 1)
}

// Errors that end a Holding (its context's cause) or that a backend returns.
var (
	// ErrRenewDeadline: no renewal succeeded within the renew deadline;
	// the holder must stop, as the lease may soon move elsewhere.
	ErrRenewDeadline = errors.New("placement: lease not renewed within the renew deadline")
	// ErrLost: the backend says the lease is no longer this holder's
	// (expired, released, or taken by another).
	ErrLost = errors.New("placement: lease lost")
	// ErrReleased: the holder released the lease itself.
	ErrReleased = errors.New("placement: lease released")
)

// HeldError is what TryAcquire returns when another holder (or a holding of
// this holder's that has not yet expired) has the lease.
type HeldError struct {
	Name   string
	Holder string
	Epoch  uint64
}

func (e *HeldError) Error() string {
	return fmt.Sprintf("placement: lease %q is held by %q (epoch %d)", e.Name, e.Holder, e.Epoch)
}

// Backend is one coordination service. Its methods may be called
// concurrently. Every call makes at most a few requests and returns; none
// retries beyond what ctx allows.
type Backend interface {
	// TryAcquire takes the lease called name for holder if nobody holds
	// it, or returns a *HeldError. The lease lasts the backend's lease
	// duration from the moment the service received the request, or from
	// when another replica saw the write, which is later.
	TryAcquire(ctx context.Context, name, holder string) (Claim, error)
	// Holder returns who holds the lease called name and its epoch, or ""
	// when nobody does.
	Holder(ctx context.Context, name string) (holder string, epoch uint64, err error)
	// Holders returns the holders of the live leases whose names start
	// with prefix (the Placer's membership), keyed by lease name. A lease
	// that has gone a lease duration without a renewal, as the backend
	// judges it, is not live, whether or not the service still keeps it.
	Holders(ctx context.Context, prefix string) (map[string]string, error)
}

// Claim is one acquisition of a lease, as a backend sees it.
type Claim interface {
	// Epoch is the fencing token of this acquisition: larger than that of
	// every earlier acquisition of the same lease.
	Epoch() uint64
	// Renew extends the lease by the lease duration from the moment the
	// service receives the request (or, later, from when another replica
	// sees the write), or returns an error wrapping ErrLost
	// when the lease is no longer this claim's. Any other error may be
	// transient.
	Renew(ctx context.Context) error
	// Release gives the lease up at once so that another may take it.
	Release(ctx context.Context) error
}

// Lease is one named resource's lease for one holder identity.
type Lease struct {
	backend Backend
	name    string
	holder  string
	timing  Timing
	// beforeRenew, when set (tests only), runs before each renewal; a
	// test blocks it to simulate a holder whose renew loop is stuck.
	beforeRenew func()
}

// NewLease returns the lease called name, to be held as holder, with the
// given timing (zero fields take DefaultTiming's). The timing must match the
// backend's: the backend decides how long the service keeps the lease.
func NewLease(b Backend, name, holder string, t Timing) (*Lease, error) {
	t, err := t.withDefaults()
	if err != nil {
		return nil, err
	}
	if name == "" || holder == "" {
		return nil, errors.New("placement: a lease needs a name and a holder identity")
	}
	return &Lease{backend: b, name: name, holder: holder, timing: t}, nil
}

// Name returns the lease's name.
func (l *Lease) Name() string { return l.name }

// Holder returns who holds the lease now and with which epoch ("" when
// nobody does), as the backend sees it.
func (l *Lease) Holder(ctx context.Context) (string, uint64, error) {
	return l.backend.Holder(ctx, l.name)
}

// TryAcquire makes one attempt to take the lease. On success the returned
// Holding renews itself until its context ends; the caller must act on the
// resource only while [Holding.Valid] and stop when [Holding.Done] closes,
// and must call Release when done with it. When another holds the lease
// the error is a *HeldError.
func (l *Lease) TryAcquire(ctx context.Context) (*Holding, error) {
	return l.tryAcquire(ctx, nil)
}

// tryAcquire is TryAcquire with a function called, from a goroutine of the
// Holding's own, as soon as its context has ended and before the claim is
// released: a voluntary release gives the lease up only after onEnd has
// returned, that is after the holder has stopped acting.
func (l *Lease) tryAcquire(ctx context.Context, onEnd func(*Holding)) (*Holding, error) {
	sent := time.Now()
	ctx, cancel := context.WithTimeout(ctx, l.timing.RenewDeadline)
	defer cancel()
	claim, err := l.backend.TryAcquire(ctx, l.name, l.holder)
	if err != nil {
		return nil, err
	}
	if time.Since(sent) >= l.timing.RenewDeadline {
		// Acquired too late to act on it safely: give it back.
		release, cancel := context.WithTimeout(context.WithoutCancel(ctx), l.timing.RenewDeadline)
		_ = claim.Release(release)
		cancel()
		return nil, fmt.Errorf("placement: acquiring lease %q took longer than the renew deadline", l.name)
	}
	return newHolding(l, claim, sent, onEnd), nil
}

// Holding is one acquisition of a Lease. Its methods may be called from any
// goroutine.
type Holding struct {
	lease  *Lease
	claim  Claim
	ctx    context.Context
	cancel context.CancelCauseFunc
	ended  chan struct{} // closed once onEnd has returned
	done   chan struct{} // closed when the renew loop has ended

	mu       sync.Mutex
	deadline time.Time   // monotonic: act only before it
	watchdog *time.Timer // ends ctx at deadline, independently of the renew loop

	// base and until mirror deadline for BeforeDeadline, which the data
	// path calls before every step: until is deadline - base, stored
	// with deadline, read without the lock.
	base  time.Time
	until atomic.Int64
}

func newHolding(l *Lease, c Claim, sent time.Time, onEnd func(*Holding)) *Holding {
	ctx, cancel := context.WithCancelCause(context.Background())
	h := &Holding{lease: l, claim: c, ctx: ctx, cancel: cancel, ended: make(chan struct{}), done: make(chan struct{})}
	h.deadline = sent.Add(l.timing.RenewDeadline)
	h.base = sent
	h.until.Store(int64(h.deadline.Sub(h.base)))
	h.watchdog = time.AfterFunc(time.Until(h.deadline), func() { h.cancel(ErrRenewDeadline) })
	// The end is reported from a goroutine apart from the renew loop, so
	// that a renew loop that is stuck delays neither the report nor the
	// watchdog.
	go func() {
		defer close(h.ended)
		<-ctx.Done()
		if onEnd != nil {
			onEnd(h)
		}
	}()
	go h.keep()
	return h
}

// Name returns the lease's name.
func (h *Holding) Name() string { return h.lease.name }

// Epoch returns the fencing token of this holding.
func (h *Holding) Epoch() uint64 { return h.claim.Epoch() }

// Context returns a context that ends, with one of ErrRenewDeadline,
// ErrLost or ErrReleased as its cause, when the holder must stop acting.
func (h *Holding) Context() context.Context { return h.ctx }

// Done is closed when the holder must stop acting: Context().Done().
func (h *Holding) Done() <-chan struct{} { return h.ctx.Done() }

// Err returns why the holding ended, or nil while it lasts.
func (h *Holding) Err() error { return context.Cause(h.ctx) }

// Valid reports whether the holder may still act, reading the monotonic
// clock itself rather than waiting for the watchdog to fire: a process that
// was paused past its deadline sees false the moment it resumes.
func (h *Holding) Valid() bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	return h.ctx.Err() == nil && time.Now().Before(h.deadline)
}

// BeforeDeadline reports whether the renew deadline has not passed yet,
// whether or not the holding has ended, reading the monotonic clock as
// Valid does. A holding ended by Release (ErrReleased) gives the lease
// back only once its end has been reported, so its holder may finish
// what it had begun until then, but never past the deadline: the lease
// may expire soon after it.
func (h *Holding) BeforeDeadline() bool {
	// time.Since of a time with a monotonic reading reads only the
	// monotonic clock, and no lock is taken: this is on the data path.
	return time.Since(h.base) < time.Duration(h.until.Load())
}

// keep renews every RetryPeriod until the holding ends.
func (h *Holding) keep() {
	defer close(h.done)
	t := h.lease.timing
	tick := time.NewTicker(t.RetryPeriod)
	defer tick.Stop()
	for {
		select {
		case <-h.ctx.Done():
			<-h.ended
			h.releaseClaim()
			return
		case <-tick.C:
		}
		if h.lease.beforeRenew != nil {
			h.lease.beforeRenew()
		}
		if err := h.renew(); errors.Is(err, ErrLost) {
			h.cancel(err)
		}
	}
}

// renew sends one renewal, bounded by the current deadline (a renewal that
// would succeed after it is of no use), and on success moves the deadline
// to RenewDeadline after the moment it was sent.
func (h *Holding) renew() error {
	sent := time.Now()
	h.mu.Lock()
	deadline := h.deadline
	h.mu.Unlock()
	ctx, cancel := context.WithDeadline(h.ctx, deadline)
	defer cancel()
	if err := h.claim.Renew(ctx); err != nil {
		return err
	}
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.ctx.Err() != nil || !time.Now().Before(h.deadline) {
		return nil // the watchdog has fired, or is about to: the holding is over
	}
	h.deadline = sent.Add(h.lease.timing.RenewDeadline)
	h.until.Store(int64(h.deadline.Sub(h.base)))
	h.watchdog.Reset(time.Until(h.deadline))
	return nil
}

// releaseClaim gives the lease back to the service when the holding has
// ended, so that a replica waiting for it need not wait for it to expire.
// After a lost lease or a missed deadline it is best-effort: the service
// may be unreachable.
func (h *Holding) releaseClaim() {
	h.mu.Lock()
	h.watchdog.Stop()
	h.mu.Unlock()
	if errors.Is(context.Cause(h.ctx), ErrLost) {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), h.lease.timing.RenewDeadline)
	defer cancel()
	_ = h.claim.Release(ctx)
}

// Release ends the holding (its context's cause is ErrReleased unless it had
// already ended) and gives the lease back, waiting at most RenewDeadline
// for the service. It returns once the renew loop has stopped.
func (h *Holding) Release() { h.end(ErrReleased) }

// end ends the holding with cause (unless it had ended already), releases
// the claim and waits for the renew loop to stop.
func (h *Holding) end(cause error) {
	h.cancel(cause)
	<-h.done
}

// Stopped is closed once the holding has ended and its renew loop has
// stopped (after any release of the claim).
func (h *Holding) Stopped() <-chan struct{} { return h.done }
