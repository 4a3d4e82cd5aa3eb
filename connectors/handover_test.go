package connectors_test

import (
	"context"
	"sync/atomic"
	"testing"

	"weida.dev/connector/connectors"
)

// retiringSource is a fakeSource whose broker keeps subscriptions after a
// disconnect (an MQTT session): it counts Retire calls.
type retiringSource struct {
	*fakeSource
	retired *atomic.Int32
}

func (s retiringSource) Retire(context.Context) error {
	s.retired.Add(1)
	return nil
}

// TestApplyKeepingDoesNotRetire: a resource stopped because it runs
// elsewhere next (a replica lost or handed over its lease) keeps what its
// broker keeps for it; only a resource that is gone withdraws it.
func TestApplyKeepingDoesNotRetire(t *testing.T) {
	var retired atomic.Int32
	f := &sources{}
	u := inboundUnit(t, "moved", "127.0.0.1:0", f)
	u.NewSource = func(report connectors.StateFunc) (connectors.Source, error) {
		s, err := f.factory(report)
		return retiringSource{fakeSource: s.(*fakeSource), retired: &retired}, err
	}
	rt, _ := newRuntime(t, nil)
	ctx := context.Background()
	if err := rt.Apply(ctx, []connectors.Unit{u}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready", rt.Ready)
	elsewhere := func(name string) bool { return name == "moved" }
	if err := rt.ApplyKeeping(ctx, nil, elsewhere); err != nil {
		t.Fatal(err)
	}
	if len(rt.Statuses()) != 0 {
		t.Fatalf("the unit still runs: %+v", rt.Statuses())
	}
	if n := retired.Load(); n != 0 {
		t.Errorf("a unit stopped to run elsewhere was retired %d times", n)
	}
	if err := rt.Apply(ctx, []connectors.Unit{u}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the unit to be ready again", rt.Ready)
	if err := rt.Apply(ctx, nil); err != nil {
		t.Fatal(err)
	}
	if n := retired.Load(); n != 1 {
		t.Errorf("a removed unit was retired %d times, want once", n)
	}
}
