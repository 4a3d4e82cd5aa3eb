package placement

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/validation"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// Kubernetes keeps leases as coordination.k8s.io/v1 Lease objects named
// Prefix+name in one namespace. Every write is an update carrying the
// resourceVersion last read or written, so the API server applies it only
// if nobody wrote the object in between (optimistic concurrency): an
// acquisition that races another fails with a conflict, and a renewal that
// conflicts means the lease is no longer this holder's.
//
// The API server does not expire a Lease: a replica decides that the
// holder has gone when the object has not changed for its
// leaseDurationSeconds as measured by its own monotonic clock from the
// moment it first saw that version (as client-go's leader election does).
// Clocks' offsets therefore do not matter, only their rates; the price is
// that a replica which has just started waits a whole lease duration
// before taking over a lease it finds held.
//
// The epoch is spec.leaseTransitions, which every acquisition increments
// (a Lease is created with 1). Release clears spec.holderIdentity and
// keeps the object, so the count survives; deleting the object by hand
// starts it again at 1, which breaks the fencing of any zombie holder
// still running: do not delete Lease objects of running replicas.
type Kubernetes struct {
	leases  coordinationclient.LeaseInterface
	prefix  string
	seconds int32

	labels *podLabels // nil: no pod is labelled (see LabelPod)

	mu   sync.Mutex
	seen map[string]sighting // by object name
}

// sighting is a version of a Lease and when this replica first saw it.
type sighting struct {
	resourceVersion string
	at              time.Time
}

// NewKubernetes returns a backend on the Lease objects that leases reaches
// (one namespace: clientset.CoordinationV1().Leases(ns)), named prefix+name,
// with leases of t.LeaseDuration. Object names must be DNS subdomains, so
// prefix, the resource names and the replica identities must be lowercase
// letters, digits, '-' and '.'.
func NewKubernetes(leases coordinationclient.LeaseInterface, prefix string, t Timing) (*Kubernetes, error) {
	t, err := t.withDefaults()
	if err != nil {
		return nil, err
	}
	return &Kubernetes{leases: leases, prefix: prefix, seconds: int32(wholeSeconds(t.LeaseDuration)), seen: make(map[string]sighting)}, nil
}

// LabelPod makes the backend label the pod called pod (this replica's own,
// reached through pods, the pods of its namespace) with
// holds.weida.dev/<resource>=true ([HoldsLabel]) for every resource lease
// it holds, and take the label off when the lease is released or lost, so
// that a Service selecting the label reaches only the current holder. It
// must be called once, before the backend is used, and starts a goroutine
// that writes the labels apart from the lease operations, which Close
// stops. Write failures are logged on log (nil discards them) and retried;
// they never delay or fail a lease operation.
//
// The replica's service account then needs get, list and patch on pods:
// list, because taking a lease also takes its label off any other pod
// (that of a holder whose node died keeps its labels until the pod is
// deleted).
func (k *Kubernetes) LabelPod(pods corev1client.PodInterface, pod string, log *slog.Logger) {
	k.labels = newPodLabels(pods, pod, time.Duration(k.seconds)*time.Second, log)
}

// Close stops the labelling of the pod that LabelPod started, if any. The
// leases are the Placer's to release, before.
func (k *Kubernetes) Close() {
	if k.labels != nil {
		k.labels.Close()
	}
}

func (k *Kubernetes) object(name string) (string, error) {
	obj := k.prefix + name
	if errs := validation.IsDNS1123Subdomain(obj); len(errs) > 0 {
		return "", fmt.Errorf("placement: kubernetes: %q cannot name a Lease object (%s): use lowercase letters, digits, '-' and '.' in the prefix, resource names and identities", obj, strings.Join(errs, "; "))
	}
	return obj, nil
}

// TryAcquire implements Backend.
func (k *Kubernetes) TryAcquire(ctx context.Context, name, holder string) (Claim, error) {
	obj, err := k.object(name)
	if err != nil {
		return nil, err
	}
	if k.labels != nil {
		if _, err := labelKey(name); err != nil {
			return nil, err
		}
	}
	sent := time.Now()
	claim, err := k.tryAcquire(ctx, name, obj, holder)
	if err == nil && k.labels != nil {
		k.labels.held(name, sent)
	}
	return claim, err
}

