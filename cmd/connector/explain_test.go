package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
)

// explainJSON runs explain with --output json and decodes every line.
func explainJSON(t *testing.T, args ...string) (int, []map[string]any) {
	t.Helper()
	code, out, errOut := runCLI(t, "", append([]string{"explain", "--output", "json"}, args...)...)
	if errOut != "" {
		t.Errorf("explain %v: stderr %q", args, errOut)
	}
	var objs []map[string]any
	dec := json.NewDecoder(strings.NewReader(out))
	for dec.More() {
		var m map[string]any
		if err := dec.Decode(&m); err != nil {
			t.Fatalf("explain %v: bad JSON %q: %v", args, out, err)
		}
		objs = append(objs, m)
	}
	if n := strings.Count(out, "\n"); n != len(objs) {
		t.Errorf("explain %v: %d lines for %d objects; want one object per line", args, n, len(objs))
	}
	return code, objs
}

func TestExplainAcceptance(t *testing.T) {
	for _, c := range []struct {
		args    []string
		output  string // "" when refused
		rule    string
		partial string // a substring of the reason
	}{
		{[]string{"--protocol", "mqtt", "--filter", "sensors/+/california/+/temperature"}, "sensors.*.california.*.temperature", "", ""},
		{[]string{"--protocol", "mqtt", "--filter", "sensors/us/#"}, "sensors.us.#", "", ""},
		{[]string{"--protocol", "mqtt", "--filter", "a/b.c"}, "", "mqtt-dotted-level", "separator"},
		{[]string{"--protocol", "mqtt", "--policy", "mqtt-levels-escaped/v1", "--filter", "a/b.c"}, "a.b%2Ec", "", ""},
		{[]string{"--protocol", "mqtt", "--topic", "a/b.c"}, "", "mqtt-dotted-level", ""},
		{[]string{"--protocol", "mqtt", "--policy", "mqtt-levels-escaped/v1", "--topic", "a/b.c"}, "a.b%2Ec", "", ""},
		{[]string{"--protocol", "mqtt", "--direction", "outbound", "--topic", "sensors.us"}, "sensors/us", "", ""},
		{[]string{"--protocol", "mqtt", "--direction", "outbound", "--topic", "a/b"}, "", "mqtt-slash-segment", ""},
		{[]string{"--protocol", "nats", "--filter", ">"}, "", "nats-one-or-more", "one or more"},
		{[]string{"--protocol", "nats", "--filter", "orders.>"}, "", "nats-one-or-more", "zero or more"},
		{[]string{"--protocol", "nats", "--filter", "a.*.c"}, "a.*.c", "", ""},
		{[]string{"--protocol", "nats", "--direction", "outbound", "--topic", "a..c"}, "", "nats-empty-token", ""},
		{[]string{"--protocol", "amqp", "--filter", "audit.events.#"}, "audit.events.#", "", ""},
		{[]string{"--protocol", "amqp", "--filter", "#.leaf"}, "", "amqp-hash-then-literal", ""},
		{[]string{"--protocol", "amqp", "--filter", "a.#.b"}, "", "amqp-hash-then-literal", ""},
		{[]string{"--protocol", "amqp", "--filter", ""}, "", "amqp-empty-binding-key", ""},
		{[]string{"--protocol", "amqp", "--filter", "#.*"}, "*.#", "", ""},
		{[]string{"--protocol", "amqp", "--topic", ""}, "", "amqp-empty-routing-key", ""},
		{[]string{"--protocol", "amqp", "--direction", "outbound", "--topic", strings.Repeat("x", 256)}, "", "amqp-too-long", ""},
	} {
		code, objs := explainJSON(t, c.args...)
		if len(objs) != 1 {
			t.Fatalf("%v: %d objects", c.args, len(objs))
		}
		o := objs[0]
		if c.rule == "" {
			if code != exitOK || o["output"] != c.output || o["refused"] != false {
				t.Errorf("%v: code %d, %v; want output %q", c.args, code, o, c.output)
			}
			continue
		}
		if _, has := o["output"]; has || code != exitRefused || o["refused"] != true || o["rule"] != c.rule {
			t.Errorf("%v: code %d, %v; want refused by %s without output", c.args, code, o, c.rule)
		}
		if reason, _ := o["reason"].(string); reason == "" || !strings.Contains(reason, c.partial) {
			t.Errorf("%v: reason %q, want it to mention %q", c.args, reason, c.partial)
		}
	}
}

