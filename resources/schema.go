package resources

import "github.com/goccy/go-yaml/ast"

// The raw schema: what a resource file says, field by field, before
// defaults, binding and cross-field rules. The yaml tags are the file's
// field names (the decoder reads them); the validate tags are
// go-playground/validator rules (validate.go registers the custom ones and
// turns failures into FieldErrors that use the yaml names). Pointers mark
// fields whose absence matters (a default applies, or a section is
// optional).

const (
	// APIVersion is the only apiVersion this package reads.
	APIVersion = "connector.weida.dev/v1alpha1"
	// Kind is the only kind this package reads.
	Kind = "Connector"
)

type rawResource struct {
	APIVersion string       `yaml:"apiVersion" validate:"required,apiversion" doc:"the resource format version: connector.weida.dev/v1alpha1"`
	Kind       string       `yaml:"kind" validate:"required,kind" doc:"always Connector"`
	Metadata   *rawMetadata `yaml:"metadata" validate:"required" doc:"the resource's name and labels"`
	Spec       *rawSpec     `yaml:"spec" validate:"required" doc:"what the connector bridges, and how"`
}

type rawMetadata struct {
	Name   string            `yaml:"name" validate:"required,dnslabel" doc:"the resource's name, a DNS label unique among the loaded resources"`
	Labels map[string]string `yaml:"labels" validate:"max=64,dive,keys,labelkey,endkeys,labelvalue" doc:"Kubernetes-style labels, for people and tools; the connector ignores them"`
}

type rawSpec struct {
	Protocol   string         `yaml:"protocol" validate:"required,protocol" doc:"the broker protocol; selects the spec.broker.<protocol> block"`
	Direction  string         `yaml:"direction" validate:"required,oneof=inbound outbound" doc:"inbound: broker to weida; outbound: weida to broker"`
	Broker     *rawBroker     `yaml:"broker" validate:"required" doc:"the foreign broker: its URL, identity, credentials and protocol options"`
	Weida      *rawWeida      `yaml:"weida" validate:"required" doc:"the weida side: an endpoint to listen on (inbound) or to dial (outbound)"`
	Conversion *rawConversion `yaml:"conversion" doc:"the topic conversion policy and the losses it incurs"`
	Routes     []rawRoute     `yaml:"routes" validate:"required,min=1,max=256,dive" doc:"the filters to bridge, in the broker's own grammar; at most 256"`
	Limits     *rawLimits     `yaml:"limits" doc:"message size, buffer and in-flight bounds; defaults apply to what is left out"`
	Delivery   *rawDelivery   `yaml:"delivery" doc:"inbound: what to do with a message no weida subscriber wants, and when a bridged one is acknowledged to the broker"`
	LastValue  *rawLastValue  `yaml:"lastValue" doc:"inbound: keep the last message of each topic and replay it to new weida subscriptions"`
}

type rawDelivery struct {
	WhenNoSubscriber string `yaml:"whenNoSubscriber" validate:"omitempty,oneof=drop hold" doc:"drop (count it as no-subscriber) or hold (leave it with the broker until a subscriber comes)"`
	Acknowledge      string `yaml:"acknowledge" validate:"omitempty,oneof=queued received" doc:"when the broker is acknowledged: queued (default: once every weida copy is queued) or received (once every copy was received by its subscriber's QUIC stack or counted lost)"`
}

type rawBroker struct {
	// url's scheme depends on spec.protocol: a struct-level rule on
	// rawSpec checks it (brokerurl).
	URL         string          `yaml:"url" validate:"required" doc:"scheme://host[:port][/path]; the scheme depends on spec.protocol; never credentials"`
	ClientID    string          `yaml:"clientID" validate:"omitempty,max=256,clientid" doc:"the client identifier on the broker; defaults to metadata.name"`
	Credentials *rawCredentials `yaml:"credentials" doc:"how the connector authenticates to the broker; secrets by reference only"`
	TLS         *rawTLS         `yaml:"tls" doc:"TLS settings for an mqtts://, tls:// or amqps:// URL"`
	// Sections are the spec.broker.<protocol> blocks, one per key that
	// names a protocol of the loader's list, in file order. The decoder
	// keeps their YAML nodes for the protocols to decode.
	Sections []section `yaml:"-"`
}

