package placement

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/fake"
	k8stesting "k8s.io/client-go/testing"
)

// These tests run the Kubernetes backend against client-go's fake
// clientset, in every run and in synctest bubbles; TestKubernetesAPIServer
// runs it against a real API server where one has been built (it takes
// minutes: scripts/kube-apiserver). The fake stores objects but
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

// TestKubernetesSightingsPruned: Holders records a sighting of every Lease
// it lists and forgets those of Leases that are gone (membership Leases
// are named after pods, which come and go).
func TestKubernetesSightingsPruned(t *testing.T) {
	ctx := context.Background()
	cs := casClientset()
	a, b := newKubernetesBackend(t, cs), newKubernetesBackend(t, cs)
	for _, name := range []string{"member.pod-1", "member.pod-2", "r0"} {
		if _, err := a.TryAcquire(ctx, name, "a"); err != nil {
			t.Fatal(err)
		}
	}
	sightings := func() int {
		b.mu.Lock()
		defer b.mu.Unlock()
		return len(b.seen)
	}
	if _, err := b.Holders(ctx, "member."); err != nil || sightings() != 3 {
		t.Fatalf("after listing three Leases: %d sightings (%v); want 3, the resource's included", sightings(), err)
	}
	if err := cs.CoordinationV1().Leases("weida").Delete(ctx, "weida-connector.member.pod-1", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	if _, err := b.Holders(ctx, "member."); err != nil || sightings() != 2 {
		t.Fatalf("after one Lease was deleted: %d sightings (%v); want 2", sightings(), err)
	}
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
		// renewTime is a lease duration old; by then they have seen its
		// resources' Leases unchanged as long (Holders records them every
		// round), so they take them over in the same round or the next.
		waitSpread(t, etcdTiming.LeaseDuration+2*etcdTiming.RetryPeriod, 6, rs[1:]...)
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
	if err != nil || d != DefaultTiming || d.Margin() != 1500*time.Millisecond {
		t.Fatalf("zero Timing = %+v, %v, margin %v; want DefaultTiming with a 1.5 s margin", d, err, d.Margin())
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

// labelsOf returns the holds.weida.dev labels of a pod of the fake (or of
// the real API server of kubernetes_apiserver_test.go).
func labelsOf(t *testing.T, cs kubernetes.Interface, pod string) map[string]string {
	t.Helper()
	p, err := cs.CoreV1().Pods("weida").Get(context.Background(), pod, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	held := make(map[string]string)
	for k, v := range p.Labels {
		if strings.HasPrefix(k, HoldsLabelPrefix) {
			held[k] = v
		}
	}
	return held
}

// takenByOther rewrites resource's Lease in namespace as another holder's
// (pod-c) and checks that the holding's next renewal finds it lost.
func takenByOther(ctx context.Context, t *testing.T, cs kubernetes.Interface, namespace, resource string, h Claim) {
	t.Helper()
	leases := cs.CoordinationV1().Leases(namespace)
	l, err := leases.Get(ctx, "weida-connector."+resourcePrefix+resource, metav1.GetOptions{})
	if err != nil {
		t.Fatal(err)
	}
	other := "pod-c"
	l.Spec.HolderIdentity = &other
	if _, err := leases.Update(ctx, l, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	if err := h.Renew(ctx); !errors.Is(err, ErrLost) {
		t.Fatalf("renewing a lease written by another: %v, want ErrLost", err)
	}
}

func wantLabels(t *testing.T, cs kubernetes.Interface, pod string, want ...string) {
	t.Helper()
	got := labelsOf(t, cs, pod)
	wantSet := make(map[string]string)
	for _, r := range want {
		wantSet[HoldsLabel(r)] = "true"
	}
	if !maps.Equal(got, wantSet) {
		t.Errorf("pod %s carries %v, want %v", pod, got, wantSet)
	}
}

// TestKubernetesPodLabels: a backend with LabelPod labels its pod with
// every resource lease it holds, only those, and takes the label off on
// release (before the release returns) and on loss; taking a lease takes
// the label off the pod of its previous holder; the first pass removes
// what an earlier run left; writes that fail are retried, an addition only
// once a renewal has confirmed the lease again; and label failures never
// fail a lease operation. It runs in a synctest bubble: synctest.Wait
// lets the reconciler finish its pass.
func TestKubernetesPodLabels(t *testing.T) {
	synctest.Test(t, testKubernetesPodLabels)
}

func testKubernetesPodLabels(t *testing.T) {
	ctx := context.Background()
	cs := casClientset()
	var podsDown atomic.Bool
	cs.PrependReactor("*", "pods", func(a k8stesting.Action) (bool, runtime.Object, error) {
		if podsDown.Load() && a.GetVerb() != "get" {
			return true, nil, apierrors.NewServiceUnavailable("the test refuses pod writes")
		}
		return false, nil, nil
	})
	pods := cs.CoreV1().Pods("weida")
	createPods(t, cs, map[string]map[string]string{
		// pod-a's container restarted: its pod kept the label of a lease
		// the previous run held.
		"pod-a": {"app.kubernetes.io/name": "weida-connector", HoldsLabel("old"): "true"},
		"pod-b": {"app.kubernetes.io/name": "weida-connector"},
	})
	a, b := newKubernetesBackend(t, cs), newKubernetesBackend(t, cs)
	a.LabelPod(pods, "pod-a", nil)
	defer a.Close()
	b.LabelPod(pods, "pod-b", nil)
	defer b.Close()

	// The first pass: the stale label goes, the pod's other labels stay.
	synctest.Wait()
	wantLabels(t, cs, "pod-a")
	if p, _ := pods.Get(ctx, "pod-a", metav1.GetOptions{}); p.Labels["app.kubernetes.io/name"] != "weida-connector" {
		t.Errorf("the sweep removed pod-a's own labels: %v", p.Labels)
	}

	// Membership is no resource: no label.
	member, err := a.TryAcquire(ctx, memberPrefix+"pod-a", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	defer member.Release(ctx)
	synctest.Wait()
	wantLabels(t, cs, "pod-a")

	// Acquire: labelled. Release: unlabelled when it returns.
	r1, err := a.TryAcquire(ctx, resourcePrefix+"r1", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-a", "r1")
	if err := r1.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-a", "r1")
	if err := r1.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, cs, "pod-a")

	// pod-b takes r1 while pod-a still carries its label (as the pod of a
	// holder whose node died would): only pod-b carries it afterwards.
	if _, err := pods.Patch(ctx, "pod-a", types.MergePatchType, []byte(`{"metadata":{"labels":{"`+HoldsLabel("r1")+`":"true"}}}`), metav1.PatchOptions{}); err != nil {
		t.Fatal(err)
	}
	r1b, err := b.TryAcquire(ctx, resourcePrefix+"r1", "pod-b")
	if err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-b", "r1")
	wantLabels(t, cs, "pod-a")

	// Lost: another replica wrote the Lease (as after this one was paused
	// past its lease); the renewal that finds out removes the label.
	r2, err := a.TryAcquire(ctx, resourcePrefix+"r2", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-a", "r2")
	takenByOther(ctx, t, cs, "weida", "r2", r2)
	synctest.Wait()
	wantLabels(t, cs, "pod-a")

	// The API server refuses pod writes: the lease operations still
	// succeed, and the labels catch up once it accepts them again, at the
	// next pass; the addition only once a renewal has confirmed the lease
	// again, as the acquisition is older than half a lease by then (the
	// test does not renew meanwhile, as a paused holder would not).
	podsDown.Store(true)
	r3, err := a.TryAcquire(ctx, resourcePrefix+"r3", "pod-a")
	if err != nil {
		t.Fatalf("acquiring while pod writes fail: %v", err)
	}
	if err := r1b.Release(ctx); err != nil {
		t.Fatalf("releasing while pod writes fail: %v", err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-a")
	wantLabels(t, cs, "pod-b", "r1") // not yet removed
	time.Sleep(etcdTiming.LeaseDuration / 2)
	podsDown.Store(false)
	time.Sleep(labelPeriod)
	synctest.Wait()
	wantLabels(t, cs, "pod-b")
	wantLabels(t, cs, "pod-a") // not confirmed recently enough
	if err := r3.Renew(ctx); err != nil {
		t.Fatal(err)
	}
	synctest.Wait()
	wantLabels(t, cs, "pod-a", "r3")
	if err := r3.Release(ctx); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, cs, "pod-a")
}

func createPods(t *testing.T, cs *fake.Clientset, pods map[string]map[string]string) {
	t.Helper()
	for name, labels := range pods {
		if _, err := cs.CoreV1().Pods("weida").Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "weida", Labels: labels}}, metav1.CreateOptions{}); err != nil {
			t.Fatal(err)
		}
	}
}

// TestKubernetesPodLabelsSlowPods: a pods API that does not answer (an
// admission webhook on pod PATCH that hangs) neither delays nor fails an
// acquisition, the renewals (the holding stays valid through many of
// them), the members' listing or a release; the label follows once the
// pods API answers. The pods live on a clientset of their own: the fake
// holds one lock while a reactor runs.
func TestKubernetesPodLabelsSlowPods(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs, podsCS := casClientset(), fake.NewClientset()
		createPods(t, podsCS, map[string]map[string]string{"pod-a": nil})
		hang := make(chan struct{})
		var hung atomic.Int32
		podsCS.PrependReactor("*", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			select {
			case <-hang:
			default:
				hung.Add(1)
				<-hang
			}
			return false, nil, nil
		})
		k := newKubernetesBackend(t, cs)
		k.LabelPod(podsCS.CoreV1().Pods("weida"), "pod-a", nil)
		defer k.Close()

		lease, err := NewLease(k, resourcePrefix+"r1", "pod-a", etcdTiming)
		if err != nil {
			t.Fatal(err)
		}
		h, err := lease.TryAcquire(context.Background())
		if err != nil {
			t.Fatalf("acquiring while the pods API hangs: %v", err)
		}
		time.Sleep(3 * etcdTiming.LeaseDuration) // thirty renewals
		if !h.Valid() {
			t.Fatalf("the holding ended while the pods API hung: %v", h.Err())
		}
		renewals := 0
		for _, a := range cs.Actions() {
			if a.GetVerb() == "update" && a.GetResource().Resource == "leases" {
				renewals++
			}
		}
		if renewals < 10 {
			t.Errorf("%d renewals in three lease durations, want one every retry period", renewals)
		}
		ctx, cancel := context.WithTimeout(context.Background(), etcdTiming.RetryPeriod)
		defer cancel()
		if _, err := k.Holders(ctx, memberPrefix); err != nil {
			t.Errorf("listing the members while the pods API hangs: %v", err)
		}
		if _, err := k.Holders(ctx, resourcePrefix); err != nil {
			t.Errorf("listing the resources while the pods API hangs: %v", err)
		}
		if hung.Load() == 0 {
			t.Fatal("the reconciler never called the pods API")
		}

		close(hang)
		time.Sleep(labelPeriod)
		synctest.Wait()
		wantLabels(t, podsCS, "pod-a", "r1")

		// A release while the pods API hangs again returns, and gives
		// the lease up.
		again := make(chan struct{})
		podsCS.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			<-again
			return false, nil, nil
		})
		h.Release()
		if holder, _, err := k.Holder(context.Background(), resourcePrefix+"r1"); err != nil || holder != "" {
			t.Errorf("after the release the lease is held by %q (%v), want nobody", holder, err)
		}
		close(again)
		synctest.Wait()
		wantLabels(t, podsCS, "pod-a")
	})
}

