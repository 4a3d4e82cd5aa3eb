package resources_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"testing/fstest"

	"pgregory.net/rapid"

	"weida.dev/connector/policy"
	"weida.dev/connector/weida/topic"
)

func quote(s string) string {
	b, _ := json.Marshal(s) // JSON strings are YAML double-quoted scalars
	return string(b)
}

// filterGen draws filters in a protocol's grammar, biased to the edges the
// policies refuse: wildcards in every position, empty levels, literal
// wildcard characters from the other grammars.
func filterGen(p policy.Protocol) *rapid.Generator[string] {
	sep := map[policy.Protocol]string{policy.MQTT: "/", policy.NATS: ".", policy.AMQP: "."}[p]
	parts := rapid.SampledFrom([]string{"a", "b", "orders", "", "*", "#", "+", ">", "x.y", "a*", "$SYS", "ü", "%2E"})
	return rapid.Custom(func(t *rapid.T) string {
		return strings.Join(rapid.SliceOfN(parts, 1, 4).Draw(t, "parts"), sep)
	})
}

// TestPropertyModel builds random resources and checks the loader against
// a model: a resource is valid exactly when the policy converts every
// route, no filter repeats, and the stated losses equal the policy's; and
// every way it is not valid is reported at the field that causes it.
func TestPropertyModel(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		drv := rapid.SampledFrom(protocols()).Draw(t, "protocol")
		proto := drv.Name()
		dir := rapid.SampledFrom([]policy.Direction{policy.Inbound, policy.Outbound}).Draw(t, "direction")
		pol := drv.Policies()[0]
		opts := policy.Options{}
		var b strings.Builder
		fmt.Fprintf(&b, "apiVersion: %s\nkind: Connector\nmetadata: {name: r}\nspec:\n  protocol: %s\n  direction: %s\n", APIVersion, proto, dir)
		switch proto {
		case policy.MQTT:
			opts.QoS = rapid.IntRange(0, 1).Draw(t, "qos")
			fmt.Fprintf(&b, "  broker: {url: \"mqtt://127.0.0.1:1883\", mqtt: {qos: %d}}\n", opts.QoS)
		case policy.NATS:
			opts.JetStream = rapid.Bool().Draw(t, "jetstream")
			js := ""
			if opts.JetStream {
				js = ", nats: {jetstream: {stream: S}}"
				if dir == policy.Inbound {
					js = ", nats: {jetstream: {stream: S, durable: d}}"
				}
			}
			fmt.Fprintf(&b, "  broker: {url: \"nats://127.0.0.1:4222\"%s}\n", js)
		case policy.AMQP:
			b.WriteString("  broker: {url: \"amqp://127.0.0.1:5672/\"}\n")
		}
		if dir == policy.Inbound {
			b.WriteString("  weida: {listen: \"weida://127.0.0.1:7001/p\"}\n")
		} else {
			b.WriteString("  weida: {dial: \"weida://127.0.0.1:7001/p\", caFile: ca.pem}\n")
		}

		want := pol.Losses(dir, opts)
		all := make([]policy.Loss, 0, 20)
		for _, l := range policy.AllLosses() {
			all = append(all, l.Loss)
		}
		declared := slices.Clone(want)
		if rapid.Bool().Draw(t, "mangle losses") {
			declared = rapid.SliceOfNDistinct(rapid.SampledFrom(all), 0, len(all), rapid.ID).Draw(t, "declared")
		}
		ls := make([]string, len(declared))
		for i, l := range declared {
			ls[i] = quote(string(l))
		}
		fmt.Fprintf(&b, "  conversion: {losses: [%s]}\n", strings.Join(ls, ", "))

		filters := rapid.SliceOfN(filterGen(proto), 1, 5).Draw(t, "filters")
		b.WriteString("  routes:\n")
		for _, f := range filters {
			fmt.Fprintf(&b, "    - filter: %s\n", quote(f))
		}

		set, err := Loader{FS: fstest.MapFS{"r.yaml": {Data: []byte(b.String())}}}.Load("r.yaml")
		errs := Errors(err)
		at := func(field, rule, value string) bool {
			return slices.ContainsFunc(errs, func(e *FieldError) bool {
				return e.Field == field && e.Rule == rule && (value == "" || e.Value == value)
			})
		}

		valid := true
		seen := map[string]bool{}
		var routes []Route
		for i, f := range filters {
			field := fmt.Sprintf("spec.routes[%d].filter", i)
			if seen[f] {
				valid = false
				if !at(field, "route-duplicate", f) {
					t.Fatalf("repeated filter %q not reported:\n%v", f, err)
				}
				continue
			}
			seen[f] = true
			w, cerr := pol.ConvertFilter(f)
			var ref *policy.Refusal
			if errors.As(cerr, &ref) {
				valid = false
				if !at(field, ref.Rule, f) {
					t.Fatalf("refused filter %q (%s) not reported:\n%v", f, ref.Rule, err)
				}
				continue
			}
			if cerr != nil || topic.ValidateFilter(w) != nil {
				t.Fatalf("policy returned %q, %v", w, cerr)
			}
			routes = append(routes, Route{Name: f, Foreign: f, Weida: w})
		}
		if len(declared) == 0 && len(want) > 0 {
			// One error names every loss to state.
			valid = false
			n := 0
			for _, e := range errs {
				if e.Field == "spec.conversion.losses" && e.Rule == "loss-undeclared" {
					n++
					for _, l := range want {
						if !strings.Contains(e.Hint, string(l)) {
							t.Fatalf("the missing losses' hint does not name %s: %v", l, e)
						}
					}
				}
			}
			if n != 1 {
				t.Fatalf("no losses stated: %d loss-undeclared errors, want 1:\n%v", n, err)
			}
		}
		// Losses stated but some missing: one error lists every missing one.
		var missing []string
		for _, l := range want {
			if len(declared) > 0 && !slices.Contains(declared, l) {
				missing = append(missing, string(l))
			}
		}
		if len(missing) > 0 {
			valid = false
			n := 0
			for _, e := range errs {
				if e.Field == "spec.conversion.losses" && e.Rule == "loss-undeclared" {
					n++
					for _, l := range missing {
						if !strings.Contains(e.Value, l) || !strings.Contains(e.Message, l) {
							t.Fatalf("missing loss %s not named in the error: %v", l, e)
						}
					}
				}
			}
			if n != 1 {
				t.Fatalf("%d missing losses: %d loss-undeclared errors, want 1:\n%v", len(missing), n, err)
			}
		}
		for i, l := range declared {
			if !slices.Contains(want, l) {
				valid = false
				if !at(fmt.Sprintf("spec.conversion.losses[%d]", i), "loss-not-incurred", string(l)) {
					t.Fatalf("extra loss %s not reported:\n%v", l, err)
				}
			}
		}
		if valid != (err == nil) {
			t.Fatalf("model says valid=%v, loader says:\n%v\n%s", valid, err, b.String())
		}
		if valid {
			c := set.Connectors()[0]
			got := stripRoutePos(c.Routes)
			if !slices.Equal(got, routes) || !slices.Equal(c.Losses, want) {
				t.Fatalf("routes %v, want %v; losses %v, want %v", got, routes, c.Losses, want)
			}
		}
	})
}

