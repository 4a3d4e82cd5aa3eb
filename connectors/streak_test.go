package connectors_test

import (
	"testing"
	"time"

	"weida.dev/connector/connectors"
)

// TestStreak: failures count in a row until what failed had stayed up for
// StableAfter; the wait before the next try is the backoff of the count,
// less the time already spent since the failure.
func TestStreak(t *testing.T) {
	now := time.Unix(1_000_000, 0)
	s := connectors.NewStreak(func() time.Time { return now })
	backoff := func(n int) time.Duration { return time.Duration(n) * time.Second }
	if w := s.Wait(backoff); w != 0 {
		t.Fatalf("wait before any failure = %v", w)
	}
	if n := s.Down(); n != 1 { // a connection that could not be made
		t.Fatalf("first failure counted %d", n)
	}
	s.Up()
	now = now.Add(time.Second)
	if n := s.Down(); n != 2 || s.Flaps() != 1 {
		t.Fatalf("a failure 1 s after coming up: %d in a row, %d flaps; want 2, 1", n, s.Flaps())
	}
	now = now.Add(500 * time.Millisecond)
	if w := s.Wait(backoff); w != 1500*time.Millisecond {
		t.Fatalf("wait 0.5 s after the second failure = %v, want 1.5 s", w)
	}
	s.Up()
	if w := s.Wait(backoff); w != 0 {
		t.Fatalf("wait while up = %v", w)
	}
	now = now.Add(connectors.StableAfter)
	if n := s.Down(); n != 1 || s.Flaps() != 0 {
		t.Fatalf("a failure after StableAfter up: %d in a row, %d flaps; want 1, 0", n, s.Flaps())
	}
}
