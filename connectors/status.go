package connectors

import (
	"sync"
	"sync/atomic"
	"time"
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
	Received     uint64            `json:"received"`
	Bridged      uint64            `json:"bridged"`
	Acknowledged uint64            `json:"acknowledged"`
	InFlight     int64             `json:"inFlight"`
	Dropped      map[string]uint64 `json:"dropped,omitempty"` // by reason
	Reconnects   uint64            `json:"reconnects"`
	Subscribers  int               `json:"weidaSubscribers,omitempty"`
}

// RouteStatus is one route of a resource as /status shows it: the filter
// in the broker's grammar and its weida conversion.
type RouteStatus struct {
	Name    string `json:"name"`
	Foreign string `json:"foreign"`
	Weida   string `json:"weida"`
}

// Status is a snapshot of one resource. Its slices belong to the caller.
type Status struct {
	Name      string `json:"name"`
	Protocol  string `json:"protocol"`
	Direction string `json:"direction"`
	// Broker is the broker URL; it never carries credentials.
	Broker     string        `json:"broker,omitempty"`
	Endpoint   string        `json:"endpoint"`
	Routes     []RouteStatus `json:"routes,omitempty"`
	Losses     []string      `json:"losses,omitempty"` // declared losses of the conversion
	Conditions []Condition   `json:"conditions"`
	Counters   Counters      `json:"counters"`
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

// conditions tracks the three conditions of a bridge. Safe for concurrent
// use.
type conditions struct {
	mu   sync.Mutex
	list [3]Condition // BrokerConnected, WeidaReady, Ready
	now  func() time.Time
}

func newConditions(now func() time.Time) *conditions {
	c := &conditions{now: now}
	t := now()
	c.list[0] = Condition{Type: CondBrokerConnected, Status: "Unknown", Reason: "Starting", LastTransitionTime: t}
	c.list[1] = Condition{Type: CondWeidaReady, Status: "Unknown", Reason: "Starting", LastTransitionTime: t}
	c.list[2] = Condition{Type: CondReady, Status: "False", Reason: "Starting", LastTransitionTime: t}
	return c
}

func (c *conditions) set(i int, up bool, reason, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st := "False"
	if up {
		st = "True"
	}
	cond := &c.list[i]
	if cond.Status != st {
		cond.LastTransitionTime = c.now()
	}
	cond.Status, cond.Reason, cond.Message = st, reason, msg
	// Ready follows the two sides.
	ready := c.list[0].Status == "True" && c.list[1].Status == "True"
	r := &c.list[2]
	rs, rr, rm := "False", "NotReady", ""
	switch {
	case ready:
		rs, rr = "True", "Bridging"
	case c.list[0].Status != "True":
		rr, rm = "BrokerNotConnected", c.list[0].Message
	default:
		rr, rm = "WeidaNotReady", c.list[1].Message
	}
	if r.Status != rs {
		r.LastTransitionTime = c.now()
	}
	r.Status, r.Reason, r.Message = rs, rr, rm
}

// fail marks the resource as failed for good (it stays visible).
func (c *conditions) fail(reason, msg string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := &c.list[2]
	if r.Status != "False" {
		r.LastTransitionTime = c.now()
	}
	r.Status, r.Reason, r.Message = "False", reason, msg
}

func (c *conditions) snapshot() []Condition {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([]Condition, len(c.list))
	copy(out[:], c.list[:])
	return out
}

// counters are the atomic running totals behind Counters.
type counters struct {
	received, bridged, acked, reconnects atomic.Uint64
	inFlight                             atomic.Int64
	mu                                   sync.Mutex
	dropped                              map[string]uint64
}

func (c *counters) drop(reason string, n uint64) {
	c.mu.Lock()
	if c.dropped == nil {
		c.dropped = make(map[string]uint64)
	}
	c.dropped[reason] += n
	c.mu.Unlock()
}

func (c *counters) snapshot() Counters {
	s := Counters{
		Received:     c.received.Load(),
		Bridged:      c.bridged.Load(),
		Acknowledged: c.acked.Load(),
		InFlight:     c.inFlight.Load(),
		Reconnects:   c.reconnects.Load(),
	}
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
