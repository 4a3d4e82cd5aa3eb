package resources

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"net"
	"reflect"
	"strconv"
	"time"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/address"
)

// Defaults applied when a resource leaves a field out. docs/RESOURCES.md
// documents each one.
const (
	DefaultMaxMessageBytes = 1 << 20 // limits.maxMessageBytes: 1 MiB
	DefaultBufferBytes     = 8 << 20 // limits.bufferBytes: 8 MiB, weida's subscriber_buffer_bytes
	DefaultInFlight        = 256     // limits.inFlight
)

// Connector is one validated resource, bound to its conversion policy, with
// every default applied: what the runtime runs. A Connector is immutable
// once returned by [Loader.Load]; share it freely, do not modify it.
type Connector struct {
	// Name is metadata.name, a DNS label unique among the loaded resources.
	Name   string
	Labels map[string]string // metadata.labels; nil when none
	// Source is where the resource's document starts.
	Source Position

	Protocol  policy.Protocol
	Direction policy.Direction
	Broker    Broker
	Weida     Weida

	// Policy converts this resource's filters and topics. When Mount is
	// not zero it is the *policy.Mounted applying Mount to the policy
	// spec.conversion.policy names: every conversion, at load and at run
	// time, goes through it.
	Policy policy.Policy
	// Mount is spec.conversion.mount; the zero Mount when the file has
	// none (or gives two empty prefixes).
	Mount policy.Mount
	// PolicyOptions are the broker settings the policy's losses depend on.
	PolicyOptions policy.Options
	// Losses are the losses this conversion incurs, sorted: equal to
	// Policy.Losses(Direction, PolicyOptions) and to what the file states.
	Losses []policy.Loss
	// Routes are in file order; there is at least one and at most
	// [MaxRoutes].
	Routes []Route
	Limits Limits
	// Delivery says what an inbound resource does with a message no weida
	// subscriber wants.
	Delivery Delivery
	// LastValue is the inbound resource's last-value cache
	// (spec.lastValue); Mode is "" when it keeps none.
	LastValue LastValue
}

// Defaults of spec.lastValue.
const (
	DefaultLastValueTopics = 10000    // lastValue.maxTopics
	DefaultLastValueBytes  = 64 << 20 // lastValue.maxBytes: 64 MiB
)

// LastValue configures an inbound resource's last-value cache: the last
// message of each weida topic, replayed to each new weida subscription
// whose filter selects it. Defaults are applied when Mode is set.
type LastValue struct {
	// Mode is "retained" (the messages the broker keeps for late
	// subscribers: MQTT retained messages, a JetStream stream's), "all"
	// (every message bridged), or "" (no cache).
	Mode      string
	MaxTopics int
	MaxBytes  int64
	// MaxAge ends a cached value that long after its source delivered
	// it; zero keeps it until replaced (or its own expiry).
	MaxAge time.Duration
	// WhenSourceDown is "withhold" (replay nothing while the source is
	// disconnected) or "" (the default, mark: replay, each copy marked
	// stale).
	WhenSourceDown string
	// OrphanAfter purges the cache once the source has been disconnected
	// that long; zero never purges.
	OrphanAfter time.Duration
	// Persist keeps the cache in the state directory across restarts
	// (lastValue.persist); only with Mode "all", the one mode whose values
	// no broker keeps for the connector to seed from again.
	Persist bool
}

// The choices of spec.delivery.whenNoSubscriber.
const (
	// WhenNoSubscriberDrop acknowledges to the broker, drops and counts
	// (no-subscriber) a message no live weida subscriber wants. The
	// default.
	WhenNoSubscriberDrop = "drop"
	// WhenNoSubscriberHold leaves such a message unacknowledged and stops
	// reading until a subscriber wants it: the broker keeps it and the
	// ones after it. Only sources whose broker keeps unacknowledged
	// messages across the connector's absence accept it ([Hold]).
	WhenNoSubscriberHold = "hold"
)

// The choices of spec.delivery.acknowledge.
const (
	// AcknowledgeQueued acknowledges a bridged message to the broker once
	// every weida copy of it is queued at the endpoint. The default.
	AcknowledgeQueued = "queued"
	// AcknowledgeReceived acknowledges it only once every copy was
	// received by its subscriber's QUIC stack, or lost and counted: a
	// connector killed before that leaves the message with the broker,
	// which delivers it again. Only sources whose broker keeps
	// unacknowledged messages across the connector's absence accept it
	// ([Hold]), as for WhenNoSubscriberHold.
	AcknowledgeReceived = "received"
)

