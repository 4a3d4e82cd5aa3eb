package connectors_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/address"
)

// TestStatusShowsEndpointIdentity: once an inbound unit's listener is up,
// its status carries the fingerprint and a subscriber URL that dials it;
// a runtime started again with the same state directory shows the same
// fingerprint.
func TestStatusShowsEndpointIdentity(t *testing.T) {
	dir := t.TempDir()
	var fps []string
	for range 2 {
		rt, _ := newRuntime(t, nil)
		u := inboundUnit(t, "ident", "127.0.0.1:0", &sources{})
		u.ListenConfig.StateDir = dir
		if err := rt.Apply(context.Background(), []connectors.Unit{u}); err != nil {
			t.Fatal(err)
		}
		waitFor(t, "the fingerprint in the status", func() bool { return statusOf(rt, "ident").SubscriberURL != "" })
		st := statusOf(rt, "ident")
		a, err := address.Parse(st.SubscriberURL)
		if err != nil || a.Fingerprint != st.Fingerprint || !strings.HasPrefix(st.Fingerprint, "sha256:") || a.Host != "127.0.0.1" || a.Port == 0 || a.Path != "/ident" {
			t.Fatalf("status %+v: %v", st, err)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		sub, err := weida.Dial(ctx, st.SubscriberURL, weida.DialConfig{})
		cancel()
		if err != nil {
			t.Fatalf("dialling %s: %v", st.SubscriberURL, err)
		}
		sub.Close()
		fps = append(fps, st.Fingerprint)
		rt.Stop()
		if st := statusOf(rt, "ident"); st.Fingerprint != "" {
			t.Errorf("a stopped runtime shows %+v", st)
		}
	}
	if fps[0] != fps[1] {
		t.Errorf("fingerprint changed across runtimes sharing a state dir: %v", fps)
	}
}
