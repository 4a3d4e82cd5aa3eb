package connectors

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// Drop reasons the runtime itself assigns. Conversion refusals use the
// policy's stable rule code as their reason, so the two vocabularies never
// collide (policy rule codes carry a protocol prefix).
const (
	ReasonLoop           = "loop"           // the message carries our own loop marker
	ReasonNoRoute        = "no-route"       // no route's filter selects the topic
	ReasonGuardMismatch  = "guard-mismatch" // a converted topic escapes the route that selected it: a defect
	ReasonTooLarge       = "too-large"      // payload over spec.limits.maxMessageBytes, or over a weida subscriber's whole budget
	ReasonWeidaRefused   = "weida-refused"  // the weida publisher refused the message (a field over its cap)
	ReasonSubscriberBuf  = "subscriber-buffer-full"
	ReasonUnroutable     = "unroutable"      // the broker had nowhere to route it
	ReasonPublishFailed  = "publish-failed"  // the broker refused it for good, or five times
	ReasonPublishDenied  = "publish-denied"  // the broker does not let the connector publish on the topic
	ReasonShutdown       = "shutdown"        // dropped because the bridge stopped mid-way
	ReasonBrokerDropped  = "broker-overflow" // the driver's client library discarded it (slow consumer, reconnect buffer)
	ReasonConnectionLost = "connection-lost" // the broker connection failed while the write was under way
	// ReasonNoSubscriber: an inbound message no live weida subscriber's
	// filter selected, under spec.delivery.whenNoSubscriber: drop.
	ReasonNoSubscriber = "no-subscriber"
	// ReasonConnectionClosed counts weida copies (not messages) whose
	// subscriber connection closed before they were written, while other
	// subscribers got theirs.
	ReasonConnectionClosed = "connection-closed"
	// ReasonRedeliveryDropped: inbound, a message the broker delivered
	// again (Message.Redelivered) and the bridge dropped, for whatever
	// reason the log line names. An earlier delivery of it may have been
	// bridged, so it is not necessarily a loss: an upper bound on what
	// redeliveries lost, counted apart so that adding it to the other
	// reasons does not count a message twice.
	ReasonRedeliveryDropped = "redelivery-dropped"
	// ReasonFenced: the unit's fence ([Unit].Fence) said it may no longer
	// act (another replica may hold its lease) when the message was to
	// be published: outbound to the broker, inbound to weida from a
	// source whose broker would not deliver it again (core NATS, MQTT
	// QoS 0, an exclusive AMQP queue). Inbound messages a broker does
	// deliver again are left with it, for the new holder, uncounted.
	ReasonFenced = "fenced"
	// ReasonOwnReplay counts weida copies (not messages) a subscriber's
	// buffer could not take because of a last-value replay that
	// subscriber asked for: a replayed copy that did not fit, or a live
	// one that arrived while replayed copies still waited for it. Its own
	// SUBSCRIBEs (a client re-subscribing in a loop on a large cache)
	// filled its buffer: counted apart, so that subscriber-buffer-full
	// keeps meaning a subscriber too slow for the traffic.
	ReasonOwnReplay = "subscriber-own-replay"
)

