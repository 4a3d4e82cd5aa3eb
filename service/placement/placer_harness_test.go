package placement

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"
	"time"
)

// event is one OnStart or OnStop a replica reported.
type event struct {
	at       time.Time
	replica  string
	resource string
	start    bool
	epoch    uint64
	reason   error
}

// recorder collects every replica's events and checks, at each start, the
// invariant placement exists for: no other replica still holds the resource
// (has started it and not yet been told to stop).
type recorder struct {
	t    testing.TB
	mu   sync.Mutex
	log  []event
	open map[string]event // by resource: the holding started and not stopped
}

func newRecorder(t testing.TB) *recorder {
	return &recorder{t: t, open: make(map[string]event)}
}

func (r *recorder) started(replica string, a Assignment) {
	r.mu.Lock()
	defer r.mu.Unlock()
	e := event{at: time.Now(), replica: replica, resource: a.Resource, start: true, epoch: a.Epoch}
	if prev, ok := r.open[a.Resource]; ok {
		r.t.Errorf("split brain: %s started %s (epoch %d) while %s still held it (epoch %d)", replica, a.Resource, a.Epoch, prev.replica, prev.epoch)
	}
	r.open[a.Resource] = e
	r.log = append(r.log, e)
}

func (r *recorder) stopped(replica, resource string, epoch uint64, reason error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if prev, ok := r.open[resource]; ok && prev.replica == replica && prev.epoch == epoch {
		delete(r.open, resource)
	} else {
		r.t.Errorf("%s stopped %s (epoch %d) that it was not recorded holding", replica, resource, epoch)
	}
	r.log = append(r.log, event{at: time.Now(), replica: replica, resource: resource, epoch: epoch, reason: reason})
}

// since returns the events from index i on, and the index after them.
func (r *recorder) since(i int) ([]event, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.log[i:]), len(r.log)
}

func (r *recorder) mark() int {
	_, n := r.since(0)
	return n
}

// replica is one Placer running as a replica would, in this process.
type replica struct {
	id     string
	p      *Placer
	cancel context.CancelFunc
	done   chan struct{}
}

func startReplica(t testing.TB, b Backend, id string, resources []string, timing Timing, rec *recorder) *replica {
	t.Helper()
	p, err := NewPlacer(Config{
		Backend: b, Identity: id, Resources: resources, Timing: timing,
		OnStart: func(a Assignment) { rec.started(id, a) },
		OnStop:  func(r string, epoch uint64, reason error) { rec.stopped(id, r, epoch, reason) },
	})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	r := &replica{id: id, p: p, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(r.done)
		_ = p.Run(ctx)
	}()
	t.Cleanup(r.close)
	return r
}

// close ends the replica as SIGTERM would: it releases what it holds.
func (r *replica) close() {
	r.cancel()
	<-r.done
}

// pause blocks the replica's rounds and renewals until resume, as a
// process stopped with SIGSTOP would (except that its watchdogs still run,
// which is the point: it learns it must stop while it cannot renew).
func (r *replica) pause() {
	g := make(chan struct{})
	r.p.gate.Store(&g)
}

func (r *replica) resume() {
	if g := r.p.gate.Swap(nil); g != nil {
		close(*g)
	}
}

func resourceNames(n int) []string {
	var names []string
	for i := range n {
		names = append(names, fmt.Sprintf("r%d", i))
	}
	return names
}

// holdings returns who holds what, by replica, and fails the test if two
// replicas hold one resource.
func holdings(t testing.TB, rs ...*replica) map[string][]string {
	t.Helper()
	by := make(map[string][]string)
	owner := make(map[string]string)
	for _, r := range rs {
		for _, res := range r.p.Held() {
			if o, ok := owner[res]; ok {
				t.Errorf("%s is held by both %s and %s", res, o, r.id)
			}
			owner[res] = r.id
			by[r.id] = append(by[r.id], res)
		}
	}
	return by
}

