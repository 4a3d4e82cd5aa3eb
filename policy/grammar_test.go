package policy

import (
	"errors"
	"strconv"
	"strings"
	"testing"
)

// levels returns n levels "a" joined by sep.
func levels(n int, sep string) string {
	return strings.TrimSuffix(strings.Repeat("a"+sep, n), sep)
}

type validateCase struct {
	in   string
	rule string // "" when valid
}

func checkValidate(t *testing.T, name string, fn func(string) error, cases []validateCase) {
	t.Helper()
	for _, c := range cases {
		err := fn(c.in)
		if c.rule == "" {
			if err != nil {
				t.Errorf("%s(%q) = %v, want valid", name, trunc(c.in), err)
			}
			continue
		}
		var r *Refusal
		if !errors.As(err, &r) {
			t.Errorf("%s(%q) = %v, want a *Refusal with rule %s", name, trunc(c.in), err, c.rule)
			continue
		}
		if r.Rule != c.rule || r.Input != c.in || r.Reason == "" {
			t.Errorf("%s(%q): rule %q input %q reason %q, want rule %q", name, trunc(c.in), r.Rule, trunc(r.Input), r.Reason, c.rule)
		}
	}
}

func trunc(s string) string {
	if len(s) > 40 {
		return s[:20] + "…" + s[len(s)-10:] + "(" + strconv.Itoa(len(s)) + "B)"
	}
	return s
}

type matchCase struct {
	filter, topic string
	want          bool
}

func checkMatch(t *testing.T, g Grammar, cases []matchCase) {
	t.Helper()
	for _, c := range cases {
		if err := g.ValidateFilter(c.filter); err != nil {
			t.Errorf("%s: filter %q of a match row is invalid: %v", g.Protocol(), c.filter, err)
		}
		if got := g.Match(c.filter, c.topic); got != c.want {
			t.Errorf("%s: Match(%q, %q) = %v, want %v", g.Protocol(), c.filter, c.topic, got, c.want)
		}
	}
}

func TestMQTTValidateFilter(t *testing.T) {
	checkValidate(t, "mqtt ValidateFilter", MQTTGrammar().ValidateFilter, []validateCase{
		{"a", ""}, {"/", ""}, {"a//b", ""}, {"/a", ""}, {"a/", ""},
		{"+", ""}, {"#", ""}, {"a/#", ""}, {"+/+", ""}, {"+/#", ""},
		{"sport/+/player1", ""}, {"$SYS/#", ""}, {"$SYS/+/x", ""},
		{"a/b.c", ""}, {"a/*", ""}, {"a/b*c", ""}, {"a/%", ""},
		{"capteur/température", ""}, {"a b/c", ""},
		{"$share", ""}, {"$shared/a", ""}, {"a/$share/b", ""},
		{levels(MQTTMaxLevels, "/"), ""},
		{strings.Repeat("x", MQTTMaxLen), ""},
		{"", RuleMQTTEmpty},
		{"sp+rt", RuleMQTTPlusNotAlone},
		{"a/+b", RuleMQTTPlusNotAlone},
		{"a/b#", RuleMQTTHashNotAlone},
		{"a/#b", RuleMQTTHashNotAlone},
		{"##", RuleMQTTHashNotAlone},
		{"a/#/b", RuleMQTTHashNotFinal},
		{"#/", RuleMQTTHashNotFinal},
		{"a\x00b", RuleMQTTNul},
		{"a/\xff", RuleMQTTInvalidUTF8},
		{strings.Repeat("x", MQTTMaxLen+1), RuleMQTTTooLong},
		{"$share/g/a", RuleMQTTShared},
		{"$share/g/#", RuleMQTTShared},
		{"$share/g+/a", RuleMQTTShared},
		{"$share//a", RuleMQTTShared},
		{levels(MQTTMaxLevels+1, "/"), RuleMQTTTooManyLevels},
		{strings.Repeat("/", MQTTMaxLevels), RuleMQTTTooManyLevels},
	})
}

