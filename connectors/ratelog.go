package connectors

import (
	"context"
	"log/slog"
	"sync"
	"time"
)

// rateLogger logs the first event of each key at once, then at most one
// line per interval carrying how many were suppressed, so that a flood of
// drops stays visible without drowning the log.
type rateLogger struct {
	log      *slog.Logger
	interval time.Duration
	now      func() time.Time

	mu   sync.Mutex
	keys map[string]*rateState
}

type rateState struct {
	last       time.Time
	suppressed int
}

func newRateLogger(log *slog.Logger, interval time.Duration, now func() time.Time) *rateLogger {
	return &rateLogger{log: log, interval: interval, now: now, keys: make(map[string]*rateState)}
}

// Log emits msg at level unless key was logged less than interval ago.
func (r *rateLogger) Log(level slog.Level, key, msg string, attrs ...slog.Attr) {
	now := r.now()
	r.mu.Lock()
	st := r.keys[key]
	if st == nil {
		st = &rateState{}
		r.keys[key] = st
	} else if now.Sub(st.last) < r.interval {
		st.suppressed++
		r.mu.Unlock()
		return
	}
	suppressed := st.suppressed
	st.last, st.suppressed = now, 0
	r.mu.Unlock()
	if suppressed > 0 {
		attrs = append(attrs, slog.Int("suppressed_since_last", suppressed))
	}
	r.log.LogAttrs(context.Background(), level, msg, attrs...)
}
