package resources_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"weida.dev/connector/resources"
	"weida.dev/connector/weida/address"
)

// An outbound resource's failover addresses are bound after dial's, in the
// order written, and a refusal names the resource, the field, the value,
// the rule and what to write instead.
func TestFailoverAddresses(t *testing.T) {
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	second := "weida://" + fp + "@127.0.0.2:7002/orders"
	third := "weida://" + fp + "@[::1]:7003/orders"
	set, err := loadFiles(t, "out.yaml", edit(t, mqttOut, "7002/orders", "7002/orders\n    failover:\n      - "+second+"\n      - "+third))
	if err != nil {
		t.Fatal(err)
	}
	c := set.Connectors()[0]
	want := []string{"weida://" + fp + "@127.0.0.1:7002/orders", second, third}
	if got := c.Weida.DialURLs(); !slices.Equal(got, want) {
		t.Errorf("DialURLs = %q, want %q", got, want)
	}
	plain, err := loadFiles(t, "out.yaml", mqttOut)
	if err != nil {
		t.Fatal(err)
	}
	p := plain.Connectors()[0]
	if got := p.Weida.DialURLs(); !slices.Equal(got, want[:1]) || p.Weida.Failover != nil {
		t.Errorf("without failover: DialURLs = %q, Failover = %v", got, p.Weida.Failover)
	}
	if p.Revision() == c.Revision() || p.Equal(c) {
		t.Error("adding failover addresses does not change the resource")
	}

	for _, tc := range []struct {
		value, rule, msg, hint string
	}{
		{"weida://" + fp + "@127.0.0.2:7002/order", "weida-failover-path", `names the path "/order", but the first address names "/orders"`, "write the path of dial, /orders"},
		{"weida://127.0.0.2:7002/orders", "weida-failover-pin", "pins no fingerprint, but the first address pins " + fp, "pin what dial pins (" + fp + ")"},
	} {
		_, err := loadFiles(t, "out.yaml", edit(t, mqttOut, "7002/orders", "7002/orders\n    failover: ["+tc.value+"]"))
		var fe *resources.FieldError
		if !errors.As(err, &fe) {
			t.Fatalf("%s: load = %v, want a *resources.FieldError", tc.rule, err)
		}
		if fe.Resource != "mqtt-out" || fe.Field != "spec.weida.failover[0]" || fe.Value != tc.value || fe.Rule != tc.rule ||
			!strings.Contains(fe.Message, tc.msg) || !strings.Contains(fe.Hint, tc.hint) || fe.Position.Line != 12 {
			t.Errorf("%s: got %+v", tc.rule, fe)
		}
		var re *address.ReplicaError
		if !errors.As(fe, &re) {
			t.Errorf("%s: the error does not wrap the address check's", tc.rule)
		}
		if s := fe.Error(); !strings.Contains(s, "mqtt-out") || !strings.Contains(s, tc.value) {
			t.Errorf("%s: %q does not name the resource and the value", tc.rule, s)
		}
	}
}
