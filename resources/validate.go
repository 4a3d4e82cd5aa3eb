package resources

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"slices"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-playground/validator/v10"

	"weida.dev/connector/weida/address"
)

// newValidator returns a validator that knows this package's rules and
// reports fields by their YAML names. spec.protocol must name one of ps.
func newValidator(ps protocolList) *validator.Validate {
	v := validator.New()
	v.RegisterTagNameFunc(func(f reflect.StructField) string {
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "-" {
			return ""
		}
		return name
	})
	for tag, fn := range map[string]func(string) bool{
		"apiversion":  func(s string) bool { return s == APIVersion },
		"kind":        func(s string) bool { return s == Kind },
		"protocol":    func(s string) bool { return ps.byName(s) != nil },
		"dnslabel":    isDNSLabel,
		"labelkey":    isLabelKey,
		"labelvalue":  func(s string) bool { return s == "" || isLabelName(s) },
		"clientid":    IsPrintable,
		"weidaurl":    func(s string) bool { _, err := address.Parse(s); return err == nil },
		"fingerprint": func(s string) bool { return address.ValidateFingerprint(s) == nil },
	} {
		mustRegister(v, tag, func(fl validator.FieldLevel) bool { return fn(fl.Field().String()) })
	}
	v.RegisterStructValidation(func(sl validator.StructLevel) {
		s := sl.Current().Interface().(rawSpec)
		if s.Broker == nil || s.Broker.URL == "" {
			return
		}
		p := ps.byName(s.Protocol)
		if p == nil {
			return // reported as spec.protocol
		}
		if brokerURLProblem(p, s.Broker.URL) != nil {
			sl.ReportError(s.Broker.URL, "broker.url", "Broker.URL", "brokerurl", s.Protocol)
		}
	}, rawSpec{})
	return v
}

func mustRegister(v *validator.Validate, tag string, fn validator.Func) {
	if err := v.RegisterValidation(tag, fn); err != nil {
		panic("resources: registering validation " + tag + ": " + err.Error())
	}
}

func isDNSLabel(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// isLabelName: Kubernetes label names and values: 1..63 characters,
// alphanumerics with '-', '_' or '.' between.
func isLabelName(s string) bool {
	if len(s) == 0 || len(s) > 63 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || i == len(s)-1 || (c != '-' && c != '_' && c != '.')) {
			return false
		}
	}
	return true
}

// isLabelKey: an optional DNS-subdomain prefix and '/', then a label name.
func isLabelKey(s string) bool {
	prefix, name, found := strings.Cut(s, "/")
	if !found {
		return isLabelName(s)
	}
	if len(prefix) == 0 || len(prefix) > 253 {
		return false
	}
	for _, l := range strings.Split(prefix, ".") {
		if !isDNSLabel(l) {
			return false
		}
	}
	return isLabelName(name)
}

// IsPrintable reports whether s is valid UTF-8 text without control
// characters, and not empty: what a broker accepts as a name or an
// identifier. Protocols use it in their own rules.
func IsPrintable(s string) bool {
	if s == "" || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if unicode.IsControl(r) {
			return false
		}
	}
	return true
}

// urlProblem is why a broker URL is refused.
type urlProblem struct{ rule, msg, hint string }