// Metrics holds the Prometheus collectors shared by every bridge of a
// process. Labels: resource (metadata.name), route (route name, or its
// filter when unnamed; empty before a route is known), reason, side
// (broker | weida).
type Metrics struct {
	Received     *prometheus.CounterVec
	Bridged      *prometheus.CounterVec
	Dropped      *prometheus.CounterVec
	Acknowledged *prometheus.CounterVec
	InFlight     *prometheus.GaugeVec
	// AwaitingReceipt is, for an inbound resource under
	// spec.delivery.acknowledge: received, the messages whose weida
	// copies are queued or written and not yet all received or lost: the
	// broker still holds them, unacknowledged.
	AwaitingReceipt *prometheus.GaugeVec
	Reconnects      *prometheus.CounterVec
	Up              *prometheus.GaugeVec
	Subscribers     *prometheus.GaugeVec
	CopiesQueued    *prometheus.CounterVec
	Latency         *prometheus.HistogramVec
	// AttemptsFailed counts failed attempts of a unit by reason.
	AttemptsFailed *prometheus.CounterVec
	// Holding is 1 while an inbound bridge under whenNoSubscriber: hold
	// waits, its message unacknowledged, for a weida subscriber.
	Holding *prometheus.GaugeVec
	// Held counts the inbound messages that had to wait for a subscriber.
	Held *prometheus.CounterVec
	// WeidaGaps and WeidaGapSeconds count the outbound losses of the
	// weida subscription that were followed by a new one, and their
	// length: what the remote side published meanwhile is lost unseen.
	WeidaGaps       *prometheus.CounterVec
	WeidaGapSeconds *prometheus.CounterVec
	// CopiesUnconfirmed counts inbound weida copies written to a
	// subscriber connection that then vanished without a close: delivered
	// or not, nobody can tell. Not a drop reason, since some arrived.
	CopiesUnconfirmed *prometheus.CounterVec
	// SessionsLost counts the broker connections that did not resume the
	// session the connector expected (see [Session]): what the broker
	// held for it while it was disconnected is gone. 0 from the start.
	SessionsLost *prometheus.CounterVec
	// Last-value caches of inbound resources: topics and bytes held,
	// topics removed by reason (a bound, an update that could not be
	// cached, an expiry, an orphaned cache; never a broker deletion),
	// copies replayed to new weida subscriptions, and copies withheld
	// while the source was down (whenSourceDown: withhold) or the unit
	// was fenced.
	LastValueEntries   *prometheus.GaugeVec
	LastValueBytes     *prometheus.GaugeVec
	LastValueEvictions *prometheus.CounterVec
	LastValueReplayed  *prometheus.CounterVec
	LastValueWithheld  *prometheus.CounterVec
	// LastValueRestoreFailures counts saved caches (lastValue.persist)
	// that could not be used at start, by reason.
	LastValueRestoreFailures *prometheus.CounterVec
}

// NewMetrics creates the collectors and registers them on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	const ns = "weida_connector"
	m := &Metrics{
		Received: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_received_total",
			Help: "Messages read from the source side (broker for inbound, weida for outbound)."}, []string{"resource"}),
		Bridged: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_bridged_total",
			Help: "Messages handed to the other side: queued for weida subscribers (inbound) or accepted by the broker (outbound)."}, []string{"resource", "route"}),
		Dropped: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_dropped_total",
			Help: "Messages not delivered, by reason. Weida's per-subscriber drops count copies, see weida_copies_total."}, []string{"resource", "route", "reason"}),
		Acknowledged: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_acknowledged_total",
			Help: "Inbound messages settled positively after hand-off; the driver sends the broker acknowledgement then or shortly after (AMQP within 1 ms, pipelined MQTT in arrival order)."}, []string{"resource"}),
		InFlight: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "messages_in_flight",
			Help: "Messages read and not yet settled."}, []string{"resource"}),
		AwaitingReceipt: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "messages_awaiting_receipt",
			Help: "Inbound messages (spec.delivery.acknowledge: received) bridged to weida and not yet acknowledged to the broker: some copy is neither received by its subscriber's QUIC stack nor counted lost."}, []string{"resource"}),
		Reconnects: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "reconnects_total",
			Help: "Connections re-established after a loss."}, []string{"resource", "side"}),
		Up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "up",
			Help: "1 when that side of the resource is connected and ready."}, []string{"resource", "side"}),
		Subscribers: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "weida_subscribers",
			Help: "Weida connections subscribed to an inbound resource's endpoint."}, []string{"resource"}),
		CopiesQueued: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "weida_copies_total",
			Help: "Weida DATA copies per outcome (queued, dropped) for inbound resources."}, []string{"resource", "outcome"}),
		Latency: prometheus.NewHistogramVec(prometheus.HistogramOpts{Namespace: ns, Name: "bridge_latency_seconds",
			Help:    "Time from reading a message to handing it off (queued for weida, or accepted by the broker).",
			Buckets: []float64{.00005, .0001, .00025, .0005, .001, .002, .005, .01, .025, .05, .1, .25, 1}}, []string{"resource"}),
		AttemptsFailed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "attempts_failed_total",
			Help: "Failed attempts to run a resource, by reason; the runtime retries each after a backoff unless it is permanent."}, []string{"resource", "reason"}),
		Holding: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "holding",
			Help: "1 while an inbound resource with whenNoSubscriber: hold waits for a weida subscriber, leaving its messages with the broker."}, []string{"resource"}),
		Held: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "messages_held_total",
			Help: "Inbound messages that waited, unacknowledged, for a weida subscriber (whenNoSubscriber: hold)."}, []string{"resource"}),
		WeidaGaps: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "weida_gaps_total",
			Help: "Outbound: times the subscription at the dialled weida endpoint was lost and then held again; what was published in between is lost."}, []string{"resource"}),
		WeidaGapSeconds: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "weida_gap_seconds_total",
			Help: "Outbound: total length of the gaps counted by weida_gaps_total."}, []string{"resource"}),
		CopiesUnconfirmed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "copies_unconfirmed_total",
			Help: "Inbound weida copies written to a subscriber connection that then vanished (idle timeout, stateless reset) within the idle timeout plus 1 s: delivered or not, nobody can tell."}, []string{"resource"}),
		SessionsLost: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "sessions_lost_total",
			Help: "Broker connections on which the broker no longer had the session the connector expected to resume (an MQTT persistent session expired, lost, or destroyed by a clean start with the same client ID): what it held for the connector while disconnected is gone."}, []string{"resource"}),
		LastValueEntries: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "last_value_entries",
			Help: "Topics held in an inbound resource's last-value cache."}, []string{"resource"}),
		LastValueBytes: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Name: "last_value_bytes",
			Help: "Bytes held in an inbound resource's last-value cache: topics, payloads, metadata and 64 bytes per topic."}, []string{"resource"}),
		LastValueEvictions: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "last_value_evictions_total",
			Help: "Topics removed from a last-value cache other than by the broker: to keep its bounds (max-topics, max-bytes), for an update that could not be cached (too-large, weida-refused), at their expiry (expired), or after the source was down for lastValue.orphanAfter (orphaned)."}, []string{"resource", "reason"}),
		LastValueReplayed: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "last_value_replayed_total",
			Help: "Cached values offered to new weida subscriptions, one per matching topic per SUBSCRIBE."}, []string{"resource"}),
		LastValueWithheld: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "last_value_withheld_total",
			Help: "Cached values not replayed to a new weida subscription, one per matching topic per SUBSCRIBE: the source was disconnected (lastValue.whenSourceDown: withhold), or the replica no longer held the resource's lease (fenced)."}, []string{"resource"}),
		LastValueRestoreFailures: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Name: "last_value_restore_failures_total",
			Help: "Saved last-value caches (lastValue.persist) that could not be used at start (unreadable, malformed, another-config, unknown-version); the cache started empty."}, []string{"resource", "reason"}),
	}
	reg.MustRegister(m.Received, m.Bridged, m.Dropped, m.Acknowledged, m.InFlight, m.AwaitingReceipt, m.Reconnects, m.Up,
		m.Subscribers, m.CopiesQueued, m.Latency, m.AttemptsFailed, m.Holding, m.Held, m.WeidaGaps, m.WeidaGapSeconds,
		m.CopiesUnconfirmed, m.SessionsLost, m.LastValueEntries, m.LastValueBytes, m.LastValueEvictions, m.LastValueReplayed, m.LastValueWithheld,
		m.LastValueRestoreFailures)
	return m
}