func (k *Kubernetes) tryAcquire(ctx context.Context, name, obj, holder string) (Claim, error) {
	lease, err := k.leases.Get(ctx, obj, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return k.create(ctx, name, obj, holder)
	}
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes: reading Lease %s: %w", obj, err)
	}
	now := time.Now()
	if current := holderOf(lease); current != "" && !k.expired(obj, lease, now) {
		return nil, &HeldError{Name: name, Holder: current, Epoch: epochOf(lease)}
	}
	next := lease.DeepCopy()
	stamp := metav1.NewMicroTime(now)
	next.Spec.HolderIdentity = &holder
	next.Spec.LeaseDurationSeconds = &k.seconds
	next.Spec.AcquireTime, next.Spec.RenewTime = &stamp, &stamp
	transitions := int32(epochOf(lease)) + 1
	next.Spec.LeaseTransitions = &transitions
	updated, err := k.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		return nil, &HeldError{Name: name, Holder: "(another replica, just now)", Epoch: uint64(transitions)}
	}
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes: taking Lease %s: %w", obj, err)
	}
	return &kubernetesClaim{k: k, name: name, lease: updated}, nil
}

func (k *Kubernetes) create(ctx context.Context, name, obj, holder string) (Claim, error) {
	stamp := metav1.NewMicroTime(time.Now())
	one := int32(1)
	lease := &coordinationv1.Lease{
		ObjectMeta: metav1.ObjectMeta{Name: obj},
		Spec: coordinationv1.LeaseSpec{
			HolderIdentity:       &holder,
			LeaseDurationSeconds: &k.seconds,
			AcquireTime:          &stamp,
			RenewTime:            &stamp,
			LeaseTransitions:     &one,
		},
	}
	created, err := k.leases.Create(ctx, lease, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return nil, &HeldError{Name: name, Holder: "(another replica, just now)", Epoch: 1}
	}
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes: creating Lease %s: %w", obj, err)
	}
	return &kubernetesClaim{k: k, name: name, lease: created}, nil
}

// expired reports whether lease has stayed at the same version for its
// duration since this replica first saw that version.
func (k *Kubernetes) expired(obj string, lease *coordinationv1.Lease, now time.Time) bool {
	k.mu.Lock()
	defer k.mu.Unlock()
	s, ok := k.seen[obj]
	if !ok || s.resourceVersion != lease.ResourceVersion {
		k.seen[obj] = sighting{resourceVersion: lease.ResourceVersion, at: now}
		return false
	}
	d := time.Duration(k.seconds) * time.Second
	if lease.Spec.LeaseDurationSeconds != nil {
		d = max(d, time.Duration(*lease.Spec.LeaseDurationSeconds)*time.Second)
	}
	return now.Sub(s.at) >= d
}

func holderOf(l *coordinationv1.Lease) string {
	if l.Spec.HolderIdentity == nil {
		return ""
	}
	return *l.Spec.HolderIdentity
}

func epochOf(l *coordinationv1.Lease) uint64 {
	if l.Spec.LeaseTransitions == nil || *l.Spec.LeaseTransitions < 0 {
		return 0
	}
	return uint64(*l.Spec.LeaseTransitions)
}

// Holder implements Backend. It reports the holder the object names, even
// if that holder has stopped renewing.
func (k *Kubernetes) Holder(ctx context.Context, name string) (string, uint64, error) {
	obj, err := k.object(name)
	if err != nil {
		return "", 0, err
	}
	lease, err := k.leases.Get(ctx, obj, metav1.GetOptions{})
	if apierrors.IsNotFound(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("placement: kubernetes: reading Lease %s: %w", obj, err)
	}
	return holderOf(lease), epochOf(lease), nil
}

// Holders implements Backend. A Lease counts as live while its renewTime
// plus its duration lies ahead by this replica's wall clock: clock offsets
// between replicas can miscount a member for that long, which skews the
// fair share but never lets two replicas hold one lease.
//
// It also records a sighting of every Lease of the backend's prefix, not
// only of those prefix asks for, as TryAcquire would. The Placer lists
// the members every round, so a replica at its full share has watched the
// resources of a replica that dies from the start: once the dead
// replica's membership runs out and the survivors' share grows, its
// Leases have gone unrenewed as long, and are taken within a round rather
// than one more lease duration later, when TryAcquire would first see
// them.
func (k *Kubernetes) Holders(ctx context.Context, prefix string) (map[string]string, error) {
	list, err := k.leases.List(ctx, metav1.ListOptions{})
	if err != nil {
		return nil, fmt.Errorf("placement: kubernetes: listing Leases: %w", err)
	}
	now := time.Now()
	holders := make(map[string]string)
	listed := make(map[string]bool, len(list.Items))
	for i := range list.Items {
		l := &list.Items[i]
		listed[l.Name] = true
		if strings.HasPrefix(l.Name, k.prefix) && holderOf(l) != "" {
			k.expired(l.Name, l, now) // the sighting; TryAcquire decides
		}
		name, ok := strings.CutPrefix(l.Name, k.prefix+prefix)
		if !ok || holderOf(l) == "" || l.Spec.RenewTime == nil || l.Spec.LeaseDurationSeconds == nil {
			continue
		}
		if now.Before(l.Spec.RenewTime.Add(time.Duration(*l.Spec.LeaseDurationSeconds) * time.Second)) {
			holders[prefix+name] = holderOf(l)
		}
	}
	// Membership Leases are named after pods, which come and go: forget
	// the sightings of objects that are gone, so that the map holds no
	// more than the namespace does.
	k.mu.Lock()
	for obj := range k.seen {
		if !listed[obj] {
			delete(k.seen, obj)
		}
	}
	k.mu.Unlock()
	return holders, nil
}