func TestMQTTValidateTopic(t *testing.T) {
	checkValidate(t, "mqtt ValidateTopic", MQTTGrammar().ValidateTopic, []validateCase{
		{"a", ""}, {"/", ""}, {"a//b", ""}, {"a/b.c", ""}, {"a/*", ""}, {"$SYS/broker", ""},
		{"%", ""}, {"a b", ""}, {"$share/g/a", ""},
		{levels(MQTTMaxLevels, "/"), ""},
		{strings.Repeat("x", MQTTMaxLen), ""},
		{"", RuleMQTTEmpty},
		{"a/+", RuleMQTTWildcardInName},
		{"+", RuleMQTTWildcardInName},
		{"#", RuleMQTTWildcardInName},
		{"a/b#", RuleMQTTWildcardInName},
		{"sp+rt", RuleMQTTWildcardInName},
		{"a\x00", RuleMQTTNul},
		{"\xc3", RuleMQTTInvalidUTF8},
		{strings.Repeat("x", MQTTMaxLen+1), RuleMQTTTooLong},
		{levels(MQTTMaxLevels+1, "/"), RuleMQTTTooManyLevels},
	})
}

func TestMQTTMatch(t *testing.T) {
	checkMatch(t, MQTTGrammar(), []matchCase{
		// MQTT 5 §4.7 and the Mosquitto 2.0.11 measurements.
		{"sport/#", "sport", true},
		{"sport/#", "sport/", true},
		{"sport/#", "sport/tennis/player1", true},
		{"sport/#", "sports", false},
		{"sport/+", "sport/", true},
		{"sport/+", "sport", false},
		{"sport/+", "sport/a/b", false},
		{"a/#", "a", true},
		{"a/#", "a/", true},
		{"+", "a", true},
		{"+", "/a", false},
		{"+", "a/", false},
		{"+", "/", false},
		{"+/+", "/", true},
		{"+/+", "/a", true},
		{"+/+", "a/", true},
		{"+/+", "a", false},
		{"a/+/+", "a//b", true},
		{"a//b", "a//b", true},
		{"a//b", "a/b", false},
		{"a/+", "a/b.c", true},
		{"a/*", "a/*", true},
		{"a/*", "a/b", false},
		{"a/B", "a/b", false},
		{"capteur/température", "capteur/température", true},
		{"capteur/température", "capteur/temperature", false},
		{"#", "a", true},
		{"#", "/", true},
		{"sensors/us/#", "sensors/us", true},
		{"sensors/+/california/+/temperature", "sensors/us/california/sf/temperature", true},
		{"sensors/+/california/+/temperature", "sensors/us/nevada/sf/temperature", false},
		// §4.7.2: a leading wildcard never matches a '$' topic.
		{"#", "$SYS/broker", false},
		{"+/+", "$a/x", false},
		{"+/x", "$a/x", false},
		{"+", "$a", false},
		{"#", "$", false},
		{"$SYS/#", "$SYS/broker", true},
		{"$SYS/+/x", "$SYS/a/x", true},
		{"a/+", "a/$x", true},
		{"a/#", "a/$x", true},
		{"/#", "/$x", true},
	})
}

func TestNATSValidateFilter(t *testing.T) {
	checkValidate(t, "nats ValidateFilter", NATSGrammar().ValidateFilter, []validateCase{
		{"a", ""}, {"a.*", ""}, {"a.>", ""}, {">", ""}, {"*", ""}, {"*.>", ""},
		{"a.#", ""}, {"a.b#", ""}, {"a.*b", ""}, {">a", ""}, {"a>.b", ""}, {"$SYS.>", ""},
		{"é.ü", ""}, {"a/b", ""},
		{"", RuleNATSEmptyToken},
		{".a", RuleNATSEmptyToken},
		{"a.", RuleNATSEmptyToken},
		{"a..b", RuleNATSEmptyToken},
		{"a b", RuleNATSWhitespace},
		{"a.\tb", RuleNATSWhitespace},
		{"a\n", RuleNATSWhitespace},
		{"\r", RuleNATSWhitespace},
		{"a.\f", RuleNATSWhitespace},
		{">.a", RuleNATSGtNotFinal},
		{"a.>.b", RuleNATSGtNotFinal},
	})
}

