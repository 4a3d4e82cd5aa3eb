package resources

import (
	"errors"
	"fmt"
	"net/url"
	"reflect"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"

	"github.com/go-playground/validator/v10"

	"weida.dev/connector/weida/address"
)

// newValidator returns a validator that knows this package's rules and
// reports fields by their YAML names.
func newValidator() *validator.Validate {
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
		"dnslabel":    isDNSLabel,
		"labelkey":    isLabelKey,
		"labelvalue":  func(s string) bool { return s == "" || isLabelName(s) },
		"clientid":    isPrintable,
		"sharename":   func(s string) bool { return isPrintable(s) && !strings.ContainsAny(s, "/+#") },
		"natsname":    func(s string) bool { return isPrintable(s) && !strings.ContainsAny(s, " \t*>") },
		"jsname":      func(s string) bool { return len(s) <= 255 && isPrintable(s) && !strings.ContainsAny(s, " \t.*>/\\") },
		"amqpname":    isAMQPName,
		"weidaurl":    func(s string) bool { _, err := address.Parse(s); return err == nil },
		"fingerprint": func(s string) bool { return address.ValidateFingerprint(s) == nil },
	} {
		mustRegister(v, tag, func(fl validator.FieldLevel) bool { return fn(fl.Field().String()) })
	}
	mustRegister(v, "mqttqos", func(fl validator.FieldLevel) bool {
		q := fl.Field().Int()
		return q == 0 || q == 1
	})
	mustRegister(v, "sessionexpiry", func(fl validator.FieldLevel) bool {
		d := time.Duration(fl.Field().Int())
		return d >= 0 && d%time.Second == 0 && d/time.Second <= 1<<32-1
	})
	v.RegisterStructValidation(func(sl validator.StructLevel) {
		s := sl.Current().Interface().(rawSpec)
		if s.Broker == nil || s.Broker.URL == "" {
			return
		}
		if p := brokerURLProblem(s.Protocol, s.Broker.URL); p != nil {
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

// isPrintable: valid UTF-8, not empty, no control characters.
func isPrintable(s string) bool {
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

// isAMQPName: AMQP 0-9-1 exchange and queue names: at most 255 bytes of
// letters, digits, '-', '_', '.' and ':'.
func isAMQPName(s string) bool {
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

// urlProblem is why a broker URL is refused.
type urlProblem struct{ rule, msg, hint string }

// brokerSchemes are the accepted schemes per protocol: the plain one first,
// then the TLS one.
func brokerSchemes(protocol string) (plain, secure string, port, securePort int) {
	switch protocol {
	case "mqtt":
		return "mqtt", "mqtts", 1883, 8883
	case "nats":
		return "nats", "tls", 4222, 4222
	case "amqp":
		return "amqp", "amqps", 5672, 5671
	}
	return "", "", 0, 0
}

// brokerURLProblem checks a broker URL for protocol, or returns nil when it
// is acceptable. An unknown protocol is reported elsewhere.
func brokerURLProblem(protocol, raw string) *urlProblem {
	plain, secure, port, _ := brokerSchemes(protocol)
	if plain == "" {
		return nil
	}
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
	switch u.Scheme {
	case plain, secure:
	case "tcp", "ssl", "ws", "wss", "mqtt+tls", "nats+tls":
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
	if protocol != "amqp" && u.Path != "" && u.Path != "/" {
		return &urlProblem{"broker-url", "must not have a path", "write " + example}
	}
	// The escaped path, so that a virtual host written with %2F counts as
	// one segment, as the hint says.
	if protocol == "amqp" && strings.Count(strings.TrimPrefix(u.EscapedPath(), "/"), "/") > 0 {
		return &urlProblem{"broker-url", "the path is the virtual host, which must be one path segment (write %2F for '/')",
			"write amqp://127.0.0.1:5672/ for the default virtual host, or amqp://host:5672/name"}
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
func (d *decoder) validateRaw(v *validator.Validate, raw *rawResource) {
	err := v.Struct(raw)
	var verrs validator.ValidationErrors
	if !errors.As(err, &verrs) {
		return
	}
	for _, fe := range verrs {
		ns := fe.Namespace()
		_, path, _ := strings.Cut(ns, ".") // drop the root type's name
		value := formatValue(fe.Value())
		if fe.Tag() == "brokerurl" { // redact before shortening, which could cut off the '@'
			value = shorten(redactUserinfo(fe.Value().(string)))
		}
		rule, msg, hint := explain(fe, path, value)
		if d.hasError(path) {
			continue // the decoder already said what is wrong here
		}
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
func explain(fe validator.FieldError, path, value string) (rule, msg, hint string) {
	tag, param := fe.Tag(), fe.Param()
	rule = tag
	isList := fe.Kind() == reflect.Slice || fe.Kind() == reflect.Map
	switch tag {
	case "required":
		msg = "is required"
		hint = requiredHint(genericPath(path))
	case "required_with":
		other := map[string]string{"KeyFile": "keyFile", "CertFile": "certFile"}[param]
		msg = fmt.Sprintf("is required when %s is set", other)
		hint = "set both certFile and keyFile, or neither"
	case "oneof":
		msg = "must be one of " + strings.ReplaceAll(param, " ", ", ")
	case "min":
		if isList {
			msg = fmt.Sprintf("must have at least %s entries", param)
			if genericPath(path) == "spec.routes" {
				hint = requiredHint("spec.routes")
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
	case "sharename":
		msg = "must be printable text without '/', '+' or '#' (MQTT 5 §4.8.2)"
	case "natsname":
		msg = "must be printable text without whitespace, '*' or '>'"
	case "jsname":
		msg = "must be a JetStream name: printable, without whitespace, '.', '*', '>', '/' or '\\'"
	case "amqpname":
		msg = "must be at most 255 bytes of letters, digits, '-', '_', '.' and ':'"
	case "hostname_rfc1123":
		msg = "must be a host name"
	case "mqttqos":
		rule = "mqtt-qos"
		msg = "must be 0 or 1"
		if value == "2" {
			rule = "mqtt-qos-2"
			msg = "QoS 2 is refused: exactly-once delivery cannot be kept across weida, which delivers at most once to each subscriber"
		}
		hint = "write qos: 1 (at least once from the broker) or qos: 0 (and state the at-most-once loss)"
	case "sessionexpiry":
		msg = "must be a whole number of seconds from 0s to 4294967295s (MQTT 5 Session Expiry Interval)"
		hint = "for example 1h"
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
		p := brokerURLProblem(param, fe.Value().(string))
		if p == nil { // cannot happen: the rule reported it
			p = &urlProblem{"broker-url", "is not accepted", ""}
		}
		rule, msg, hint = p.rule, p.msg, p.hint
	default:
		msg = fmt.Sprintf("breaks the rule %s %s", tag, param)
	}
	return rule, msg, hint
}

func requiredHint(gpath string) string {
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
		return "protocol: mqtt, nats or amqp"
	case "spec.direction":
		return "direction: inbound (broker to weida) or outbound (weida to broker)"
	case "spec.broker":
		return "broker: {url: mqtt://127.0.0.1:1883}"
	case "spec.broker.url":
		return "for example url: mqtt://127.0.0.1:1883"
	case "spec.weida":
		return "inbound: weida: {listen: weida://127.0.0.1:7001/path}; outbound: weida: {dial: weida://sha256:<fingerprint>@host:port/path}"
	case "spec.routes":
		return `add at least one route: routes: [{filter: "sensors/+/temperature"}]`
	case "spec.routes[].filter":
		return `write the filter in the broker's own grammar, quoted when it starts with '#' (which otherwise starts a YAML comment), '*', '>', '&' or '!': filter: "#"`
	case "spec.broker.nats.jetstream.stream":
		return "name the JetStream stream: jetstream: {stream: ORDERS, durable: connector}"
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
