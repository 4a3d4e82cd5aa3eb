package amqp

import (
	"fmt"
	"reflect"
	"strings"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

// Options are the AMQP 0-9-1 settings of a resource (spec.broker.amqp and
// the URL's virtual host, defaults applied), as [Driver] stores them in
// resources.Broker.Options.
type Options struct {
	// VHost is the virtual host: the URL's path, "/" when it has none.
	VHost string
	// Exchange is the topic exchange routes bind to (inbound) or publish
	// to (outbound).
	Exchange string
	// ExchangePassive uses Exchange as it already exists (a passive
	// declare) instead of declaring it; while it is missing the resource
	// reports DeclarationRefused and is retried.
	ExchangePassive bool
	// Queue is the queue an inbound resource consumes; zero for outbound.
	// An empty Name asks the broker to name it; such a queue is exclusive
	// and not durable.
	Queue Queue
	// Prefetch bounds unacknowledged deliveries (inbound); 0 for outbound.
	Prefetch int
}

// OptionsOf returns c's AMQP options; ok is false when c is not a bound
// AMQP resource.
func OptionsOf(c *resources.Connector) (o Options, ok bool) {
	o, ok = c.Broker.Options.(Options)
	return o, ok
}

// Driver is the AMQP 0-9-1 protocol (RabbitMQ topic exchanges): how
// resources write it and how the connector bridges it. It is stateless;
// the program lists it among its drivers.
var Driver driver

type driver struct{}

type rawOptions struct {
	Exchange        string    `yaml:"exchange" validate:"omitempty,amqpname" doc:"the topic exchange (default amq.topic)"`
	ExchangePassive bool      `yaml:"exchangePassive" doc:"use the exchange as it exists (a passive declare) instead of declaring it"`
	Queue           *rawQueue `yaml:"queue" doc:"inbound only: the queue bound to the exchange with the routes"`
	Prefetch        *int      `yaml:"prefetch" validate:"omitempty,min=1,max=65535" doc:"inbound only: unacknowledged deliveries in flight (default limits.inFlight)"`
}

type rawQueue struct {
	Name      string `yaml:"name" validate:"omitempty,amqpname" doc:"the queue's name; the broker names it when left out"`
	Type      string `yaml:"type" validate:"omitempty,oneof=classic quorum" doc:"classic (default) or quorum; a quorum queue is named, durable and not exclusive"`
	Passive   bool   `yaml:"passive" doc:"use the named queue as it exists instead of declaring it"`
	Durable   bool   `yaml:"durable" doc:"keep the queue and its messages while the connector is away; needs a name"`
	Exclusive *bool  `yaml:"exclusive" doc:"delete the queue with its connection; default true when unnamed, false when named"`
}

// isName: AMQP 0-9-1 exchange and queue names: at most 255 bytes of
// letters, digits, '-', '_', '.' and ':'.
func isName(s string) bool {
	if len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte("-_.:", c) >= 0) {
			return false
		}
	}
	return true
}

// schema is a function so that its rules cannot be changed at run time.
func schema() resources.Schema {
	return resources.Schema{Rules: map[string]resources.Rule{
		"amqpname": {
			Valid: func(v reflect.Value) bool { return isName(v.String()) },
			JSON:  map[string]any{"pattern": "[-A-Za-z0-9_.:]{0,255}"},
			Explain: func(string) (string, string, string) {
				return "amqpname", "must be at most 255 bytes of letters, digits, '-', '_', '.' and ':'", ""
			},
		},
	}}
}

func (driver) Name() policy.Protocol { return policy.AMQP }

func (driver) URL() resources.URLRules {
	return resources.URLRules{Scheme: "amqp", TLSScheme: "amqps", Port: 5672, TLSPort: 5671, Path: "virtual host"}
}

func (driver) Policies() []policy.Policy { return []policy.Policy{policy.AMQPWordsV1()} }

func (driver) DescribeOptions(policy.Options) string { return "" }

func (driver) Settings() []policy.Setting { return nil }

// BrokerSchema returns what Broker decodes spec.broker.amqp with.
func (driver) BrokerSchema() (any, resources.Schema) { return new(rawOptions), schema() }