// FuzzLoad: the loader never panics, and whatever it reports is well
// formed and points inside the file.
func FuzzLoad(f *testing.F) {
	for _, doc := range []string{mqttIn, mqttOut, natsIn, natsOut, amqpIn, amqpOut, mqttIn + "---\n" + natsIn,
		"a: &x [*x]\n", "<<: [*a, *b]\n", "--- !!str\n", "\t- x", "? [a]\n: b\n", "a: !!binary aGk=\n"} {
		f.Add([]byte(doc))
	}
	for _, glob := range []string{"../examples/*.yaml", "../examples/invalid/*.yaml"} {
		files, _ := filepath.Glob(glob)
		for _, name := range files {
			if b, err := os.ReadFile(name); err == nil {
				f.Add(b)
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		set, err := Loader{FS: fstest.MapFS{"f.yaml": {Data: data}}}.Load("f.yaml")
		if set == nil {
			t.Fatal("nil set")
		}
		lines := strings.Count(string(data), "\n") + 1
		for _, e := range Errors(err) {
			if e.File != "f.yaml" || e.Line < 0 || e.Line > lines+1 || e.Rule == "" || e.Message == "" {
				t.Fatalf("malformed error %#v for %d lines", e, lines)
			}
		}
		for _, c := range set.Connectors() {
			if len(c.Routes) == 0 || len(c.Routes) > MaxRoutes || c.Policy == nil {
				t.Fatalf("bad connector %+v", c)
			}
			for _, r := range c.Routes {
				if topic.ValidateFilter(r.Weida) != nil {
					t.Fatalf("route %+v has an invalid weida filter", r)
				}
			}
		}
	})
}