func TestNATSValidateTopic(t *testing.T) {
	checkValidate(t, "nats ValidateTopic", NATSGrammar().ValidateTopic, []validateCase{
		{"a", ""}, {"a.b", ""}, {"$X.y", ""}, {"a.#", ""}, {"a.b#", ""}, {"a.*b", ""},
		// Routed as literal tokens by nats-server (probed).
		{"p.*", ""}, {"p.>", ""}, {">", ""},
		{strings.Repeat("x", 5000), ""},
		{"", RuleNATSEmptyToken},
		{"p..b", RuleNATSEmptyToken},
		{"p.", RuleNATSEmptyToken},
		{".p", RuleNATSEmptyToken},
		{"a b", RuleNATSWhitespace},
		{"a\r\n", RuleNATSWhitespace},
	})
}

func TestNATSMatch(t *testing.T) {
	checkMatch(t, NATSGrammar(), []matchCase{
		// Rows of the acceptance list.
		{"a.*", "a.b.c", false},
		{"*", "a.b", false},
		{"a.>", "a.b.c.d", true},
		{"a.>", "a", false},
		{"a.*.c", "a..c", false},
		{"a.B.c", "a.b.c", false},
		// nats-server 2.9.10, measured and probed.
		{"a.>", "a.b", true},
		{"*.>", "a", false},
		{"*.>", "a.b", true},
		{">", "a", true},
		{">", "a.b.c", true},
		{"a.*", "a.#", true},
		{"a.*", "a.b#", true},
		{"a.*", "a.*b", true},
		{"a.#", "a.#", true},
		{"a.#", "a.b", false},
		{"a.b#", "a.b#", true},
		{"a.*b", "a.*b", true},
		{"a.*b", "a.xb", false},
		{"p.*", "p.*", true},
		{"p.*", "p.>", true},
		{"p.>", "p.*", true},
		{">", "p.>", true},
		{"*.*", "p.>", true},
		{"p.x", "p.*", false},
		{"p.x.y", "p.>", false},
		{">", "$X.y", true},
		{"*.*", "$X.y", true},
		// A subject with an empty token reaches nobody, not even '>'.
		{">", "", false},
		{">", "p..b", false},
		{">", "p.", false},
		{">", ".p", false},
		{"a.>", "a.b.", false},
		{"a.>", "a..b", false},
		{"*", "", false},
		{"p.*", "p.", false},
		{"a.b", "a.b", true},
		{"a.b", "a.b.c", false},
		{"a.b.c", "a.b", false},
	})
}

func TestAMQPValidate(t *testing.T) {
	g := AMQPGrammar()
	cases := []validateCase{
		{"", ""}, {"a", ""}, {"a..b", ""}, {"a.", ""}, {".a", ""}, {"#.leaf", ""}, {"a.#.b", ""},
		{"#.#", ""}, {"a*b", ""}, {"\xff", ""}, {strings.Repeat("x", AMQPMaxLen), ""},
		{strings.Repeat("x", AMQPMaxLen+1), RuleAMQPTooLong},
	}
	checkValidate(t, "amqp ValidateFilter", g.ValidateFilter, cases)
	checkValidate(t, "amqp ValidateTopic", g.ValidateTopic, cases)
}