// Delivery is spec.delivery, defaults applied.
type Delivery struct {
	// WhenNoSubscriber is WhenNoSubscriberDrop or WhenNoSubscriberHold;
	// always WhenNoSubscriberDrop for an outbound resource.
	WhenNoSubscriber string
	// Acknowledge is AcknowledgeQueued or AcknowledgeReceived; always
	// AcknowledgeQueued for an outbound resource.
	Acknowledge string
}

// AwaitReceipt reports whether the resource acknowledges a bridged
// message only once its copies were received.
func (d Delivery) AwaitReceipt() bool { return d.Acknowledge == AcknowledgeReceived }

// Hold reports whether the resource holds messages while no weida
// subscriber wants them.
func (d Delivery) Hold() bool { return d.WhenNoSubscriber == WhenNoSubscriberHold }

// MaxRoutes is the most routes a resource may have: each outbound route is
// one weida subscription, and weida allows 256 per connection.
const MaxRoutes = 256

// Route is one filter, in both grammars.
type Route struct {
	// Name is the route's name, or its foreign filter when the file gives
	// none. Unique within the resource; metrics label with it.
	Name string
	// Foreign is the filter in the broker's grammar, as written. Inbound:
	// what the connector subscribes to on the broker. Outbound: which
	// broker topics the connector may publish (the guard after TopicFromWeida).
	Foreign string
	// Weida is Policy.ConvertFilter(Foreign): inbound, the guard every
	// converted topic must pass; outbound, what the connector subscribes
	// to at the dialled endpoint.
	Weida  string
	Source Position // where the route's filter is written
}

// Broker says how to reach the foreign broker.
type Broker struct {
	// URL is the broker URL as written. It carries no credentials: the
	// loader refuses user information in URLs.
	URL    string
	Scheme string // one of the protocol's two schemes ([URLRules])
	Host   string // without brackets for IPv6
	Port   int    // the scheme's default port when the URL has none
	// Path is the URL's path without its leading '/', unescaped, for a
	// protocol whose URLs have one ([URLRules].Path): "" when the URL has
	// none or ends at "/".
	Path string
	// ClientID is broker.clientID, or the resource name when absent: how
	// the connector names itself to the broker (the protocol says how).
	ClientID    string
	Credentials Credentials
	TLS         TLS
	// Options are the protocol's own settings, from spec.broker.<protocol>
	// with its defaults applied: what its [Protocol.Broker] returned,
	// which only that protocol's driver reads.
	Options any
}

// Addr returns host:port, bracketing IPv6 hosts.
func (b Broker) Addr() string { return net.JoinHostPort(b.Host, strconv.Itoa(b.Port)) }

// Credentials refer to secrets; [Resolver.Resolve] reads them when the
// connector starts the resource and again at each connection attempt. Username is shared by every protocol; the secrets are
// the kinds the resource's protocol declares ([Protocol.Credentials]), by
// name. The protocol decides which combinations are valid.
type Credentials struct {
	Username string // not a secret; "" when none
	// Secrets are the references written, by kind ("password",
	// "token"); nil when none. Read them with [Credentials.Secret].
	Secrets map[string]SecretRef
}

// Secret returns the reference of kind, or the zero SecretRef when the
// resource names none.
func (c Credentials) Secret(kind string) SecretRef { return c.Secrets[kind] }

// TLS configures the broker connection's TLS. File paths are relative to
// the working directory or absolute (the loader resolved them against the
// resource file's directory).
type TLS struct {
	// Enabled is true when the URL's scheme is the protocol's TLS one.
	// The other fields are empty when it is false.
	Enabled    bool
	CAFile     string // "" : the system's roots
	CertFile   string // client certificate; "" : none
	KeyFile    string // set exactly when CertFile is
	ServerName string // "" : Host
}

