package resources

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"github.com/goccy/go-yaml/ast"
	"github.com/goccy/go-yaml/token"
)

// The decoder walks goccy/go-yaml's AST into the raw schema types of
// schema.go. It exists instead of yaml.Unmarshal with DisallowUnknownField
// because that stops at the first problem: this one keeps going, records
// the position of every field it sets (validation errors need them), and
// reports every unknown field, wrong type and duplicate key of a document.
//
// The schema is finite and has no recursive types, so the walk is bounded
// by the input's size even when aliases are used; maxAliasDepth bounds
// alias chains anyway.

const (
	maxAliasDepth = 16
	// maxErrorsPerDocument keeps a pathological document (say, a long list
	// of wrong values) from burying everything else.
	maxErrorsPerDocument = 50
)

// Duration is a YAML duration written as Go writes it: "90s", "1h30m".
type Duration time.Duration

// ByteSize is a YAML size in bytes: an integer, or a string with a binary
// unit ("64KiB", "1MiB", "2GiB").
type ByteSize int64

type fieldPos struct {
	key   Position // where the key is written; zero for sequence items and the root
	value Position // where the value starts
}

type decoder struct {
	file     string
	lineBase int // added to every line: the document's offset in its file
	anchors  map[string]ast.Node
	pos      map[string]fieldPos
	errs     []*FieldError
	aliases  int // current alias nesting
	dropped  int // errors not recorded because of maxErrorsPerDocument
	// sections are the protocol names whose spec.broker.<name> blocks
	// are kept as nodes for the protocol to decode.
	sections []string
	// creds is the struct spec.broker.credentials decodes through, with
	// a field for each credential kind the protocols declare.
	creds reflect.Type
	// meant are the fields an unknown field's did-you-mean named: a
	// required one of them is not reported missing, since the unknown
	// field's error already says what to write.
	meant map[string]bool
}

func newDecoder(file string, lineBase int) *decoder {
	return &decoder{
		file:     file,
		lineBase: lineBase,
		anchors:  map[string]ast.Node{},
		pos:      map[string]fieldPos{},
		meant:    map[string]bool{},
	}
}

func (d *decoder) position(tk *token.Token) Position {
	if tk == nil || tk.Position == nil {
		return Position{File: d.file}
	}
	return Position{File: d.file, Line: tk.Position.Line + d.lineBase, Column: tk.Position.Column}
}

// nodePos is where a node's value starts. A block mapping's own token is
// its first ':', so it reports its first key instead.
func (d *decoder) nodePos(n ast.Node) Position {
	switch m := n.(type) {
	case *ast.MappingNode:
		if len(m.Values) > 0 && m.Values[0].Key != nil && !m.IsFlowStyle {
			return d.position(m.Values[0].Key.GetToken())
		}
		if m.Start != nil {
			return d.position(m.Start)
		}
	case *ast.MappingValueNode:
		if m.Key != nil {
			return d.position(m.Key.GetToken())
		}
	case *ast.AnchorNode:
		if m.Start != nil {
			return d.position(m.Start)
		}
	case *ast.TagNode:
		if m.Start != nil {
			return d.position(m.Start)
		}
	}
	return d.position(n.GetToken())
}

func (d *decoder) fail(path string, at Position, value, rule, msg, hint string) {
	if len(d.errs) >= maxErrorsPerDocument {
		d.dropped++
		return
	}
	d.errs = append(d.errs, &FieldError{Position: at, Field: path, Value: value, Rule: rule, Message: msg, Hint: hint})
}

