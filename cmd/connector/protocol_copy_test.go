package main

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"weida.dev/connector/cmd/drivers"
	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/policy"
	"weida.dev/connector/resources"
	"weida.dev/connector/service"
)

// These tests add a protocol the way docs/DRIVERS.md tells a contributor
// to: a package of its own (here a copy of the MQTT driver under the name
// "twin", with its own URL schemes and policy names) and one more entry in
// the driver list. Nothing else changes, and check, explain, the lastValue
// rules and mounting must treat the copy exactly as the original: the
// copy's output, with its name replaced by the original's, is the
// original's output byte for byte. A rule anywhere outside the driver that
// names a protocol (a separator chosen by protocol, a closed rule-to-loss
// table, "only MQTT keeps retained messages") shows up here as a
// difference.

const copyName = "twin"

// copyDriver is mqtt.Driver under another protocol name.
type copyDriver struct{ service.Driver }

func (copyDriver) Name() policy.Protocol { return copyName }

func (d copyDriver) URL() resources.URLRules {
	r := d.Driver.URL()
	r.Scheme, r.TLSScheme = copyName, copyName+"s"
	return r
}

// Policies are MQTT's, each under the copy's name and protocol, as a new
// protocol's package would define its own.
func (d copyDriver) Policies() []policy.Policy {
	var out []policy.Policy
	for _, p := range d.Driver.Policies() {
		out = append(out, renamedPolicy{p, strings.Replace(p.Name(), "mqtt", copyName, 1)})
	}
	return out
}

// renamedPolicy is a policy under another name, for the copy's protocol.
type renamedPolicy struct {
	policy.Policy
	name string
}

func (p renamedPolicy) Name() string              { return p.name }
func (p renamedPolicy) Protocol() policy.Protocol { return copyName }
func (p renamedPolicy) Grammar() policy.Grammar   { return renamedGrammar{p.Policy.Grammar()} }

func (p renamedPolicy) ConvertFilter(f string) (string, error) {
	out, err := p.Policy.ConvertFilter(f)
	return out, p.own(err)
}

func (p renamedPolicy) TopicToWeida(t string) (string, error) {
	out, err := p.Policy.TopicToWeida(t)
	return out, p.own(err)
}

func (p renamedPolicy) TopicFromWeida(t string) (string, error) {
	out, err := p.Policy.TopicFromWeida(t)
	return out, p.own(err)
}

// own makes a refusal by the wrapped policy a refusal by this one.
func (p renamedPolicy) own(err error) error {
	var r *policy.Refusal
	if !errors.As(err, &r) {
		return err
	}
	c := *r
	c.Policy = p.name
	return &c
}

type renamedGrammar struct{ policy.Grammar }

func (renamedGrammar) Protocol() policy.Protocol { return copyName }

// withCopy is the program's driver list with the copy as one more entry.
func withCopy() []service.Driver {
	return append(drivers.All(), copyDriver{mqtt.Driver})
}

// asOriginal replaces the copy's name by the original's.
func asOriginal(s string) string {
	return strings.NewReplacer(copyName, "mqtt", strings.ToUpper(copyName), "MQTT").Replace(s)
}

// asCopy writes an MQTT resource as the copy's.
func asCopy(s string) string {
	return strings.NewReplacer("mqtt", copyName, "MQTT", strings.ToUpper(copyName)).Replace(s)
}

func useCopy(t *testing.T) {
	t.Helper()
	old := programDrivers
	programDrivers = withCopy
	t.Cleanup(func() { programDrivers = old })
}

