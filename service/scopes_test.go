package service

import (
	"maps"
	"slices"
	"testing"

	"weida.dev/connector/resources"
	"weida.dev/connector/weida"
)

// TestEndpointScopes: without any scoped client nothing is restricted
// (the allowlist alone decides); with one, every allowed client is listed,
// the bare ones with everything.
func TestEndpointScopes(t *testing.T) {
	a, b := "sha256:aa", "sha256:bb"
	if s := endpointScopes(resources.Weida{AllowedClients: []string{a, b}}); s != nil {
		t.Errorf("bare clients only: %v, want nil", s)
	}
	if s := endpointScopes(resources.Weida{}); s != nil {
		t.Errorf("open endpoint: %v, want nil", s)
	}
	got := endpointScopes(resources.Weida{AllowedClients: []string{a, b}, Scopes: map[string][]string{b: {"plant.a.#"}}})
	want := weida.Scopes{a: {"#"}, b: {"plant.a.#"}}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("endpointScopes = %v, want %v", got, want)
	}
}
