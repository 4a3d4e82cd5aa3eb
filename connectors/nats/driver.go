package nats

import (
	"fmt"
	"reflect"
	"strings"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

// Options are the NATS settings of a resource (spec.broker.nats), as
// [Driver] stores them in resources.Broker.Options.
type Options struct {
	// QueueGroup, when set (inbound, core NATS only), makes replicas split
	// the messages.
	QueueGroup string
	// JetStream is nil for core NATS. Its Durable is "" for outbound
	// resources, which publish with acks.
	JetStream *JetStream
}

// OptionsOf returns c's NATS options; ok is false when c is not a bound
// NATS resource.
func OptionsOf(c *resources.Connector) (o Options, ok bool) {
	o, ok = c.Broker.Options.(Options)
	return o, ok
}

// Driver is the NATS protocol (core NATS and JetStream): how resources
// write it and how the connector bridges it. It is stateless; the program
// lists it among its drivers.
var Driver driver

type driver struct{}

type rawOptions struct {
	QueueGroup string        `yaml:"queueGroup" validate:"omitempty,natsname" doc:"inbound, core NATS only: replicas in one queue group split the messages"`
	JetStream  *rawJetStream `yaml:"jetstream" doc:"use JetStream instead of core NATS (which is at most once)"`
}

type rawJetStream struct {
	Stream  string `yaml:"stream" validate:"required,jsname" doc:"the stream consumed from (inbound) or whose acks confirm a publish (outbound)"`
	Durable string `yaml:"durable" validate:"omitempty,jsname" doc:"inbound only, and required there: the durable consumer"`
}

// schema is a function so that its rules cannot be changed at run time.
func schema() resources.Schema {
	str := func(f func(string) bool) func(reflect.Value) bool {
		return func(v reflect.Value) bool { return f(v.String()) }
	}
	return resources.Schema{
		Rules: map[string]resources.Rule{
			"natsname": {
				Valid: str(func(s string) bool { return resources.IsPrintable(s) && !strings.ContainsAny(s, " \t*>") }),
				JSON:  map[string]any{"pattern": `[^ \t*>]+`},
				Explain: func(string) (string, string, string) {
					return "natsname", "must be printable text without whitespace, '*' or '>'", ""
				},
			},
			"jsname": {
				Valid: str(func(s string) bool {
					return len(s) <= 255 && resources.IsPrintable(s) && !strings.ContainsAny(s, " \t.*>/\\")
				}),
				JSON: map[string]any{"pattern": `[^ \t.*>/\\]+`},
				Explain: func(string) (string, string, string) {
					return "jsname", "must be a JetStream name: printable, without whitespace, '.', '*', '>', '/' or '\\'", ""
				},
			},
		},
		RequiredHints: map[string]string{
			"spec.broker.nats.jetstream.stream": "name the JetStream stream: jetstream: {stream: ORDERS, durable: connector}",
		},
	}
}

func (driver) Name() policy.Protocol { return policy.NATS }

func (driver) URL() resources.URLRules {
	return resources.URLRules{Scheme: "nats", TLSScheme: "tls", Port: 4222, TLSPort: 4222}
}

// Policies lists nats-tokens/v1 first, the default, and the opt-in
// nats-tokens-tail/v1, which a resource must name to bridge X.> routes.
func (driver) Policies() []policy.Policy {
	return []policy.Policy{policy.NATSTokensV1(), policy.NATSTail()}
}

func (driver) DescribeOptions(o policy.Options) string {
	if o.JetStream {
		return "JetStream"
	}
	return "core NATS"
}

func (driver) Settings() []policy.Setting {
	return []policy.Setting{policy.BoolSetting("jetstream", "the bridge would use JetStream; changes the losses",
		func(o *policy.Options, v bool) { o.JetStream = v })}
}

// BrokerSchema returns what Broker decodes spec.broker.nats with.
func (driver) BrokerSchema() (any, resources.Schema) { return new(rawOptions), schema() }

func (driver) Broker(b *resources.BrokerBlock) resources.BrokerOptions {
	var raw rawOptions
	b.Decode(&raw, schema())
	if !b.Binding() {
		return resources.BrokerOptions{}
	}
	if cr, ok := b.Credentials(); ok {
		checkCredentials(b, cr)
	}
	n := Options{}
	out := resources.BrokerOptions{PolicyOK: true, Hold: resources.Hold{
		Why:  "core NATS delivers each message once, to whoever is subscribed, and keeps nothing",
		Hint: "read from a JetStream stream: jetstream: {stream: NAME, durable: weida-connector}",
	}, LastValues: resources.LastValues{
		Why:  "core NATS keeps nothing (a JetStream stream keeps the last message of each subject)",
		Hint: "write mode: all to cache every message bridged, or read from a JetStream stream",
	}}
	const base = "spec.broker.nats"
	n.QueueGroup = raw.QueueGroup
	b.DirectionOnly(base+".queueGroup", raw.QueueGroup != "", policy.Inbound,
		"a queue group splits what the server delivers among subscribers; an outbound resource only publishes")
	if rj := raw.JetStream; rj != nil {
		n.JetStream = &JetStream{Stream: rj.Stream, Durable: rj.Durable}
		out.Policy.JetStream = true
		// The durable consumer keeps what is not acknowledged, across
		// the connector's restarts.
		out.Hold = resources.Hold{OK: true}
		// The stream keeps the last message of each subject; the
		// source reads them when it starts.
		out.LastValues = resources.LastValues{OK: true}
		js := base + ".jetstream"
		if raw.QueueGroup != "" {
			b.Fail(base+".queueGroup", b.KeyAt(base+".queueGroup"), raw.QueueGroup, "jetstream-queue-group",
				"applies to core NATS only; with jetstream, replicas share the durable consumer",
				"remove queueGroup; replicas that name the same durable split the messages")
		}
		if dir, ok := b.Direction(); ok {
			switch dir {
			case policy.Inbound:
				if rj.Durable == "" {
					b.Fail(js+".durable", b.KeyAt(js+".durable"), "", "required",
						"is required for an inbound resource: the durable consumer remembers what was acknowledged across restarts",
						"durable: weida-connector")
				}
			case policy.Outbound:
				b.DirectionOnly(js+".durable", rj.Durable != "", policy.Inbound,
					"an outbound resource publishes to the stream and waits for its acks; it consumes nothing")
			}
		}
	}
	out.Options = n
	return out
}

// Credentials: NATS authenticates with a user and password, a token, an
// NKey seed or a .creds file (JWT and seed).
func (driver) Credentials() []resources.CredentialKind {
	return []resources.CredentialKind{
		{Name: "password", Doc: "the password, by reference: {env: NAME} or {file: PATH}", Label: "password"},
		{Name: "token", Doc: "a NATS token, by reference", Label: "token"},
		{Name: "nkeySeed", Doc: "a NATS NKey seed, by reference", Label: "NKey seed"},
		{Name: "creds", Doc: "a NATS .creds file (JWT and seed), by reference", Label: "credentials"},
	}
}

// checkCredentials applies NATS's rules: a password needs a username, and
// one method only.
func checkCredentials(b *resources.BrokerBlock, cr resources.Credentials) {
	const base = "spec.broker.credentials"
	if cr.Username != "" && cr.Secret("password").IsZero() && b.OK(base+".password") {
		b.Fail(base+".username", b.KeyAt(base+".username"), cr.Username, "credentials-incomplete",
			"is set without a password, which nats requires", "add password: {env: NAME}")
	}
	var methods []string
	if cr.Username != "" || !cr.Secret("password").IsZero() {
		methods = append(methods, "username/password")
	}
	for _, name := range []string{"token", "nkeySeed", "creds"} {
		if !cr.Secret(name).IsZero() {
			methods = append(methods, name)
		}
	}
	if len(methods) > 1 {
		b.Fail(base, b.KeyAt(base), "", "credentials-conflict",
			"names more than one way to authenticate: "+strings.Join(methods, ", "),
			"keep one: username and password, token, nkeySeed, or creds")
	}
}

// CheckSet refuses two resources with one durable consumer on one stream:
// the server would split the messages between them.
func (driver) CheckSet(s *resources.SetCheck) {
	durable := func(c *resources.Connector) string {
		o, _ := OptionsOf(c)
		if o.JetStream == nil {
			return ""
		}
		return o.JetStream.Durable
	}
	for _, g := range s.GroupBy(s.Connectors(), func(c *resources.Connector) string {
		o, _ := OptionsOf(c)
		if durable(c) == "" || resources.BrokerKey(c) == "" {
			return ""
		}
		return resources.BrokerKey(c) + "\x00" + o.JetStream.Stream + "\x00" + durable(c)
	}) {
		s.Report(g, resources.Conflict{
			Field: func(*resources.Connector) string { return "spec.broker.nats.jetstream.durable" },
			Value: durable,
			Rule:  "broker-consumer-duplicate",
			Message: func(others string) string {
				return "is also the durable consumer of " + others + " on the same stream: the server would split the messages between the two resources"
			},
			Hint: "give each resource its own durable name",
		})
	}
}

// Summary describes how c reads or writes NATS, for `connector check`.
func (driver) Summary(c *resources.Connector) string {
	n, _ := OptionsOf(c)
	var parts []string
	switch {
	case n.JetStream != nil && n.JetStream.Durable != "":
		parts = append(parts, fmt.Sprintf("JetStream stream %s, durable %s", n.JetStream.Stream, n.JetStream.Durable))
	case n.JetStream != nil:
		parts = append(parts, fmt.Sprintf("JetStream stream %s", n.JetStream.Stream))
	default:
		parts = append(parts, "core NATS")
	}
	if n.QueueGroup != "" {
		parts = append(parts, "queue group "+n.QueueGroup)
	}
	return strings.Join(parts, "; ")
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
	c, creds := bc.Resource, bc.Credentials
	cfg := Config{
		Host:       c.Broker.Host,
		Port:       c.Broker.Port,
		TLS:        bc.BrokerTLS(),
		Name:       c.Broker.ClientID,
		User:       creds.Username,
		Password:   creds.Secret("password").Reveal(),
		Token:      creds.Secret("token").Reveal(),
		NKeySeed:   creds.Secret("nkeySeed").Reveal(),
		LoopMarker: bc.LoopMarker,
		Logger:     bc.Logger,
	}
	if cf := creds.Secret("creds"); !cf.IsZero() {
		cfg.Creds = []byte(cf.Reveal())
	}
	if o, ok := OptionsOf(c); ok {
		cfg.QueueGroup = o.QueueGroup
		if js := o.JetStream; js != nil {
			cfg.JetStream = &JetStream{Stream: js.Stream, Durable: js.Durable}
		}
	}
	if c.Direction == policy.Inbound && c.Limits.InFlight > 0 {
		// A new durable consumer delivers no more than the runtime may
		// hold unsettled.
		cfg.MaxAckPending = c.Limits.InFlight
	}
	return cfg
}
