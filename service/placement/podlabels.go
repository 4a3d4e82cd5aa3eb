package placement

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/validation"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

// HoldsLabelPrefix starts the label a replica's pod carries for every
// resource whose lease it holds: holds.weida.dev/<resource>=true. The
// resource name is the label's name part whole, which fits because a
// resource's metadata.name is a DNS label (at most 63 characters, the
// limit of a label name); a key such as weida.dev/holds.<resource> would
// not fit names over 57 characters. A Service per endpoint selects its
// resource's label, so it reaches the holder's pod only.
const HoldsLabelPrefix = "holds.weida.dev/"

// HoldsLabel returns the label key of resource's holder.
func HoldsLabel(resource string) string { return HoldsLabelPrefix + resource }

// podLabels keeps one pod's holds.weida.dev labels equal to the resource
// leases its Kubernetes backend holds, so that the per-endpoint Services
// follow the leases.
//
// Every pod write is made by one goroutine, the reconciler, never inside a
// lease operation: an acquisition, a renewal or a release only records
// what is wanted and wakes it. A lease's deadline counts from when its
// acquisition or renewal was sent, so a label write inside one (a slow
// pods API, an admission webhook on pod PATCH) would eat the renewal's
// tolerance and could fence a healthy holder: routing follows the leases
// and must never cost one.
//
// On every wake-up, and at least every labelPeriod, the reconciler reads
// its pod and makes its holds.weida.dev labels equal to what is wanted, in
// both directions: that removes the labels an earlier run of this pod left
// (a restarted container keeps its pod and its labels), a label set by
// hand, and one the API server applied late, after the write had timed
// out. Before it labels its pod with a key it takes the key off every
// other pod (a holder that died with its node, whose pod the API server
// keeps for minutes): the other order would route to two pods at once,
// and the new holder may not be listening yet anyway. It checks the other
// pods again every othersPeriod for every key held, for a label that
// another pod kept or was given by hand.
//
// A label is added only while the API server confirmed the lease less
// than half a lease duration ago (by an acquisition or a renewal), so that
// a replica which has lost a lease without knowing it yet (one paused past
// its lease, whose label the next holder removed) never labels itself
// anew. A label is removed before the lease is released (the release
// waits up to releaseWait for it) and as soon as a renewal finds the lease
// lost.
//
// Label errors never fail a lease operation: they are logged, and the
// reconciler tries again at its next pass.
type podLabels struct {
	pods  corev1client.PodInterface
	pod   string
	log   *slog.Logger
	fresh time.Duration // how long after a confirmation of a lease its label may be added

	kick   chan struct{} // wakes the reconciler; one slot, so wake-ups coalesce
	ctx    context.Context
	cancel context.CancelFunc // ends ctx: Close
	done   chan struct{}      // closed when the reconciler has returned

	mu sync.Mutex
	// want holds the keys of the leases confirmed to this replica, with
	// the time the last confirmation was sent: a key is absent once its
	// lease is released or lost.
	want map[string]time.Time
	// carries holds the keys this pod may carry: those the last read of
	// the pod showed, and those whose addition was sent, whether or not
	// it succeeded (a write that timed out may still be applied).
	carries map[string]bool
	changed chan struct{} // closed and replaced whenever carries shrinks or a pass ends
	failed  bool          // the last pass failed (warned once per run of failures)
	// begun and ended count the passes, and last is the error of the
	// last one to end, for flush.
	begun, ended uint64
	last         error
}

const (
	// labelPeriod bounds the time for which a label stays wrong: a
	// label set by hand, applied late, or left by a write that failed.
	// Each pass reads one pod: cheap for the API server.
	labelPeriod = 2 * time.Second
	// othersPeriod is how often the reconciler lists, for every key it
	// holds, the other pods that carry it: one List per resource held,
	// so less often than labelPeriod. A key newly wanted is checked at
	// once.
	othersPeriod = 10 * time.Second
	// labelTimeout bounds every call to the pods API.
	labelTimeout = 2 * time.Second
	// releaseWait is how long a release waits for the reconciler to
	// have removed the label from this pod, so that the Service stops
	// selecting it before the lease goes to the next holder, whose pod
	// is labelled soon after: the other order routes to two pods, one of
	// which serves nothing. It delays the hand-over of a released lease
	// only when the pods API is slow or down, and by one second at most,
	// well within a lease duration; a label removed later still goes at
	// the next pass, and the next holder takes it off too.
	releaseWait = time.Second
)

// newPodLabels starts the reconciler of pod's labels; Close stops it.
// Labels are added only within half of leaseDuration of a confirmation.
func newPodLabels(pods corev1client.PodInterface, pod string, leaseDuration time.Duration, log *slog.Logger) *podLabels {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancel(context.Background())
	p := &podLabels{
		pods: pods, pod: pod, log: log, fresh: leaseDuration / 2,
		kick: make(chan struct{}, 1), ctx: ctx, cancel: cancel, done: make(chan struct{}),
		want: make(map[string]time.Time), carries: make(map[string]bool), changed: make(chan struct{}),
	}
	go p.run()
	return p
}

