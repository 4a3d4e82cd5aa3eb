package connectors

import (
	"time"

	"github.com/cenkalti/backoff/v5"
)

// Backoff is the capped exponential backoff with jitter used everywhere in
// the module: between attempts of a unit, between re-dials of a weida
// endpoint, and by drivers between broker reconnections.
//
// The n-th wait doubles from Initial towards Max and is drawn at random
// around its centre (±50 %), so that replicas failing together do not
// retry together. Every wait lies within [Initial, Max]. The zero value
// waits from 250 ms to 10 s: the cap the MQTT and NATS clients' own
// reconnections use, so that every protocol is back within 10 s of its
// broker.
type Backoff struct {
	Initial time.Duration // the shortest wait; zero means 250 ms
	Max     time.Duration // the longest wait; zero means 10 s
}

// jitter is the randomization factor: a wait is drawn from
// [c·(1-jitter), c·(1+jitter)] around its centre c.
const jitter = 0.5

// Wait returns the wait before attempt n+1 after n failures (n ≥ 1). Values
// of n below 1 count as 1. Wait is safe for concurrent use.
func (b Backoff) Wait(n int) time.Duration {
	lo, hi := b.Initial, b.Max
	if lo <= 0 {
		lo = 250 * time.Millisecond
	}
	if hi <= 0 {
		hi = 10 * time.Second
	}
	if hi < lo {
		hi = lo
	}
	// Centres are chosen so that the jittered range of the first wait
	// starts at lo and that of the capped one ends at hi.
	first := time.Duration(float64(lo) / (1 - jitter))
	last := time.Duration(float64(hi) / (1 + jitter))
	if last < first {
		first = last
	}
	eb := &backoff.ExponentialBackOff{
		InitialInterval:     first,
		RandomizationFactor: jitter,
		Multiplier:          2,
		MaxInterval:         last,
	}
	eb.Reset()
	// Past 64 doublings every centre is capped anyway.
	var d time.Duration
	for range min(max(n, 1), 64) {
		d = eb.NextBackOff()
	}
	return min(max(d, lo), hi)
}

// ExponentialBackoff returns [Backoff]{Initial: min, Max: max}.Wait. It is
// kept for the drivers' Config.Backoff fields.
func ExponentialBackoff(min, max time.Duration) func(int) time.Duration {
	return Backoff{Initial: min, Max: max}.Wait
}
