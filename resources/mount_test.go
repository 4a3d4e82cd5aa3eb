package resources_test

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"weida.dev/connector/policy"
)

// mountedOut is mqttOut under a mount of orders/ at weida, which a mount
// under a foreign prefix no longer loses empty-segments or, since no
// topic under orders/ starts with '$', dollar-topics for.
func mountedOut(t *testing.T, name, weida string, edits ...string) string {
	t.Helper()
	doc := rename(t, mqttOut, "mqtt-out", name)
	doc = edit(t, doc, "  conversion:\n", "  conversion:\n    mount: {foreign: \"orders/\", weida: \""+weida+"\"}\n", "empty-segments, ", "", "dollar-topics, ", "")
	if len(edits) > 0 {
		doc = edit(t, doc, edits...)
	}
	return doc
}

func TestMountBinds(t *testing.T) {
	set, err := loadFiles(t, "a.yaml", mountedOut(t, "a", "shop.orders."))
	if err != nil {
		t.Fatal(err)
	}
	c := set.Connectors()[0]
	if c.Mount != (policy.Mount{Foreign: "orders/", Weida: "shop.orders."}) {
		t.Errorf("Mount = %+v", c.Mount)
	}
	if _, ok := c.Policy.(*policy.Mounted); !ok || c.Policy.Name() != policy.MQTTLevels {
		t.Errorf("Policy = %T %s, want a mounted %s", c.Policy, c.Policy.Name(), policy.MQTTLevels)
	}
	if got := c.Routes[0].Weida; got != "shop.orders.*.created" {
		t.Errorf("route converts to %q", got)
	}
	if !slices.Equal(c.Losses, c.Policy.Losses(c.Direction, c.PolicyOptions)) || slices.Contains(c.Losses, policy.LossEmptySegments) {
		t.Errorf("losses %v", c.Losses)
	}
	// A change of mount is a change of configuration.
	other, err := loadFiles(t, "a.yaml", mountedOut(t, "a", "shop.orders2."))
	if err != nil {
		t.Fatal(err)
	}
	if o := other.Connectors()[0]; o.Equal(c) || o.Revision() == c.Revision() {
		t.Error("connectors with different mounts compare equal")
	}
	// Two empty prefixes are no mount.
	set, err = loadFiles(t, "a.yaml", edit(t, mqttOut, "  conversion:\n", "  conversion:\n    mount: {foreign: \"\", weida: \"\"}\n"))
	if err != nil {
		t.Fatal(err)
	}
	if c := set.Connectors()[0]; c.Mount != (policy.Mount{}) || c.Routes[0].Weida != "orders.*.created" {
		t.Errorf("empty mount: %+v %v", c.Mount, c.Routes)
	}
}

func TestMountRefusals(t *testing.T) {
	for _, tt := range []struct {
		name  string
		doc   string
		want  []diag
		cause string // a refusal rule the first error wraps
	}{
		{"foreign prefix without separator", mountedOut(t, "a", "shop.", `"orders/"`, `"orders"`),
			[]diag{{"spec.conversion.mount.foreign", policy.RuleMountBoundary}}, policy.RuleMountBoundary},
		{"both prefixes wrong", mountedOut(t, "a", "shop.", `"orders/"`, `"+/"`, `"shop."`, `"shop.#."`),
			// The MQTT grammar refuses '+' in a topic before the mount looks.
			[]diag{{"spec.conversion.mount.foreign", policy.RuleMQTTWildcardInName}, {"spec.conversion.mount.weida", policy.RuleMountWildcard}}, policy.RuleMQTTWildcardInName},
		{"weida prefix with an empty joint", mountedOut(t, "a", "shop.."),
			[]diag{{"spec.conversion.mount.weida", policy.RuleMountEmptyJoint}}, policy.RuleMountEmptyJoint},
		{"route outside", mountedOut(t, "a", "shop.", "orders/+/created", "+/+/created"),
			[]diag{{"spec.routes[0].filter", policy.RuleMountOutside}}, policy.RuleMountOutside},
		{"route selecting the parent without a weida prefix", mountedOut(t, "a", "", "orders/+/created", "orders/#"),
			[]diag{{"spec.routes[0].filter", policy.RuleMountParent}}, policy.RuleMountParent},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, err := loadFiles(t, "a.yaml", tt.doc)
			checkWellFormed(t, set)
			errs := Errors(err)
			if got := diags(errs); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v\n%s", got, tt.want, dump(set))
			}
			for _, e := range errs {
				if e.Hint == "" || e.Position.Line == 0 {
					t.Errorf("%v: no hint or no position", e)
				}
			}
			var r *policy.Refusal
			if !errors.As(errs[0], &r) || r.Rule != tt.cause {
				t.Errorf("%v does not wrap a %s refusal", errs[0], tt.cause)
			}
		})
	}
}

