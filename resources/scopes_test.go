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