func TestExplainJSONFieldsAndOrder(t *testing.T) {
	code, objs := explainJSON(t, "--protocol", "mqtt", "--qos", "0",
		"--topic", "a/b", "--filter", "a/*", "--topic", "a/b.c", "--filter", "+/#")
	if code != exitRefused {
		t.Errorf("code %d, want %d", code, exitRefused)
	}
	var got []string
	for _, o := range objs {
		got = append(got, o["kind"].(string)+" "+o["input"].(string))
		for _, k := range []string{"input", "kind", "protocol", "policy", "direction", "refused", "reason", "rule", "losses"} {
			if _, ok := o[k]; !ok {
				t.Errorf("%v lacks %q", o, k)
			}
		}
		if o["protocol"] != "mqtt" || o["policy"] != "mqtt-levels/v1" || o["direction"] != "inbound" {
			t.Errorf("%v: wrong protocol, policy or direction", o)
		}
	}
	if want := []string{"topic a/b", "filter a/*", "topic a/b.c", "filter +/#"}; !slices.Equal(got, want) {
		t.Errorf("order %v, want %v", got, want)
	}
	losses := func(o map[string]any) []string {
		var ls []string
		for _, l := range o["losses"].([]any) {
			ls = append(ls, l.(string))
		}
		return ls
	}
	if ls := losses(objs[0]); !slices.Contains(ls, "at-most-once") || !slices.Contains(ls, "dotted-levels") {
		t.Errorf("converted topic at QoS 0: losses %v", ls)
	}
	if ls := losses(objs[1]); len(ls) != 0 {
		t.Errorf("refused filter: losses %v, want none", ls)
	}
	if ls := losses(objs[2]); !slices.Equal(ls, []string{"dotted-levels"}) {
		t.Errorf("refused topic: losses %v, want the loss it is counted under", ls)
	}
	if objs[1]["part"] != "*" || objs[1]["hint"] == "" {
		t.Errorf("refused filter: part %v hint %v", objs[1]["part"], objs[1]["hint"])
	}
	if objs[3]["output"] != "*.#" {
		t.Errorf("+/# → %v", objs[3]["output"])
	}
}

func TestExplainText(t *testing.T) {
	code, out, errOut := runCLI(t, "", "explain", "--protocol", "nats", "--filter", "orders.*", "--filter", "orders.>", "--topic", "orders.eu")
	if code != exitRefused || errOut != "" {
		t.Fatalf("code %d, stderr %q", code, errOut)
	}
	for _, want := range []string{
		"nats-tokens/v1, inbound, core NATS",
		"filter \"orders.*\"\n       → \"orders.*\"\n",
		"filter \"orders.>\"\n       refused [nats-one-or-more] at \">\": NATS '>' matches one or more tokens",
		"hint: ",
		"topic  \"orders.eu\"\n       → \"orders.eu\"\n",
		"losses of nats-tokens/v1 inbound",
		"at-most-once ",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("output lacks %q:\n%s", want, out)
		}
	}
	// Only refusals: no losses block, and the run-time loss of the topic.
	code, out, _ = runCLI(t, "", "explain", "--protocol", "amqp", "--direction", "outbound", "--topic", "")
	if code != exitRefused || strings.Contains(out, "losses of") || !strings.Contains(out, "counted under reason amqp-empty-routing-key (the declared loss empty-routing-key)") {
		t.Errorf("code %d:\n%s", code, out)
	}
	// All converted: exit 0.
	code, _, _ = runCLI(t, "", "explain", "--protocol", "amqp", "--filter", "a.#.*", "--jetstream=false")
	if code != exitUsage {
		t.Errorf("--jetstream with amqp: code %d", code)
	}
	code, out, _ = runCLI(t, "", "explain", "--protocol", "amqp", "--filter", "a.#.*")
	if code != exitOK || !strings.Contains(out, `→ "a.*.#"`) {
		t.Errorf("code %d:\n%s", code, out)
	}
}