// brokerURLProblem checks a broker URL against p's rules, or returns nil
// when it is acceptable.
//
// One check per URL part, in the order a URL is written, each with its
// own rule name: the branches are the rules.
func brokerURLProblem(p Protocol, raw string) *urlProblem {
	rules, protocol := p.URL(), p.Name()
	plain, secure, port := rules.Scheme, rules.TLSScheme, rules.Port
	example := fmt.Sprintf("%s://127.0.0.1:%d", plain, port)
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		msg := err.Error()
		if errors.As(err, &ue) {
			msg = ue.Err.Error()
		}
		return &urlProblem{"broker-url", "is not a URL: " + msg, "write " + example}
	}
	if u.User != nil {
		return &urlProblem{"broker-url-credentials", "carries user information; credentials never go in the URL",
			"remove it and write spec.broker.credentials: {username: NAME, password: {env: VAR}}"}
	}
	switch {
	case u.Scheme == plain || u.Scheme == secure:
	case slices.Contains([]string{"tcp", "ssl", "ws", "wss"}, u.Scheme) || strings.HasSuffix(u.Scheme, "+tls"):
		// Transports client libraries spell as schemes (mqtt+tls,
		// nats+tls), which no protocol of the list accepts.
		return &urlProblem{"broker-url-scheme", fmt.Sprintf("scheme %s:// is not accepted for %s", u.Scheme, protocol),
			fmt.Sprintf("write %s:// (plain TCP) or %s:// (TLS); WebSocket transports are not supported", plain, secure)}
	default:
		return &urlProblem{"broker-url-scheme", fmt.Sprintf("scheme %q does not belong to protocol %s", u.Scheme, protocol),
			fmt.Sprintf("write %s:// or %s://, or change spec.protocol", plain, secure)}
	}
	if u.Opaque != "" || u.Host == "" || u.Hostname() == "" {
		return &urlProblem{"broker-url", "has no host", "write " + example}
	}
	if p := u.Port(); p != "" {
		if n, err := parsePort(p); err != nil || n == 0 {
			return &urlProblem{"broker-url", "port must be a number from 1 to 65535", "write " + example}
		}
	}
	if u.RawQuery != "" || u.Fragment != "" || strings.Contains(raw, "?") || strings.Contains(raw, "#") {
		return &urlProblem{"broker-url", "must not have a query or fragment", "options go in spec.broker, not in the URL"}
	}
	if rules.Path == "" && u.Path != "" && u.Path != "/" {
		return &urlProblem{"broker-url", "must not have a path", "write " + example}
	}
	// The escaped path, so that a name written with %2F counts as one
	// segment, as the hint says.
	if rules.Path != "" && strings.Count(strings.TrimPrefix(u.EscapedPath(), "/"), "/") > 0 {
		return &urlProblem{"broker-url", fmt.Sprintf("the path is the %s, which must be one path segment (write %%2F for '/')", rules.Path),
			fmt.Sprintf("write %s://127.0.0.1:%d/ for the default %s, or %s://host:%d/name", plain, port, rules.Path, plain, port)}
	}
	return nil
}

func parsePort(p string) (int, error) {
	n := 0
	if len(p) == 0 || len(p) > 5 {
		return 0, errors.New("bad port")
	}
	for i := 0; i < len(p); i++ {
		if p[i] < '0' || p[i] > '9' {
			return 0, errors.New("bad port")
		}
		n = n*10 + int(p[i]-'0')
	}
	if n > 65535 {
		return 0, errors.New("bad port")
	}
	return n, nil
}

// validateRaw runs the structural rules and turns each failure into a
// FieldError positioned with the decoder's map.
func (d *decoder) validateRaw(v *validator.Validate, raw *rawResource, ps protocolList) {
	d.validate(v, raw, "", func(fe validator.FieldError, path, value string) (string, string, string) {
		return explain(fe, path, value, ps)
	})
}

// validate checks x, whose fields are written under base, and reports each
// failure as explained by why.
func (d *decoder) validate(v *validator.Validate, x any, base string, why func(fe validator.FieldError, path, value string) (rule, msg, hint string)) {
	err := v.Struct(x)
	var verrs validator.ValidationErrors
	if !errors.As(err, &verrs) {
		return
	}
	for _, fe := range verrs {
		ns := fe.Namespace()
		_, path, _ := strings.Cut(ns, ".") // drop the root type's name
		path = join(base, path)
		value := formatValue(fe.Value())
		if fe.Tag() == "brokerurl" { // redact before shortening, which could cut off the '@'
			value = shorten(redactUserinfo(fe.Value().(string)))
		}
		if d.hasError(path) || fe.Tag() == "required" && d.meant[path] {
			continue // the decoder already said what is wrong here
		}
		rule, msg, hint := why(fe, path, value)
		d.fail(path, d.lookupPos(path, fe.Tag() == "required"), value, rule, msg, hint)
	}
}

// hasError reports whether the decoder already reported path or one of
// its ancestors (a mapping that was a list, say): what it says about the
// parts would only repeat that.
func (d *decoder) hasError(path string) bool {
	for _, e := range d.errs {
		if e.Field == path || e.Field == "" || strings.HasPrefix(path, e.Field+".") || strings.HasPrefix(path, e.Field+"[") {
			return true
		}
	}
	return false
}

