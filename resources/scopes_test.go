package resources_test

import (
	"maps"
	"slices"
	"strings"
	"testing"

	"weida.dev/connector/resources"
)

// TestAllowedClientScopes: a bare fingerprint admits its client to
// everything and adds no scopes; a {client, scopes} entry binds its
// scopes; a resource whose scopes change gets another revision, so a
// reload applies them.
func TestAllowedClientScopes(t *testing.T) {
	a := "sha256:" + strings.Repeat("0a", 32)
	b := "sha256:" + strings.Repeat("0b", 32)
	load := func(doc string) *resources.Connector {
		t.Helper()
		set, err := loadFiles(t, "r.yaml", doc)
		if err != nil {
			t.Fatal(err)
		}
		return set.Connectors()[0]
	}
	bare := load(edit(t, mqttIn, "7001/sensors", "7001/sensors\n    allowedClients: ["+a+", "+b+"]"))
	if !slices.Equal(bare.Weida.AllowedClients, []string{a, b}) || bare.Weida.Scopes != nil {
		t.Fatalf("bare entries: clients %q, scopes %v", bare.Weida.AllowedClients, bare.Weida.Scopes)
	}
	scoped := load(edit(t, mqttIn, "7001/sensors", "7001/sensors\n    allowedClients:\n      - "+a+"\n      - client: "+b+"\n        scopes: [plant.a.#, 'plant.*.temp']"))
	if !slices.Equal(scoped.Weida.AllowedClients, []string{a, b}) {
		t.Fatalf("clients %q", scoped.Weida.AllowedClients)
	}
	if want := map[string][]string{b: {"plant.a.#", "plant.*.temp"}}; !maps.EqualFunc(scoped.Weida.Scopes, want, slices.Equal) {
		t.Fatalf("scopes %v, want %v", scoped.Weida.Scopes, want)
	}
	// {client} without scopes is the bare form.
	same := load(edit(t, mqttIn, "7001/sensors", "7001/sensors\n    allowedClients: [{client: "+a+"}, "+b+"]"))
	if same.Revision() != bare.Revision() {
		t.Error("{client: fp} and the bare fingerprint differ in revision")
	}
	narrowed := load(edit(t, mqttIn, "7001/sensors", "7001/sensors\n    allowedClients:\n      - "+a+"\n      - client: "+b+"\n        scopes: [plant.a.#]"))
	if narrowed.Revision() == scoped.Revision() || scoped.Revision() == bare.Revision() {
		t.Error("a change of scopes kept the revision")
	}
}

// TestAllowedClientIdentities: entries naming a CA-issued client bind as
// the identities weida matches ("dns:…" as written, "cn:" and the
// CommonName), beside fingerprints, with their scopes; clientCAFile is
// relative to the resource file, and a change of the CA file's name
// changes the revision.
func TestAllowedClientIdentities(t *testing.T) {
	a := "sha256:" + strings.Repeat("0a", 32)
	load := func(doc string) *resources.Connector {
		t.Helper()
		set, err := loadFiles(t, "r.yaml", doc)
		if err != nil {
			t.Fatal(err)
		}
		return set.Connectors()[0]
	}
	doc := func(ca string) string {
		return edit(t, mqttIn, "7001/sensors", "7001/sensors\n    clientCAFile: "+ca+"\n    allowedClients:\n      - "+a+
			"\n      - {san: 'uri:spiffe://plant-a/dash', scopes: [plant.a.#]}\n      - {commonName: dash-7}")
	}
	c := load(doc("ca.pem"))
	if want := []string{a, "uri:spiffe://plant-a/dash", "cn:dash-7"}; !slices.Equal(c.Weida.AllowedClients, want) {
		t.Fatalf("clients %q, want %q", c.Weida.AllowedClients, want)
	}
	if want := map[string][]string{"uri:spiffe://plant-a/dash": {"plant.a.#"}}; !maps.EqualFunc(c.Weida.Scopes, want, slices.Equal) {
		t.Fatalf("scopes %v, want %v", c.Weida.Scopes, want)
	}
	if !strings.HasSuffix(c.Weida.ClientCAFile, "ca.pem") || c.Weida.Open() {
		t.Fatalf("ClientCAFile %q (want the file beside the resource), open %v", c.Weida.ClientCAFile, c.Weida.Open())
	}
	if load(doc("other-ca.pem")).Revision() == c.Revision() {
		t.Error("another clientCAFile kept the revision")
	}
}
