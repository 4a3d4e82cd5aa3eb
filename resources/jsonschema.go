package resources

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strconv"
	"strings"

	"weida.dev/connector/policy"
)

// JSONSchemaID is the $id of the schema [JSONSchema] returns.
const JSONSchemaID = "https://weida.dev/connector/" + "v1alpha1/connector.schema.json"

// JSONSchema returns a JSON Schema (draft 2020-12) of one resource
// document for the protocols ps, for editors to validate and complete
// resource files with. It is generated from the definitions the loader
// decodes with: the yaml tags name the fields, the validate tags give
// required fields, enums, bounds and the project's own rules, pointers mark
// optional sections, the doc tags describe each field, and each protocol's
// [Protocol.BrokerSchema] gives its spec.broker block. spec.protocol
// selects which block is allowed and which conversion policies and broker
// URL schemes apply.
//
// The schema checks structure, not everything: rules that span fields
// (losses, route conversion) or resources stay with the loader, which is
// the authority. Where the two differ the schema is the more lenient, with
// one exception: it refuses null for an optional field, which the loader
// reads as absent. The output is deterministic, with a final newline.
func JSONSchema(ps []Protocol) ([]byte, error) {
	g := &schemaGen{ps: protocolList(ps)}
	root, err := g.object(reflect.TypeFor[rawResource](), "")
	if err != nil {
		return nil, err
	}
	root["$schema"] = "https://json-schema.org/draft/2020-12/schema"
	root["$id"] = JSONSchemaID
	root["title"] = "weida-connector Connector resource"
	root["description"] = "One Connector resource (" + APIVersion + "); a file holds one per YAML document. `connector check` applies every rule."

	spec := props(root)["spec"].(map[string]any)
	broker := props(spec)["broker"].(map[string]any)
	conversion := props(spec)["conversion"].(map[string]any)
	var allOf []any
	var allPolicies []string
	for _, p := range g.ps {
		name := string(p.Name())
		block, s := p.BrokerSchema()
		t := reflect.TypeOf(block)
		if t == nil || t.Kind() != reflect.Pointer || t.Elem().Kind() != reflect.Struct {
			return nil, fmt.Errorf("resources: protocol %s: BrokerSchema returns %T, not a pointer to a struct", name, block)
		}
		g.rules = s.Rules
		bs, err := g.object(t.Elem(), "spec.broker."+name)
		g.rules = nil
		if err != nil {
			return nil, err
		}
		bs["description"] = fmt.Sprintf("%s options; only when spec.protocol is %s", name, name)
		props(broker)[name] = bs

		var others []string
		for _, o := range g.ps {
			if o.Name() != p.Name() {
				others = append(others, string(o.Name()))
			}
		}
		forbid := map[string]any{}
		for _, o := range others {
			forbid[o] = false
		}
		rules := p.URL()
		policies := policy.Names(p.Policies())
		allPolicies = append(allPolicies, policies...)
		allOf = append(allOf, map[string]any{
			"if": map[string]any{
				"properties": map[string]any{"protocol": map[string]any{"const": name}},
				"required":   []string{"protocol"},
			},
			"then": map[string]any{
				"properties": map[string]any{
					"broker": map[string]any{"properties": merge(forbid, map[string]any{
						"url": map[string]any{"pattern": fmt.Sprintf("^(%s|%s)://", rules.Scheme, rules.TLSScheme)},
					})},
					"conversion": map[string]any{"properties": map[string]any{
						"policy": map[string]any{"enum": policies},
					}},
				},
			},
		})
	}
	if len(allOf) > 0 {
		spec["allOf"] = allOf
	}
	props(conversion)["policy"].(map[string]any)["enum"] = allPolicies
	var losses []string
	for _, l := range policy.AllLosses() {
		losses = append(losses, string(l.Loss))
	}
	props(conversion)["losses"].(map[string]any)["items"].(map[string]any)["enum"] = losses

	out, err := json.MarshalIndent(root, "", "  ")
	if err != nil {
		return nil, fmt.Errorf("resources: encoding the JSON Schema: %w", err)
	}
	return append(out, '\n'), nil
}

func props(s map[string]any) map[string]any { return s["properties"].(map[string]any) }

