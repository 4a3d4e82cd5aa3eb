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

// TestSplitClients: fingerprints go to ClientFingerprints, identities to
// ClientIdentities, each in order; scopes keyed by an identity list every
// client as fingerprints alone do.
func TestSplitClients(t *testing.T) {
	a := "sha256:aa"
	fps, ids := splitClients([]string{"dns:x.example", a, "cn:ops"})
	if !slices.Equal(fps, []string{a}) || !slices.Equal(ids, []string{"dns:x.example", "cn:ops"}) {
		t.Errorf("splitClients = %q, %q", fps, ids)
	}
	got := endpointScopes(resources.Weida{AllowedClients: []string{a, "cn:ops"}, Scopes: map[string][]string{"cn:ops": {"plant.a.#"}}})
	want := weida.Scopes{a: {"#"}, "cn:ops": {"plant.a.#"}}
	if !maps.EqualFunc(got, want, slices.Equal) {
		t.Errorf("endpointScopes = %v, want %v", got, want)
	}
}