// resolve follows anchors, aliases and tags to the node that holds the
// value. It returns nil for null (an absent value, as in Kubernetes).
// done must be called when the caller has finished with the node.
func (d *decoder) resolve(path string, n ast.Node) (_ ast.Node, done func()) {
	depth := 0
	done = func() { d.aliases -= depth }
	for {
		switch v := n.(type) {
		case nil, *ast.NullNode:
			return nil, done
		case *ast.AnchorNode:
			if v.Name != nil {
				d.anchors[v.Name.GetToken().Value] = v.Value
			}
			n = v.Value
		case *ast.AliasNode:
			name := ""
			if v.Value != nil {
				name = v.Value.GetToken().Value
			}
			target, ok := d.anchors[name]
			if !ok {
				d.fail(path, d.nodePos(v), "*"+name, "yaml-alias", fmt.Sprintf("alias *%s refers to no anchor defined before it in this document", name),
					fmt.Sprintf("a value that starts with '*' must be quoted: %q; for an alias, define &%s earlier in the same document", "*"+name, name))
				return nil, done
			}
			if d.aliases >= maxAliasDepth {
				d.fail(path, d.nodePos(v), "*"+name, "yaml-alias", "aliases nest too deeply", "")
				return nil, done
			}
			d.aliases++
			depth++
			n = target
		case *ast.TagNode:
			tag := ""
			if v.Start != nil {
				tag = v.Start.Value
			}
			switch tag {
			case "!!str":
				if s, ok := v.Value.(ast.ScalarNode); ok && v.Value.Type() != ast.StringType && v.Value.Type() != ast.LiteralType {
					// !!str 123 is the string "123".
					return ast.String(s.GetToken()), done
				}
				n = v.Value
			case "!!int", "!!bool", "!!float", "!!map", "!!seq", "!!null":
				n = v.Value
			default:
				d.fail(path, d.nodePos(v), tag, "yaml-tag", fmt.Sprintf("the tag %s is not supported", tag), "a value that starts with '!' must be quoted; otherwise remove the tag")
				return nil, done
			}
		default:
			return n, done
		}
	}
}

var (
	typeSecretRef = reflect.TypeFor[SecretRef]()
	typeDuration  = reflect.TypeFor[Duration]()
	typeByteSize  = reflect.TypeFor[ByteSize]()
	typeRawBroker = reflect.TypeFor[rawBroker]()
	typeRawClient = reflect.TypeFor[rawClient]()
)

// decode stores the YAML value n into v, which must be settable.
//
// One case per YAML node kind and special field type; the switch is the
// decoder's whole dispatch and reads best in one place.
func (d *decoder) decode(path string, key Position, n ast.Node, v reflect.Value) {
	n, done := d.resolve(path, n)
	defer done()
	if n == nil {
		if key.Line != 0 {
			d.pos[path] = fieldPos{key: key, value: key}
		}
		return
	}
	at := d.nodePos(n)
	d.pos[path] = fieldPos{key: key, value: at}

	switch v.Type() {
	case typeSecretRef:
		d.decodeSecret(path, at, n, v)
		return
	case typeDuration:
		s, ok := d.scalarString(path, at, n, "a duration such as 30s or 1h")
		if !ok {
			return
		}
		dur, err := time.ParseDuration(s)
		if err != nil {
			d.fail(path, at, s, "duration", "is not a duration", `write a number and a unit: "500ms", "30s", "1h"`)
			return
		}
		v.SetInt(int64(dur))
		return
	case typeByteSize:
		d.decodeByteSize(path, at, n, v)
		return
	case typeRawCredentials:
		d.decodeCredentials(path, at, n, v)
		return
	case typeRawClient:
		if _, mapping := n.(*ast.MappingNode); mapping {
			d.decodeStruct(path, at, n, v)
			return
		}
		if s, ok := d.scalarString(path, at, n, `a fingerprint "sha256:<hex>", or a mapping {client|san|commonName, scopes}`); ok {
			rc := v.Addr().Interface().(*rawClient)
			rc.Client, rc.bare = s, true
		}
		return
	}

	switch v.Kind() {
	case reflect.Pointer:
		elem := reflect.New(v.Type().Elem())
		d.decode(path, key, n, elem.Elem())
		v.Set(elem)
	case reflect.Struct:
		d.decodeStruct(path, at, n, v)
	case reflect.Slice:
		seq, ok := n.(*ast.SequenceNode)
		if !ok {
			d.typeError(path, at, n, "a list")
			return
		}
		s := reflect.MakeSlice(v.Type(), len(seq.Values), len(seq.Values))
		for i, item := range seq.Values {
			d.decode(fmt.Sprintf("%s[%d]", path, i), Position{}, item, s.Index(i))
		}
		v.Set(s)
	case reflect.Map:
		d.decodeMap(path, at, n, v)
	case reflect.String:
		if s, ok := d.scalarString(path, at, n, "a string"); ok {
			v.SetString(s)
		}
	case reflect.Bool:
		b, ok := n.(*ast.BoolNode)
		if !ok {
			d.typeError(path, at, n, "true or false")
			return
		}
		v.SetBool(b.Value)
	case reflect.Int:
		i, ok := d.integer(path, at, n)
		if ok {
			v.SetInt(i)
		}
	default:
		panic(fmt.Sprintf("resources: the schema uses an unsupported type %s at %s", v.Type(), path))
	}
}