func merge(a, b map[string]any) map[string]any {
	out := make(map[string]any, len(a)+len(b))
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

// schemaGen turns the raw schema types into JSON Schema.
type schemaGen struct {
	ps    protocolList
	rules map[string]Rule // the rules of the protocol block being described
}

// object describes the struct t, written at path.
func (g *schemaGen) object(t reflect.Type, path string) (map[string]any, error) {
	properties := map[string]any{}
	var required []string
	dependent := map[string][]string{}
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("yaml"), ",")
		if name == "" || name == "-" {
			continue
		}
		fpath := join(path, name)
		s, tags, err := g.field(f.Type, f.Tag.Get("validate"), fpath)
		if err != nil {
			return nil, err
		}
		if doc := f.Tag.Get("doc"); doc != "" {
			s["description"] = doc
		}
		properties[name] = s
		for _, tg := range tags {
			switch tg.name {
			case "required":
				required = append(required, name)
			case "required_with":
				other, ok := t.FieldByName(tg.param)
				if !ok {
					return nil, fmt.Errorf("resources: %s: required_with names %s, which %s does not have", fpath, tg.param, t)
				}
				on, _, _ := strings.Cut(other.Tag.Get("yaml"), ",")
				dependent[on] = append(dependent[on], name)
			}
		}
	}
	s := map[string]any{"type": "object", "properties": properties, "additionalProperties": false}
	if len(required) > 0 {
		s["required"] = required
	}
	if len(dependent) > 0 {
		s["dependentRequired"] = dependent
	}
	return s, nil
}

type tag struct{ name, param string }

// splitTags splits a validate tag at "dive": own applies to the field,
// elem to each element of a list or map, keys to a map's keys.
func splitTags(v string) (own, elem, keys []tag) {
	if v == "" {
		return nil, nil, nil
	}
	dst, inKeys := &own, false
	for _, part := range strings.Split(v, ",") {
		name, param, _ := strings.Cut(part, "=")
		switch {
		case name == "dive":
			dst = &elem
			continue
		case name == "keys":
			inKeys = true
			continue
		case name == "endkeys":
			inKeys = false
			continue
		}
		if inKeys {
			keys = append(keys, tag{name, param})
		} else {
			*dst = append(*dst, tag{name, param})
		}
	}
	return own, elem, keys
}

// field describes a field of type t with the validate tag v, and returns
// the tags that concern its parent (required, required_with).
func (g *schemaGen) field(t reflect.Type, v, path string) (map[string]any, []tag, error) {
	own, elem, keys := splitTags(v)
	if t.Kind() == reflect.Pointer {
		t = t.Elem()
	}
	s, err := g.typ(t, path, elem, keys)
	if err != nil {
		return nil, nil, err
	}
	if err := g.apply(s, t, own, path); err != nil {
		return nil, nil, err
	}
	return s, own, nil
}

// typ describes a value of type t; elem and keys are the rules of its
// elements and keys when it is a list or a map.
func (g *schemaGen) typ(t reflect.Type, path string, elem, keys []tag) (map[string]any, error) {
	switch t {
	case typeRawCredentials:
		return g.object(g.ps.credentialsType(), path)
	case typeSecretRef:
		return map[string]any{
			"type": "object",
			"properties": map[string]any{
				"env":  map[string]any{"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$", "description": "an environment variable of the connector's process"},
				"file": map[string]any{"type": "string", "minLength": 1, "description": "a file holding the secret, relative to the resource file"},
			},
			"additionalProperties": false,
			"oneOf":                []any{map[string]any{"required": []string{"env"}}, map[string]any{"required": []string{"file"}}},
		}, nil
	case typeRawClient:
		obj, err := g.object(t, path)
		if err != nil {
			return nil, err
		}
		// Exactly one of the three names the client.
		delete(obj, "required")
		obj["oneOf"] = []any{
			map[string]any{"required": []string{"client"}},
			map[string]any{"required": []string{"san"}},
			map[string]any{"required": []string{"commonName"}},
		}
		obj["properties"].(map[string]any)["san"].(map[string]any)["pattern"] = `^(?:dns|uri|email):\S`
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "string", "pattern": `^(?:sha256:[0-9a-f]{64})$`, "description": "admitted to everything"},
			obj,
		}}, nil
	case typeDuration:
		return map[string]any{"type": "string", "examples": []string{"30s", "1h"}}, nil
	case typeByteSize:
		return map[string]any{"anyOf": []any{
			map[string]any{"type": "integer", "minimum": 0},
			map[string]any{"type": "string", "pattern": `^[0-9]+\s*(B|KiB|MiB|GiB)?$`, "examples": []string{"64KiB", "8MiB"}},
		}}, nil
	}
	switch t.Kind() {
	case reflect.Struct:
		return g.object(t, path)
	case reflect.Slice:
		items, err := g.typ(t.Elem(), path+"[]", nil, nil)
		if err != nil {
			return nil, err
		}
		if err := g.apply(items, t.Elem(), elem, path+"[]"); err != nil {
			return nil, err
		}
		return map[string]any{"type": "array", "items": items}, nil
	case reflect.Map:
		if t.Key().Kind() != reflect.String {
			return nil, fmt.Errorf("resources: %s: a map whose keys are not strings has no JSON Schema", path)
		}
		values, err := g.typ(t.Elem(), path+"[]", nil, nil)
		if err != nil {
			return nil, err
		}
		if err := g.apply(values, t.Elem(), elem, path+"[]"); err != nil {
			return nil, err
		}
		s := map[string]any{"type": "object", "additionalProperties": values}
		if len(keys) > 0 {
			names := map[string]any{"type": "string"}
			if err := g.apply(names, t.Key(), keys, path+"[]"); err != nil {
				return nil, err
			}
			s["propertyNames"] = names
		}
		return s, nil
	case reflect.String:
		return map[string]any{"type": "string"}, nil
	case reflect.Bool:
		return map[string]any{"type": "boolean"}, nil
	case reflect.Int:
		return map[string]any{"type": "integer"}, nil
	}
	return nil, fmt.Errorf("resources: %s: the type %s has no JSON Schema", path, t)
}