// waitSpread waits until the replicas hold all n resources, each at most
// ceil(n / len(rs)) of them, and returns how long that took.
func waitSpread(t testing.TB, within time.Duration, n int, rs ...*replica) time.Duration {
	t.Helper()
	share := (n + len(rs) - 1) / len(rs)
	begin := time.Now()
	for {
		by := holdings(t, rs...)
		total, fair := 0, true
		for _, r := range rs {
			total += len(by[r.id])
			fair = fair && len(by[r.id]) <= share
		}
		if total == n && fair {
			return time.Since(begin)
		}
		if time.Since(begin) > within {
			t.Fatalf("after %v the replicas hold %v; want all %d resources, at most %d each", within, by, n, share)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// quiet fails the test if any event is recorded during d.
func quiet(t testing.TB, rec *recorder, d time.Duration) {
	t.Helper()
	from := rec.mark()
	time.Sleep(d)
	if evs, _ := rec.since(from); len(evs) > 0 {
		t.Fatalf("holdings moved while they should not: %v", describe(evs))
	}
}

func describe(evs []event) []string {
	var out []string
	for _, e := range evs {
		if e.start {
			out = append(out, fmt.Sprintf("%s start %s epoch %d", e.replica, e.resource, e.epoch))
		} else {
			out = append(out, fmt.Sprintf("%s stop %s epoch %d: %v", e.replica, e.resource, e.epoch, e.reason))
		}
	}
	return out
}

// checkFencedTakeover checks, for every resource the paused replica held,
// that it was told to stop (ErrRenewDeadline) before another replica
// started it, with a larger epoch, and within the renew deadline of the
// pause.
func checkFencedTakeover(t testing.TB, evs []event, paused string, pausedAt time.Time, timing Timing, slack time.Duration) {
	t.Helper()
	stops := make(map[string]event)
	for _, e := range evs {
		if !e.start && e.replica == paused {
			stops[e.resource] = e
		}
	}
	if len(stops) == 0 {
		t.Fatalf("the paused replica %s was never told to stop: %v", paused, describe(evs))
	}
	for _, res := range slices.Sorted(maps.Keys(stops)) {
		stop := stops[res]
		if !errors.Is(stop.reason, ErrRenewDeadline) {
			t.Errorf("%s stopped %s because %v; want the renew deadline", paused, res, stop.reason)
		}
		if late := stop.at.Sub(pausedAt); late > timing.RenewDeadline+slack {
			t.Errorf("%s was told to stop %s %v after the pause; want within the renew deadline %v", paused, res, late, timing.RenewDeadline)
		}
		var took *event
		for i, e := range evs {
			if e.start && e.resource == res && e.replica != paused {
				took = &evs[i]
				break
			}
		}
		if took == nil {
			t.Errorf("nobody took over %s from the paused %s: %v", res, paused, describe(evs))
			continue
		}
		if !stop.at.Before(took.at) {
			t.Errorf("%s started %s at %v, before the paused %s was told to stop at %v", took.replica, res, took.at, paused, stop.at)
		}
		if took.epoch <= stop.epoch {
			t.Errorf("%s took %s with epoch %d, not above the paused holder's %d", took.replica, res, took.epoch, stop.epoch)
		}
		t.Logf("%s: %s told to stop %v after the pause; %s took over %v after it (epoch %d -> %d)",
			res, paused, stop.at.Sub(pausedAt).Round(time.Millisecond), took.replica, took.at.Sub(stop.at).Round(time.Millisecond), stop.epoch, took.epoch)
	}
}

// describeFrom is describe with each event's time after t0.
func describeFrom(evs []event, t0 time.Time) []string {
	lines := describe(evs)
	for i, e := range evs {
		lines[i] = fmt.Sprintf("+%v %s", e.at.Sub(t0).Round(time.Millisecond), lines[i])
	}
	return lines
}