// lookupPos finds where to point for path: the value when it is written,
// otherwise (a missing field) the nearest written ancestor's key.
func (d *decoder) lookupPos(path string, missing bool) Position {
	for p := path; ; {
		if fp, ok := d.pos[p]; ok {
			if missing || p != path {
				if fp.key.Line != 0 {
					return fp.key
				}
			}
			return fp.value
		}
		i := strings.LastIndexAny(p, ".[")
		if i < 0 {
			break
		}
		p = p[:i]
	}
	return d.docPos()
}

func (d *decoder) docPos() Position {
	if fp, ok := d.pos[""]; ok {
		return fp.value
	}
	return Position{File: d.file, Line: d.lineBase + 1, Column: 1}
}

func formatValue(v any) string {
	rv := reflect.ValueOf(v)
	for rv.IsValid() && rv.Kind() == reflect.Pointer {
		if rv.IsNil() {
			return ""
		}
		rv = rv.Elem()
	}
	if !rv.IsValid() {
		return ""
	}
	switch rv.Kind() {
	case reflect.Slice, reflect.Map, reflect.Struct:
		return ""
	}
	if rv.Type() == typeDuration {
		return time.Duration(rv.Int()).String()
	}
	return shorten(fmt.Sprint(rv.Interface()))
}

// genericPath replaces list indices and map keys with [].
func genericPath(path string) string {
	var b strings.Builder
	for i := 0; i < len(path); i++ {
		if path[i] == '[' {
			j := strings.IndexByte(path[i:], ']')
			if j > 0 {
				b.WriteString("[]")
				i += j
				continue
			}
		}
		b.WriteByte(path[i])
	}
	return b.String()
}

// explain turns a validator failure into a rule, a message and a hint.
//
// It is one switch over the validator's tags, each mapped to its message
// and hint; the length is the vocabulary's, not nested logic.
func explain(fe validator.FieldError, path, value string, ps protocolList) (rule, msg, hint string) {
	tag, param := fe.Tag(), fe.Param()
	rule = tag
	isList := fe.Kind() == reflect.Slice || fe.Kind() == reflect.Map
	switch tag {
	case "required":
		msg = "is required"
		hint = requiredHint(genericPath(path), ps)
	case "required_with":
		other := map[string]string{"KeyFile": "keyFile", "CertFile": "certFile"}[param]
		msg = fmt.Sprintf("is required when %s is set", other)
		hint = "set both certFile and keyFile, or neither"
	case "oneof":
		msg = "must be one of " + strings.ReplaceAll(param, " ", ", ")
	case "protocol":
		rule = "oneof"
		msg = "must be one of " + strings.Join(ps.names(), ", ")
	case "min":
		if isList {
			msg = fmt.Sprintf("must have at least %s entries", param)
			if genericPath(path) == "spec.routes" {
				hint = requiredHint("spec.routes", ps)
			}
		} else {
			msg = "must be at least " + param
		}
	case "max":
		if isList {
			msg = fmt.Sprintf("must have at most %s entries", param)
			if genericPath(path) == "spec.routes" {
				msg = fmt.Sprintf("has more than %s routes; each outbound route is one weida subscription, and weida allows %s per connection", param, param)
				hint = "split the routes over several resources, or use wildcards"
			}
		} else if fe.Kind() == reflect.String {
			msg = fmt.Sprintf("must be at most %s bytes", param)
		} else {
			msg = "must be at most " + param
		}
	case "unique":
		msg = "lists the same value twice"
		hint = "remove the repeated entry"
	case "apiversion":
		msg = fmt.Sprintf("must be %s", APIVersion)
		hint = "apiVersion: " + APIVersion
	case "kind":
		msg = fmt.Sprintf("must be %s; this file may hold only Connector resources", Kind)
		hint = "kind: " + Kind
	case "dnslabel":
		msg = "must be a DNS label: 1 to 63 lowercase letters, digits and '-', starting and ending with a letter or digit"
		hint = fmt.Sprintf("for example %q", suggestLabel(value))
	case "labelkey", "labelvalue":
		msg = "is not a valid label " + strings.TrimPrefix(tag, "label") + ": up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit"
		if tag == "labelkey" {
			msg += ", optionally after a DNS prefix and '/'"
		}
	case "clientid":
		msg = "must be printable UTF-8 text without control characters"
	case "hostname_rfc1123":
		msg = "must be a host name"
	case "weidaurl":
		rule = "weida-url"
		_, err := address.Parse(fe.Value().(string))
		msg = "is not a weida URL: " + strings.TrimPrefix(err.Error(), fmt.Sprintf("%s %q: ", address.ErrSyntax, fe.Value()))
		hint = "write weida://host:port/path, e.g. weida://127.0.0.1:7001/sensors"
	case "fingerprint":
		rule = "fingerprint"
		msg = `must be "sha256:" followed by 64 lowercase hexadecimal digits`
		hint = "`connector weida` prints a certificate's fingerprint"
	case "brokerurl":
		var p *urlProblem
		if proto := ps.byName(param); proto != nil {
			p = brokerURLProblem(proto, fe.Value().(string))
		}
		if p == nil { // cannot happen: the rule reported it
			p = &urlProblem{"broker-url", "is not accepted", ""}
		}
		rule, msg, hint = p.rule, p.msg, p.hint
	default:
		msg = fmt.Sprintf("breaks the rule %s %s", tag, param)
	}
	return rule, msg, hint
}

