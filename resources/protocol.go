package resources

import (
	"fmt"
	"net"
	"net/url"
	"reflect"
	"strconv"
	"strings"

	"github.com/go-playground/validator/v10"
	"github.com/goccy/go-yaml/ast"

	"weida.dev/connector/policy"
)

// Protocol is what the loader knows of one broker protocol: everything
// about a resource that is not common to all protocols. Each broker driver
// (connectors/mqtt, /nats, /amqp) provides one, and the program passes the
// list to [Loader]: spec.protocol is valid when it names one of them.
//
// A Protocol is stateless and safe for concurrent use; the loader calls it
// from the goroutine that called [Loader.Load].
type Protocol interface {
	// Name is the protocol's spec.protocol value and the key of its
	// spec.broker block ("mqtt").
	Name() policy.Protocol
	// URL says which broker URLs the protocol accepts. The loader parses
	// spec.broker.url once, with these rules, into [Broker].
	URL() URLRules
	// Policies lists the conversion policies the protocol offers, its
	// default first; the list is not empty and the caller does not keep
	// or change it.
	Policies() []policy.Policy
	// DescribeOptions names the broker settings o stands for, as messages
	// print them after the policy ("QoS 1", "core NATS"); "" when the
	// protocol has no such setting.
	DescribeOptions(o policy.Options) string
	// Broker reads the spec.broker.<Name> block b (which may be absent)
	// and applies the protocol's own rules, reporting every problem
	// through b. When b.Binding() is false the block only needs decoding
	// for its diagnostics and the result is ignored.
	Broker(b *BrokerBlock) BrokerOptions
	// BrokerSchema returns a pointer to a zero value of the struct Broker
	// decodes its block into with [BrokerBlock.Decode], and the Schema it
	// passes there. [JSONSchema] describes the block from them; Decode
	// panics when Broker uses another type, so the two cannot drift.
	BrokerSchema() (block any, s Schema)
	// Credentials lists the secrets spec.broker.credentials may name for
	// the protocol besides username, which every protocol shares. The
	// loader accepts a kind that any protocol of its list declares,
	// refuses it for a resource whose protocol does not, and resolves the
	// rest into [ResolvedCredentials].
	Credentials() []CredentialKind
	// CheckSet applies the protocol's rules that span resources (two
	// resources using one broker identity, say) and reports each conflict
	// through s. It is called once per load with every resource of the
	// protocol, including those with other errors.
	CheckSet(s *SetCheck)
}

// URLRules are the broker URLs a protocol accepts: scheme://host[:port][/path].
// User information, queries and fragments are always refused.
type URLRules struct {
	Scheme    string // the plain TCP scheme ("mqtt")
	TLSScheme string // the TLS scheme ("mqtts"); [TLS.Enabled] reports it was used
	Port      int    // the port when a Scheme URL has none
	TLSPort   int    // the port when a TLSScheme URL has none
	// Path names what the URL's path means ("virtual host"); the path is
	// then one segment, handed to the protocol in [Broker.Path]. "" means
	// the URL has no path.
	Path string
}

// Address returns a broker's address as a URL without credentials or
// path: scheme://host:port, with the TLS scheme when tls is set and the
// scheme's default port when port is 0. Drivers give it to client
// libraries that take their server only as a URL, and name the broker by it
// in logs and errors; it is built from parsed fields, never parsed again.
func (r URLRules) Address(host string, port int, tls bool) *url.URL {
	scheme, def := r.Scheme, r.Port
	if tls {
		scheme, def = r.TLSScheme, r.TLSPort
	}
	if port == 0 {
		port = def
	}
	return &url.URL{Scheme: scheme, Host: net.JoinHostPort(host, strconv.Itoa(port))}
}

// BrokerOptions are what a protocol made of its spec.broker block.
type BrokerOptions struct {
	// Options is stored in [Broker.Options] for the protocol's driver to
	// read; no one else does. It must be comparable with reflect.DeepEqual
	// (a struct, or a pointer to one): a reload keeps a running resource
	// whose Connector is [Connector.Equal] to its new version.
	Options any
	// Policy are the settings the policy's losses depend on.
	Policy policy.Options
	// PolicyOK is false when a setting Policy depends on is invalid: the
	// losses are then not checked, since the error is elsewhere.
	PolicyOK bool
	// Hold says whether an inbound source so configured can hold messages
	// (spec.delivery.whenNoSubscriber: hold). The zero value says it
	// cannot.
	Hold Hold
	// LastValues says whether an inbound source so configured knows which
	// messages its broker keeps as each topic's current value for later
	// subscribers (MQTT retained messages, a JetStream stream's last
	// message per subject), which spec.lastValue.mode: retained caches.
	// The zero value says it does not.
	LastValues LastValues
}

// LastValues is whether a source can tell which messages its broker keeps
// as last values. Each driver says so for its own sources, so that the
// loader names no protocol when it refuses spec.lastValue.mode: retained.
type LastValues struct {
	OK bool
	// Why completes, when OK is false, the loader's "caches what the
	// broker keeps for late subscribers, and ..." ("core NATS keeps
	// nothing"). Hint says what to write instead; when it is empty the
	// loader suggests mode: all.
	Why, Hint string
}

