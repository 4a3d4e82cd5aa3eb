package admin

import (
	"sync"
	"time"

	"weida.dev/connector/connectors"
)

// Rates are a resource's message rates, per second, over the last
// WindowSeconds, as /status reports them: computed here, once, so that
// the page and a script reading /status show the same numbers.
type Rates struct {
	Received      float64 `json:"received"`
	Bridged       float64 `json:"bridged"`
	Dropped       float64 `json:"dropped"`
	WindowSeconds float64 `json:"windowSeconds"`
}

// Rates are taken over at least rateWindow when readings that old exist,
// from readings kept at least rateSpacing apart.
const (
	rateWindow  = 5 * time.Second
	rateSpacing = time.Second
)

// rateTracker turns the counters of successive /status readings into
// rates, with no goroutine of its own: each reading is a sample, and the
// rate is taken against the newest kept sample at least rateWindow old
// (or the oldest one, in the first seconds). A script that reads /status
// once a minute therefore gets the rate over that minute. Safe for
// concurrent use.
type rateTracker struct {
	mu      sync.Mutex
	samples map[string][]rateSample // by resource
}

type rateSample struct {
	t                          time.Time
	received, bridged, dropped uint64
}

func newRateTracker() *rateTracker {
	return &rateTracker{samples: make(map[string][]rateSample)}
}

// observe records st as read at now and returns each resource's rates;
// a resource read for the first time has none.
func (r *rateTracker) observe(now time.Time, st []connectors.Status) map[string]*Rates {
	out := make(map[string]*Rates, len(st))
	r.mu.Lock()
	defer r.mu.Unlock()
	seen := make(map[string]bool, len(st))
	for _, s := range st {
		seen[s.Name] = true
		cur := rateSample{t: now, received: s.Counters.Received, bridged: s.Counters.Bridged}
		for _, n := range s.Counters.Dropped {
			cur.dropped += n
		}
		h := r.samples[s.Name]
		// A counter that went down belongs to a resource removed and
		// added again: its history is another resource's.
		if len(h) > 0 {
			last := h[len(h)-1]
			if cur.received < last.received || cur.bridged < last.bridged || cur.dropped < last.dropped || now.Before(last.t) {
				h = h[:0]
			}
		}
		if len(h) > 0 {
			base := h[0]
			if dt := now.Sub(base.t).Seconds(); dt > 0 {
				out[s.Name] = &Rates{
					Received:      float64(cur.received-base.received) / dt,
					Bridged:       float64(cur.bridged-base.bridged) / dt,
					Dropped:       float64(cur.dropped-base.dropped) / dt,
					WindowSeconds: dt,
				}
			}
		}
		if len(h) == 0 || now.Sub(h[len(h)-1].t) >= rateSpacing {
			h = append(h, cur)
		}
		for len(h) > 1 && now.Sub(h[1].t) >= rateWindow {
			h = h[1:]
		}
		r.samples[s.Name] = h
	}
	for name := range r.samples {
		if !seen[name] {
			delete(r.samples, name)
		}
	}
	return out
}
