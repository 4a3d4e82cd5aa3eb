package connectors

import (
	"net"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida"
	"weida.dev/connector/weida/address"
)

// Condition types of a resource's status, in the style of Kubernetes.
const (
	CondBrokerConnected = "BrokerConnected"
	CondWeidaReady      = "WeidaReady"
	CondReady           = "Ready"
)

// Condition is one observed aspect of a running resource.
type Condition struct {
	Type               string    `json:"type"`
	Status             string    `json:"status"` // "True", "False" or "Unknown"
	Reason             string    `json:"reason"`
	Message            string    `json:"message,omitempty"`
	LastTransitionTime time.Time `json:"lastTransitionTime"`
}

// Counters are a resource's running totals, for /status. Prometheus has the
// same numbers with more labels.
type Counters struct {
	Received uint64 `json:"received"`
	Bridged  uint64 `json:"bridged"`
	// Acknowledged counts the inbound messages the bridge settled
	// positively: it called their AckFunc with nil. The driver sends the
	// broker's acknowledgement then or shortly after, so the broker's
	// count may trail this one by what a driver holds back: AMQP
	// coalesces acks for at most a millisecond; pipelined MQTT
	// (acknowledge: received) sends PUBACKs in arrival order every 5 ms,
	// so a message settled early waits for those that came before it. A
	// connection lost before the acknowledgement left makes the broker
	// deliver the message again, which is counted once more.
	Acknowledged uint64 `json:"acknowledged"`
	InFlight     int64  `json:"inFlight"`
	// AwaitingReceipt (inbound, acknowledge: received) counts the
	// messages among InFlight bridged to weida whose copies are not yet
	// all received or lost; the broker still holds them.
	AwaitingReceipt int64             `json:"awaitingReceipt,omitempty"`
	Dropped         map[string]uint64 `json:"dropped,omitempty"` // by reason
	Reconnects      uint64            `json:"reconnects"`
	Subscribers     int               `json:"weidaSubscribers,omitempty"`
	// Held counts the inbound messages that waited, unacknowledged, for a
	// weida subscriber (whenNoSubscriber: hold); HoldingSince is when the
	// current wait began, absent while none is under way.
	Held         uint64    `json:"held,omitempty"`
	HoldingSince time.Time `json:"holdingSince,omitzero"`
	// WeidaGaps (outbound) counts the losses of the weida subscription
	// followed by a new one, WeidaGapSeconds their total length, and
	// LastWeidaGap is the last one, or the one still open.
	WeidaGaps       uint64  `json:"weidaGaps,omitempty"`
	WeidaGapSeconds float64 `json:"weidaGapSeconds,omitempty"`
	LastWeidaGap    *Gap    `json:"lastWeidaGap,omitempty"`
	// Unconfirmed (inbound) counts the weida copies written to a
	// subscriber connection that then vanished without a close: some
	// arrived, some did not, and nobody can tell which.
	Unconfirmed uint64 `json:"weidaCopiesUnconfirmed,omitempty"`
	// SessionsLost counts the connections on which the broker no longer
	// had the session the connector expected to resume (see [Session]);
	// LastSessionLost is when the last one was found.
	SessionsLost    uint64    `json:"sessionsLost,omitempty"`
	LastSessionLost time.Time `json:"lastSessionLost,omitzero"`
	// LastValue is present for an inbound resource keeping a last-value
	// cache.
	LastValue *LastValueCounters `json:"lastValue,omitempty"`
}

// Gap is a time the outbound subscription at the dialled weida endpoint was
// lost: whatever the endpoint published meanwhile did not reach the bridge.
type Gap struct {
	Start time.Time `json:"start"`
	// Seconds is the gap's length; while it is Open, its length so far.
	Seconds float64 `json:"seconds"`
	Open    bool    `json:"open,omitempty"`
}

// RouteStatus is one route of a resource as /status shows it: the filter
// in the broker's grammar and its weida conversion, and what the route
// carried: the messages it bridged and those of its topics dropped (under
// any reason; drops before a route is known, such as no-route, belong to
// no route). They are the route-labelled series of
// weida_connector_messages_bridged_total and _dropped_total.
type RouteStatus struct {
	Name    string `json:"name"`
	Foreign string `json:"foreign"`
	Weida   string `json:"weida"`
	Bridged uint64 `json:"bridged"`
	Dropped uint64 `json:"dropped"`
}

