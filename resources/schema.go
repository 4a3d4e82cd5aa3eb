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
	APIVersion string       `yaml:"apiVersion" validate:"required,apiversion"`
	Kind       string       `yaml:"kind" validate:"required,kind"`
	Metadata   *rawMetadata `yaml:"metadata" validate:"required"`
	Spec       *rawSpec     `yaml:"spec" validate:"required"`
}

type rawMetadata struct {
	Name   string            `yaml:"name" validate:"required,dnslabel"`
	Labels map[string]string `yaml:"labels" validate:"max=64,dive,keys,labelkey,endkeys,labelvalue"`
}

type rawSpec struct {
	Protocol   string         `yaml:"protocol" validate:"required,protocol"`
	Direction  string         `yaml:"direction" validate:"required,oneof=inbound outbound"`
	Broker     *rawBroker     `yaml:"broker" validate:"required"`
	Weida      *rawWeida      `yaml:"weida" validate:"required"`
	Conversion *rawConversion `yaml:"conversion"`
	Routes     []rawRoute     `yaml:"routes" validate:"required,min=1,max=256,dive"`
	Limits     *rawLimits     `yaml:"limits"`
	LastValue  *rawLastValue  `yaml:"lastValue"`
}

type rawBroker struct {
	// url's scheme depends on spec.protocol: a struct-level rule on
	// rawSpec checks it (brokerurl).
	URL         string          `yaml:"url" validate:"required"`
	ClientID    string          `yaml:"clientID" validate:"omitempty,max=256,clientid"`
	Credentials *rawCredentials `yaml:"credentials"`
	TLS         *rawTLS         `yaml:"tls"`
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

type rawCredentials struct {
	Username string    `yaml:"username" validate:"omitempty,max=1024"`
	Password SecretRef `yaml:"password"`
	Token    SecretRef `yaml:"token"`
	NKeySeed SecretRef `yaml:"nkeySeed"`
	Creds    SecretRef `yaml:"creds"`
}

type rawTLS struct {
	CAFile     string `yaml:"caFile"`
	CertFile   string `yaml:"certFile" validate:"required_with=KeyFile"`
	KeyFile    string `yaml:"keyFile" validate:"required_with=CertFile"`
	ServerName string `yaml:"serverName" validate:"omitempty,hostname_rfc1123"`
}

type rawWeida struct {
	Listen         string   `yaml:"listen" validate:"omitempty,weidaurl"`
	Dial           string   `yaml:"dial" validate:"omitempty,weidaurl"`
	CertFile       string   `yaml:"certFile" validate:"required_with=KeyFile"`
	KeyFile        string   `yaml:"keyFile" validate:"required_with=CertFile"`
	CAFile         string   `yaml:"caFile"`
	AllowedClients []string `yaml:"allowedClients" validate:"max=1024,unique,dive,fingerprint"`
}

type rawConversion struct {
	Policy string   `yaml:"policy"`
	Losses []string `yaml:"losses" validate:"unique"`
}

type rawRoute struct {
	Name   string  `yaml:"name" validate:"omitempty,dnslabel"`
	Filter *string `yaml:"filter" validate:"required"`
}

type rawLastValue struct {
	Mode      string    `yaml:"mode" validate:"required,oneof=retained all"`
	MaxTopics *int      `yaml:"maxTopics" validate:"omitempty,min=1,max=1000000"`
	MaxBytes  *ByteSize `yaml:"maxBytes" validate:"omitempty,min=1024,max=1073741824"`
}

type rawLimits struct {
	MaxMessageBytes *ByteSize `yaml:"maxMessageBytes" validate:"omitempty,min=1,max=67108864"`
	BufferBytes     *ByteSize `yaml:"bufferBytes" validate:"omitempty,min=1,max=1073741824"`
	InFlight        *int      `yaml:"inFlight" validate:"omitempty,min=1,max=65535"`
}
