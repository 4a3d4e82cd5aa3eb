package mqtt

import (
	"fmt"
	"reflect"
	"strconv"
	"strings"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

// Defaults of spec.broker.mqtt; docs/RESOURCES.md documents them.
const (
	DefaultQoS           = 1         // qos
	DefaultSessionExpiry = time.Hour // sessionExpiry
)

// Options are the MQTT 5 settings of a resource (spec.broker.mqtt, defaults
// applied), as [Driver] stores them in resources.Broker.Options.
type Options struct {
	QoS           byte          // 0 or 1
	CleanStart    bool          // false: resume the session named by the client id
	SessionExpiry time.Duration // whole seconds; how long the broker keeps the session after a disconnect
	// SharedGroup, when set (inbound only), makes every subscription
	// $share/SharedGroup/filter, so that replicas split the messages.
	SharedGroup string
	// Retain (outbound only) publishes every message with the retain
	// flag, so that the broker keeps the last one of each topic for
	// MQTT subscribers that come later.
	Retain bool
}

// OptionsOf returns c's MQTT options; ok is false when c is not a bound
// MQTT resource.
func OptionsOf(c *resources.Connector) (o Options, ok bool) {
	o, ok = c.Broker.Options.(Options)
	return o, ok
}

// Driver is the MQTT 5 protocol: how resources write it and how the
// connector bridges it. It is stateless; the program lists it among its
// drivers.
var Driver driver

type driver struct{}

type rawOptions struct {
	QoS           *int                `yaml:"qos" validate:"omitempty,mqttqos" doc:"0 or 1 (default 1); 2 is refused: weida cannot keep exactly-once"`
	CleanStart    *bool               `yaml:"cleanStart" doc:"false (default) resumes the session named by clientID after a reconnect or restart"`
	SessionExpiry *resources.Duration `yaml:"sessionExpiry" validate:"omitempty,sessionexpiry" doc:"how long the broker keeps the session while the connector is away, in whole seconds (default 1h)"`
	SharedGroup   string              `yaml:"sharedGroup" validate:"omitempty,sharename" doc:"inbound only: subscribe $share/<group>/<filter> so that replicas split the messages"`
	Retain        *bool               `yaml:"retain" doc:"outbound only: publish with the retain flag, so that late MQTT subscribers get the last value"`
}

// schema is a function so that its rules cannot be changed at run time.
func schema() resources.Schema {
	return resources.Schema{Rules: map[string]resources.Rule{
		"mqttqos": {
			Valid: func(v reflect.Value) bool { q := v.Int(); return q == 0 || q == 1 },
			JSON:  map[string]any{"enum": []int{0, 1}},
			Explain: func(value string) (string, string, string) {
				hint := "write qos: 1 (at least once from the broker) or qos: 0 (and state the at-most-once loss)"
				if value == "2" {
					return "mqtt-qos-2", "QoS 2 is refused: exactly-once delivery cannot be kept across weida, which delivers at most once to each subscriber", hint
				}
				return "mqtt-qos", "must be 0 or 1", hint
			},
		},
		"sessionexpiry": {
			Valid: func(v reflect.Value) bool {
				d := time.Duration(v.Int())
				return d >= 0 && d%time.Second == 0 && d/time.Second <= 1<<32-1
			},
			Explain: func(string) (string, string, string) {
				return "sessionexpiry", "must be a whole number of seconds from 0s to 4294967295s (MQTT 5 Session Expiry Interval)", "for example 1h"
			},
		},
		"sharename": {
			Valid: func(v reflect.Value) bool {
				s := v.String()
				return resources.IsPrintable(s) && !strings.ContainsAny(s, "/+#")
			},
			JSON: map[string]any{"pattern": "[^/+#]+"},
			Explain: func(string) (string, string, string) {
				return "sharename", "must be printable text without '/', '+' or '#' (MQTT 5 §4.8.2)", ""
			},
		},
	}}
}

func (driver) Name() policy.Protocol { return policy.MQTT }

func (driver) URL() resources.URLRules {
	return resources.URLRules{Scheme: "mqtt", TLSScheme: "mqtts", Port: 1883, TLSPort: 8883}
}

func (driver) Policies() []policy.Policy {
	return []policy.Policy{policy.MQTTLevelsV1(), policy.MQTTLevelsEscapedV1()}
}

func (driver) DescribeOptions(o policy.Options) string {
	if o.LastValue {
		return fmt.Sprintf("QoS %d, last-value cache", o.QoS)
	}
	return fmt.Sprintf("QoS %d", o.QoS)
}

func (driver) Settings() []policy.Setting {
	return []policy.Setting{{
		Name: "qos", Usage: "the QoS the bridge would use (0 or 1); changes the losses", Values: "0|1", Default: "1",
		Apply: func(o *policy.Options, v string) error {
			q, err := strconv.Atoi(v)
			if err != nil || (q != 0 && q != 1) {
				return fmt.Errorf("must be 0 or 1, not %s", v)
			}
			o.QoS = q
			return nil
		},
	}, policy.BoolSetting("last-value", "the inbound resource keeps a last-value cache (spec.lastValue); removes the retain loss",
		func(o *policy.Options, v bool) { o.LastValue = v }),
	}
}

// BrokerSchema returns what Broker decodes spec.broker.mqtt with.
func (driver) BrokerSchema() (any, resources.Schema) { return new(rawOptions), schema() }

func (driver) Broker(b *resources.BrokerBlock) resources.BrokerOptions {
	var raw rawOptions
	b.Decode(&raw, schema())
	if !b.Binding() {
		return resources.BrokerOptions{}
	}
	base := b.Path()
	m := Options{QoS: DefaultQoS, SessionExpiry: DefaultSessionExpiry}
	optsOK := true
	if raw.QoS != nil {
		if b.OK(base + ".qos") {
			m.QoS = byte(*raw.QoS)
		} else {
			optsOK = false
		}
	}
	if raw.CleanStart != nil {
		m.CleanStart = *raw.CleanStart
	}
	if raw.SessionExpiry != nil {
		m.SessionExpiry = time.Duration(*raw.SessionExpiry)
	}
	m.SharedGroup = raw.SharedGroup
	b.DirectionOnly(base+".sharedGroup", raw.SharedGroup != "", policy.Inbound,
		"a shared subscription splits what the broker delivers among subscribers; an outbound resource only publishes")
	if raw.Retain != nil {
		m.Retain = *raw.Retain
		b.DirectionOnly(base+".retain", true, policy.Outbound,
			"an inbound resource receives retained messages; to replay them to late weida subscribers, set spec.lastValue")
	}
	return resources.BrokerOptions{Options: m, Policy: policy.Options{QoS: int(m.QoS)}, PolicyOK: optsOK, Hold: hold(m), LastValues: lastValues(m)}
}

// lastValues says whether the source receives the broker's retained
// messages. A shared subscription must not (MQTT 5 §4.8.2, §3.8.3.1):
// a conforming broker would seed the cache with nothing, and Mosquitto
// 2.0.11, which sends them anyway, would seed it with values the standard
// says the connector never gets. So the two are refused together rather
// than left to the broker.
func lastValues(m Options) resources.LastValues {
	if m.SharedGroup != "" {
		return resources.LastValues{
			Why:  "spec.broker.mqtt.sharedGroup subscribes to a shared subscription, to which MQTT 5 forbids sending retained messages (§4.8.2): a conforming broker seeds nothing (Mosquitto 2.0.11 sends them anyway)",
			Hint: "remove sharedGroup so that the connector receives the retained messages, or write mode: all to cache the messages this replica bridges",
		}
	}
	return resources.LastValues{OK: true}
}

// hold says whether the broker keeps what the connector does not
// acknowledge, also while it is away: QoS 1 or 2 messages of a session
// that outlives the connection.
func hold(m Options) resources.Hold {
	switch {
	case m.QoS == 0:
		return resources.Hold{Why: "at QoS 0 the broker neither waits for an acknowledgement nor sends a message again",
			Hint: "set spec.broker.mqtt.qos: 1"}
	case m.CleanStart:
		return resources.Hold{Why: "cleanStart: true discards the session, and what it held, at every connection",
			Hint: "set spec.broker.mqtt.cleanStart: false"}
	case m.SessionExpiry <= 0:
		return resources.Hold{Why: "a session expiry of 0 ends the session, and what it held, with the connection",
			Hint: "set spec.broker.mqtt.sessionExpiry to how long the broker should keep messages for the connector, e.g. 1h"}
	}
	return resources.Hold{OK: true}
}

// Credentials: username and password, MQTT 5's only method.
func (driver) Credentials() []resources.CredentialKind {
	return []resources.CredentialKind{{Name: "password", Doc: "the password, by reference: {env: NAME} or {file: PATH}", Label: "password"}}
}

// CheckSet refuses two resources with one client id on one broker: each
// connection would make the broker disconnect the other, over and over.
func (driver) CheckSet(s *resources.SetCheck) {
	cs := s.Connectors()
	for _, g := range s.GroupBy(cs, func(c *resources.Connector) string {
		if resources.BrokerKey(c) == "" || c.Broker.ClientID == "" {
			return ""
		}
		return resources.BrokerKey(c) + "\x00" + c.Broker.ClientID
	}) {
		addr := g[0].Broker.Addr()
		s.Report(g, resources.Conflict{
			// Point at metadata.name when the client id defaulted to it.
			Field: func(c *resources.Connector) string {
				if s.Written(c, "spec.broker.clientID") {
					return "spec.broker.clientID"
				}
				return "metadata.name"
			},
			Value: func(c *resources.Connector) string { return c.Broker.ClientID },
			Rule:  "broker-client-id-duplicate",
			Message: func(others string) string {
				return fmt.Sprintf("is also the MQTT client id of %s on %s: each connection would make the broker disconnect the other, over and over", others, addr)
			},
			Hint: "give each resource its own spec.broker.clientID (it defaults to metadata.name)",
		})
	}
}

// Summary describes c's MQTT session for `connector check`.
func (driver) Summary(c *resources.Connector) string {
	m, _ := OptionsOf(c)
	s := fmt.Sprintf("qos %d", m.QoS)
	if m.CleanStart {
		s += ", clean start"
	} else {
		s += fmt.Sprintf(", session kept %s", m.SessionExpiry)
	}
	if m.SharedGroup != "" {
		s += ", shared group " + m.SharedGroup
	}
	if m.Retain {
		s += ", retained"
	}
	return s
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
	m, _ := OptionsOf(c)
	cfg := Config{
		Host:          c.Broker.Host,
		Port:          c.Broker.Port,
		TLS:           bc.BrokerTLS(),
		ClientID:      c.Broker.ClientID,
		Username:      bc.Credentials.Username,
		QoS:           m.QoS,
		CleanStart:    m.CleanStart,
		SessionExpiry: m.SessionExpiry,
		SharedGroup:   m.SharedGroup,
		Retain:        m.Retain,
		LoopMarker:    bc.LoopMarker,
		Logger:        bc.Logger,
	}
	if pw := bc.Credentials.Secret("password"); !pw.IsZero() {
		cfg.Password = []byte(pw.Reveal())
	}
	if read := bc.ReadCredentials; read != nil {
		cfg.Credentials = func() (string, []byte, error) {
			cr, err := read()
			if err != nil {
				return "", nil, err
			}
			var pw []byte
			if s := cr.Secret("password"); !s.IsZero() {
				pw = []byte(s.Reveal())
			}
			return cr.Username, pw, nil
		}
	}
	return cfg
}