// Status is a snapshot of one resource. Its slices belong to the caller.
type Status struct {
	Name      string `json:"name"`
	Protocol  string `json:"protocol"`
	Direction string `json:"direction"`
	// Broker is the broker URL; it never carries credentials.
	Broker   string `json:"broker,omitempty"`
	Endpoint string `json:"endpoint"`
	// Fingerprint and SubscriberURL describe an inbound resource's hosted
	// endpoint while its listener is up (empty otherwise): the
	// fingerprint subscribers pin, and the weida URL to dial with it
	// pinned. For a listener on a wildcard address (0.0.0.0, ::) the URL
	// names that address: subscribers replace it with one they reach.
	Fingerprint   string        `json:"fingerprint,omitempty"`
	SubscriberURL string        `json:"subscriberURL,omitempty"`
	Routes        []RouteStatus `json:"routes,omitempty"`
	Losses        []string      `json:"losses,omitempty"` // declared losses of the conversion
	Conditions    []Condition   `json:"conditions"`
	Counters      Counters      `json:"counters"`
	// Failure is present while the unit is down after a failed attempt,
	// until another attempt has started.
	Failure *FailureStatus `json:"failure,omitempty"`
	// Placement is present when replicas share the resources through
	// leases: who runs this one. The runtime never sets it; the service
	// does, as it reports its runtime.
	Placement *PlacementStatus `json:"placement,omitempty"`
}

// PlacementStatus is where a resource shared by replicas runs.
type PlacementStatus struct {
	// Role is this replica's part: "holder" (it runs the resource),
	// "standby" (another replica does) or "unheld" (no replica does now).
	Role string `json:"role"`
	// Holder is the identity of the replica that holds the lease; empty
	// when none does.
	Holder string `json:"holder,omitempty"`
	// Epoch is the fencing token of the holding, when this replica is the
	// holder; every change of holder increases it.
	Epoch uint64 `json:"epoch,omitempty"`
	// Standbys are the other live replicas, ready to take over.
	Standbys []string `json:"standbys,omitempty"`
	// Since is when this replica's role last changed.
	Since time.Time `json:"since,omitzero"`
}

// FailureStatus is why a unit is down, and when it is tried again.
type FailureStatus struct {
	Reason        string    `json:"reason"`   // CamelCase, see [Failure]
	Message       string    `json:"message"`  // the error text; never a secret
	Attempts      int       `json:"attempts"` // failed attempts in a row
	Permanent     bool      `json:"permanent,omitempty"`
	LastErrorTime time.Time `json:"lastErrorTime"`
	// NextRetryTime is when the next attempt starts; zero when the
	// failure is permanent.
	NextRetryTime time.Time `json:"nextRetryTime,omitzero"`
}

// Ready reports whether the Ready condition is True.
func (s Status) Ready() bool {
	for _, c := range s.Conditions {
		if c.Type == CondReady {
			return c.Status == "True"
		}
	}
	return false
}

// Indexes of the conditions of a bridge.
const (
	condBroker = 0
	condWeida  = 1
	condReady  = 2
)

// conditions tracks the three conditions of a bridge and its failure.
// Safe for concurrent use.
type conditions struct {
	mu      sync.Mutex
	list    [3]Condition // BrokerConnected, WeidaReady, Ready
	failure *FailureStatus
	now     func() time.Time
}

func newConditions(now func() time.Time) *conditions {
	c := &conditions{now: now}
	t := now()
	c.list[condBroker] = Condition{Type: CondBrokerConnected, Status: "Unknown", Reason: "Starting", LastTransitionTime: t}
	c.list[condWeida] = Condition{Type: CondWeidaReady, Status: "Unknown", Reason: "Starting", LastTransitionTime: t}
	c.list[condReady] = Condition{Type: CondReady, Status: "False", Reason: "Starting", LastTransitionTime: t}
	return c
}

func (c *conditions) get(i int) Condition {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.list[i]
}

func (c *conditions) set(i int, up bool, reason, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.setLocked(i, up, reason, msg)
	c.readyLocked()
}

func (c *conditions) setLocked(i int, up bool, reason, msg string) {
	st := "False"
	if up {
		st = "True"
	}
	cond := &c.list[i]
	if cond.Status != st {
		cond.LastTransitionTime = c.now()
	}
	cond.Status, cond.Reason, cond.Message = st, reason, msg
}