// Hold is whether a source's broker keeps the messages the connector leaves
// unacknowledged, and keeps them while the connector is away (restarted,
// disconnected), so that holding them until a weida subscriber comes loses
// nothing.
type Hold struct {
	OK bool
	// Why says, when OK is false, what the source lacks: the loader
	// reports "hold needs a source that keeps unacknowledged messages:"
	// followed by it. Hint says what to change.
	Why, Hint string
}

// protocolList is the loader's protocols, in the program's order.
type protocolList []Protocol

func (ps protocolList) byName(name string) Protocol {
	for _, p := range ps {
		if string(p.Name()) == name {
			return p
		}
	}
	return nil
}

func (ps protocolList) names() []string {
	out := make([]string, len(ps))
	for i, p := range ps {
		out[i] = string(p.Name())
	}
	return out
}

// choice lists the names as a sentence does: "mqtt, nats or amqp".
func (ps protocolList) choice() string {
	n := ps.names()
	if len(n) < 2 {
		return strings.Join(n, "")
	}
	return strings.Join(n[:len(n)-1], ", ") + " or " + n[len(n)-1]
}

func (ps protocolList) policies() []policy.Policy {
	var out []policy.Policy
	for _, p := range ps {
		out = append(out, p.Policies()...)
	}
	return out
}

// Rule is a validation rule a protocol adds for the validate tags of its
// block's schema, next to go-playground/validator's own (required,
// omitempty, min, max, oneof...).
type Rule struct {
	// Valid reports whether a field's value keeps the rule. v is the
	// field's value: a string, an int, a [Duration]...
	Valid func(v reflect.Value) bool
	// Explain returns the FieldError's rule code, message and hint for a
	// value that breaks the rule, the value shown as in FieldError.Value.
	Explain func(value string) (rule, msg, hint string)
	// JSON is the rule as JSON Schema keywords, merged into the field's
	// schema by [JSONSchema]: {"enum": [0, 1]}, or {"pattern": "[^/]+"},
	// a pattern the whole value must match (JSONSchema anchors it). nil
	// when the rule has no JSON Schema form: the schema then states only
	// the field's type, and the loader alone applies the rule. The
	// keywords must not be stricter than Valid.
	JSON map[string]any
}

// Schema is how a protocol's block is decoded: the rules of its validate
// tags, and hints for its required fields.
type Schema struct {
	// Rules are the protocol's own validate tags, by tag name. Every
	// Decode of one destination type must pass the same rules.
	Rules map[string]Rule
	// RequiredHints say what to write when a required field is missing,
	// keyed by the field's path with list indexes written [] (e.g.
	// "spec.broker.nats.jetstream.stream").
	RequiredHints map[string]string
}

// BrokerBlock is one resource's spec.broker.<protocol> block, handed to
// [Protocol.Broker], with what the protocol's rules may depend on and the
// means to report what is wrong. Paths are full YAML paths
// ("spec.broker.mqtt.qos"). A BrokerBlock is valid only during the call.
type BrokerBlock struct {
	b       *binder
	name    string
	node    ast.Node
	present bool
	binding bool
}

// Path is the block's own path: "spec.broker." and the protocol's name.
func (bb *BrokerBlock) Path() string { return "spec.broker." + bb.name }

// Present reports whether the resource has the block.
func (bb *BrokerBlock) Present() bool { return bb.present }

// Binding reports whether the resource is of this block's protocol. When
// it is not (spec.protocol names another protocol, or is wrong), the
// protocol only decodes the block, and its result is ignored.
func (bb *BrokerBlock) Binding() bool { return bb.binding }

// Decode walks the block into dst, a pointer to a struct whose yaml tags
// name the block's fields and whose validate tags state its rules, and
// reports every unknown field, wrong type and broken rule with its file
// position. dst keeps its zero value when the block is absent. The field
// types the decoder knows are string, bool, int, pointers, slices, maps
// with string keys, structs of these, [SecretRef], [Duration] and
// [ByteSize].
func (bb *BrokerBlock) Decode(dst any, s Schema) {
	if !bb.present {
		return
	}
	v := reflect.ValueOf(dst)
	if v.Kind() != reflect.Pointer || v.Elem().Kind() != reflect.Struct {
		panic(fmt.Sprintf("resources: BrokerBlock.Decode needs a pointer to a struct, not %T", dst))
	}
	if p := bb.b.ld.protocols.byName(bb.name); p != nil {
		if want, _ := p.BrokerSchema(); reflect.TypeOf(want) != v.Type() {
			panic(fmt.Sprintf("resources: protocol %s decodes its block into %T, but its BrokerSchema returns %T", bb.name, dst, want))
		}
	}
	d := bb.b.decoder
	d.decode(bb.Path(), d.pos[bb.Path()].key, bb.node, v.Elem())
	val := bb.b.ld.blockValidator(v.Elem().Type(), s.Rules)
	d.validate(val, dst, bb.Path(), func(fe validator.FieldError, path, value string) (string, string, string) {
		if r, ok := s.Rules[fe.Tag()]; ok {
			return r.Explain(value)
		}
		rule, msg, hint := explain(fe, path, value, bb.b.ld.protocols)
		if fe.Tag() == "required" {
			hint = s.RequiredHints[genericPath(path)]
		}
		return rule, msg, hint
	})
}

