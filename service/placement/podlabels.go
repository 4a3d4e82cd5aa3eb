package placement

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

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
// A label is added only just after the API server has confirmed the lease
// (an acquisition, or a renewal when the first write failed), so that a
// replica which has lost a lease without knowing it yet never labels
// itself anew; adding it also removes the label from any other pod that
// still carries it (a holder that died with its node, whose pod the API
// server keeps for minutes). A label is removed before the lease is
// released, and when a renewal finds the lease lost; a removal that
// fails is retried at every later call of the backend until it succeeds.
// The first call also removes the labels an earlier run of this pod left
// (a restarted container keeps its pod and its labels).
//
// Label errors never fail a lease operation: routing follows the leases,
// never the other way round.
type podLabels struct {
	pods corev1client.PodInterface
	pod  string
	log  *slog.Logger

	// write serialises the writes to pods, so that the sweep of stale
	// labels cannot remove one that an acquisition adds meanwhile: a
	// one-slot semaphore rather than a mutex, so that a lease operation
	// waiting behind a slow write gives up with its context. Taken before
	// mu.
	write chan struct{}

	mu     sync.Mutex
	want   map[string]bool // label key → whether this pod should carry it
	dirty  map[string]bool // label keys whose last write has not succeeded
	swept  bool            // the labels of earlier runs are gone
	failed bool            // the last write failed (warned once per run of failures)
}

func newPodLabels(pods corev1client.PodInterface, pod string, log *slog.Logger) *podLabels {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &podLabels{pods: pods, pod: pod, log: log, write: make(chan struct{}, 1), want: make(map[string]bool), dirty: make(map[string]bool)}
}

// lock takes the write semaphore, or reports false once ctx has ended.
func (p *podLabels) lock(ctx context.Context) bool {
	select {
	case p.write <- struct{}{}:
		return true
	case <-ctx.Done():
		p.report(fmt.Errorf("waiting for another label write: %w", context.Cause(ctx)))
		return false
	}
}

func (p *podLabels) unlock() { <-p.write }

// budget bounds a label write made inside a lease operation to half the
// time its context has left, so that a slow API server delays the
// operation by at most that much: an acquisition or a renewal that comes
// back after the renew deadline counts for nothing, and a slow label must
// not cost the lease.
func budget(ctx context.Context) (context.Context, context.CancelFunc) {
	d, ok := ctx.Deadline()
	if !ok {
		return context.WithCancel(ctx)
	}
	return context.WithDeadline(ctx, time.Now().Add(time.Until(d)/2))
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

// held records that the lease called name was confirmed to this replica
// just now, and labels the pod.
func (p *podLabels) held(ctx context.Context, name string) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.mu.Lock()
	p.want[key], p.dirty[key] = true, true
	p.mu.Unlock()
	ctx, cancel := budget(ctx)
	defer cancel()
	p.sync(ctx, key, true)
}

// confirmed is held for a renewal: it writes only when an earlier write
// for name has failed.
func (p *podLabels) confirmed(ctx context.Context, name string) {
	key, _ := labelKey(name)
	p.mu.Lock()
	again := key != "" && p.want[key] && p.dirty[key]
	p.mu.Unlock()
	if again {
		ctx, cancel := budget(ctx)
		defer cancel()
		p.sync(ctx, key, true)
	}
}

// dropped records that the lease called name is no longer this replica's
// (or is about to be released) and removes the label.
func (p *podLabels) dropped(ctx context.Context, name string) {
	key, _ := labelKey(name)
	if key == "" {
		return
	}
	p.mu.Lock()
	p.want[key], p.dirty[key] = false, true
	p.mu.Unlock()
	ctx, cancel := budget(ctx)
	defer cancel()
	p.sync(ctx, key, false)
}