func (driver) Broker(b *resources.BrokerBlock) resources.BrokerOptions {
	var ra rawOptions
	b.Decode(&ra, schema())
	if !b.Binding() {
		return resources.BrokerOptions{}
	}
	if cr, ok := b.Credentials(); ok {
		checkCredentials(b, cr)
	}
	a := Options{Exchange: DefaultExchange, VHost: "/"}
	out := resources.BrokerOptions{PolicyOK: true, LastValues: resources.LastValues{
		Why: "an AMQP queue keeps nothing for later consumers: each message goes to one consumer and is gone once acknowledged",
	}}
	if p := b.BrokerPath(); p != "" {
		a.VHost = p
	}
	dir, dirOK := b.Direction()
	inbound := dirOK && dir == policy.Inbound
	if inbound {
		a.Queue = Queue{Exclusive: true}
		a.Prefetch = b.Limits().InFlight
	}
	if !b.Present() {
		out.Options = a
		return out
	}
	const base = "spec.broker.amqp"
	if ra.Exchange != "" {
		a.Exchange = ra.Exchange
	}
	a.ExchangePassive = ra.ExchangePassive
	b.DirectionOnly(base+".queue", ra.Queue != nil, policy.Inbound, "an outbound resource publishes to the exchange and reads no queue")
	b.DirectionOnly(base+".prefetch", ra.Prefetch != nil, policy.Inbound, "prefetch bounds deliveries from a queue; an outbound resource reads none (limits.inFlight bounds its confirms)")
	if ra.Prefetch != nil && inbound && b.OK(base+".prefetch") {
		a.Prefetch = *ra.Prefetch
	}
	if ra.Queue != nil && inbound {
		a.Queue = bindQueue(b, ra.Queue)
	}
	out.Options = a
	out.Hold = hold(a.Queue)
	return out
}

// hold says whether the queue keeps what the connector does not
// acknowledge while the connector is away. An exclusive queue holds
// unacknowledged messages only while the connection lasts: a restart or a
// broken connection deletes it with everything it held, so hold is refused
// there rather than promising what it cannot keep. A named queue outlives
// the connection (and, durable, a broker restart); a passive one is taken
// as declared.
func hold(q Queue) resources.Hold {
	if q.Exclusive {
		return resources.Hold{
			Why:  "an exclusive queue (the default, and every unnamed queue) is deleted with the connector's connection, and what it held with it",
			Hint: "name a queue that outlives the connection: queue: {name: NAME, durable: true}",
		}
	}
	return resources.Hold{OK: true}
}

func bindQueue(b *resources.BrokerBlock, q *rawQueue) Queue {
	const qp = "spec.broker.amqp.queue"
	out := Queue{Name: q.Name, Quorum: q.Type == "quorum", Passive: q.Passive, Durable: q.Durable, Exclusive: q.Name == ""}
	if q.Exclusive != nil {
		out.Exclusive = *q.Exclusive
	}
	if q.Passive {
		// The queue's properties are the existing queue's own.
		out.Exclusive = false
		switch {
		case q.Name == "":
			b.Fail(qp+".passive", b.At(qp+".passive"), "true", "amqp-queue",
				"needs a queue name: passive uses a queue that already exists", "name the queue: queue: {name: orders, passive: true}")
		case q.Type != "" || q.Durable || q.Exclusive != nil:
			b.Fail(qp+".passive", b.At(qp+".passive"), "true", "amqp-queue",
				"uses the queue as it was declared, so type, durable and exclusive would be ignored",
				"remove type, durable and exclusive, or passive")
		}
		return out
	}
	switch {
	case out.Quorum && (q.Name == "" || !q.Durable || out.Exclusive):
		b.Fail(qp+".type", b.At(qp+".type"), q.Type, "amqp-queue",
			"needs a named, durable, non-exclusive queue: RabbitMQ replicates a quorum queue and keeps it across restarts",
			"write queue: {name: weida-orders, type: quorum, durable: true, exclusive: false}")
	case strings.HasPrefix(q.Name, "amq."):
		b.Fail(qp+".name", b.At(qp+".name"), q.Name, "amqp-reserved-name",
			`starts with "amq.", which the broker reserves for its own queues`, "choose another name")
	case q.Name == "" && q.Durable:
		b.Fail(qp+".durable", b.At(qp+".durable"), "true", "amqp-queue",
			"needs a queue name: a queue the broker names is gone once the connection closes",
			"name the queue: queue: {name: weida-orders, durable: true}")
	case q.Name == "" && !out.Exclusive:
		b.Fail(qp+".exclusive", b.At(qp+".exclusive"), "false", "amqp-queue",
			"needs a queue name: only the connection that declared a broker-named queue can use it",
			"name the queue, or remove exclusive")
	case q.Durable && out.Exclusive:
		b.Fail(qp+".exclusive", b.At(qp+".exclusive"), "true", "amqp-queue",
			"contradicts durable: an exclusive queue is deleted when its connection closes, so what it held is lost on a restart",
			"write exclusive: false to keep the queue across restarts")
	}
	return out
}

