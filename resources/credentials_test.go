package resources_test

import (
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
)

// keyed is the MQTT driver under another name, with one more credential
// kind: a protocol whose package declares a secret no other has.
type keyed struct{ resources.Protocol }

func (keyed) Name() policy.Protocol { return "keyed" }

func (k keyed) Credentials() []resources.CredentialKind {
	return append(k.Protocol.Credentials(), resources.CredentialKind{Name: "apiKey", Doc: "an API key, by reference", Label: "API key"})
}

func (keyed) Policies() []policy.Policy { return []policy.Policy{keyedPolicy{policy.MQTTLevelsV1()}} }

type keyedPolicy struct{ policy.Policy }

func (keyedPolicy) Name() string              { return "keyed-levels/v1" }
func (keyedPolicy) Protocol() policy.Protocol { return "keyed" }

// TestCredentialKindsFromDrivers: spec.broker.credentials accepts the
// kinds the drivers declare and no others. A kind one protocol declares
// is decoded and resolved for it, and refused for another protocol,
// naming the one that declares it; an undeclared key is an unknown field
// with a did-you-mean; the JSON Schema lists the new kind.
func TestCredentialKindsFromDrivers(t *testing.T) {
	ps := append(protocols(), keyed{mqtt.Driver})
	load := func(doc string) (*Set, []*FieldError) {
		t.Helper()
		set, err := resources.Loader{FS: fstest.MapFS{"a.yaml": {Data: []byte(doc)}}, Protocols: ps}.Load("a.yaml")
		return set, resources.Errors(err)
	}
	withCreds := func(creds string) string {
		return edit(t, mqttIn, "    mqtt:\n", "    credentials: "+creds+"\n    mqtt:\n")
	}

	// Declared by keyed only: mqtt refuses it, naming keyed.
	_, errs := load(withCreds("{apiKey: {env: K}}"))
	if got := diags(errs); !slices.Equal(got, []diag{{"spec.broker.credentials.apiKey", "credentials-protocol"}}) {
		t.Fatalf("mqtt with apiKey: %v", errs)
	}
	if !strings.Contains(errs[0].Message, "is a keyed credential, but spec.protocol is mqtt") || errs[0].Hint != "use username and password" {
		t.Errorf("message %q, hint %q", errs[0].Message, errs[0].Hint)
	}
	// nats's kinds are refused for mqtt as before, by the same rule.
	if _, errs := load(withCreds("{token: {env: T}}")); len(errs) != 1 || !strings.Contains(errs[0].Message, "is a nats credential") {
		t.Errorf("mqtt with token: %v", errs)
	}

	// keyed accepts it; the resolver reads it.
	doc := strings.NewReplacer("protocol: mqtt", "protocol: keyed", "policy: mqtt-levels/v1", "policy: keyed-levels/v1", "    mqtt:\n", "    credentials: {apiKey: {env: K}}\n    keyed:\n").Replace(mqttIn)
	set, errs := load(doc)
	if len(errs) != 0 {
		t.Fatalf("keyed with apiKey: %v", errs)
	}
	c := set.Connectors()[0]
	if c.Broker.Credentials.Secret("apiKey") != (SecretRef{Env: "K"}) || len(c.Broker.Credentials.Secrets) != 1 {
		t.Fatalf("credentials %+v", c.Broker.Credentials)
	}
	rc, err := Resolver{LookupEnv: func(k string) (string, bool) { return "k3y", k == "K" }}.Credentials(c.Broker.Credentials)
	if err != nil || rc.Secret("apiKey").Reveal() != "k3y" {
		t.Fatalf("resolved %v, %v", rc, err)
	}

	// A kind nobody declares is an unknown field, with the kinds listed.
	_, errs = load(withCreds("{apikey: {env: K}}"))
	if got := diags(errs); !slices.Equal(got, []diag{{"spec.broker.credentials.apikey", "unknown-field"}}) || !strings.Contains(errs[0].Hint, "apiKey") {
		t.Errorf("misspelt kind: %v", errs)
	}

	schema, err := resources.JSONSchema(ps)
	if err != nil || !strings.Contains(string(schema), `"apiKey"`) || !strings.Contains(string(schema), "an API key, by reference") {
		t.Errorf("the schema does not list apiKey (%v)", err)
	}
}

// TestTLSTransportSchemeAnyProtocol: a "+tls" transport scheme is named
// as such for every protocol, not for the two the loader once listed.
func TestTLSTransportSchemeAnyProtocol(t *testing.T) {
	for _, c := range []struct{ doc, from, to, secure string }{
		{mqttIn, "mqtt://127.0.0.1", "mqtt+tls://127.0.0.1", "mqtts://"},
		{natsIn, "nats://127.0.0.1", "nats+tls://127.0.0.1", "tls://"},
		{amqpIn, "amqp://127.0.0.1", "amqp+tls://127.0.0.1", "amqps://"},
	} {
		_, err := loadFiles(t, "a.yaml", edit(t, c.doc, c.from, c.to))
		errs := resources.Errors(err)
		if len(errs) != 1 || errs[0].Rule != "broker-url-scheme" || !strings.Contains(errs[0].Message, "is not accepted for") || !strings.Contains(errs[0].Hint, c.secure) {
			t.Errorf("%s: %v", c.to, err)
		}
	}
}