func requiredHint(gpath string, ps protocolList) string {
	switch gpath {
	case "apiVersion":
		return "apiVersion: " + APIVersion
	case "kind":
		return "kind: " + Kind
	case "metadata":
		return "metadata: {name: my-connector}"
	case "metadata.name":
		return "name the resource with a DNS label, e.g. name: sensors-in"
	case "spec":
		return "a Connector needs a spec: protocol, direction, broker, weida and routes"
	case "spec.protocol":
		return "protocol: " + ps.choice()
	case "spec.direction":
		return "direction: inbound (broker to weida) or outbound (weida to broker)"
	case "spec.broker":
		if len(ps) > 0 {
			u := ps[0].URL()
			return fmt.Sprintf("broker: {url: %s://127.0.0.1:%d}", u.Scheme, u.Port)
		}
	case "spec.broker.url":
		if len(ps) > 0 {
			u := ps[0].URL()
			return fmt.Sprintf("for example url: %s://127.0.0.1:%d", u.Scheme, u.Port)
		}
	case "spec.weida":
		return "inbound: weida: {listen: weida://127.0.0.1:7001/path}; outbound: weida: {dial: weida://sha256:<fingerprint>@host:port/path}"
	case "spec.routes":
		return `add at least one route: routes: [{filter: "sensors/+/temperature"}]`
	case "spec.routes[].filter":
		return `write the filter in the broker's own grammar, quoted when it starts with '#' (which otherwise starts a YAML comment), '*', '>', '&' or '!': filter: "#"`
	}
	return ""
}

// suggestLabel turns s into a DNS label, for a hint.
func suggestLabel(s string) string {
	var b strings.Builder
	dash := false
	for _, r := range strings.ToLower(s) {
		switch {
		case r >= 'a' && r <= 'z', r >= '0' && r <= '9':
			if dash && b.Len() > 0 {
				b.WriteByte('-')
			}
			dash = false
			b.WriteRune(r)
		default:
			dash = true
		}
		if b.Len() >= 63 {
			break
		}
	}
	if b.Len() == 0 {
		return "my-connector"
	}
	return b.String()
}

// redactUserinfo hides whatever precedes the host in a URL: a password, or
// a NATS token written where a user name goes. It works on the text, so
// that it also covers URLs that do not parse.
func redactUserinfo(raw string) string {
	prefix, rest := "", raw
	if i := strings.Index(raw, "://"); i >= 0 {
		prefix, rest = raw[:i+3], raw[i+3:]
	}
	end := strings.IndexAny(rest, "/?#")
	if end < 0 {
		end = len(rest)
	}
	at := strings.LastIndexByte(rest[:end], '@')
	if at < 0 {
		return raw
	}
	return prefix + redacted + rest[at:]
}
