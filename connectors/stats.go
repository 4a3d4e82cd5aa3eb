package connectors

import (
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/weida"
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

// addRoutes resolves the series of routes not yet known: a reload that
// changes a resource's routes carries its accounting on. The old routes'
// series stay, with what they counted. Call it only while no bridge uses s.
func (s *stats) addRoutes(routes []Route) {
	s.count.mu.Lock() // routeCounts may be reading the map
	defer s.count.mu.Unlock()
	for _, r := range routes {
		if s.m.bridged[r.Name] == nil {
			s.m.bridged[r.Name] = &routeSeries{bridged: s.metrics.Bridged.WithLabelValues(s.resource, r.Name)}
		}
	}
}

// routeSeries is one route's bridged series and its running totals for
// /status.
type routeSeries struct {
	bridged prometheus.Counter
	// count counts the messages of the route bridged, dropped the ones
	// dropped under any reason.
	count, dropped atomic.Uint64
}

// routeCounts returns the running totals of the named routes, by name.
func (s *stats) routeCounts(routes []Route) []RouteStatus {
	if len(routes) == 0 {
		return nil
	}
	out := make([]RouteStatus, len(routes))
	s.count.mu.Lock()
	defer s.count.mu.Unlock()
	for i, r := range routes {
		out[i] = RouteStatus{Name: r.Name, Foreign: r.Foreign, Weida: r.Weida}
		if rs := s.m.bridged[r.Name]; rs != nil {
			out[i].Bridged, out[i].Dropped = rs.count.Load(), rs.dropped.Load()
		}
	}
	return out
}

// series are the bridge's metric children, resolved once: a label lookup
// per message costs more than the count itself.
type series struct {
	received, acked, copiesQueued, copiesDropped prometheus.Counter
	copiesOwnReplay                              prometheus.Counter
	held, gaps, gapSeconds, unconfirmed          prometheus.Counter
	sessionsLost                                 prometheus.Counter
	inFlight, holding, awaitingReceipt           prometheus.Gauge
	latency                                      prometheus.Observer
	// bridged is by route name. Bridge goroutines read it without a
	// lock: only addRoutes writes it, while no bridge uses the stats.
	bridged map[string]*routeSeries
}

func newStats(m *Metrics, resource string, routes []Route, rlog *RateLogger) *stats {
	s := &stats{
		resource: resource,
		metrics:  m,
		rlog:     rlog,
		m: series{
			received:        m.Received.WithLabelValues(resource),
			acked:           m.Acknowledged.WithLabelValues(resource),
			copiesQueued:    m.CopiesQueued.WithLabelValues(resource, "queued"),
			copiesDropped:   m.CopiesQueued.WithLabelValues(resource, "dropped"),
			copiesOwnReplay: m.CopiesQueued.WithLabelValues(resource, "own-replay"),
			inFlight:        m.InFlight.WithLabelValues(resource),
			awaitingReceipt: m.AwaitingReceipt.WithLabelValues(resource),
			holding:         m.Holding.WithLabelValues(resource),
			held:            m.Held.WithLabelValues(resource),
			gaps:            m.WeidaGaps.WithLabelValues(resource),
			gapSeconds:      m.WeidaGapSeconds.WithLabelValues(resource),
			unconfirmed:     m.CopiesUnconfirmed.WithLabelValues(resource),
			sessionsLost:    m.SessionsLost.WithLabelValues(resource),
			latency:         m.Latency.WithLabelValues(resource),
			bridged:         make(map[string]*routeSeries, len(routes)),
		},
	}
	for _, r := range routes {
		s.m.bridged[r.Name] = &routeSeries{bridged: m.Bridged.WithLabelValues(resource, r.Name)}
	}
	// The series a dashboard graphs exist from the start, at 0, rather
	// than from their first event: a panel over an absent series shows
	// "No data", not 0. WithLabelValues leaves an existing child as it
	// is, so a resource restarted by a reload keeps its values.
	for _, side := range []string{"broker", "weida"} {
		m.Reconnects.WithLabelValues(resource, side)
		m.Up.WithLabelValues(resource, side)
	}
	m.Subscribers.WithLabelValues(resource)
	return s
}

// drop counts n messages of route not delivered, under reason, and logs
// msg at level, at most once per interval per reason.
func (s *stats) drop(route, reason string, n int, level slog.Level, msg string, attrs ...slog.Attr) {
	s.count.drop(reason, uint64(n))
	if rs := s.m.bridged[route]; rs != nil {
		rs.dropped.Add(uint64(n))
	}
	s.metrics.Dropped.WithLabelValues(s.resource, route, reason).Add(float64(n))
	attrs = append(attrs, slog.String("reason", reason), slog.String("route", route))
	if n != 1 {
		attrs = append(attrs, slog.Int("messages", n))
	}
	s.rlog.Log(level, "drop:"+reason, msg, attrs...)
}

// copies counts the weida copies of one inbound message: queued ones, and
// dropped ones, which also count as drops: those of a slow subscriber, and
// those of a subscriber whose connection was closing when another live one
// took or refused its copy. Closing copies of a message only closing
// subscribers matched are left to the caller, which counts the message
// itself (no-subscriber) or publishes it again (hold).
//
// The copies of a redelivered message are counted under
// ReasonRedeliveryDropped instead, the reason in the log line: an earlier
// delivery may have given that subscriber its copy.
//
// Copies a subscriber's own replay crowded out (ownReplay, among dropped)
// are counted under ReasonOwnReplay alone: that subscriber caused them,
// so they are neither the route's drops nor weida copies dropped, which
// measure what the traffic lost.
func (s *stats) copies(route string, queued, dropped, closing, ownReplay int, redelivered bool) {
	reasonFor := func(reason string, msg string) (string, string, []slog.Attr) {
		if !redelivered {
			return reason, msg, nil
		}
		return ReasonRedeliveryDropped, msg + "; the broker delivered the message again, and an earlier delivery may have reached it",
			[]slog.Attr{slog.String("dropped_for", reason)}
	}
	if ownReplay > 0 {
		s.m.copiesOwnReplay.Add(float64(ownReplay))
		s.count.drop(ReasonOwnReplay, uint64(ownReplay))
		s.metrics.Dropped.WithLabelValues(s.resource, route, ReasonOwnReplay).Add(float64(ownReplay))
		s.rlog.Log(slog.LevelInfo, "drop:"+ReasonOwnReplay,
			"a weida subscriber's buffer is taken by a replay it asked for; its copies are dropped",
			slog.String("reason", ReasonOwnReplay), slog.String("route", route), slog.Int("copies", ownReplay))
	}
	full := dropped - closing - ownReplay
	if full > 0 {
		s.m.copiesDropped.Add(float64(full))
		reason, msg, attrs := reasonFor(ReasonSubscriberBuf, "a weida subscriber is too slow; its copies are dropped")
		s.drop(route, reason, full, slog.LevelWarn, msg, attrs...)
	}
	if (queued > 0 || full > 0) && closing > 0 {
		s.m.copiesDropped.Add(float64(closing))
		reason, msg, attrs := reasonFor(ReasonConnectionClosed, "a weida subscriber's connection was closing; its copies are dropped")
		s.drop(route, reason, closing, slog.LevelWarn, msg, attrs...)
	}
	if queued > 0 {
		s.m.copiesQueued.Add(float64(queued))
	}
}

// copiesLost counts n copies a subscriber connection dropped after they
// were queued, when it closed before writing them.
func (s *stats) copiesLost(n int) {
	s.m.copiesDropped.Add(float64(n))
	s.drop("", ReasonConnectionClosed, n, slog.LevelWarn, "a weida subscriber's connection closed before its copies were written")
}

// copiesUnconfirmed counts the copies written to a weida subscriber
// connection that then vanished (killed, cut off) before anything said
// they arrived. They are not drops: some were delivered, so they are
// counted apart, and the log names the subscriber.
func (s *stats) copiesUnconfirmed(u weida.UnconfirmedCopies) {
	n := u.Len()
	if n == 0 {
		return
	}
	s.count.unconfirmed.Add(uint64(n))
	s.m.unconfirmed.Add(float64(n))
	attrs := []slog.Attr{slog.Int("copies", n), slog.String("subscriber", u.Remote), slog.Any("cause", u.Cause)}
	s.rlog.Log(slog.LevelWarn, "unconfirmed",
		"a weida subscriber vanished without closing its connection; the copies written to it last may not have arrived", attrs...)
}

// holdStarted and holdEnded bracket a wait for a weida subscriber.
func (s *stats) holdStarted(now time.Time) {
	s.count.gapMu.Lock()
	s.count.holdingSince = now
	s.count.gapMu.Unlock()
	s.count.held.Add(1)
	s.m.held.Inc()
	s.m.holding.Set(1)
}

func (s *stats) holdEnded() {
	s.count.gapMu.Lock()
	s.count.holdingSince = time.Time{}
	s.count.gapMu.Unlock()
	s.m.holding.Set(0)
}

// weidaLost opens a gap in the outbound subscription at now, unless one
// is open.
func (s *stats) weidaLost(now time.Time) {
	s.count.gapMu.Lock()
	defer s.count.gapMu.Unlock()
	if !s.count.gap.Open {
		s.count.gap = Gap{Start: now, Open: true}
	}
}

// weidaSubscribed closes the open gap, if any, at now and counts it.
func (s *stats) weidaSubscribed(now time.Time) {
	s.count.gapMu.Lock()
	defer s.count.gapMu.Unlock()
	g := &s.count.gap
	if !g.Open {
		return
	}
	d := now.Sub(g.Start)
	g.Open, g.Seconds = false, d.Seconds()
	s.count.gaps++
	s.count.gapSeconds += d.Seconds()
	s.m.gaps.Inc()
	s.m.gapSeconds.Add(d.Seconds())
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

// awaitReceipt counts a message whose acknowledgement waits for the
// receipt of its weida copies; receiptSettled ends the wait.
func (s *stats) awaitReceipt() {
	s.count.awaitingReceipt.Add(1)
	s.m.awaitingReceipt.Inc()
}

func (s *stats) receiptSettled() {
	s.count.awaitingReceipt.Add(-1)
	s.m.awaitingReceipt.Dec()
}

func (s *stats) acked() {
	s.count.acked.Add(1)
	s.m.acked.Inc()
}

// bridged counts a message of route handed to the other side, received at
// receivedUnixNano.
func (s *stats) bridged(route string, receivedUnixNano int64, now time.Time) {
	s.count.bridged.Add(1)
	rs := s.m.bridged[route]
	rs.count.Add(1)
	rs.bridged.Inc()
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