func (d *decoder) integer(path string, at Position, n ast.Node) (int64, bool) {
	in, ok := n.(*ast.IntegerNode)
	if !ok {
		d.typeError(path, at, n, "an integer")
		return 0, false
	}
	switch x := in.Value.(type) {
	case int64:
		return x, true
	case uint64:
		if x <= math.MaxInt64 {
			return int64(x), true
		}
	}
	d.fail(path, at, in.GetToken().Value, "type", "is out of range", "")
	return 0, false
}

// scalarString returns the text of a string scalar. Numbers and booleans
// are refused rather than converted: "clientID: 0123" would otherwise
// become "83" (octal) and "on" a surprise.
func (d *decoder) scalarString(path string, at Position, n ast.Node, want string) (string, bool) {
	switch s := n.(type) {
	case *ast.StringNode:
		return s.Value, true
	case *ast.LiteralNode:
		if s.Value != nil && s.Value.Value != "" {
			return s.Value.Value, true
		}
		// "filter: >" is a folded block scalar with nothing in it, not the
		// NATS wildcard: refuse it rather than pass on "".
		ind := s.GetToken().Value
		d.fail(path, at, ind, "yaml-quote", fmt.Sprintf("%s starts a YAML block scalar, and the block is empty", ind),
			fmt.Sprintf("to write the character %s, quote it: %q", ind, ind))
		return "", false
	}
	d.typeError(path, at, n, want)
	return "", false
}

func (d *decoder) typeError(path string, at Position, n ast.Node, want string) {
	found, value, hint := describe(n)
	if _, scalar := n.(ast.ScalarNode); scalar && strings.HasPrefix(want, "a string") {
		hint = fmt.Sprintf("quote it to make it a string: %q", value)
	}
	d.fail(path, at, value, "type", fmt.Sprintf("must be %s, not %s", want, found), hint)
}

// describe names a node's kind for a message, with its text for scalars.
func describe(n ast.Node) (kind, value, hint string) {
	switch n.Type() {
	case ast.MappingType, ast.MappingValueType:
		return "a mapping", "", ""
	case ast.SequenceType:
		return "a list", "", ""
	case ast.StringType, ast.LiteralType:
		return "a string", shorten(n.GetToken().Value), ""
	case ast.IntegerType:
		return "an integer", shorten(n.GetToken().Value), ""
	case ast.FloatType, ast.InfinityType, ast.NanType:
		return "a number", shorten(n.GetToken().Value), ""
	case ast.BoolType:
		return "a boolean", n.GetToken().Value, ""
	default:
		return strings.ToLower(n.Type().String()), "", ""
	}
}

type entry struct {
	name   string
	keyPos Position
	value  ast.Node
}

// entries lists a mapping's key/value pairs. Merge keys ("<<: *base") are
// expanded: a key written in the mapping wins over a merged one, and an
// earlier merged mapping wins over a later one. Duplicate keys are errors.
func (d *decoder) entries(path string, at Position, n ast.Node) ([]entry, bool) {
	var pairs []*ast.MappingValueNode
	switch m := n.(type) {
	case *ast.MappingNode:
		pairs = m.Values
	case *ast.MappingValueNode:
		pairs = []*ast.MappingValueNode{m}
	default:
		d.typeError(path, at, n, "a mapping")
		return nil, false
	}
	var own, merged []entry
	seen := map[string]Position{}
	for _, p := range pairs {
		if p.Key == nil {
			continue
		}
		kp := d.position(p.Key.GetToken())
		if p.Key.IsMergeKey() {
			merged = append(merged, d.mergeEntries(path, kp, p.Value)...)
			continue
		}
		name, ok := d.keyName(path, kp, p.Key)
		if !ok {
			continue
		}
		if first, dup := seen[name]; dup {
			d.fail(join(path, name), kp, name, "duplicate-key", fmt.Sprintf("%s is written twice; the first is at line %d", name, first.Line), "keep one of them")
			continue
		}
		seen[name] = kp
		own = append(own, entry{name, kp, p.Value})
	}
	for _, e := range merged {
		if _, dup := seen[e.name]; dup {
			continue
		}
		seen[e.name] = e.keyPos
		own = append(own, e)
	}
	return own, true
}