// copyResources are MQTT resources that go through every rule a new
// protocol could trip over: the lastValue modes, a shared group with
// mode: retained, mounts (accepted, badly written, selecting the parent),
// declared losses (exact, one missing, dollar-topics under a '$' prefix),
// credentials (accepted, another protocol's kind, an unknown key) and
// refused filters.
var copyResources = map[string]string{
	"in-last-value.yaml": copyDoc("in-last-value", "inbound", "      qos: 1\n", "",
		"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]",
		"  lastValue: {mode: retained, maxTopics: 100}\n", "sensors/+/temperature", "factory/#"),
	"in-shared-retained.yaml": copyDoc("in-shared", "inbound", "      qos: 1\n      sharedGroup: replicas\n", "",
		"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]",
		"  lastValue: {mode: retained}\n", "sensors/#"),
	"in-shared-all.yaml": copyDoc("in-shared-all", "inbound", "      qos: 0\n      sharedGroup: replicas\n", "",
		"[at-most-once, delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]",
		"  lastValue: {mode: all}\n", "sensors/#"),
	"in-refused-filter.yaml": copyDoc("in-refused", "inbound", "      qos: 1\n", "",
		"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]",
		"", "sensors/a*b/+", "sensors/#/x"),
	"out-mounted.yaml": copyDoc("out-mounted", "outbound", "      qos: 1\n", `{foreign: "factory/", weida: "plants.berlin."}`,
		"[delivery-best-effort, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]", "", "factory/#", "factory/+/state"),
	"out-mounted-missing.yaml": copyDoc("out-missing", "outbound", "      qos: 1\n", `{foreign: "factory/", weida: "plants.berlin."}`,
		"[delivery-best-effort, forbidden-chars, ordering, topic-length, wildcard-names]", "", "factory/#"),
	"out-mounted-dollar.yaml": copyDoc("out-dollar", "outbound", "      qos: 1\n", `{foreign: "$SYS/", weida: "sys."}`,
		"[delivery-best-effort, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]", "", "$SYS/#"),
	"out-bad-mount.yaml": copyDoc("out-bad-mount", "outbound", "      qos: 1\n", `{foreign: "factory", weida: "plants.berlin"}`,
		"[delivery-best-effort, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]", "", "factory/#"),
	"in-credentials.yaml": withCredentials(copyDoc("in-credentials", "inbound", "      qos: 1\n", "",
		"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]", "", "sensors/#"),
		"{username: bridge, password: {env: MQTT_PASSWORD}}"),
	"in-token.yaml": withCredentials(copyDoc("in-token", "inbound", "      qos: 1\n", "",
		"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, retain, topic-length]", "", "sensors/#"),
		"{token: {env: TOKEN}, apiKey: {env: KEY}}"),
	"out-parent.yaml": copyDoc("out-parent", "outbound", "      qos: 1\n", `{foreign: "factory/", weida: ""}`,
		"[delivery-best-effort, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]", "", "factory/#"),
}

// withCredentials adds spec.broker.credentials to a copyDoc.
func withCredentials(doc, creds string) string {
	return strings.Replace(doc, "    mqtt:\n", "    credentials: "+creds+"\n    mqtt:\n", 1)
}

func copyDoc(name, dir, block, mount, losses, extra string, filters ...string) string {
	var b strings.Builder
	b.WriteString("apiVersion: connector.weida.dev/v1alpha1\nkind: Connector\nmetadata:\n  name: " + name + "\nspec:\n")
	b.WriteString("  protocol: mqtt\n  direction: " + dir + "\n  broker:\n    url: mqtt://127.0.0.1:1883\n    mqtt:\n" + block)
	if dir == "inbound" {
		b.WriteString("  weida:\n    listen: weida://127.0.0.1:7101/" + name + "\n")
	} else {
		b.WriteString("  weida:\n    dial: weida://sha256:9091e5f37dc3e870fcce55bf2721bd5db9e7ba9067b3b8067fd12f0153a52b98@127.0.0.1:7102/" + name + "\n")
	}
	b.WriteString("  conversion:\n")
	if mount != "" {
		b.WriteString("    mount: " + mount + "\n")
	}
	b.WriteString("    losses: " + losses + "\n" + extra + "  routes:\n")
	for _, f := range filters {
		b.WriteString("    - filter: \"" + f + "\"\n")
	}
	return b.String()
}

// writeResources writes copyResources, converted by conv, into a new
// directory and makes it the working directory, so that both runs print
// the same relative paths.
func writeResources(t *testing.T, conv func(string) string) []string {
	t.Helper()
	dir := t.TempDir()
	var names []string
	for name, doc := range copyResources {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(conv(doc)), 0o600); err != nil {
			t.Fatal(err)
		}
		names = append(names, name)
	}
	slices.Sort(names)
	t.Chdir(dir)
	return names
}