func TestMountOverlap(t *testing.T) {
	const over = "mount-overlap"
	const fp = "sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98"
	plain := func(filter string) string {
		return edit(t, rename(t, mqttOut, "mqtt-out", "plain"), "orders/+/created", filter)
	}
	tests := []struct {
		name string
		docs []string
		want [][]diag // per document
	}{
		{"disjoint prefixes", []string{mountedOut(t, "a", "plants.berlin."), mountedOut(t, "b", "plants.b.")}, [][]diag{nil, nil}},
		{"nested prefixes", []string{mountedOut(t, "a", "plants."), mountedOut(t, "b", "plants.berlin.")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		{"same prefix", []string{mountedOut(t, "a", "plants.berlin."), mountedOut(t, "b", "plants.berlin.")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		{"same prefix, other endpoints", []string{mountedOut(t, "a", "plants.berlin."), mountedOut(t, "b", "plants.berlin.", "7002/orders", "7002/other")}, [][]diag{nil, nil}},
		{"same prefix, endpoint host spelt otherwise", []string{mountedOut(t, "a", "plants.berlin.", "127.0.0.1:7002", "[::1]:7002"), mountedOut(t, "b", "plants.berlin.", "127.0.0.1:7002", "[0:0::1]:7002")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		// Failover addresses are addresses of the endpoint too: a
		// resource dialling A with failover B and another dialling B with
		// failover A bridge one replica's topics twice once A is down.
		{"same prefix, crossed failover", []string{
			mountedOut(t, "a", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.1:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.2:7002/orders\"]"),
			mountedOut(t, "b", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.2:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.1:7002/orders\"]")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		{"same prefix, one dial is the other's failover", []string{
			mountedOut(t, "a", "plants."),
			mountedOut(t, "b", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.2:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.1:7002/orders\"]")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		{"same prefix, failover spelt otherwise", []string{
			mountedOut(t, "a", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.1:7002/orders\n    failover: [\"weida://"+fp+"@[::1]:7002/orders\"]"),
			mountedOut(t, "b", "plants.berlin.", "127.0.0.1:7002/orders", "[0:0::1]:7002/orders")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.conversion.mount.weida", over}}}},
		// a and c share no address, but each shares one with b.
		{"linked through a third resource", []string{
			mountedOut(t, "a", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.1:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.2:7002/orders\"]"),
			mountedOut(t, "b", "plants.paris.", "127.0.0.1:7002/orders", "127.0.0.3:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.2:7002/orders\"]"),
			mountedOut(t, "c", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.3:7002/orders")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, nil, {{"spec.conversion.mount.weida", over}}}},
		{"same prefix, failover to other endpoints", []string{
			mountedOut(t, "a", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.1:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.2:7002/orders\"]"),
			mountedOut(t, "b", "plants.berlin.", "127.0.0.1:7002/orders", "127.0.0.3:7002/orders\n    failover: [\"weida://"+fp+"@127.0.0.4:7002/orders\"]")},
			[][]diag{nil, nil}},
		{"unmounted route beside the claim", []string{mountedOut(t, "a", "plants.berlin."), plain("plants/paris/#")}, [][]diag{nil, nil}},
		{"unmounted route above the parent", []string{mountedOut(t, "a", "plants.berlin."), plain("plants")}, [][]diag{nil, nil}},
		{"unmounted route at the parent", []string{mountedOut(t, "a", "plants.berlin."), plain("plants/berlin")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.routes[0].filter", over}}}},
		{"unmounted route reaching in with wildcards", []string{mountedOut(t, "a", "plants.berlin."), plain("+/+/x")},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.routes[0].filter", over}}}},
		{"unmounted route selecting everything", []string{mountedOut(t, "a", "plants.berlin."), plain(`"#"`)},
			[][]diag{{{"spec.conversion.mount.weida", over}}, {{"spec.routes[0].filter", over}}}},
		{"two unmounted resources are not checked", []string{plain(`"#"`), rename(t, plain(`"#"`), "plain", "plain2")}, [][]diag{nil, nil}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var files []string
			for i, d := range tt.docs {
				files = append(files, string(rune('a'+i))+".yaml", d)
			}
			set, _ := loadFiles(t, files...)
			checkWellFormed(t, set)
			for i, d := range set.Documents {
				if got := diags(d.Errors); !slices.Equal(got, tt.want[i]) {
					t.Errorf("%s: got %v, want %v\n%s", d.Name, got, tt.want[i], dump(set))
				}
				for _, e := range d.Errors {
					if e.Hint == "" {
						t.Errorf("%v has no hint", e)
					}
					for _, o := range set.Documents {
						// Every resource in conflict is named; one only
						// linking the endpoint's addresses is not.
						if o != d && len(o.Errors) > 0 && !strings.Contains(e.Message, o.Source.String()) {
							t.Errorf("%v does not name %s", e, o.Source)
						}
					}
				}
			}
		})
	}
}

// TestNATSTailPolicy: naming nats-tokens-tail/v1 admits X.> routes, with
// the losses of nats-tokens/v1; the default keeps refusing them and its
// hint names the opt-in.
func TestNATSTailPolicy(t *testing.T) {
	doc := edit(t, natsIn, "orders.*.created", "orders.>", "  conversion:\n", "  conversion:\n    policy: nats-tokens-tail/v1\n")
	set, err := loadFiles(t, "a.yaml", doc)
	if err != nil {
		t.Fatalf("%v\n%s", err, dump(set))
	}
	c := set.Connectors()[0]
	if c.Policy.Name() != policy.NATSTokensTail || c.Routes[0].Weida != "orders.*.#" {
		t.Errorf("policy %s, route %+v", c.Policy.Name(), c.Routes[0])
	}
	if want := policy.NATSTokensV1().Losses(c.Direction, c.PolicyOptions); !slices.Equal(c.Losses, want) {
		t.Errorf("losses %v, want %v", c.Losses, want)
	}
	_, err = loadFiles(t, "a.yaml", edit(t, natsIn, "orders.*.created", "orders.>"))
	errs := Errors(err)
	if len(errs) != 1 || errs[0].Rule != policy.RuleNATSOneOrMore || !strings.Contains(errs[0].Hint, policy.NATSTokensTail) {
		t.Errorf("default policy: %v", errs)
	}
}

// TestMountLossesChecked: the declared-losses check asks for exactly the
// losses that can occur under the mount (issue 24, item 7). An MQTT
// outbound resource mounting factory/ at plants.berlin. is valid without
// dollar-topics, is refused when it states it, and is still refused when
// it leaves out a loss that can occur; under a '$' prefix dollar-topics
// is required again.
func TestMountLossesChecked(t *testing.T) {
	base := func(foreign, route string, edits ...string) string {
		doc := mountedOut(t, "a", "plants.berlin.", `"orders/"`, `"`+foreign+`"`, "orders/+/created", route)
		if len(edits) > 0 {
			doc = edit(t, doc, edits...)
		}
		return doc
	}
	for _, tt := range []struct {
		name string
		doc  string
		want []diag
	}{
		{"exact", base("factory/", "factory/#"), nil},
		{"dollar-topics stated", base("factory/", "factory/#", "delivery-best-effort, ", "delivery-best-effort, dollar-topics, "),
			[]diag{{"spec.conversion.losses[1]", "loss-not-incurred"}}},
		{"a possible loss left out", base("factory/", "factory/#", "slashed-segments, ", ""),
			[]diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"under a dollar prefix", base("$SYS/", "$SYS/#"),
			[]diag{{"spec.conversion.losses", "loss-undeclared"}}},
		{"under a dollar prefix, stated", base("$SYS/", "$SYS/#", "delivery-best-effort, ", "delivery-best-effort, dollar-topics, "), nil},
	} {
		t.Run(tt.name, func(t *testing.T) {
			set, err := loadFiles(t, "a.yaml", tt.doc)
			if got := diags(Errors(err)); !slices.Equal(got, tt.want) {
				t.Fatalf("got %v, want %v\n%s", got, tt.want, dump(set))
			}
		})
	}
}
