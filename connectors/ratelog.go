package connectors

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"golang.org/x/time/rate"
)

// RateLogger logs the first event of each key at once, then at most one
// line per interval per key, carrying how many events it suppressed since
// the last line, so that a flood of drops or reconnections stays visible
// without drowning the log. Its methods are safe for concurrent use.
type RateLogger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*rateKey
}

type rateKey struct {
	lim        *rate.Limiter
	suppressed int
}

// NewRateLogger returns a RateLogger writing to log at most one line per
// key per interval. now is its clock; nil means time.Now.
func NewRateLogger(log *slog.Logger, interval time.Duration, now func() time.Time) *RateLogger {
	if now == nil {
		now = time.Now
	}
	return &RateLogger{log: log, interval: interval, now: now, keys: make(map[string]*rateKey)}
}

// Log emits msg with attrs at level unless key was logged less than the
// interval ago, in which case it only counts the event.
func (r *RateLogger) Log(level slog.Level, key, msg string, attrs ...slog.Attr) {
	if !r.log.Enabled(context.Background(), level) {
		return
	}
	now := r.now()
	r.mu.Lock()
	k := r.keys[key]
	if k == nil {
		k = &rateKey{lim: rate.NewLimiter(rate.Every(r.interval), 1)}
		r.keys[key] = k
	}
	if !k.lim.AllowN(now, 1) {
		k.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := k.suppressed
	k.suppressed = 0
	r.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed_since_last", suppressed))
	}
	r.log.LogAttrs(context.Background(), level, msg, attrs...)
}