// TestCopiedDriverCheck: `connector check`, text and JSON, says of the
// copy's resources exactly what it says of the original's.
func TestCopiedDriverCheck(t *testing.T) {
	useCopy(t)
	for _, output := range []string{"text", "json"} {
		t.Run(output, func(t *testing.T) {
			check := func(conv func(string) string) (int, string) {
				var args []string
				for _, n := range writeResources(t, conv) {
					args = append(args, "-f", n)
				}
				code, out, errOut := runCLI(t, "", append([]string{"check", "--output", output}, args...)...)
				if errOut != "" {
					t.Errorf("stderr %q", errOut)
				}
				return code, out
			}
			origCode, orig := check(func(s string) string { return s })
			copyCode, cp := check(asCopy)
			if strings.Contains(orig, copyName) {
				t.Fatalf("the original's output names %q, so the comparison below would hide a difference", copyName)
			}
			if !strings.Contains(cp, copyName) {
				t.Fatalf("the copy's output never names the copy:\n%s", cp)
			}
			if origCode != copyCode || asOriginal(cp) != orig {
				t.Errorf("check of the copy (exit %d) differs from check of the original (exit %d):\n--- copy, renamed\n%s\n--- original\n%s",
					copyCode, origCode, asOriginal(cp), orig)
			}
			// What the comparison is about: the rules a new protocol
			// used to trip over are all exercised.
			for _, want := range []string{"last-value-retained", "loss-undeclared", "mount-boundary", "mount-parent", "mqtt-star-level", "dollar-topics",
				"credentials-protocol", "unknown-field"} {
				if !strings.Contains(orig, want) {
					t.Errorf("the original's output does not show %s:\n%s", want, orig)
				}
			}
			if output == "text" && !strings.Contains(orig, "user bridge (password from env MQTT_PASSWORD)") {
				t.Errorf("the credentials are not summarized:\n%s", orig)
			}
			if output == "text" && !strings.Contains(orig, "out-mounted.yaml:1  out-mounted  valid") {
				t.Errorf("the mounted outbound resource without dollar-topics is not valid:\n%s", orig)
			}
		})
	}
}

// TestCopiedDriverExplain: `connector explain` converts, refuses, and
// states losses for the copy exactly as for the original, mounted or not,
// with each setting and policy.
func TestCopiedDriverExplain(t *testing.T) {
	useCopy(t)
	mounted := []string{"--mount-foreign", "factory/", "--mount-weida", "plants.berlin."}
	cases := [][]string{
		{"--filter", "sensors/+/temperature", "--filter", "a/#", "--filter", "a*b", "--filter", "$share/g/x/+", "--topic", "a/b.c", "--topic", "$SYS/x"},
		{"--qos", "0", "--topic", "a/b"},
		{"--last-value", "--topic", "a/b"},
		{"--policy", "mqtt-levels-escaped/v1", "--topic", "a/b.c", "--direction", "outbound", "--topic", "a.b%2Ec"},
		{"--direction", "outbound", "--topic", "a.b/c", "--topic", "$x.y", "--topic", ""},
		append([]string{"--filter", "factory/#", "--filter", "factory/$share/g/+", "--filter", "other/#", "--topic", "factory/a/b"}, mounted...),
		append([]string{"--direction", "outbound", "--topic", "plants.berlin.$x", "--topic", "plants.berlin", "--topic", "plants.paris.x"}, mounted...),
		{"--filter", "factory", "--mount-foreign", "factory/"},
		{"--filter", "x", "--mount-foreign", "factory"},
	}
	for _, args := range cases {
		for _, output := range []string{"text", "json"} {
			orig := append([]string{"explain", "--output", output, "--protocol", "mqtt"}, args...)
			cp := make([]string, len(orig))
			for i, a := range orig {
				cp[i] = asCopy(a)
				if strings.HasPrefix(a, "--") {
					cp[i] = a // flags keep their names: --qos is the protocol's setting
				}
			}
			oc, oout, oerr := runCLI(t, "", orig...)
			cc, cout, cerr := runCLI(t, "", cp...)
			if strings.Contains(oout+oerr, copyName) {
				t.Fatalf("%v: the original's output names %q", orig, copyName)
			}
			if oc != cc || asOriginal(cout) != oout || asOriginal(cerr) != oerr {
				t.Errorf("explain %v: the copy (exit %d) differs from the original (exit %d):\n--- copy, renamed\n%s%s\n--- original\n%s%s",
					args, cc, oc, asOriginal(cout), asOriginal(cerr), oout, oerr)
			}
		}
	}
}

