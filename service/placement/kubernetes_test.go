package placement

import (
	"context"
	"strconv"
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