// section is one spec.broker.<protocol> block as written.
type section struct {
	name string
	node ast.Node
}

type rawTLS struct {
	CAFile     string `yaml:"caFile" doc:"PEM trust anchors for the broker's certificate, instead of the system's"`
	CertFile   string `yaml:"certFile" validate:"required_with=KeyFile" doc:"a PEM client certificate, with keyFile"`
	KeyFile    string `yaml:"keyFile" validate:"required_with=CertFile" doc:"the client certificate's PEM private key"`
	ServerName string `yaml:"serverName" validate:"omitempty,hostname_rfc1123" doc:"the name the broker's certificate must carry, when it is not the URL's host"`
}

type rawWeida struct {
	Listen         string      `yaml:"listen" validate:"omitempty,weidaurl" doc:"inbound: the endpoint to host, weida://host:port/path"`
	Dial           string      `yaml:"dial" validate:"omitempty,weidaurl" doc:"outbound: the endpoint to subscribe to, weida://sha256:<fingerprint>@host:port/path"`
	Failover       []string    `yaml:"failover" validate:"max=16,unique,dive,weidaurl" doc:"outbound: more addresses of the same endpoint (its other replicas), dialled in turn when dial's does not answer or is lost (an address that publishes nothing at the path counts as not answering); the same path and pin as dial"`
	CertFile       string      `yaml:"certFile" validate:"required_with=KeyFile" doc:"the endpoint's PEM certificate, with keyFile; a self-signed one is generated when both are left out"`
	KeyFile        string      `yaml:"keyFile" validate:"required_with=CertFile" doc:"the endpoint certificate's PEM private key"`
	CAFile         string      `yaml:"caFile" doc:"outbound: PEM trust anchors, when the dial URL pins no fingerprint"`
	AllowedClients []rawClient `yaml:"allowedClients" validate:"max=1024" doc:"inbound: the subscribers admitted, by certificate fingerprint or by a name their clientCAFile-issued certificate carries, each to everything (a bare fingerprint, or an entry without scopes) or within its scopes ({client|san|commonName, scopes}); empty admits anyone"`
	ClientCAFile   string      `yaml:"clientCAFile" doc:"inbound: PEM CA certificates issuing the client certificates that allowedClients entries with san or commonName name; read again when it changes"`

	// The endpoint's connection limits (issue 25: one host held every
	// slot of an open endpoint).
	MaxConnections           *int `yaml:"maxConnections" validate:"omitempty,min=1,max=65536" doc:"inbound: connections the endpoint serves at once, from all clients; default 1024"`
	MaxConnectionsPerAddress *int `yaml:"maxConnectionsPerAddress" validate:"omitempty,min=1,max=65536" doc:"inbound: connections one client address may hold (an IPv4 address, an IPv6 /64; clients behind one NAT share it), unless allowedClients admits its certificate; at most maxConnections; default 64"`

	// How long the endpoint waits on a silent subscriber (issue 21: at
	// 2 s, subscribers that read lost their connections when the
	// endpoint was saturated and their round trips grew).
	IdleTimeout *Duration `yaml:"idleTimeout" doc:"inbound: how long a subscriber connection may stay silent before the endpoint takes it for gone (QUIC's idle timeout; the endpoint pings every 500 ms); 1s to 1m; default 2s"`
}

