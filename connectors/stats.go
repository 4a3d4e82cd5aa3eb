package connectors

import (
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// stats is a bridge's accounting. Every event goes through one of its
// methods, which updates together the /status counter, the Prometheus
// series and, for drops, the rate-limited log line, so that no path can
// count a drop in one place and forget another. Its methods are safe for
// concurrent use. It lives as long as the bridge, across attempts.
type stats struct {
	resource string
	metrics  *Metrics
	count    counters
	m        series
	rlog     *RateLogger
}

// series are the bridge's metric children, resolved once: a label lookup
// per message costs more than the count itself.
type series struct {
	received, acked, copiesQueued, copiesDropped prometheus.Counter
	inFlight                                     prometheus.Gauge
	latency                                      prometheus.Observer
	bridged                                      map[string]prometheus.Counter // by route name
}

func newStats(m *Metrics, resource string, routes []Route, rlog *RateLogger) *stats {
	s := &stats{
		resource: resource,
		metrics:  m,
		rlog:     rlog,
		m: series{
			received:      m.Received.WithLabelValues(resource),
			acked:         m.Acknowledged.WithLabelValues(resource),
			copiesQueued:  m.CopiesQueued.WithLabelValues(resource, "queued"),
			copiesDropped: m.CopiesQueued.WithLabelValues(resource, "dropped"),
			inFlight:      m.InFlight.WithLabelValues(resource),
			latency:       m.Latency.WithLabelValues(resource),
			bridged:       make(map[string]prometheus.Counter, len(routes)),
		},
	}
	for _, r := range routes {
		s.m.bridged[r.Name] = m.Bridged.WithLabelValues(resource, r.Name)
	}
	return s
}

// drop counts n messages of route not delivered, under reason, and logs
// msg at level, at most once per interval per reason.
func (s *stats) drop(route, reason string, n int, level slog.Level, msg string, attrs ...slog.Attr) {
	s.count.drop(reason, uint64(n))
	s.metrics.Dropped.WithLabelValues(s.resource, route, reason).Add(float64(n))
	attrs = append(attrs, slog.String("reason", reason), slog.String("route", route))
	if n != 1 {
		attrs = append(attrs, slog.Int("messages", n))
	}
	s.rlog.Log(level, "drop:"+reason, msg, attrs...)
}

// copies counts the weida copies of one inbound message: queued ones, and
// dropped ones (a slow subscriber), which also count as drops.
func (s *stats) copies(route string, queued, dropped int) {
	if dropped > 0 {
		s.m.copiesDropped.Add(float64(dropped))
		s.drop(route, ReasonSubscriberBuf, dropped, slog.LevelWarn, "a weida subscriber is too slow; its copies are dropped")
	}
	if queued > 0 {
		s.m.copiesQueued.Add(float64(queued))
	}
}

func (s *stats) received() {
	s.count.received.Add(1)
	s.m.received.Inc()
}

// taken and settled bracket a message in flight.
func (s *stats) taken() {
	s.count.inFlight.Add(1)
	s.m.inFlight.Inc()
}

func (s *stats) settled() {
	s.count.inFlight.Add(-1)
	s.m.inFlight.Dec()
}

func (s *stats) acked() {
	s.count.acked.Add(1)
	s.m.acked.Inc()
}

// bridged counts a message of route handed to the other side, received at
// receivedUnixNano.
func (s *stats) bridged(route string, receivedUnixNano int64, now time.Time) {
	s.count.bridged.Add(1)
	s.m.bridged[route].Inc()
	s.m.latency.Observe(now.Sub(time.Unix(0, receivedUnixNano)).Seconds())
}

// reconnected counts a connection of side (broker or weida) re-established
// after a loss.
func (s *stats) reconnected(side string) {
	s.count.reconnects.Add(1)
	s.metrics.Reconnects.WithLabelValues(s.resource, side).Inc()
}

// attemptFailed counts a failed attempt of the unit.
func (s *stats) attemptFailed(reason string) {
	s.metrics.AttemptsFailed.WithLabelValues(s.resource, reason).Inc()
}

// up sets the up gauge of side.
func (s *stats) up(side string, up bool) {
	v := 0.0
	if up {
		v = 1
	}
	s.metrics.Up.WithLabelValues(s.resource, side).Set(v)
}