// Close stops the reconciler and waits for it to return. Labels are left
// as they are: the releases before it removed them.
func (p *podLabels) Close() {
	p.cancel()
	<-p.done
}

// labelKey returns the label of a lease name, or "" for leases that are not a
// resource's (the Placer's membership).
func labelKey(lease string) (string, error) {
	r, ok := strings.CutPrefix(lease, resourcePrefix)
	if !ok {
		return "", nil
	}
	key := HoldsLabel(r)
	if errs := validation.IsQualifiedName(key); len(errs) > 0 {
		return "", fmt.Errorf("placement: kubernetes: resource %q cannot name the pod label %s (%s): use a resource name of at most 63 lowercase letters, digits and '-'", r, key, strings.Join(errs, "; "))
	}
	return key, nil
}

// held records that the API server confirmed the acquisition of the lease
// called name, sent at sent.
func (p *podLabels) held(name string, sent time.Time) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.mu.Lock()
	p.want[key] = sent
	p.mu.Unlock()
	p.wake()
}

// confirmed records a renewal of the lease called name, sent at sent. It
// wakes the reconciler only when the label is missing (an addition that
// failed, or one the lease was too stale for).
func (p *podLabels) confirmed(name string, sent time.Time) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.mu.Lock()
	_, wanted := p.want[key]
	if wanted {
		p.want[key] = sent
	}
	missing := wanted && !p.carries[key]
	p.mu.Unlock()
	if missing {
		p.wake()
	}
}

// dropped records that the lease called name is no longer this replica's,
// and wakes the reconciler to remove the label; it does not wait.
func (p *podLabels) dropped(_ context.Context, name string) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.drop(key)
}

// released is dropped for a lease about to be released: it waits, up to
// releaseWait or until ctx ends, for the label to be off this pod.
func (p *podLabels) released(ctx context.Context, name string) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.drop(key)
	timer := time.NewTimer(releaseWait)
	defer timer.Stop()
	for {
		p.mu.Lock()
		gone, changed := !p.carries[key], p.changed
		p.mu.Unlock()
		if gone {
			return
		}
		select {
		case <-changed:
			continue
		case <-timer.C:
		case <-ctx.Done():
		case <-p.done:
		}
		// Not an API error (the reconciler reports those): a slow pods
		// API may route to this pod a little after the release.
		p.log.Info("placement: kubernetes: releasing a lease before its label is off this pod: the pods API is slow or failing", "pod", p.pod, "label", key)
		return
	}
}

// flush waits for a pass that begins after it is called and returns the
// error of the last pass to end: for tests on a real API server, which
// cannot wait for the reconciler as synctest.Wait does.
func (p *podLabels) flush(ctx context.Context) error {
	p.mu.Lock()
	target := p.begun + 1
	p.mu.Unlock()
	p.wake()
	for {
		p.mu.Lock()
		ended, err, changed := p.ended >= target, p.last, p.changed
		p.mu.Unlock()
		if ended {
			return err
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-p.done:
			return errors.New("placement: kubernetes: the pod's labels are no longer written (closed)")
		}
	}
}

func (p *podLabels) drop(key string) {
	p.mu.Lock()
	delete(p.want, key)
	p.mu.Unlock()
	p.wake()
}

func (p *podLabels) wake() {
	select {
	case p.kick <- struct{}{}:
	default:
	}
}

// run is the reconciler: a pass on every wake-up and every labelPeriod.
func (p *podLabels) run() {
	defer close(p.done)
	tick := time.NewTicker(labelPeriod)
	defer tick.Stop()
	var others time.Time // the last pass that checked the other pods for every key
	for {
		all := others.IsZero() || time.Since(others) >= othersPeriod
		p.mu.Lock()
		p.begun++
		p.mu.Unlock()
		err := p.pass(all)
		if all && err == nil {
			others = time.Now()
		}
		p.mu.Lock()
		p.ended, p.last = p.begun, err
		p.notify()
		p.mu.Unlock()
		p.report(err)
		select {
		case <-p.ctx.Done():
			return
		case <-p.kick:
		case <-tick.C:
		}
	}
}