type kubernetesClaim struct {
	k    *Kubernetes
	name string

	mu    sync.Mutex
	lease *coordinationv1.Lease // as last written by this claim
}

func (c *kubernetesClaim) Epoch() uint64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	return epochOf(c.lease)
}

// Renew writes a new renewTime over the version this claim wrote last: a
// conflict means somebody else wrote the Lease since, so it is lost, unless
// the Lease still names this holder at this epoch (stillMine).
func (c *kubernetesClaim) Renew(ctx context.Context) error {
	c.mu.Lock()
	next := c.lease.DeepCopy()
	c.mu.Unlock()
	stamp := metav1.NewMicroTime(time.Now())
	next.Spec.RenewTime = &stamp
	updated, err := c.k.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		if fresh, ok := c.stillMine(ctx); ok {
			next = fresh.DeepCopy()
			next.Spec.RenewTime = &stamp
			updated, err = c.k.leases.Update(ctx, next, metav1.UpdateOptions{})
		}
	}
	if apierrors.IsConflict(err) || apierrors.IsNotFound(err) {
		if c.k.labels != nil {
			// The Holding does not release a lost lease: the label goes now.
			c.k.labels.dropped(ctx, c.name)
		}
		return fmt.Errorf("placement: kubernetes: Lease %s was written by another: %w", next.Name, ErrLost)
	}
	if err != nil {
		return fmt.Errorf("placement: kubernetes: renewing Lease %s: %w", next.Name, err)
	}
	c.mu.Lock()
	c.lease = updated
	c.mu.Unlock()
	if c.k.labels != nil {
		c.k.labels.confirmed(c.name, stamp.Time)
	}
	return nil
}

// Release clears the holder, over the version this claim wrote last, so
// that another replica may take it without waiting; a conflict means it is
// not this claim's to release any more.
//
// The pod's label goes first (Release waits a second at most for it):
// between the two, no pod is routed to, which is what is true once the
// resource has stopped; the other order could route to two pods, the next
// holder's and this one, which serves nothing.
func (c *kubernetesClaim) Release(ctx context.Context) error {
	if c.k.labels != nil {
		c.k.labels.released(ctx, c.name)
	}
	c.mu.Lock()
	next := c.lease.DeepCopy()
	c.mu.Unlock()
	none := ""
	next.Spec.HolderIdentity = &none
	_, err := c.k.leases.Update(ctx, next, metav1.UpdateOptions{})
	if apierrors.IsConflict(err) {
		if fresh, ok := c.stillMine(ctx); ok {
			next = fresh.DeepCopy()
			next.Spec.HolderIdentity = &none
			_, err = c.k.leases.Update(ctx, next, metav1.UpdateOptions{})
		}
	}
	if err != nil && !apierrors.IsConflict(err) && !apierrors.IsNotFound(err) {
		return fmt.Errorf("placement: kubernetes: releasing Lease %s: %w", next.Name, err)
	}
	return nil
}

// stillMine re-reads the Lease after a conflict and returns it if it is
// still this claim's acquisition: the same holder and epoch, which every
// other acquisition increments. A conflict does not prove the lease lost:
// a write of this claim that the server applied but whose answer never
// arrived leaves the claim a version behind. That is what a real API
// server does when a renewal in flight is cancelled (Release cancels it)
// or its connection breaks: without this re-read, the release that follows
// conflicts and is dropped, and the lease stays taken until it expires
// (TestKubernetesAPIServer/Lease found it; TestKubernetesLostAnswer pins
// it on the fake). A read that fails counts as lost: stopping is safe.
func (c *kubernetesClaim) stillMine(ctx context.Context) (*coordinationv1.Lease, bool) {
	c.mu.Lock()
	holder, epoch, name := holderOf(c.lease), epochOf(c.lease), c.lease.Name
	c.mu.Unlock()
	fresh, err := c.k.leases.Get(ctx, name, metav1.GetOptions{})
	if err != nil || holderOf(fresh) != holder || epochOf(fresh) != epoch {
		return nil, false
	}
	return fresh, true
}
