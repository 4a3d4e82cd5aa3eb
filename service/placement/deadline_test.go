package placement

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"
)

// grantAll grants every lease at once and renews it as asked.
type grantAll struct{}

type grantClaim struct{}

func (grantAll) TryAcquire(context.Context, string, string) (Claim, error) { return grantClaim{}, nil }
func (grantAll) Holder(context.Context, string) (string, uint64, error)    { return "", 0, nil }
func (grantAll) Holders(context.Context, string) (map[string]string, error) {
	return nil, nil
}
func (grantClaim) Epoch() uint64                 { return 1 }
func (grantClaim) Renew(context.Context) error   { return nil }
func (grantClaim) Release(context.Context) error { return nil }

// TestBeforeDeadline: BeforeDeadline follows the renew deadline alone. It
// moves with each renewal, turns false once the deadline passes with the
// renew loop stuck (as Valid does, before the watchdog's goroutine has run
// or not), and stays true after a Release until the deadline, for the
// holder to finish what it had begun.
func TestBeforeDeadline(t *testing.T) {
	timing := Timing{LeaseDuration: 5 * time.Second, RenewDeadline: 3 * time.Second, RetryPeriod: time.Second}
	synctest.Test(t, func(t *testing.T) {
		l, err := NewLease(grantAll{}, "r", "me", timing)
		if err != nil {
			t.Fatal(err)
		}
		var stuck atomic.Pointer[chan struct{}]
		l.beforeRenew = func() {
			if g := stuck.Load(); g != nil {
				<-*g
			}
		}
		h, err := l.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * time.Second) // renewed every second, the last one now
		synctest.Wait()
		if !h.BeforeDeadline() || !h.Valid() {
			t.Fatal("a renewed holding is past its deadline")
		}
		gate := make(chan struct{})
		stuck.Store(&gate)
		time.Sleep(2900 * time.Millisecond)
		if !h.BeforeDeadline() {
			t.Error("past the deadline before 3 s without a renewal")
		}
		time.Sleep(200 * time.Millisecond)
		if h.BeforeDeadline() || h.Valid() {
			t.Error("before the deadline more than 3 s after the last renewal")
		}
		close(gate)
		h.Release()
	})
	synctest.Test(t, func(t *testing.T) {
		l, err := NewLease(grantAll{}, "r", "me", timing)
		if err != nil {
			t.Fatal(err)
		}
		h, err := l.TryAcquire(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		h.Release()
		if h.Valid() || !h.BeforeDeadline() {
			t.Errorf("just released: Valid = %v, BeforeDeadline = %v; want false, true", h.Valid(), h.BeforeDeadline())
		}
		time.Sleep(3 * time.Second)
		if h.BeforeDeadline() {
			t.Error("released, and still before the deadline 3 s later")
		}
	})
}