func TestExplainUsage(t *testing.T) {
	for _, args := range [][]string{
		{},
		{"--filter", "a"},
		{"--protocol", "zmtp", "--filter", "a"},
		{"--protocol", "MQTT", "--filter", "a"},
		{"--protocol", "mqtt", "--policy", "mqtt-levels/v9", "--filter", "a"},
		{"--protocol", "mqtt", "--policy", "nats-tokens/v1", "--filter", "a"},
		{"--protocol", "mqtt", "--direction", "sideways", "--filter", "a"},
		{"--protocol", "mqtt", "--output", "yaml", "--filter", "a"},
		{"--protocol", "mqtt"},
		{"--protocol", "mqtt", "a/b"},
		{"--protocol", "mqtt", "--filter", "a", "b"},
		{"--protocol", "mqtt", "--qos", "2", "--filter", "a"},
		{"--protocol", "nats", "--qos", "0", "--filter", "a"},
		{"--protocol", "mqtt", "--jetstream", "--filter", "a"},
		{"--protocol", "mqtt", "--bogus"},
		{"--protocol", "mqtt", "--filter"},
	} {
		code, out, errOut := runCLI(t, "", append([]string{"explain"}, args...)...)
		if code != exitUsage || out != "" || errOut == "" {
			t.Errorf("explain %q: code %d, stdout %q, stderr %q; want a usage error", args, code, out, errOut)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"--protocol", "mqtt", "--help"}, {"--protocol", "mqtt", "stray", "--help"}} {
		code, out, _ := runCLI(t, "", append([]string{"explain"}, args...)...)
		if code != exitOK || !strings.Contains(out, "usage: connector explain") || !strings.Contains(out, "-topic") {
			t.Errorf("explain %q: code %d, stdout %q", args, code, out)
		}
	}
}

func TestExplainFlagValues(t *testing.T) {
	// Values that look like flags, or are empty, are still inputs.
	code, objs := explainJSON(t, "--protocol", "nats", "--direction", "outbound", "--topic", "-x", "--topic=", "--topic", "a b")
	if code != exitRefused || len(objs) != 3 {
		t.Fatalf("code %d, %d objects", code, len(objs))
	}
	if objs[0]["output"] != "-x" || objs[1]["rule"] != "nats-empty-token" || objs[2]["rule"] != "nats-whitespace" {
		t.Errorf("%v", objs)
	}
}

func TestExplainDefaultPolicies(t *testing.T) {
	for proto, name := range map[string]string{"mqtt": "mqtt-levels/v1", "nats": "nats-tokens/v1", "amqp": "amqp-words/v1"} {
		_, objs := explainJSON(t, "--protocol", proto, "--topic", "a")
		if len(objs) != 1 || objs[0]["policy"] != name {
			t.Errorf("%s: %v, want policy %s", proto, objs, name)
		}
	}
}