// rawClient is one entry of spec.weida.allowedClients: a bare fingerprint
// (bare, admitted to everything) or a mapping naming the client by exactly
// one of client (a fingerprint), san or commonName (a name of a
// certificate clientCAFile issued), with optional scopes. The loader
// checks both forms by hand (see binder.allowedClients), so that a bare
// fingerprint's fault is reported at the entry, as before scopes existed;
// the validate tags here only describe the mapping in the JSON Schema,
// which adds the one-of rule (see schemaGen.typ).
type rawClient struct {
	Client     string   `yaml:"client" validate:"omitempty,fingerprint" doc:"the subscriber's certificate fingerprint"`
	SAN        string   `yaml:"san" validate:"omitempty,max=1024" doc:"instead of client: a subject alternative name its certificate carries, exactly: dns:<name>, uri:<uri> or email:<address>; the certificate must chain to clientCAFile"`
	CommonName string   `yaml:"commonName" validate:"omitempty,max=1024" doc:"instead of client: its certificate's subject CommonName, exactly; the certificate must chain to clientCAFile"`
	Scopes     []string `yaml:"scopes" validate:"omitempty,min=1,max=64,unique,dive,max=256" doc:"weida filters the subscriber may subscribe within: a SUBSCRIBE is admitted only when every topic its filter can match is matched by one of them; left out, everything"`
	bare       bool
}

type rawConversion struct {
	Policy string    `yaml:"policy" doc:"the conversion policy; the protocol's default when left out"`
	Losses []string  `yaml:"losses" validate:"unique" doc:"every loss this conversion incurs, exactly; connector check says which"`
	Mount  *rawMount `yaml:"mount" doc:"places a foreign subtree at a weida subtree, exactly"`
}

// rawMount is spec.conversion.mount. Its prefixes are checked by the
// policy package when the mount is bound (policy.NewMounted): their rules
// depend on the protocol's grammar.
type rawMount struct {
	Foreign string `yaml:"foreign" doc:"the foreign prefix, ending with the protocol's separator; empty for none"`
	Weida   string `yaml:"weida" doc:"the weida prefix, ending with '.'; empty for none"`
}

type rawRoute struct {
	Name   string  `yaml:"name" validate:"omitempty,dnslabel" doc:"the route's name in metrics and status; defaults to the filter"`
	Filter *string `yaml:"filter" validate:"required" doc:"a filter in the broker's grammar; quote it when it starts with #, *, >, & or !"`
}

type rawLastValue struct {
	Mode           string    `yaml:"mode" validate:"required,oneof=retained all"`
	MaxTopics      *int      `yaml:"maxTopics" validate:"omitempty,min=1,max=1000000"`
	MaxBytes       *ByteSize `yaml:"maxBytes" validate:"omitempty,min=1024,max=1073741824"`
	MaxAge         *Duration `yaml:"maxAge" doc:"end a cached value this long after its source delivered it, for sources whose messages carry no expiry; default: kept until replaced"`
	WhenSourceDown string    `yaml:"whenSourceDown" validate:"omitempty,oneof=mark withhold" doc:"while the source is disconnected: mark (default) replays with each copy marked stale, withhold replays nothing"`
	OrphanAfter    *Duration `yaml:"orphanAfter" doc:"purge the cache once the source has been disconnected this long; default: never"`
	Persist        *bool     `yaml:"persist" doc:"mode all: keep the cache in the state directory across restarts; default false"`
}

type rawLimits struct {
	MaxMessageBytes *ByteSize `yaml:"maxMessageBytes" validate:"omitempty,min=1,max=67108864" doc:"the largest payload bridged, larger ones are dropped and counted; default 1MiB"`
	BufferBytes     *ByteSize `yaml:"bufferBytes" validate:"omitempty,min=1,max=1073741824" doc:"payload queued per weida subscriber (inbound) or between weida and the broker (outbound); default 8MiB"`
	InFlight        *int      `yaml:"inFlight" validate:"omitempty,min=1,max=65535" doc:"messages handed on and not yet acknowledged; default 256"`
}