// Credentials: username and password, AMQP 0-9-1 PLAIN.
func (driver) Credentials() []resources.CredentialKind {
	return []resources.CredentialKind{{Name: "password", Doc: "the password, by reference: {env: NAME} or {file: PATH}", Label: "password"}}
}

// checkCredentials applies AMQP's rules: username and password, both or
// neither.
func checkCredentials(b *resources.BrokerBlock, cr resources.Credentials) {
	const base = "spec.broker.credentials"
	if cr.Username != "" && cr.Secret("password").IsZero() && b.OK(base+".password") {
		b.Fail(base+".username", b.KeyAt(base+".username"), cr.Username, "credentials-incomplete",
			"is set without a password, which amqp requires", "add password: {env: NAME}")
	}
}

// CheckSet refuses two resources consuming one queue: RabbitMQ would
// deliver each message to only one of them.
func (driver) CheckSet(s *resources.SetCheck) {
	queue := func(c *resources.Connector) string { o, _ := OptionsOf(c); return o.Queue.Name }
	for _, g := range s.GroupBy(s.Connectors(), func(c *resources.Connector) string {
		o, _ := OptionsOf(c)
		if o.Queue.Name == "" || resources.BrokerKey(c) == "" {
			return ""
		}
		return resources.BrokerKey(c) + "\x00" + o.VHost + "\x00" + o.Queue.Name
	}) {
		s.Report(g, resources.Conflict{
			Field: func(*resources.Connector) string { return "spec.broker.amqp.queue.name" },
			Value: queue,
			Rule:  "broker-queue-duplicate",
			Message: func(others string) string {
				return "is also the queue of " + others + ": RabbitMQ would deliver each message to only one of the two resources"
			},
			Hint: "give each resource its own queue name",
		})
	}
}

// Summary describes how c reads or writes RabbitMQ, for `connector check`.
func (driver) Summary(c *resources.Connector) string {
	a, _ := OptionsOf(c)
	s := "exchange " + a.Exchange
	if a.ExchangePassive {
		s += " (passive)"
	}
	if c.Direction != policy.Inbound {
		return s + ", publisher confirms"
	}
	q := a.Queue.Name
	if q == "" {
		q = "named by the broker"
	}
	var attrs []string
	if a.Queue.Durable {
		attrs = append(attrs, "durable")
	}
	if a.Queue.Exclusive {
		attrs = append(attrs, "exclusive")
	}
	if len(attrs) > 0 {
		q += " (" + strings.Join(attrs, ", ") + ")"
	}
	return s + fmt.Sprintf(", queue %s, prefetch %d", q, a.Prefetch)
}

// Source returns the factory of an inbound resource's Source.
func (driver) Source(bc resources.BrokerConfig) connectors.SourceFactory {
	cfg := configOf(bc)
	return func(report connectors.StateFunc) (connectors.Source, error) { return NewSource(cfg, report) }
}

// Sink returns the factory of an outbound resource's Sink.
func (driver) Sink(bc resources.BrokerConfig) connectors.SinkFactory {
	cfg := configOf(bc)
	return func(report connectors.StateFunc) (connectors.Sink, error) { return NewSink(cfg, report) }
}

// configOf maps a loaded resource onto a Config.
func configOf(bc resources.BrokerConfig) Config {
	c := bc.Resource
	o, _ := OptionsOf(c)
	return Config{
		Host:            c.Broker.Host,
		Port:            c.Broker.Port,
		VHost:           o.VHost,
		TLS:             bc.BrokerTLS(),
		Username:        bc.Credentials.Username,
		Password:        bc.Credentials.Secret("password").Reveal(),
		Exchange:        o.Exchange,
		ExchangePassive: o.ExchangePassive,
		Queue:           o.Queue,
		Prefetch:        o.Prefetch,
		ConnectionName:  c.Broker.ClientID,
		LoopMarker:      bc.LoopMarker,
		Logger:          bc.Logger,
	}
}