// amqpMatchCases are RabbitMQ 3.10.8's answers (foreign-grammars.md §4) and
// the edges of '#' anywhere. They also seed FuzzAMQPMatch.
var amqpMatchCases = []matchCase{
	// Acceptance row.
	{"audit.events.#", "audit.events", true},
	// The empty routing key is zero words.
	{"#", "", true},
	{"#.#", "", true},
	{"", "", true},
	{"*", "", false},
	{"*.#", "", false},
	{"#.*", "", false},
	{"*.*", "", false},
	{"a.#", "", false},
	{"a.*", "", false},
	{"#.leaf", "", false},
	{"a.#.b", "", false},
	{"a", "", false},
	{".#", "", false},
	// The empty binding key matches only the empty routing key.
	{"", "a", false},
	{"", ".", false},
	// Empty words inside a key are words.
	{"a.*", "a.", true},
	{"*.*", "a.", true},
	{"*.*", ".a", true},
	{"*.*", ".", true},
	{"*", ".", false},
	{"a.#.b", "a..b", true},
	{"a.#", "a..b", true},
	{"a..b", "a..b", true},
	{"a..b", "a.b", false},
	{"a.", "a.", true},
	{"a.", "a", false},
	{".a", ".a", true},
	{".#", ".", true},
	{".#", ".a", true},
	// '#' anywhere.
	{"#.leaf", "leaf", true},
	{"#.leaf", "x.leaf", true},
	{"#.leaf", "x.y.leaf", true},
	{"#.leaf", "leaf.x", false},
	{"#.leaf", "xleaf", false},
	{"a.#.b", "a.b", true},
	{"a.#.b", "a.x.b", true},
	{"a.#.b", "a.x.y.b", true},
	{"a.#.b", "a.b.c", false},
	{"a.#.b", "b.a.b", false},
	{"a.#", "a", true},
	{"a.#", "a.b.c", true},
	{"a.#", "ab", false},
	{"#.#", "a.b", true},
	{"#.*", "a", true},
	{"#.*", "a.b", true},
	{"*.#", "a", true},
	{"*.#", ".", true},
	{"#", "a.b.c", true},
	// The tutorial.
	{"*.orange.*", "quick.orange.rabbit", true},
	{"*.orange.*", "lazy.orange.elephant", true},
	{"*.*.rabbit", "quick.orange.rabbit", true},
	{"lazy.#", "lazy.pink.rabbit", true},
	{"lazy.#", "lazy.orange.male.rabbit", true},
	{"*.orange.*", "quick.orange.male.rabbit", false},
	{"*.*.rabbit", "quick.brown.fox", false},
	// Backtracking.
	{"#.a.#.b", "a.a.b.b", true},
	{"#.a.#.b", "x.a.b.c", false},
	{"#.a.*", "a.a.a", true},
	{"#.a.*", "a.a", true},
	{"#.a.*", "a", false},
	{"a.#.a.#.a", "a.a.a", true},
	{"a.#.a.#.a", "a.a", false},
	{"#.b.#", "a.b", true},
	{"#.b.#", "a.c", false},
	{"*.#.*", "a", false},
	{"*.#.*", "a.b", true},
	{"#.*.b", "b", false},
	{"#.*.b", "x.b", true},
	// Wildcard characters inside a word and in routing keys are literal.
	{"a*b", "a*b", true},
	{"a*b", "axb", false},
	{"a.*", "a.*", true},
	{"a.#", "a.#", true},
	{"*", "#", true},
}

func TestAMQPMatch(t *testing.T) { checkMatch(t, AMQPGrammar(), amqpMatchCases) }

func TestGrammarOf(t *testing.T) {
	for _, p := range protocols() {
		g := grammarOf(p)
		if g == nil || g.Protocol() != p {
			t.Errorf("grammarOf(%s) = %v", p, g)
		}
		if defaultPolicy(p).Grammar().Protocol() != p {
			t.Errorf("defaultPolicy(%s) has grammar %s", p, defaultPolicy(p).Grammar().Protocol())
		}
	}
	if grammarOf("zmtp") != nil || defaultPolicy("zmtp") != nil {
		t.Error("unknown protocol gave a grammar or policy")
	}
}
