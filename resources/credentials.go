package resources

import (
	"fmt"
	"reflect"
	"slices"
	"strings"

	"github.com/goccy/go-yaml/ast"
)

// CredentialKind is one secret a protocol accepts in
// spec.broker.credentials, besides username, which every protocol shares.
// Each driver declares its own ([Protocol.Credentials]); the loader
// decodes, checks and resolves what the drivers declare, and names none of
// them itself.
type CredentialKind struct {
	// Name is the key in spec.broker.credentials ("password", "token").
	Name string
	// Doc describes it for the JSON Schema ("a NATS token, by reference").
	Doc string
	// Label names it in `connector check`'s summary ("NKey seed").
	Label string
}

// credentialPassword is the one kind the loader's own rule reads: a
// password without a username names no one to authenticate as, whichever
// protocol declares it.
const credentialPassword = "password"

// rawCredentials is spec.broker.credentials as written. The decoder reads
// it through a struct built from the protocols' kinds ([credentialsType]),
// so that an unknown key, a wrong type and a misspelling are reported as in
// any other block, with a did-you-mean.
type rawCredentials struct {
	Username string               `yaml:"username" validate:"omitempty,max=1024"`
	Secrets  map[string]SecretRef `yaml:"-"` // by kind; only the kinds written
}

var typeRawCredentials = reflect.TypeFor[rawCredentials]()

const usernameDoc = "the user name to authenticate as"

// credentialKinds returns every kind the protocols declare, once each, in
// the order of the protocols and of their declarations; the first
// declaration of a name gives its Doc and Label.
func (ps protocolList) credentialKinds() []CredentialKind {
	var out []CredentialKind
	for _, p := range ps {
		for _, k := range p.Credentials() {
			if !slices.ContainsFunc(out, func(o CredentialKind) bool { return o.Name == k.Name }) {
				out = append(out, k)
			}
		}
	}
	return out
}

// credentialsType is the struct spec.broker.credentials decodes into and
// the JSON Schema describes: username, then one SecretRef for each kind.
func (ps protocolList) credentialsType() reflect.Type {
	fields := []reflect.StructField{{
		Name: "Username", Type: reflect.TypeFor[string](),
		Tag: reflect.StructTag(`yaml:"username" validate:"omitempty,max=1024" doc:"` + usernameDoc + `"`),
	}}
	for i, k := range ps.credentialKinds() {
		fields = append(fields, reflect.StructField{
			Name: fmt.Sprintf("Secret%d", i), Type: typeSecretRef,
			Tag: reflect.StructTag(fmt.Sprintf(`yaml:%q doc:%q`, k.Name, k.Doc)),
		})
	}
	return reflect.StructOf(fields)
}

// decodeCredentials decodes n into v, a rawCredentials, through d.creds.
func (d *decoder) decodeCredentials(path string, at Position, n ast.Node, v reflect.Value) {
	s := reflect.New(d.creds).Elem()
	d.decodeStruct(path, at, n, s)
	rc := v.Addr().Interface().(*rawCredentials)
	rc.Username = s.Field(0).String()
	for i := 1; i < s.NumField(); i++ {
		ref := s.Field(i).Interface().(SecretRef)
		if ref.IsZero() {
			continue
		}
		if rc.Secrets == nil {
			rc.Secrets = map[string]SecretRef{}
		}
		rc.Secrets[d.creds.Field(i).Tag.Get("yaml")] = ref
	}
}

// bindCredentials applies the rules every protocol shares: a kind the
// resource's protocol does not declare is refused, naming the protocols
// that do, and a password needs a username. The protocol applies its own
// rules (which combinations, whether a password is required) in its
// Broker.
func (b *binder) bindCredentials(rc *rawCredentials) {
	const base = "spec.broker.credentials"
	cr := &b.c.Broker.Credentials
	cr.Username = rc.Username
	var own []CredentialKind
	if b.protoOK {
		own = b.proto.Credentials()
	}
	for _, name := range sortedKeys(rc.Secrets) {
		ref := rc.Secrets[name]
		if b.protoOK && !slices.ContainsFunc(own, func(k CredentialKind) bool { return k.Name == name }) {
			path := base + "." + name
			b.fail(path, b.lookupPos(path, true), "", "credentials-protocol",
				fmt.Sprintf("is a %s credential, but spec.protocol is %s", b.declaring(name), b.c.Protocol), ownCredentialsHint(own))
			continue
		}
		if ref.File != "" {
			ref.File = b.relTo(ref.File)
		}
		if cr.Secrets == nil {
			cr.Secrets = map[string]SecretRef{}
		}
		cr.Secrets[name] = ref
	}
	if _, ok := rc.Secrets[credentialPassword]; ok && rc.Username == "" {
		b.fail(base+".password", b.lookupPos(base+".password", true), "", "credentials-incomplete",
			"is set without a username", "add username: NAME")
	}
}

// declaring names the protocols that declare the credential kind name.
func (b *binder) declaring(name string) string {
	var ps protocolList
	for _, p := range b.ld.protocols {
		if slices.ContainsFunc(p.Credentials(), func(k CredentialKind) bool { return k.Name == name }) {
			ps = append(ps, p)
		}
	}
	return ps.choice()
}

// ownCredentialsHint says what a protocol accepts: "use username and
// password".
func ownCredentialsHint(own []CredentialKind) string {
	names := []string{"username"}
	for _, k := range own {
		names = append(names, k.Name)
	}
	if len(names) == 1 {
		return "remove it: this protocol takes no credentials"
	}
	return "use " + strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func sortedKeys[V any](m map[string]V) []string {
	keys := make([]string, 0, len(m))
	for k := range m {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	return keys
}
