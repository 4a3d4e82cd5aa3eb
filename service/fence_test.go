package service

import (
	"context"
	"errors"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/service/admin"
	"weida.dev/connector/service/placement"
)

// TestFence: a unit may act while its holding's renew deadline has not
// passed and the holding was not lost; a holding the Placer gave up
// itself keeps acting (its drain) until the deadline.
func TestFence(t *testing.T) {
	cases := []struct {
		name   string
		cause  error // nil: the holding lasts
		inTime bool
		want   bool
	}{
		{"held", nil, true, true},
		{"paused past the deadline", nil, false, false},
		{"lost", placement.ErrLost, true, false},
		{"renew deadline", placement.ErrRenewDeadline, true, false},
		{"rebalanced, draining", placement.ErrRebalanced, true, true},
		{"closed, draining", placement.ErrClosed, true, true},
		{"closed, past the deadline", placement.ErrClosed, false, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithCancelCause(context.Background())
			defer cancel(nil)
			if tc.cause != nil {
				cancel(tc.cause)
			}
			f := fence(placement.Assignment{Context: ctx, BeforeDeadline: func() bool { return tc.inTime }})
			if got := f(); got != tc.want {
				t.Errorf("fence() = %v; want %v", got, tc.want)
			}
		})
	}
}

// TestPlacedReadinessOwnResourcesOnly: a replica's readiness never
// depends on resources it does not hold. Its /readyz answers 200 while
// the resource it holds is down, /readyz/{resource} answers for that
// resource alone (503), and the probe of a resource another replica runs
// answers 200 here (a standby) whatever that replica's state.
func TestPlacedReadinessOwnResourcesOnly(t *testing.T) {
	reg := prometheus.NewRegistry()
	rt := connectors.NewRuntime(connectors.Deps{Metrics: connectors.NewMetrics(reg), Backoff: func(int) time.Duration { return time.Hour }})
	t.Cleanup(rt.Stop)
	p := &placed{
		rt:      rt,
		cfg:     Config{Placement: Placement{Backend: "etcd", Identity: "r0"}},
		metrics: newPlacementMetrics(reg),
		held:    map[string]uint64{"mine": 3},
		fences:  map[string]func() bool{},
		since:   map[string]time.Time{},
		ended:   map[string]string{},
		view:    placement.View{Holders: map[string]string{"mine": "r0", "theirs": "r1"}, Members: []string{"r0", "r1"}},
	}
	pol := policy.NATSTokensV1()
	wf, err := pol.ConvertFilter("in.*")
	if err != nil {
		t.Fatal(err)
	}
	mine := connectors.Unit{
		Spec: connectors.Spec{Name: "mine", Protocol: policy.NATS, Direction: policy.Inbound, Policy: pol,
			Routes: []connectors.Route{{Name: "r", Foreign: "in.*", Weida: wf}}, Endpoint: "weida://127.0.0.1:0/mine"},
		Revision: "1", Listen: "127.0.0.1:0", Path: "/mine",
		NewSource: func(connectors.StateFunc) (connectors.Source, error) { return nil, errors.New("the broker is down") },
	}
	theirs := connectors.Unit{Spec: connectors.Spec{Name: "theirs", Protocol: policy.MQTT, Direction: policy.Inbound}}
	p.setUnits([]connectors.Unit{mine, theirs})
	p.applyHeld()
	deadline := time.Now().Add(10 * time.Second)
	for statusOf(p, "mine").Failure == nil {
		if time.Now().After(deadline) {
			t.Fatal("the held resource did not fail")
		}
		time.Sleep(5 * time.Millisecond)
	}
	h := admin.Handler(p, reg, admin.Options{Loaded: func() bool { return true }})
	for path, want := range map[string]int{"/readyz": 200, "/readyz/mine": 503, "/readyz/theirs": 200} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("GET %s = %d %q; want %d", path, rec.Code, rec.Body.String(), want)
		}
	}
	if st := statusOf(p, "theirs"); st.Placement == nil || st.Placement.Role != roleStandby {
		t.Errorf("theirs: %+v; want a standby", st.Placement)
	}
}

func statusOf(p *placed, name string) connectors.Status {
	for _, s := range p.Statuses() {
		if s.Name == name {
			return s
		}
	}
	return connectors.Status{}
}

// oneBackend grants every lease at once and renews it forever.
type oneBackend struct{}

type oneClaim struct{}

func (oneBackend) TryAcquire(context.Context, string, string) (placement.Claim, error) {
	return oneClaim{}, nil
}
func (oneBackend) Holder(context.Context, string) (string, uint64, error)     { return "", 0, nil }
func (oneBackend) Holders(context.Context, string) (map[string]string, error) { return nil, nil }
func (oneClaim) Epoch() uint64                                                { return 1 }
func (oneClaim) Renew(context.Context) error                                  { return nil }
func (oneClaim) Release(context.Context) error                                { return nil }

// BenchmarkFence is what the data path pays per check of a real holding,
// alone and from every writer at once.
func BenchmarkFence(b *testing.B) {
	l, err := placement.NewLease(oneBackend{}, "r", "me", placement.Timing{LeaseDuration: time.Minute, RenewDeadline: 30 * time.Second, RetryPeriod: 10 * time.Second})
	if err != nil {
		b.Fatal(err)
	}
	h, err := l.TryAcquire(context.Background())
	if err != nil {
		b.Fatal(err)
	}
	defer h.Release()
	f := fence(placement.Assignment{Context: h.Context(), BeforeDeadline: h.BeforeDeadline})
	b.Run("one", func(b *testing.B) {
		for b.Loop() {
			if !f() {
				b.Fatal("fenced")
			}
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !f() {
					b.Error("fenced")
					return
				}
			}
		})
	})
}