// retry sweeps the labels of earlier runs once, and retries the removals
// that failed. Additions are retried only by confirmed, on proof that the
// lease is still held.
func (p *podLabels) retry(ctx context.Context) {
	p.mu.Lock()
	var keys []string
	for k, d := range p.dirty {
		if d && !p.want[k] {
			keys = append(keys, k)
		}
	}
	swept := p.swept
	p.mu.Unlock()
	if !swept {
		p.sweep(ctx)
	}
	for _, k := range keys {
		p.sync(ctx, k, false)
	}
}

// sweep removes every holds.weida.dev label of this pod that no lease held
// now accounts for.
func (p *podLabels) sweep(ctx context.Context) {
	if !p.lock(ctx) {
		return
	}
	defer p.unlock()
	pod, err := p.pods.Get(ctx, p.pod, metav1.GetOptions{})
	if err != nil {
		p.report(fmt.Errorf("reading pod %s: %w", p.pod, err))
		return
	}
	p.mu.Lock()
	stale := make(map[string]any)
	for k := range pod.Labels {
		if strings.HasPrefix(k, HoldsLabelPrefix) && !p.want[k] {
			stale[k] = nil
		}
	}
	p.mu.Unlock()
	if len(stale) > 0 {
		if err := p.patch(ctx, p.pod, stale); err != nil {
			p.report(err)
			return
		}
		p.log.Info("removed the holder labels an earlier run of this pod left", "pod", p.pod, "labels", len(stale))
	}
	p.mu.Lock()
	p.swept = true
	p.mu.Unlock()
}

// sync writes key as wanted: on, it labels this pod and takes the label off
// every other pod; off, it removes it from this pod.
func (p *podLabels) sync(ctx context.Context, key string, on bool) {
	if !p.lock(ctx) {
		return
	}
	defer p.unlock()
	p.mu.Lock()
	current := p.want[key] == on && p.dirty[key]
	p.mu.Unlock()
	if !current {
		return // a later call changed what is wanted, or wrote it already
	}
	var err error
	if on {
		err = p.label(ctx, key)
	} else {
		err = p.patch(ctx, p.pod, map[string]any{key: nil})
	}
	if err != nil {
		p.report(err)
		return
	}
	p.mu.Lock()
	if p.want[key] == on {
		delete(p.dirty, key)
		if !on {
			delete(p.want, key)
		}
	}
	if p.failed {
		p.log.Info("pod holder labels written again", "pod", p.pod)
	}
	p.failed = false
	p.mu.Unlock()
}

// label puts key on this pod and takes it off any other.
func (p *podLabels) label(ctx context.Context, key string) error {
	if err := p.patch(ctx, p.pod, map[string]any{key: "true"}); err != nil {
		return err
	}
	others, err := p.pods.List(ctx, metav1.ListOptions{LabelSelector: key + "=true"})
	if err != nil {
		return fmt.Errorf("listing the pods labelled %s: %w", key, err)
	}
	for _, o := range others.Items {
		if o.Name == p.pod {
			continue
		}
		if err := p.patch(ctx, o.Name, map[string]any{key: nil}); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
		p.log.Info("took the holder label off the pod of the lease's previous holder", "label", key, "pod", o.Name)
	}
	return nil
}

// patch merges labels into pod's (a nil value removes one).
func (p *podLabels) patch(ctx context.Context, pod string, labels map[string]any) error {
	body, err := json.Marshal(map[string]any{"metadata": map[string]any{"labels": labels}})
	if err != nil {
		return err
	}
	if _, err := p.pods.Patch(ctx, pod, types.MergePatchType, body, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("labelling pod %s: %w", pod, err)
	}
	return nil
}

// report logs a failed write: at Warn for the first of a run of failures,
// then at Debug, as it is retried every retry period.
func (p *podLabels) report(err error) {
	p.mu.Lock()
	first := !p.failed
	p.failed = true
	p.mu.Unlock()
	level := slog.LevelDebug
	if first {
		level = slog.LevelWarn
	}
	p.log.Log(context.Background(), level, "placement: kubernetes: the pod's holder labels could not be written; the per-endpoint Services may reach the wrong pod until a retry succeeds (the Role must allow get, list and patch on pods)",
		"pod", p.pod, "err", err.Error())
}