// TestExplainJSONIsStable guards the field names the documentation shows.
func TestExplainJSONIsStable(t *testing.T) {
	var out bytes.Buffer
	code := run(t.Context(), []string{"explain", "--protocol", "amqp", "--output", "json", "--filter", "#.leaf"}, strings.NewReader(""), &out, &out)
	want := `{"input":"#.leaf","kind":"filter","protocol":"amqp","policy":"amqp-words/v1","direction":"inbound","refused":true,` +
		`"reason":"a literal word follows '#': AMQP '#' may match any number of words before it, weida's '#' must be last","rule":"amqp-hash-then-literal",` +
		`"part":"#.leaf","hint":"bind the prefix with a final '#' and filter the rest downstream, or bind each depth with '*'","losses":[]}` + "\n"
	if code != exitRefused || out.String() != want {
		t.Errorf("code %d\n got %s\nwant %s", code, out.String(), want)
	}
}

// TestExplainMount: --mount-foreign and --mount-weida explain what a
// resource with spec.conversion.mount converts, in both directions.
func TestExplainMount(t *testing.T) {
	m := []string{"--protocol", "mqtt", "--mount-foreign", "factory/", "--mount-weida", "plants.berlin."}
	for _, c := range []struct {
		args   []string
		output string // "" when refused
		rule   string
	}{
		{[]string{"--filter", "factory/+/press"}, "plants.berlin.*.press", ""},
		{[]string{"--filter", "factory/#"}, "plants.berlin.#", ""},
		{[]string{"--filter", "office/#"}, "", "mount-outside"},
		{[]string{"--filter", "#"}, "", "mount-outside"},
		{[]string{"--topic", "factory/hall-2/press"}, "plants.berlin.hall-2.press", ""},
		{[]string{"--topic", "office/x"}, "", "mount-outside"},
		{[]string{"--direction", "outbound", "--topic", "plants.berlin.hall-2.press"}, "factory/hall-2/press", ""},
		{[]string{"--direction", "outbound", "--topic", "plants.paris.x"}, "", "mount-outside"},
	} {
		args := append(slices.Clone(m), c.args...)
		code, objs := explainJSON(t, args...)
		if len(objs) != 1 {
			t.Fatalf("%v: %d objects", args, len(objs))
		}
		o := objs[0]
		mount, _ := o["mount"].(map[string]any)
		if mount["foreign"] != "factory/" || mount["weida"] != "plants.berlin." {
			t.Errorf("%v: mount %v", args, o["mount"])
		}
		if c.rule == "" {
			if code != exitOK || o["output"] != c.output {
				t.Errorf("%v: code %d, %v; want %q", args, code, o, c.output)
			}
			continue
		}
		if code != exitRefused || o["rule"] != c.rule || o["hint"] == nil && c.args[0] == "--filter" {
			t.Errorf("%v: code %d, %v; want refused by %s", args, code, o, c.rule)
		}
	}
	// Outbound losses under a foreign prefix: no empty-segments.
	_, objs := explainJSON(t, append(slices.Clone(m), "--direction", "outbound", "--filter", "factory/#")...)
	if ls, _ := objs[0]["losses"].([]any); slices.Contains(ls, any("empty-segments")) || len(ls) == 0 {
		t.Errorf("mounted outbound losses %v", ls)
	}
	code, out, _ := runCLI(t, "", append([]string{"explain"}, append(slices.Clone(m), "--filter", "factory/#")...)...)
	if code != exitOK || !strings.Contains(out, `mqtt-levels/v1 mounting MQTT "factory/" at weida "plants.berlin.", inbound`) ||
		!strings.Contains(out, "losses of mqtt-levels/v1 inbound under this mount") {
		t.Errorf("code %d:\n%s", code, out)
	}
	// A mount the policy refuses is a usage error that says why.
	for _, bad := range [][]string{
		{"--protocol", "mqtt", "--mount-weida", "plants.*.", "--filter", "a"},
		{"--protocol", "mqtt", "--mount-foreign", "factory", "--filter", "factory/a"},
		{"--protocol", "nats", "--mount-foreign", "orders..", "--filter", "orders.a"},
	} {
		code, out, errOut := runCLI(t, "", append([]string{"explain"}, bad...)...)
		if code != exitUsage || out != "" || !strings.Contains(errOut, "mount-") {
			t.Errorf("explain %q: code %d, stdout %q, stderr %q", bad, code, out, errOut)
		}
	}
}