// forget removes every series of the named resources, so that resources
// removed by a reload, or by a stop, do not linger in /metrics. It reads
// each collector's series once and deletes those of the named resources
// by their exact labels: prometheus's DeletePartialMatch scans every
// series for each resource, which made stopping n resources cost n² (a
// stop of 10,000 took minutes).
func (m *Metrics) forget(resources map[string]bool) {
	if len(resources) == 0 {
		return
	}
	for _, v := range []deletingCollector{m.Received, m.Bridged, m.Dropped, m.Acknowledged, m.InFlight, m.AwaitingReceipt,
		m.Reconnects, m.Up, m.Subscribers, m.CopiesQueued, m.Latency, m.AttemptsFailed, m.Holding, m.Held,
		m.WeidaGaps, m.WeidaGapSeconds, m.CopiesUnconfirmed, m.SessionsLost, m.LastValueEntries, m.LastValueBytes, m.LastValueEvictions, m.LastValueReplayed, m.LastValueWithheld,
		m.LastValueRestoreFailures} {
		forgetIn(v, resources)
	}
}

// deletingCollector is what the vectors of [Metrics] have in common.
type deletingCollector interface {
	prometheus.Collector
	Delete(prometheus.Labels) bool
}

func forgetIn(v deletingCollector, resources map[string]bool) {
	// Collect holds the vector's read lock while it sends, and Delete
	// takes its write lock: the labels are gathered first, deleted after.
	ch := make(chan prometheus.Metric, 64)
	go func() {
		v.Collect(ch)
		close(ch)
	}()
	var doomed []prometheus.Labels
	var pb dto.Metric
	for metric := range ch {
		pb.Reset()
		if metric.Write(&pb) != nil {
			continue
		}
		labels := make(prometheus.Labels, len(pb.GetLabel()))
		for _, lp := range pb.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if resources[labels["resource"]] {
			doomed = append(doomed, labels)
		}
	}
	for _, l := range doomed {
		v.Delete(l)
	}
}