func (d *decoder) mergeEntries(path string, kp Position, v ast.Node) []entry {
	v, done := d.resolve(path, v)
	defer done()
	var sources []ast.Node
	switch s := v.(type) {
	case nil:
		return nil
	case *ast.SequenceNode:
		sources = s.Values
	default:
		sources = []ast.Node{s}
	}
	var out []entry
	for _, src := range sources {
		src, done := d.resolve(path, src)
		if src == nil {
			done()
			continue
		}
		es, ok := d.entries(path, d.nodePos(src), src)
		done()
		if ok {
			out = append(out, es...)
		}
	}
	return out
}

func (d *decoder) keyName(path string, kp Position, k ast.MapKeyNode) (string, bool) {
	switch key := k.(type) {
	case *ast.StringNode:
		return key.Value, true
	case ast.ScalarNode:
		// "on:" or "123:" as a key: use the text as written, which then
		// fails as an unknown field with a readable name.
		return key.GetToken().Value, true
	}
	d.fail(path, kp, "", "yaml-key", "complex mapping keys are not supported", "write plain keys")
	return "", false
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

type structField struct {
	name  string
	index int
}

func fieldsOf(t reflect.Type) []structField {
	out := make([]structField, 0, t.NumField())
	for i := range t.NumField() {
		tag := t.Field(i).Tag.Get("yaml")
		if tag == "" || tag == "-" {
			continue
		}
		out = append(out, structField{tag, i})
	}
	return out
}

func (d *decoder) decodeStruct(path string, at Position, n ast.Node, v reflect.Value) {
	es, ok := d.entries(path, at, n)
	if !ok {
		return
	}
	fields := fieldsOf(v.Type())
	if v.Type() == typeRawBroker {
		for _, name := range d.sections {
			fields = append(fields, structField{name, -1})
		}
	}
	for _, e := range es {
		child := join(path, e.name)
		i := -2
		for _, f := range fields {
			if f.name == e.name {
				i = f.index
				break
			}
		}
		if i == -1 { // a protocol's block: its protocol decodes it
			d.pos[child] = fieldPos{key: e.keyPos, value: e.keyPos}
			if _, null := e.value.(*ast.NullNode); null || e.value == nil {
				continue // an empty block is no block, as for the other fields
			}
			rb := v.Addr().Interface().(*rawBroker)
			rb.Sections = append(rb.Sections, section{e.name, e.value})
			continue
		}
		if i < 0 {
			d.unknownField(path, child, e, fields)
			continue
		}
		d.decode(child, e.keyPos, e.value, v.Field(i))
	}
}

func (d *decoder) unknownField(parent, child string, e entry, fields []structField) {
	names := make([]string, len(fields))
	for i, f := range fields {
		names[i] = f.name
	}
	where := parent
	if where == "" {
		where = "the top level"
	}
	msg := fmt.Sprintf("%s is not a field of %s", e.name, where)
	hint := "fields here: " + strings.Join(names, ", ")
	if s := closest(e.name, names); s != "" {
		hint = fmt.Sprintf("did you mean %s? (fields here: %s)", s, strings.Join(names, ", "))
		d.meant[join(parent, s)] = true
	}
	if extra := misplaced(e.name); extra != "" {
		hint = extra
	}
	d.fail(child, e.keyPos, "", "unknown-field", msg, hint)
}

// misplaced explains fields that people coming from other tools write.
func misplaced(name string) string {
	switch name {
	case "namespace":
		return "Connector resources have no namespace; the name alone must be unique"
	case "status":
		return "status is not part of a resource file; `connector run` serves it at /status"
	case "admin":
		return "the admin listener is a command-line flag of `connector run`, not part of a resource"
	}
	return ""
}

// closest returns the name within edit distance 2 of s (case-insensitive),
// or "".
func closest(s string, names []string) string {
	best, bestD := "", 3
	for _, n := range names {
		if dist := editDistance(strings.ToLower(s), strings.ToLower(n)); dist < bestD {
			best, bestD = n, dist
		}
	}
	return best
}

func editDistance(a, b string) int {
	if len(a) > 64 || len(b) > 64 {
		return 99
	}
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func (d *decoder) decodeMap(path string, at Position, n ast.Node, v reflect.Value) {
	es, ok := d.entries(path, at, n)
	if !ok {
		return
	}
	m := reflect.MakeMapWithSize(v.Type(), len(es))
	for _, e := range es {
		child := fmt.Sprintf("%s[%s]", path, e.name)
		val := reflect.New(v.Type().Elem()).Elem()
		d.decode(child, e.keyPos, e.value, val)
		m.SetMapIndex(reflect.ValueOf(e.name).Convert(v.Type().Key()), val)
	}
	v.Set(m)
}

func (d *decoder) decodeByteSize(path string, at Position, n ast.Node, v reflect.Value) {
	if _, ok := n.(*ast.IntegerNode); ok {
		if i, ok := d.integer(path, at, n); ok {
			v.SetInt(i)
		}
		return
	}
	s, ok := d.scalarString(path, at, n, `a size: an integer, or a string such as "64KiB" or "8MiB"`)
	if !ok {
		return
	}
	size, ok := parseByteSize(s)
	if !ok {
		d.fail(path, at, s, "size", "is not a size", `write an integer number of bytes, or a number and KiB, MiB or GiB: "64KiB"`)
		return
	}
	v.SetInt(size)
}

func parseByteSize(s string) (int64, bool) {
	mult := int64(1)
	for _, u := range []struct {
		suffix string
		mult   int64
	}{{"KiB", 1 << 10}, {"MiB", 1 << 20}, {"GiB", 1 << 30}, {"B", 1}} {
		if rest, ok := strings.CutSuffix(s, u.suffix); ok {
			s, mult = strings.TrimSpace(rest), u.mult
			break
		}
	}
	n, err := strconv.ParseInt(s, 10, 64)
	if err != nil || n < 0 || n > math.MaxInt64/mult {
		return 0, false
	}
	return n * mult, true
}

// decodeSecret reads {env: NAME} or {file: PATH}. A scalar where a secret
// belongs is refused without echoing it: it may be the secret itself.
func (d *decoder) decodeSecret(path string, at Position, n ast.Node, v reflect.Value) {
	field := path[strings.LastIndexByte(path, '.')+1:]
	if _, ok := n.(ast.ScalarNode); ok {
		d.fail(path, at, redacted, "secret-literal",
			"a secret must not be written in a resource file",
			fmt.Sprintf("write %s: {env: NAME} and set NAME in the connector's environment, or %s: {file: /path/to/secret}", field, field))
		return
	}
	es, ok := d.entries(path, at, n)
	if !ok {
		return
	}
	var ref SecretRef
	for _, e := range es {
		child := join(path, e.name)
		var dst *string
		switch e.name {
		case "env":
			dst = &ref.Env
		case "file":
			dst = &ref.File
		default:
			d.unknownField(path, child, e, []structField{{name: "env"}, {name: "file"}})
			continue
		}
		val := reflect.New(reflect.TypeFor[string]()).Elem()
		d.decode(child, e.keyPos, e.value, val)
		*dst = val.String()
	}
	switch {
	case ref.Env != "" && ref.File != "":
		d.fail(path, at, "", "secret-ref", "names both env and file", fmt.Sprintf("keep one: %s: {env: NAME} or %s: {file: PATH}", field, field))
		return
	case ref.Env == "" && ref.File == "":
		d.fail(path, at, "", "secret-ref", "names neither env nor file", fmt.Sprintf("write %s: {env: NAME} or %s: {file: PATH}", field, field))
		return
	case ref.Env != "" && !validEnvName(ref.Env):
		d.fail(join(path, "env"), d.pos[join(path, "env")].value, ref.Env, "secret-env-name",
			"is not an environment variable name", "use letters, digits and '_', not starting with a digit")
		return
	}
	v.Set(reflect.ValueOf(ref))
}

func validEnvName(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '_', c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z':
		case c >= '0' && c <= '9' && i > 0:
		default:
			return false
		}
	}
	return s != ""
}