// TestExplainNATSTail: the opt-in tail policy writes a final '>' as '*.#'.
func TestExplainNATSTail(t *testing.T) {
	for in, want := range map[string]string{"orders.>": "orders.*.#", ">": "*.#", "a.*.>": "a.*.*.#", "orders.eu": "orders.eu"} {
		code, objs := explainJSON(t, "--protocol", "nats", "--policy", "nats-tokens-tail/v1", "--filter", in)
		if code != exitOK || len(objs) != 1 || objs[0]["output"] != want || objs[0]["policy"] != "nats-tokens-tail/v1" {
			t.Errorf("%s: code %d, %v; want %s", in, code, objs, want)
		}
	}
}

// TestExplainAndCheckAgreeUnderMount: for MQTT outbound under factory/ ↔
// plants.berlin., explain's losses are the losses check accepts for a
// resource with that mount, and neither asks for dollar-topics, which no
// topic under factory/ can incur (issue 24, item 7). Under $SYS/ both ask
// for it.
func TestExplainAndCheckAgreeUnderMount(t *testing.T) {
	for _, c := range []struct {
		foreign, weida string
		dollar         bool
	}{{"factory/", "plants.berlin.", false}, {"$SYS/", "sys.", true}} {
		_, objs := explainJSON(t, "--protocol", "mqtt", "--direction", "outbound",
			"--mount-foreign", c.foreign, "--mount-weida", c.weida, "--topic", c.weida+"a")
		if len(objs) != 1 {
			t.Fatalf("explain: %v", objs)
		}
		var explained []string
		for _, l := range objs[0]["losses"].([]any) {
			explained = append(explained, l.(string))
		}
		if got := slices.Contains(explained, "dollar-topics"); got != c.dollar {
			t.Errorf("%s: explain's losses %v hold dollar-topics: %v, want %v", c.foreign, explained, got, c.dollar)
		}
		doc := copyDoc("mounted", "outbound", "      qos: 1\n", fmt.Sprintf("{foreign: %q, weida: %q}", c.foreign, c.weida),
			"["+strings.Join(explained, ", ")+"]", "", c.foreign+"#")
		dir := t.TempDir()
		if err := os.WriteFile(filepath.Join(dir, "m.yaml"), []byte(doc), 0o600); err != nil {
			t.Fatal(err)
		}
		code, out, _ := runCLI(t, "", "check", "--output", "json", "-f", filepath.Join(dir, "m.yaml"))
		var res checkJSON
		if err := json.Unmarshal([]byte(out), &res); err != nil || code != exitOK || !res.Valid {
			t.Fatalf("%s: check refuses the losses explain printed (exit %d, %v):\n%s", c.foreign, code, err, out)
		}
		if got := fmt.Sprint(res.Resources[0].Losses); got != fmt.Sprint(explained) {
			t.Errorf("%s: check's losses %s, explain's %v", c.foreign, got, explained)
		}
	}
}

// TestExplainNamesDropReason: where explain says a refused topic is lost
// at run time, it names the reason label the drop counter uses (the
// refusal's rule), beside the loss a resource declares.
func TestExplainNamesDropReason(t *testing.T) {
	code, out, _ := runCLI(t, "", "explain", "--protocol", "mqtt", "--topic", "v1.2/status")
	if code != exitRefused || !strings.Contains(out, "counted under reason mqtt-dotted-level (the declared loss dotted-levels)") {
		t.Errorf("code %d:\n%s", code, out)
	}
	code, out, _ = runCLI(t, "", "explain", "--protocol", "mqtt", "--topic", "v1.2/status", "--output", "json")
	if code != exitRefused || !strings.Contains(out, `"dropReason":"mqtt-dotted-level"`) {
		t.Errorf("code %d:\n%s", code, out)
	}
}