// apply adds the rules of tags to s, the schema of a value of type t.
func (g *schemaGen) apply(s map[string]any, t reflect.Type, tags []tag, path string) error {
	omitempty := slices.ContainsFunc(tags, func(tg tag) bool { return tg.name == "omitempty" })
	// A ByteSize's bounds apply to its integer form.
	target := s
	if t == typeByteSize {
		target = s["anyOf"].([]any)[0].(map[string]any)
	}
	for _, tg := range tags {
		switch tg.name {
		case "omitempty", "required_with":
		case "required":
			if t.Kind() == reflect.String {
				s["minLength"] = 1
			}
		case "min", "max":
			n, err := strconv.Atoi(tg.param)
			if err != nil {
				return fmt.Errorf("resources: %s: %s=%s is not a number", path, tg.name, tg.param)
			}
			key := map[reflect.Kind]string{reflect.String: "Length", reflect.Slice: "Items", reflect.Map: "Properties"}[t.Kind()]
			if key == "" {
				key = map[string]string{"min": "minimum", "max": "maximum"}[tg.name]
			} else {
				key = tg.name + key
			}
			target[key] = n
		case "oneof":
			var enum []any
			for _, o := range strings.Fields(tg.param) {
				if t.Kind() == reflect.Int {
					n, err := strconv.Atoi(o)
					if err != nil {
						return fmt.Errorf("resources: %s: oneof value %s is not a number", path, o)
					}
					enum = append(enum, n)
				} else {
					enum = append(enum, o)
				}
			}
			s["enum"] = enum
		case "unique":
			s["uniqueItems"] = true
		default:
			kw, err := g.rule(tg.name, path)
			if err != nil {
				return err
			}
			for k, v := range kw {
				if k == "pattern" {
					p := v.(string)
					if omitempty {
						v = "^(?:" + p + ")?$"
					} else {
						v = "^(?:" + p + ")$"
					}
				}
				s[k] = v
			}
		}
	}
	return nil
}

// rule returns the JSON Schema keywords of a rule of this package or of
// the protocol being described. Every rule must be known here, so that a
// new one cannot be left out of the schema by accident; a rule without a
// JSON Schema form returns no keywords.
func (g *schemaGen) rule(name, path string) (map[string]any, error) {
	const (
		label    = `[a-z0-9](?:[-a-z0-9]{0,61}[a-z0-9])?`
		labelKey = `[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?`
	)
	switch name {
	case "apiversion":
		return map[string]any{"const": APIVersion}, nil
	case "kind":
		return map[string]any{"const": Kind}, nil
	case "protocol":
		return map[string]any{"enum": g.ps.names()}, nil
	case "dnslabel":
		return map[string]any{"pattern": label}, nil
	case "labelkey":
		return map[string]any{"pattern": `(?:` + label + `(?:\.` + label + `)*/)?` + labelKey}, nil
	case "labelvalue":
		return map[string]any{"pattern": `(?:` + labelKey + `)?`}, nil
	case "fingerprint":
		return map[string]any{"pattern": `sha256:[0-9a-f]{64}`}, nil
	case "weidaurl":
		return map[string]any{"pattern": `weida://.+`}, nil
	case "clientid", "hostname_rfc1123":
		return nil, nil // checked by the loader only
	}
	if r, ok := g.rules[name]; ok {
		return r.JSON, nil
	}
	return nil, fmt.Errorf("resources: %s: the rule %s has no JSON Schema form; describe it in JSONSchema or in its Rule.JSON", path, name)
}