// Direction returns spec.direction, and whether it is valid.
func (bb *BrokerBlock) Direction() (policy.Direction, bool) {
	return bb.b.c.Direction, bb.b.dirOK
}

// Credentials returns spec.broker.credentials as written (secret file
// paths resolved), and whether the resource has the block.
func (bb *BrokerBlock) Credentials() (Credentials, bool) {
	return bb.b.c.Broker.Credentials, bb.b.raw.Spec.Broker.Credentials != nil
}

// Limits returns spec.limits with its defaults applied.
func (bb *BrokerBlock) Limits() Limits { return bb.b.c.Limits }

// OK reports whether no error was reported at path or inside it.
func (bb *BrokerBlock) OK(path string) bool { return bb.b.ok(path) }

// Written reports whether the resource writes path.
func (bb *BrokerBlock) Written(path string) bool { _, ok := bb.b.pos[path]; return ok }

// At returns where path's value is written or, when it is not, where its
// nearest written ancestor's key is.
func (bb *BrokerBlock) At(path string) Position { return bb.b.lookupPos(path, false) }

// KeyAt returns where path's key is written, or its nearest written
// ancestor's key: where to point when the field's presence is the problem.
func (bb *BrokerBlock) KeyAt(path string) Position { return bb.b.lookupPos(path, true) }

// Fail reports a FieldError at path, pointing at at (see [BrokerBlock.At]
// and [BrokerBlock.KeyAt]). value is the offending value as written, or
// "" when a field is missing; it must never be a secret.
func (bb *BrokerBlock) Fail(path string, at Position, value, rule, msg, hint string) {
	bb.b.fail(path, at, value, rule, msg, hint)
}

// DirectionOnly reports path, when set, as a field that applies only to
// dir's resources, when the resource's direction is valid and another;
// why says what the field does that the other direction does not need.
func (bb *BrokerBlock) DirectionOnly(path string, set bool, dir policy.Direction, why string) {
	bb.b.directionOnly(path, set, string(dir), why)
}

// SetCheck is one protocol's view of a load, for [Protocol.CheckSet].
type SetCheck struct {
	docs []*Document
}

// Connectors returns the protocol's resources as far as binding could
// fill them in, in load order, errors or not: fields that had errors are
// zero, and Broker.Options may be nil.
func (s *SetCheck) Connectors() []*Connector {
	out := make([]*Connector, len(s.docs))
	for i, d := range s.docs {
		out[i] = d.partial
	}
	return out
}

func (s *SetCheck) doc(c *Connector) *Document {
	for _, d := range s.docs {
		if d.partial == c {
			return d
		}
	}
	panic("resources: SetCheck given a Connector it did not list")
}

// Written reports whether c's resource writes path.
func (s *SetCheck) Written(c *Connector, path string) bool { return s.doc(c).hasField(path) }

// GroupBy returns the groups of two or more of cs sharing a key, in the
// order their first member appears. Connectors whose key is "" are left
// out.
func (s *SetCheck) GroupBy(cs []*Connector, key func(*Connector) string) [][]*Connector {
	docs := make([]*Document, len(cs))
	for i, c := range cs {
		docs[i] = s.doc(c)
	}
	groups := groupBy(docs, func(d *Document) string { return key(d.partial) })
	out := make([][]*Connector, len(groups))
	for i, g := range groups {
		for _, d := range g {
			out[i] = append(out[i], d.partial)
		}
	}
	return out
}

// Conflict is a rule the members of a group break together.
type Conflict struct {
	Field   func(*Connector) string // the path to report for each member
	Value   func(*Connector) string // its value as written
	Rule    string
	Message func(others string) string // others names the other members and where they are
	Hint    string
}

// Report adds to each member of group an error naming the other members,
// so that the output for any one resource is complete.
func (s *SetCheck) Report(group []*Connector, c Conflict) {
	docs := make([]*Document, len(group))
	for i, m := range group {
		docs[i] = s.doc(m)
	}
	conflict(docs, func(d *Document) string { return c.Field(d.partial) }, func(d *Document) string { return c.Value(d.partial) },
		c.Rule, c.Message, c.Hint)
}

// BrokerKey identifies c's broker: protocol, canonical host and port; ""
// when the URL had errors. Two resources with one BrokerKey talk to one
// broker.
func BrokerKey(c *Connector) string {
	if c.Broker.Port == 0 {
		return ""
	}
	return string(c.Protocol) + "://" + joinHostPort(canonicalHost(c.Broker.Host), c.Broker.Port)
}

// BrokerPath returns the broker URL's path as [Broker.Path] holds it: ""
// when the URL had errors, has no path, or the protocol takes none.
func (bb *BrokerBlock) BrokerPath() string { return bb.b.c.Broker.Path }