// TestCopiedDriverCarriesRetained follows the lastValue path past the
// loader, against the loopback Mosquitto: resources load and become units
// through service.Units with the copy in the driver list, the copy's Sink
// (retain: true) publishes a retained message, and the copy's Source
// reads it back marked Retained, the mark the runtime's cache in mode
// retained keeps. The original does the same, for comparison.
func TestCopiedDriverCarriesRetained(t *testing.T) {
	for _, proto := range []string{"mqtt", copyName} {
		t.Run(proto, func(t *testing.T) {
			topic := fmt.Sprintf("weida-test/copied-driver/%s/%d", proto, time.Now().UnixNano())
			name := strings.ReplaceAll(strings.TrimPrefix(t.Name(), "Test"), "/", "-")
			conv := func(s string) string { return s }
			if proto == copyName {
				conv = asCopy
			}
			in := conv(copyDoc("in-"+strings.ToLower(name), "inbound", "      qos: 1\n      cleanStart: true\n", "",
				"[delivery-best-effort, dotted-levels, expiry, ordering, properties, reply-to, topic-length]",
				"  lastValue: {mode: retained}\n", topic))
			out := conv(copyDoc("out-"+strings.ToLower(name), "outbound", "      qos: 1\n      retain: true\n", "",
				"[delivery-best-effort, dollar-topics, empty-segments, forbidden-chars, ordering, slashed-segments, topic-length, wildcard-names]", "", "#"))
			dir := t.TempDir()
			for n, doc := range map[string]string{"in.yaml": in, "out.yaml": out} {
				if err := os.WriteFile(filepath.Join(dir, n), []byte(doc), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			ds := withCopy()
			set, err := resources.Load(service.Protocols(ds), filepath.Join(dir, "in.yaml"), filepath.Join(dir, "out.yaml"))
			if err != nil {
				t.Fatal(err)
			}
			units, err := service.Units(set.Connectors(), service.Env{Drivers: ds, StateDir: t.TempDir()})
			if err != nil {
				t.Fatal(err)
			}
			src, sink := units[0], units[1]
			if src.Spec.LastValue.Mode != "retained" || string(src.Spec.Protocol) != proto {
				t.Fatalf("inbound unit %s with last value %+v", src.Spec.Protocol, src.Spec.LastValue)
			}
			ctx, cancel := context.WithTimeout(t.Context(), 20*time.Second)
			defer cancel()
			report := func(connectors.ConnState) {}

			sk, err := sink.NewSink(report)
			if err != nil {
				t.Fatal(err)
			}
			if err := sk.Start(ctx); err != nil {
				t.Fatal(err)
			}
			defer sk.Close(context.Background())
			if err := sk.Write(ctx, &connectors.Message{Topic: topic, Payload: []byte("v1")}); err != nil {
				t.Fatal(err)
			}
			defer sk.Write(context.Background(), &connectors.Message{Topic: topic}) // deletes the retained message

			s, err := src.NewSource(report)
			if err != nil {
				t.Fatal(err)
			}
			if err := s.Start(ctx, []string{topic}); err != nil {
				t.Fatal(err)
			}
			defer s.Close(context.Background())
			m, ack, err := s.Read(ctx)
			if err != nil {
				t.Fatal(err)
			}
			ack(nil)
			if m.Topic != topic || string(m.Payload) != "v1" || !m.Retained {
				t.Errorf("read %q %q retained=%v, want %q \"v1\" retained", m.Topic, m.Payload, m.Retained, topic)
			}
		})
	}
}

// oddPolicy is a policy written outside package policy with a refusal
// rule of its own, mapped to a loss by the policy itself.
type oddPolicy struct{ renamedPolicy }

const ruleOdd = "twin-odd-level"

func (p oddPolicy) TopicToWeida(t string) (string, error) {
	if strings.Contains(t, "odd") {
		return "", &policy.Refusal{Policy: p.Name(), Input: t, Part: "odd", Rule: ruleOdd, Reason: "the twin protocol keeps odd levels to itself"}
	}
	return p.renamedPolicy.TopicToWeida(t)
}

func (p oddPolicy) LossFor(rule string) (policy.Loss, bool) {
	if rule == ruleOdd {
		return policy.LossDottedLevels, true
	}
	return p.renamedPolicy.LossFor(rule)
}

type oddDriver struct{ copyDriver }

func (d oddDriver) Policies() []policy.Policy {
	return []policy.Policy{oddPolicy{d.copyDriver.Policies()[0].(renamedPolicy)}}
}

// TestExplainAsksThePolicyForLosses: explain names the loss of a refused
// topic from the policy's own mapping, so a policy written in a
// protocol's package, with rules package policy has never heard of, is
// explained like the built-in ones.
func TestExplainAsksThePolicyForLosses(t *testing.T) {
	old := programDrivers
	programDrivers = func() []service.Driver { return append(drivers.All(), oddDriver{copyDriver{mqtt.Driver}}) }
	t.Cleanup(func() { programDrivers = old })
	_, objs := explainJSON(t, "--protocol", copyName, "--topic", "a/odd")
	if len(objs) != 1 || objs[0]["rule"] != ruleOdd || fmt.Sprint(objs[0]["losses"]) != "[dotted-levels]" {
		t.Errorf("explain: %v, want rule %s with loss dotted-levels", objs, ruleOdd)
	}
}
