package connectors

import (
	"sync"
	"time"
)

// StableAfter is how long an attempt must stay up for the next failure to
// count as the first in a row again, so that its backoff starts over from
// its shortest wait.
const StableAfter = 30 * time.Second

// Streak counts failures in a row under the runtime's one rule of
// stability, [StableAfter]: a failure of something that had stayed up that
// long counts as the first in a row again. The runtime keeps one per unit,
// for its attempts. A driver whose client library reconnects by itself
// within an attempt (autopaho) keeps one for those reconnections, and tells
// it when its connection comes up and goes down: it then paces them on the
// same rule, and with the same kind of clock, as the runtime paces
// attempts, instead of a rule of its own.
//
// Create it with [NewStreak]. Its methods are safe for concurrent use.
type Streak struct {
	now func() time.Time

	mu     sync.Mutex
	upAt   time.Time // zero while down
	downAt time.Time // the last failure
	n      int       // failures in a row
	flaps  int       // of those, times it came up and failed before StableAfter
}

// NewStreak returns a streak with no failure, read on the clock now (nil
// means time.Now).
func NewStreak(now func() time.Time) *Streak {
	if now == nil {
		now = time.Now
	}
	return &Streak{now: now}
}

// Up records that what the streak follows is up (an attempt started, a
// connection came up).
func (s *Streak) Up() {
	s.mu.Lock()
	s.upAt = s.now()
	s.mu.Unlock()
}

// Down records a failure (an attempt ended, a connection was lost or could
// not be made) and returns the failures in a row, this one included.
func (s *Streak) Down() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	if !s.upAt.IsZero() {
		if now.Sub(s.upAt) >= StableAfter {
			s.n, s.flaps = 0, 0
		} else {
			s.flaps++
		}
		s.upAt = time.Time{}
	}
	s.n++
	s.downAt = now
	return s.n
}

// Flaps returns how many times in a row what the streak follows came up and
// then failed within StableAfter.
func (s *Streak) Flaps() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.flaps
}

// Wait returns how long to wait from now before the next try: backoff(n)
// after n failures in a row, less the time since the last one; zero before
// the first failure and while up.
func (s *Streak) Wait(backoff func(n int) time.Duration) time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.n == 0 || !s.upAt.IsZero() {
		return 0
	}
	return max(0, backoff(s.n)-s.now().Sub(s.downAt))
}