// TestKubernetesPodLabelsReconcile: a label set by hand (or applied late,
// after its write timed out) is corrected by the reconciler's periodic
// passes, on this pod and on others: a label on this pod for a lease it
// does not hold, a held lease's label missing from this pod, and a held
// lease's label on another pod.
func TestKubernetesPodLabelsReconcile(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		cs := casClientset()
		pods := cs.CoreV1().Pods("weida")
		createPods(t, cs, map[string]map[string]string{"pod-a": nil, "pod-b": nil})
		k := newKubernetesBackend(t, cs)
		k.LabelPod(pods, "pod-a", nil)
		defer k.Close()
		lease, err := NewLease(k, resourcePrefix+"r1", "pod-a", etcdTiming)
		if err != nil {
			t.Fatal(err)
		}
		h, err := lease.TryAcquire(ctx)
		if err != nil {
			t.Fatal(err)
		}
		defer h.Release()
		synctest.Wait()
		wantLabels(t, cs, "pod-a", "r1")

		set := func(pod, labels string) {
			t.Helper()
			if _, err := pods.Patch(ctx, pod, types.MergePatchType, []byte(`{"metadata":{"labels":`+labels+`}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		set("pod-a", `{"`+HoldsLabel("r9")+`":"true"}`)
		set("pod-b", `{"`+HoldsLabel("r1")+`":"true"}`)
		time.Sleep(labelPeriod)
		synctest.Wait()
		wantLabels(t, cs, "pod-a", "r1")
		time.Sleep(othersPeriod)
		synctest.Wait()
		wantLabels(t, cs, "pod-b")

		set("pod-a", `{"`+HoldsLabel("r1")+`":null}`)
		time.Sleep(labelPeriod)
		synctest.Wait()
		wantLabels(t, cs, "pod-a", "r1")
		if !h.Valid() {
			t.Fatalf("the holding ended: %v", h.Err())
		}
	})
}

// TestKubernetesPodLabelsOrder: taking a lease takes its label off the
// other pod before it labels its own, so that no moment routes to both.
// It runs in real time, waiting for the reconciler with flush as a test
// on a real API server would.
func TestKubernetesPodLabelsOrder(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	cs, podsCS := casClientset(), fake.NewClientset()
	createPods(t, podsCS, map[string]map[string]string{"pod-a": nil, "pod-b": {HoldsLabel("r1"): "true"}})
	k := newKubernetesBackend(t, cs)
	k.LabelPod(podsCS.CoreV1().Pods("weida"), "pod-a", nil)
	defer k.Close()
	if err := k.labels.flush(ctx); err != nil {
		t.Fatal(err)
	}
	podsCS.ClearActions()
	c, err := k.TryAcquire(ctx, resourcePrefix+"r1", "pod-a")
	if err != nil {
		t.Fatal(err)
	}
	defer c.Release(ctx)
	if err := k.labels.flush(ctx); err != nil {
		t.Fatal(err)
	}
	wantLabels(t, podsCS, "pod-a", "r1")
	wantLabels(t, podsCS, "pod-b")
	removed, added := -1, -1
	for i, a := range podsCS.Actions() {
		p, ok := a.(k8stesting.PatchAction)
		if !ok {
			continue
		}
		switch patch := string(p.GetPatch()); {
		case p.GetName() == "pod-b" && strings.Contains(patch, `"`+HoldsLabel("r1")+`":null`):
			removed = i
		case p.GetName() == "pod-a" && strings.Contains(patch, `"`+HoldsLabel("r1")+`":"true"`):
			added = i
		}
	}
	if removed < 0 || added < 0 || removed > added {
		t.Errorf("pod-b's label removed at action %d, pod-a's added at %d: want the removal first (%v)", removed, added, podsCS.Actions())
	}
}

// TestKubernetesPodLabelsUnconfirmed: a replica whose lease has not been
// confirmed for half a lease (one paused past its lease, whose label the
// next holder moved to its own pod) neither labels its pod again nor takes
// the label off the other pod; a renewal that confirms the lease again
// lets it do both.
func TestKubernetesPodLabelsUnconfirmed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		cs := casClientset()
		pods := cs.CoreV1().Pods("weida")
		createPods(t, cs, map[string]map[string]string{"pod-a": nil, "pod-b": nil})
		k := newKubernetesBackend(t, cs)
		k.LabelPod(pods, "pod-a", nil)
		defer k.Close()
		c, err := k.TryAcquire(ctx, resourcePrefix+"r1", "pod-a")
		if err != nil {
			t.Fatal(err)
		}
		defer c.Release(ctx)
		synctest.Wait()
		wantLabels(t, cs, "pod-a", "r1")

		time.Sleep(etcdTiming.LeaseDuration / 2) // no renewal meanwhile
		// What the next holder's reconciler does.
		for pod, labels := range map[string]string{"pod-a": `null`, "pod-b": `"true"`} {
			if _, err := pods.Patch(ctx, pod, types.MergePatchType, []byte(`{"metadata":{"labels":{"`+HoldsLabel("r1")+`":`+labels+`}}}`), metav1.PatchOptions{}); err != nil {
				t.Fatal(err)
			}
		}
		time.Sleep(othersPeriod + labelPeriod)
		synctest.Wait()
		wantLabels(t, cs, "pod-a")
		wantLabels(t, cs, "pod-b", "r1")

		// The renewal wakes the reconciler: the label is missing.
		if err := c.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		wantLabels(t, cs, "pod-a", "r1")
		wantLabels(t, cs, "pod-b")
	})
}

// TestKubernetesPodLabelsLog: a run of failed passes is warned about
// once, with the API server's reason, and with the RBAC hint only when the
// API server says forbidden; the end of the run is logged; a release that
// does not wait for its label has a message of its own.
func TestKubernetesPodLabelsLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		ctx := context.Background()
		cs := casClientset()
		var refusal atomic.Pointer[error]
		refuse := func(err error) { refusal.Store(&err) }
		cs.PrependReactor("patch", "pods", func(k8stesting.Action) (bool, runtime.Object, error) {
			if err := refusal.Load(); err != nil && *err != nil {
				return true, nil, *err
			}
			return false, nil, nil
		})
		createPods(t, cs, map[string]map[string]string{"pod-a": nil})
		var logs logLines
		k := newKubernetesBackend(t, cs)
		k.LabelPod(cs.CoreV1().Pods("weida"), "pod-a", slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelInfo})))
		defer k.Close()

		refuse(apierrors.NewForbidden(corev1.Resource("pods"), "pod-a", errors.New("the test forbids it")))
		c, err := k.TryAcquire(ctx, resourcePrefix+"r1", "pod-a")
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(3 * labelPeriod)
		synctest.Wait()
		if warns := logs.count("level=WARN"); warns != 1 || logs.count("the test forbids it") != 1 || logs.count("the Role must allow") != 1 {
			t.Errorf("three failed passes, forbidden: want one warning with the reason and the RBAC hint; logs:\n%s", logs.String())
		}

		refuse(nil)
		if err := c.Renew(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if logs.count("written again") != 1 {
			t.Errorf("want the end of the failures logged; logs:\n%s", logs.String())
		}

		refuse(apierrors.NewServiceUnavailable("the test refuses pod writes"))
		if err := c.Release(ctx); err != nil {
			t.Fatal(err)
		}
		synctest.Wait()
		if logs.count("level=WARN") != 2 || logs.count("the Role must allow") != 1 || logs.count("the test refuses pod writes") != 1 {
			t.Errorf("a failure that is not forbidden: want a warning without the RBAC hint; logs:\n%s", logs.String())
		}
		if logs.count("releasing a lease before its label is off") != 1 {
			t.Errorf("a release that did not wait for its label: want its own message; logs:\n%s", logs.String())
		}
	})
}

// logLines collects a handler's output.
type logLines struct {
	mu  sync.Mutex
	buf strings.Builder
}

func (l *logLines) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.Write(b)
}

func (l *logLines) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

func (l *logLines) count(s string) int { return strings.Count(l.String(), s) }

// TestKubernetesPodLabelsPlacement: three replicas of a Placer on one fake
// API server, each labelling its pod. Once spread, each resource's label
// is on exactly the pod of its holder; when a replica closes (SIGTERM),
// its pod carries no label at once and the survivors' pods carry them all.
func TestKubernetesPodLabelsPlacement(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cs := casClientset()
		pods := cs.CoreV1().Pods("weida")
		resources := resourceNames(6)
		rec := newRecorder(t)
		var rs []*replica
		for _, id := range []string{"a", "b", "c"} {
			if _, err := pods.Create(context.Background(), &corev1.Pod{ObjectMeta: metav1.ObjectMeta{Name: id, Namespace: "weida"}}, metav1.CreateOptions{}); err != nil {
				t.Fatal(err)
			}
			k := newKubernetesBackend(t, cs)
			k.LabelPod(pods, id, nil)
			t.Cleanup(k.Close) // after the replica's (cleanups run last first)
			rs = append(rs, startReplica(t, k, id, resources, etcdTiming, rec))
		}
		waitSpread(t, 10*time.Second, 6, rs...)
		synctest.Wait()
		checkLabelsFollow(t, cs, resources, rs...)

		rs[2].close()
		wantLabels(t, cs, rs[2].id)
		waitSpread(t, etcdTiming.LeaseDuration+etcdTiming.RetryPeriod, 6, rs[:2]...)
		synctest.Wait()
		checkLabelsFollow(t, cs, resources, rs[:2]...)
	})
}

// checkLabelsFollow checks that every resource's label is on the pod of
// the replica that holds it, and on no other.
func checkLabelsFollow(t *testing.T, cs kubernetes.Interface, resources []string, rs ...*replica) {
	t.Helper()
	for _, p := range labelsMisplaced(t, cs, resources, rs...) {
		t.Error(p)
	}
}

// labelsMisplaced says how the pods' labels differ from what
// checkLabelsFollow wants.
func labelsMisplaced(t *testing.T, cs kubernetes.Interface, resources []string, rs ...*replica) []string {
	t.Helper()
	var problems []string
	for _, r := range rs {
		want := make(map[string]string)
		for _, res := range r.p.Held() {
			want[HoldsLabel(res)] = "true"
		}
		if got := labelsOf(t, cs, r.id); !maps.Equal(got, want) {
			problems = append(problems, fmt.Sprintf("pod %s carries %v, want %v", r.id, got, want))
		}
	}
	list, err := cs.CoreV1().Pods("weida").List(context.Background(), metav1.ListOptions{})
	if err != nil {
		t.Fatal(err)
	}
	for _, res := range resources {
		n := 0
		for _, p := range list.Items {
			if p.Labels[HoldsLabel(res)] == "true" {
				n++
			}
		}
		if n != 1 {
			problems = append(problems, fmt.Sprintf("%d pods carry %s, want 1", n, HoldsLabel(res)))
		}
	}
	return problems
}
