package resources

import (
	"encoding/json"
	"reflect"
	"strings"
	"testing"

	"weida.dev/connector/policy"
)

// schemaProto is a protocol whose block and rules a test chooses.
type schemaProto struct {
	block any
	s     Schema
}

func (schemaProto) Name() policy.Protocol                 { return policy.MQTT }
func (schemaProto) Credentials() []CredentialKind         { return nil }
func (schemaProto) URL() URLRules                         { return URLRules{Scheme: "mqtt", TLSScheme: "mqtts", Port: 1883} }
func (schemaProto) Policies() []policy.Policy             { return []policy.Policy{policy.MQTTLevelsV1()} }
func (schemaProto) DescribeOptions(policy.Options) string { return "" }
func (schemaProto) Broker(*BrokerBlock) BrokerOptions     { return BrokerOptions{} }
func (p schemaProto) BrokerSchema() (any, Schema)         { return p.block, p.s }
func (schemaProto) CheckSet(*SetCheck)                    {}

type blockWithRule struct {
	Name string `yaml:"name" validate:"omitempty,thing" doc:"a thing"`
}

func TestJSONSchemaRules(t *testing.T) {
	// A rule the generator does not know fails, so that no new rule is
	// left out of the schema unnoticed.
	_, err := JSONSchema([]Protocol{schemaProto{block: new(blockWithRule)}})
	if err == nil || !strings.Contains(err.Error(), "thing") {
		t.Errorf("an unknown rule: err = %v", err)
	}
	// A rule with a pattern: anchored, and optional under omitempty.
	b, err := JSONSchema([]Protocol{schemaProto{block: new(blockWithRule), s: Schema{Rules: map[string]Rule{
		"thing": {Valid: func(reflect.Value) bool { return true }, JSON: map[string]any{"pattern": "[a-z]+"}},
	}}}})
	if err != nil {
		t.Fatal(err)
	}
	var root map[string]any
	if err := json.Unmarshal(b, &root); err != nil {
		t.Fatal(err)
	}
	name := props(props(props(props(root)["spec"].(map[string]any))["broker"].(map[string]any))["mqtt"].(map[string]any))["name"].(map[string]any)
	if name["pattern"] != "^(?:[a-z]+)?$" || name["description"] != "a thing" || name["type"] != "string" {
		t.Errorf("spec.broker.mqtt.name = %v", name)
	}
	// A block that is not a pointer to a struct is refused.
	if _, err := JSONSchema([]Protocol{schemaProto{block: blockWithRule{}}}); err == nil {
		t.Error("a struct value was accepted as a block")
	}
}