// pass makes this pod's labels equal to what is wanted: it removes the
// unwanted ones from this pod first (a release waits for that), then, for
// every key this pod lacks (every key held, when all is set), takes the
// label off the other pods, and only then labels this pod.
func (p *podLabels) pass(all bool) error {
	pod, err := call(p.ctx, func(ctx context.Context) (*corev1.Pod, error) { return p.pods.Get(ctx, p.pod, metav1.GetOptions{}) })
	if err != nil {
		return fmt.Errorf("reading pod %s: %w", p.pod, err)
	}
	p.mu.Lock()
	stale := make(map[string]any)
	unknown := 0 // stale labels this reconciler did not add: an earlier run's, or set by hand, or applied late
	carries := make(map[string]bool)
	for k, v := range pod.Labels {
		if !strings.HasPrefix(k, HoldsLabelPrefix) {
			continue
		}
		if _, ok := p.want[k]; !ok {
			stale[k] = nil
			if !p.carries[k] {
				unknown++
			}
		}
		p.carries[k] = true
		if v == "true" {
			carries[k] = true
		}
	}
	for k := range p.carries {
		if _, ok := pod.Labels[k]; !ok {
			delete(p.carries, k)
		}
	}
	p.notify()
	// Other pods are touched only for a lease confirmed recently: a
	// replica that was paused past its lease must not take the label off
	// the pod of the holder that took it over meanwhile.
	var check []string
	now := time.Now()
	for k, sent := range p.want {
		if (all || !carries[k]) && now.Sub(sent) < p.fresh {
			check = append(check, k)
		}
	}
	p.mu.Unlock()
	slices.Sort(check)

	var errs []error
	p.mu.Lock()
	for k := range stale {
		if _, ok := p.want[k]; ok {
			delete(stale, k) // acquired since the read
		}
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		if err := p.patch(p.pod, stale); err != nil {
			errs = append(errs, err)
		} else {
			p.mu.Lock()
			for k := range stale {
				delete(p.carries, k)
			}
			p.notify()
			p.mu.Unlock()
			if unknown > 0 {
				p.log.Info("placement: kubernetes: removed holder labels of leases this replica does not hold (left by an earlier run of this pod, set by hand, or applied late)", "pod", p.pod, "labels", unknown)
			}
		}
	}
	cleared := make(map[string]bool)
	for _, k := range check {
		if err := p.clearOthers(k); err != nil {
			errs = append(errs, err)
			continue
		}
		cleared[k] = true
	}
	// Label this pod with the wanted keys it lacks whose other pods this
	// pass cleared, if the lease was confirmed recently enough: what is wanted
	// is read again here, so that a lease dropped meanwhile is not
	// labelled. An addition sent just before the drop may land after it;
	// the next pass, which the drop has already asked for, removes it.
	p.mu.Lock()
	add := make(map[string]any)
	now = time.Now()
	for k, sent := range p.want {
		if !carries[k] && cleared[k] && now.Sub(sent) < p.fresh {
			add[k] = "true"
			p.carries[k] = true
		}
	}
	p.mu.Unlock()
	if len(add) > 0 {
		if err := p.patch(p.pod, add); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// clearOthers takes key off every pod but this one.
func (p *podLabels) clearOthers(key string) error {
	others, err := call(p.ctx, func(ctx context.Context) (*corev1.PodList, error) {
		return p.pods.List(ctx, metav1.ListOptions{LabelSelector: key})
	})
	if err != nil {
		return fmt.Errorf("listing the pods labelled %s: %w", key, err)
	}
	for _, o := range others.Items {
		if o.Name == p.pod {
			continue
		}
		if err := p.patch(o.Name, map[string]any{key: nil}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		p.log.Info("placement: kubernetes: took the holder label off another pod: this replica holds the lease", "label", key, "pod", o.Name)
	}
	return nil
}

// notify wakes the releases waiting for carries to shrink. Call with mu held.
func (p *podLabels) notify() {
	close(p.changed)
	p.changed = make(chan struct{})
}

// call makes one call to the pods API, bounded by labelTimeout.
func call[T any](ctx context.Context, f func(context.Context) (T, error)) (T, error) {
	ctx, cancel := context.WithTimeout(ctx, labelTimeout)
	defer cancel()
	return f(ctx)
}

// patch merges labels into pod's (a nil value removes one).
func (p *podLabels) patch(pod string, labels map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if _, err := call(p.ctx, func(ctx context.Context) (*corev1.Pod, error) {
		return p.pods.Patch(ctx, pod, types.MergePatchType, body, metav1.PatchOptions{})
	}); err != nil {
		return fmt.Errorf("labelling pod %s: %w", pod, err)
	}
	return nil
}

// report logs the outcome of a pass: a failure at Warn for the first of a
// run of failures, then at Debug, as the next pass retries; the end of a
// run at Info.
func (p *podLabels) report(err error) {
	p.mu.Lock()
	first, recovered := err != nil && !p.failed, err == nil && p.failed
	p.failed = err != nil
	p.mu.Unlock()
	switch {
	case recovered:
		p.log.Info("placement: kubernetes: the pod's holder labels are written again", "pod", p.pod)
	case err == nil:
	case p.ctx.Err() != nil:
		// Closing: the calls in flight were cancelled.
	default:
		level := slog.LevelDebug
		if first {
			level = slog.LevelWarn
		}
		msg := "placement: kubernetes: the pod's holder labels could not be written; the per-endpoint Services may reach the wrong pod until a retry succeeds"
		if apierrors.IsForbidden(err) {
			msg += " (the Role must allow get, list and patch on pods)"
		}
		p.log.Log(context.Background(), level, msg, "pod", p.pod, "err", err.Error())
	}
}