// readyLocked derives Ready: the failure while there is one, else the two
// sides.
func (c *conditions) readyLocked() {
	r := &c.list[condReady]
	rs, rr, rm := "False", "NotReady", ""
	switch {
	case c.failure != nil:
		rr, rm = c.failure.Reason, c.failure.Message
	case c.list[condBroker].Status == "True" && c.list[condWeida].Status == "True":
		rs, rr = "True", "Bridging"
	case c.list[condBroker].Status != "True":
		rr, rm = "BrokerNotConnected", c.list[condBroker].Message
	default:
		rr, rm = "WeidaNotReady", c.list[condWeida].Message
	}
	if r.Status != rs {
		r.LastTransitionTime = c.now()
	}
	r.Status, r.Reason, r.Message = rs, rr, rm
}

// setFailure records f (nil clears it); side, unless -1, is the condition
// that says the same.
func (c *conditions) setFailure(f *FailureStatus, side int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.failure = f
	if f != nil && side >= 0 {
		c.setLocked(side, false, f.Reason, f.Message)
	}
	c.readyLocked()
}

func (c *conditions) snapshot() ([]Condition, *FailureStatus) {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Condition, len(c.list))
	copy(out, c.list[:])
	var f *FailureStatus
	if c.failure != nil {
		cp := *c.failure
		f = &cp
	}
	return out, f
}

// counters are the atomic running totals behind Counters.
type counters struct {
	received, bridged, acked, reconnects, held atomic.Uint64
	unconfirmed                                atomic.Uint64
	sessionsLost                               atomic.Uint64
	inFlight, awaitingReceipt                  atomic.Int64
	mu                                         sync.Mutex
	dropped                                    map[string]uint64

	gapMu        sync.Mutex // guards the fields below
	holdingSince time.Time
	gap          Gap // the last or open gap; zero before the first
	gaps         uint64
	gapSeconds   float64

	sessionMu       sync.Mutex
	sessionKey      string    // the session the last connection was on; "" before one
	lastSessionLost time.Time // guarded by sessionMu
}

// session records a connection's session and reports whether it is a
// lost one: the broker did not resume the session of the same key that an
// earlier connection was on.
func (c *counters) session(s Session, now time.Time) (lost bool) {
	c.sessionMu.Lock()
	defer c.sessionMu.Unlock()
	lost = !s.Resumed && c.sessionKey == s.Key
	c.sessionKey = s.Key
	if lost {
		c.sessionsLost.Add(1)
		c.lastSessionLost = now
	}
	return lost
}

func (c *counters) drop(reason string, n uint64) {
	c.mu.Lock()
	if c.dropped == nil {
		c.dropped = make(map[string]uint64)
	}
	c.dropped[reason] += n
	c.mu.Unlock()
}

func (c *counters) snapshot(now time.Time) Counters {
	s := Counters{
		Received:        c.received.Load(),
		Bridged:         c.bridged.Load(),
		Acknowledged:    c.acked.Load(),
		InFlight:        c.inFlight.Load(),
		AwaitingReceipt: c.awaitingReceipt.Load(),
		Reconnects:      c.reconnects.Load(),
		Held:            c.held.Load(),
		Unconfirmed:     c.unconfirmed.Load(),
		SessionsLost:    c.sessionsLost.Load(),
	}
	c.sessionMu.Lock()
	s.LastSessionLost = c.lastSessionLost
	c.sessionMu.Unlock()
	c.gapMu.Lock()
	s.HoldingSince = c.holdingSince
	s.WeidaGaps, s.WeidaGapSeconds = c.gaps, c.gapSeconds
	if !c.gap.Start.IsZero() {
		g := c.gap
		if g.Open {
			g.Seconds = now.Sub(g.Start).Seconds()
		}
		s.LastWeidaGap = &g
	}
	c.gapMu.Unlock()
	c.mu.Lock()
	if len(c.dropped) > 0 {
		s.Dropped = make(map[string]uint64, len(c.dropped))
		for k, v := range c.dropped {
			s.Dropped[k] = v
		}
	}
	c.mu.Unlock()
	return s
}

// subscriberURL is the URL a subscriber dials to reach path on l, which
// listens on listen (host:port as the resource writes it): l's
// fingerprint pinned, and the port l was given when listen asked for any.
func subscriberURL(listen, path string, l *weida.Listener) string {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return ""
	}
	ua, ok := l.Addr().(*net.UDPAddr)
	if !ok {
		return ""
	}
	if host == "" {
		host = ua.IP.String()
	}
	return address.Address{Fingerprint: l.Fingerprint(), Host: host, Port: ua.Port, Path: path}.String()
}