// Weida says where the weida side of the bridge is.
type Weida struct {
	// Endpoint is, inbound, the address the connector listens on and the
	// path it publishes on; outbound, the publisher endpoint it dials
	// (with Endpoint.Fingerprint the pinned certificate, if any).
	Endpoint address.Address
	// Failover (outbound only) are more addresses of the endpoint, its
	// other replicas, to dial in turn after Endpoint: each names the same
	// path and pins the same fingerprint (or none) as Endpoint, and no
	// host:port repeats. Nil when the endpoint has one address. (The tag
	// keeps Revision unchanged for resources without it.)
	Failover []address.Address `json:",omitempty"`
	// MaxConnections and MaxConnectionsPerAddress (inbound only) are the
	// endpoint's weida Limits of those names: the connections it serves
	// at once, and those one client address may hold unless
	// AllowedClients admits its certificate. Zero means weida's default
	// (1024 and 64); the tags keep Revision unchanged for resources that
	// set neither.
	MaxConnections           int `json:",omitempty"`
	MaxConnectionsPerAddress int `json:",omitempty"`
	// IdleTimeout (inbound only) is the endpoint's weida IdleTimeout: how
	// long a subscriber connection may be silent before it is taken for
	// gone. Zero means weida's default for a listener (2 s); the tag
	// keeps Revision unchanged for resources that leave it out.
	IdleTimeout time.Duration `json:",omitempty"`
	// CertFile and KeyFile: inbound, the endpoint's certificate (both ""
	// means generate one at start); outbound, an optional client
	// certificate.
	CertFile, KeyFile string
	// CAFile (outbound only) holds the trust anchors for the endpoint's
	// certificate when the URL pins no fingerprint.
	CAFile string
	// AllowedClients (inbound only) name the clients that may subscribe:
	// "sha256:<hex>" fingerprints of their certificates, and names that a
	// certificate issued by ClientCAFile carries ("dns:…", "uri:…",
	// "email:…" subject alternative names, "cn:…" the subject's
	// CommonName; see weida.ListenConfig.ClientIdentities). Empty means
	// anyone who can reach the address may subscribe and receive every
	// bridged message.
	AllowedClients []string
	// ClientCAFile (inbound only) holds the CA certificates that issue the
	// clients AllowedClients names by identity; set exactly when it names
	// one. (The tag keeps Revision unchanged for resources without it.)
	ClientCAFile string `json:",omitempty"`
	// Scopes (inbound only) restrict what some of AllowedClients may
	// subscribe to on this endpoint's path: the weida filters listed for
	// a name of AllowedClients (a client known under several gets their
	// union), within which every SUBSCRIBE filter must lie (see
	// topic.CoveredBy). A client in AllowedClients without an entry here
	// may subscribe to everything. Nil when no entry has scopes. (The tag
	// keeps Revision unchanged for resources without it.)
	Scopes map[string][]string `json:",omitempty"`
}

// DialURLs returns, outbound, every address of the endpoint in the order
// to dial them: Endpoint, then Failover.
func (w Weida) DialURLs() []string {
	urls := []string{w.Endpoint.String()}
	for _, a := range w.Failover {
		urls = append(urls, a.String())
	}
	return urls
}

// Open reports whether an inbound endpoint admits any client.
func (w Weida) Open() bool { return len(w.AllowedClients) == 0 }

// Generated reports whether an inbound endpoint generates its certificate.
func (w Weida) Generated() bool { return w.CertFile == "" }

// Limits bound the resources one connector uses, defaults applied.
type Limits struct {
	// MaxMessageBytes is the largest payload bridged; larger ones are
	// dropped and counted.
	MaxMessageBytes int64
	// BufferBytes bounds queued payload: inbound, per weida subscriber of
	// the hosted endpoint (copies beyond it are dropped and counted, as
	// weida specifies); outbound, between the weida side and the broker
	// (beyond it the connector stops reading from weida). At least
	// MaxMessageBytes.
	BufferBytes int64
	// InFlight bounds messages handed on but not yet acknowledged (broker
	// acks outbound, weida hand-off inbound).
	InFlight int
}

// Equal reports whether c and o configure the same connector, ignoring
// where they were written (Source positions). A reload keeps a running
// connector whose resource is Equal to its new version.
func (c *Connector) Equal(o *Connector) bool {
	if c == nil || o == nil {
		return c == o
	}
	a, b := *c, *o
	a.Source, b.Source = Position{}, Position{}
	a.Routes = stripRoutePos(a.Routes)
	b.Routes = stripRoutePos(b.Routes)
	return reflect.DeepEqual(a, b)
}

// Revision returns an opaque digest of c's configuration, ignoring where
// it was written, as Equal does: two connectors that are Equal have the
// same Revision, and any change of configuration gives another one. The
// runtime compares revisions on reload.
func (c *Connector) Revision() string {
	a := *c
	a.Source = Position{}
	a.Routes = stripRoutePos(a.Routes)
	policyName := ""
	if a.Policy != nil {
		policyName = a.Policy.Name()
	}
	// A policy is code, not data: its name (which carries its version)
	// stands for it.
	a.Policy = nil
	// JSON follows pointers and sorts map keys, so equal configurations
	// encode to equal bytes; every field is plain data.
	b, err := json.Marshal(struct {
		Connector Connector
		Policy    string
	}{a, policyName})
	if err != nil {
		// Unreachable with plain data; an empty revision restarts the
		// connector on every reload, which is safe.
		return ""
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func stripRoutePos(rs []Route) []Route {
	out := make([]Route, len(rs))
	for i, r := range rs {
		r.Source = Position{}
		out[i] = r
	}
	return out
}

func joinHostPort(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }
