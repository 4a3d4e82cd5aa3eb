package placement

import (
	"context"
	"errors"
	"strconv"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// The Kubernetes backend runs against client-go's fake clientset: no API
// server can be run on this machine's loopback. The fake stores objects but
// neither assigns resourceVersions nor rejects a stale update, which is the
// very thing the backend relies on, so casClientset adds a reactor that
// does both as the API server does: every create and update gets a new
// resourceVersion, and an update whose resourceVersion is not the stored
// one fails with 409 Conflict. TestKubernetesCompareAndSwap checks the
// reactor itself.
func casClientset() *fake.Clientset {
	cs := fake.NewClientset()
	version := 0
	next := func(obj runtime.Object) {
		version++ // reactors run under the fake's lock: no race
		obj.(metav1.Object).SetResourceVersion(strconv.Itoa(version))
	}
	cs.PrependReactor("create", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		next(a.(k8stesting.CreateAction).GetObject())
		return false, nil, nil // the tracker stores it
	})
	cs.PrependReactor("update", "leases", func(a k8stesting.Action) (bool, runtime.Object, error) {
		u := a.(k8stesting.UpdateAction)
		obj := u.GetObject().(metav1.Object)
		gvr := coordinationv1.SchemeGroupVersion.WithResource("leases")
		stored, err := cs.Tracker().Get(gvr, u.GetNamespace(), obj.GetName())
		if err != nil {
			return true, nil, err
		}
		if have := stored.(metav1.Object).GetResourceVersion(); obj.GetResourceVersion() != have {
			return true, nil, apierrors.NewConflict(gvr.GroupResource(), obj.GetName(),
				errStale{sent: obj.GetResourceVersion(), stored: have})
		}
		next(u.GetObject())
		return false, nil, nil
	})
	return cs
}

type errStale struct{ sent, stored string }

func (e errStale) Error() string {
	return "the object has been modified: resourceVersion " + e.sent + " is not the stored " + e.stored
}

func TestKubernetesCompareAndSwap(t *testing.T) {
	leases := casClientset().CoordinationV1().Leases("ns")
	ctx := context.Background()
	created, err := leases.Create(ctx, &coordinationv1.Lease{ObjectMeta: metav1.ObjectMeta{Name: "x"}}, metav1.CreateOptions{})
	if err != nil || created.ResourceVersion == "" {
		t.Fatalf("create: %v, resourceVersion %q", err, created.ResourceVersion)
	}
	first := created.DeepCopy()
	first.Labels = map[string]string{"by": "first"}
	updated, err := leases.Update(ctx, first, metav1.UpdateOptions{})
	if err != nil || updated.ResourceVersion == created.ResourceVersion {
		t.Fatalf("update from the current version: %v, resourceVersion %q -> %q", err, created.ResourceVersion, updated.ResourceVersion)
	}
	second := created.DeepCopy() // read before the first update
	second.Labels = map[string]string{"by": "second"}
	if _, err := leases.Update(ctx, second, metav1.UpdateOptions{}); !apierrors.IsConflict(err) {
		t.Fatalf("update from a stale version: %v; want a conflict", err)
	}
}

func newKubernetesBackend(t *testing.T, cs *fake.Clientset) *Kubernetes {
	t.Helper()
	b, err := NewKubernetes(cs.CoordinationV1().Leases("weida"), "weida-connector.", etcdTiming)
	if err != nil {
		t.Fatal(err)
	}
	return b
}

// TestKubernetesLease runs the lease contract with two replicas' backends
// (each with its own sightings) on one fake API server, in a synctest
// bubble so that the lease's seconds pass at once.
func TestKubernetesLease(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := casClientset()
		testLease(t, newKubernetesBackend(t, cs), newKubernetesBackend(t, cs))
	})
}

func TestKubernetesNames(t *testing.T) {
	b := newKubernetesBackend(t, casClientset())
	if _, err := b.TryAcquire(context.Background(), "Resource/One", "a"); err == nil {
		t.Fatal("a name that cannot name a Lease object was accepted")
	}
}

// TestKubernetesPlacement spreads six resources over three replicas,
// pauses one until its leases expire (it must be told to stop before the
// others take them over, and they get larger epochs), then closes one.
func TestKubernetesPlacement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := casClientset()
		resources := resourceNames(6)
		rec := newRecorder(t)
		var rs []*replica
		for _, id := range []string{"a", "b", "c"} {
			rs = append(rs, startReplica(t, newKubernetesBackend(t, cs), id, resources, etcdTiming, rec))
		}
		waitSpread(t, 10*time.Second, 6, rs...)
		quiet(t, rec, 2*etcdTiming.LeaseDuration)

		from := rec.mark()
		pausedAt := time.Now()
		rs[0].pause()
		// The others count the paused replica out once its membership's
		// renewTime is a lease duration old, and take a resource over once
		// they have seen its Lease unchanged for a lease duration.
		waitSpread(t, 2*etcdTiming.LeaseDuration+etcdTiming.RenewDeadline, 6, rs[1:]...)
		evs, _ := rec.since(from)
		checkFencedTakeover(t, evs, rs[0].id, pausedAt, etcdTiming, 0)
		rs[0].resume()
		waitSpread(t, 10*time.Second, 6, rs...)

		rs[2].close()
		waitSpread(t, etcdTiming.LeaseDuration+etcdTiming.RetryPeriod, 6, rs[:2]...)
	})
}

// TestKubernetesOutage makes the API server refuse every Lease request:
// every holder must stop within the renew deadline, nobody may start
// anything meanwhile, and they hold everything again once it answers.
func TestKubernetesOutage(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := casClientset()
		var down atomic.Bool
		cs.PrependReactor("*", "leases", func(k8stesting.Action) (bool, runtime.Object, error) {
			if down.Load() {
				return true, nil, apierrors.NewServiceUnavailable("the test took the API server down")
			}
			return false, nil, nil
		})
		resources := resourceNames(6)
		rec := newRecorder(t)
		var rs []*replica
		for _, id := range []string{"a", "b", "c"} {
			rs = append(rs, startReplica(t, newKubernetesBackend(t, cs), id, resources, etcdTiming, rec))
		}
		waitSpread(t, 10*time.Second, 6, rs...)

		from := rec.mark()
		downAt := time.Now()
		down.Store(true)
		time.Sleep(etcdTiming.LeaseDuration)
		evs, _ := rec.since(from)
		stops := 0
		for _, e := range evs {
			switch {
			case e.start:
				t.Errorf("%s started %s while the API server was down", e.replica, e.resource)
			case !errors.Is(e.reason, ErrRenewDeadline):
				t.Errorf("%s stopped %s because %v; want the renew deadline", e.replica, e.resource, e.reason)
			case e.at.Sub(downAt) > etcdTiming.RenewDeadline:
				t.Errorf("%s stopped %s %v after the outage began; want within %v", e.replica, e.resource, e.at.Sub(downAt), etcdTiming.RenewDeadline)
			default:
				stops++
			}
		}
		if stops != 6 {
			t.Fatalf("%d of 6 holdings stopped during the outage: %v", stops, describe(evs))
		}
		down.Store(false)
		waitSpread(t, 3*etcdTiming.LeaseDuration, 6, rs...)
	})
}

func TestTiming(t *testing.T) {
	d, err := Timing{}.withDefaults()
	if err != nil || d != DefaultTiming || d.Margin() != 2*time.Second {
		t.Fatalf("zero Timing = %+v, %v, margin %v; want DefaultTiming with a 2 s margin", d, err, d.Margin())
	}
	for _, bad := range []Timing{
		{LeaseDuration: 3 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: time.Second},
		{LeaseDuration: 5 * time.Second, RenewDeadline: time.Second, RetryPeriod: time.Second},
		{RetryPeriod: -time.Second},
	} {
		if _, err := bad.withDefaults(); err == nil {
			t.Errorf("%+v was accepted; want 0 < retry < renew deadline < lease", bad)
		}
	}
	if s := wholeSeconds(2100 * time.Millisecond); s != 3 {
		t.Errorf("2.1 s rounds to %d whole seconds; want 3 (never shorter)", s)
	}
}
