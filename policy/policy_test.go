package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"weida.dev/connector/weida/topic"
)

// op names one conversion of a policy.
type op int

const (
	opFilter op = iota // ConvertFilter
	opIn               // TopicToWeida
	opOut              // TopicFromWeida
)

func (o op) String() string { return [...]string{"ConvertFilter", "TopicToWeida", "TopicFromWeida"}[o] }

func (o op) apply(p Policy, in string) (string, error) {
	switch o {
	case opFilter:
		return p.ConvertFilter(in)
	case opIn:
		return p.TopicToWeida(in)
	default:
		return p.TopicFromWeida(in)
	}
}

type convCase struct {
	policy string
	op     op
	in     string
	out    string // wanted output when rule is ""
	rule   string // wanted refusal rule
	part   string // wanted Refusal.Part when not ""
}

// pad returns s followed by '/'- or '.'-separated filler levels so that the
// result is exactly n bytes long.
func pad(s string, sep byte, n int) string {
	if len(s) >= n {
		return s[:n]
	}
	return s + string(sep) + strings.Repeat("x", n-len(s)-1)
}

var convCases = []convCase{
	// mqtt-levels/v1, filters. The first rows are the acceptance list.
	{MQTTLevels, opFilter, "sensors/+/california/+/temperature", "sensors.*.california.*.temperature", "", ""},
	{MQTTLevels, opFilter, "sensors/us/#", "sensors.us.#", "", ""},
	{MQTTLevels, opFilter, "a/b.c", "", RuleMQTTDottedLevel, "b.c"},
	{MQTTLevels, opFilter, "#", "#", "", ""},
	{MQTTLevels, opFilter, "+", "*", "", ""},
	{MQTTLevels, opFilter, "temperature", "temperature", "", ""},
	{MQTTLevels, opFilter, "/", ".", "", ""},
	{MQTTLevels, opFilter, "a//b", "a..b", "", ""},
	{MQTTLevels, opFilter, "/+/#", ".*.#", "", ""},
	{MQTTLevels, opFilter, "$SYS/#", "$SYS.#", "", ""},
	{MQTTLevels, opFilter, "a/%", "a.%", "", ""},
	{MQTTLevels, opFilter, "a/*", "", RuleMQTTStarLevel, "*"},
	{MQTTLevels, opFilter, "a/b*c", "", RuleMQTTStarLevel, "b*c"},
	{MQTTLevels, opFilter, "a.b", "", RuleMQTTDottedLevel, "a.b"},
	{MQTTLevels, opFilter, "$share/g/a", "", RuleMQTTShared, "$share/"},
	{MQTTLevels, opFilter, "a/b#", "", RuleMQTTHashNotAlone, "b#"},
	{MQTTLevels, opFilter, "", "", RuleMQTTEmpty, ""},
	{MQTTLevels, opFilter, pad("a", '/', 256), pad("a", '.', 256), "", ""},
	{MQTTLevels, opFilter, pad("a", '/', 257), "", RuleFilterTooLong, ""},
	// mqtt-levels/v1, topics in.
	{MQTTLevels, opIn, "a/b", "a.b", "", ""},
	{MQTTLevels, opIn, "temperature", "temperature", "", ""},
	{MQTTLevels, opIn, "/", ".", "", ""},
	{MQTTLevels, opIn, "a/", "a.", "", ""},
	{MQTTLevels, opIn, "$SYS/broker", "$SYS.broker", "", ""},
	{MQTTLevels, opIn, "a/*", "a.*", "", ""},
	{MQTTLevels, opIn, "a/%2E", "a.%2E", "", ""},
	{MQTTLevels, opIn, "capteur/température", "capteur.température", "", ""},
	{MQTTLevels, opIn, "a/b.c", "", RuleMQTTDottedLevel, "b.c"},
	{MQTTLevels, opIn, "a/+", "", RuleMQTTWildcardInName, "+"},
	{MQTTLevels, opIn, pad("a", '/', 256), pad("a", '.', 256), "", ""},
	{MQTTLevels, opIn, pad("a", '/', 257), "", RuleTopicTooLong, ""},
	{MQTTLevels, opIn, strings.Repeat("x", 300), "", RuleTopicTooLong, ""},
	// mqtt-levels/v1, topics out.
	{MQTTLevels, opOut, "a.b", "a/b", "", ""},
	{MQTTLevels, opOut, "temperature", "temperature", "", ""},
	{MQTTLevels, opOut, "a.", "a/", "", ""},
	{MQTTLevels, opOut, ".", "/", "", ""},
	{MQTTLevels, opOut, "a.*", "a/*", "", ""},
	{MQTTLevels, opOut, "a.%2E", "a/%2E", "", ""},
	{MQTTLevels, opOut, "$SYS.x", "$SYS/x", "", ""},
	{MQTTLevels, opOut, "a/b", "", RuleMQTTSlashSegment, "a/b"},
	{MQTTLevels, opOut, "a.+", "", RuleMQTTWildcardInName, "+"},
	{MQTTLevels, opOut, "a.#", "", RuleMQTTWildcardInName, "#"},
	{MQTTLevels, opOut, "a.b#", "", RuleMQTTWildcardInName, "b#"},
	{MQTTLevels, opOut, "", "", RuleMQTTEmpty, ""},
	{MQTTLevels, opOut, "a\x00", "", RuleMQTTNul, ""},
	{MQTTLevels, opOut, strings.Repeat(".", MQTTMaxLevels-1), strings.Repeat("/", MQTTMaxLevels-1), "", ""},
	{MQTTLevels, opOut, strings.Repeat(".", MQTTMaxLevels), "", RuleMQTTTooManyLevels, ""},
	{MQTTLevels, opOut, "a" + strings.Repeat(".", MQTTMaxLevels) + "z", "", RuleMQTTTooManyLevels, ""},
	{MQTTLevels, opOut, strings.Repeat("x", 257), "", RuleTopicTooLong, ""},
	{MQTTLevels, opOut, "\xff", "", RuleInvalidUTF8, ""},

	// mqtt-levels-escaped/v1.
	{MQTTLevelsEscaped, opFilter, "sensors/+/california/+/temperature", "sensors.*.california.*.temperature", "", ""},
	{MQTTLevelsEscaped, opFilter, "a/b.c", "a.b%2Ec", "", ""},
	{MQTTLevelsEscaped, opFilter, "a/*", "a.%2A", "", ""},
	{MQTTLevelsEscaped, opFilter, "a/b*c/+", "a.b%2Ac.*", "", ""},
	{MQTTLevelsEscaped, opFilter, "100%/#", "100%25.#", "", ""},
	{MQTTLevelsEscaped, opFilter, "a.b.c", "a%2Eb%2Ec", "", ""},
	{MQTTLevelsEscaped, opFilter, "plain", "plain", "", ""},
	{MQTTLevelsEscaped, opFilter, "$share/g/a", "", RuleMQTTShared, "$share/"},
	{MQTTLevelsEscaped, opFilter, strings.Repeat(".", 86), "", RuleFilterTooLong, ""},
	{MQTTLevelsEscaped, opFilter, strings.Repeat(".", 85) + "a", strings.Repeat("%2E", 85) + "a", "", ""},
	{MQTTLevelsEscaped, opIn, "a/b.c", "a.b%2Ec", "", ""},
	{MQTTLevelsEscaped, opIn, "a/b/c", "a.b.c", "", ""},
	{MQTTLevelsEscaped, opIn, "a/%2E", "a.%252E", "", ""},
	{MQTTLevelsEscaped, opIn, "a/*", "a.%2A", "", ""},
	{MQTTLevelsEscaped, opIn, "%", "%25", "", ""},
	{MQTTLevelsEscaped, opIn, "plain", "plain", "", ""},
	{MQTTLevelsEscaped, opIn, pad(".", '/', 254), "%2E." + strings.Repeat("x", 252), "", ""},
	{MQTTLevelsEscaped, opIn, pad(".", '/', 255), "", RuleTopicTooLong, ""},
	{MQTTLevelsEscaped, opOut, "a.b%2Ec", "a/b.c", "", ""},
	{MQTTLevelsEscaped, opOut, "a.%252E", "a/%2E", "", ""},
	{MQTTLevelsEscaped, opOut, "a.%2A", "a/*", "", ""},
	{MQTTLevelsEscaped, opOut, "%25", "%", "", ""},
	{MQTTLevelsEscaped, opOut, "plain", "plain", "", ""},
	{MQTTLevelsEscaped, opOut, "a.*", "", RuleMQTTEscape, "*"},
	{MQTTLevelsEscaped, opOut, "a.%", "", RuleMQTTEscape, "%"},
	{MQTTLevelsEscaped, opOut, "a.%2", "", RuleMQTTEscape, "%2"},
	{MQTTLevelsEscaped, opOut, "a.%2e", "", RuleMQTTEscape, "%2e"},
	{MQTTLevelsEscaped, opOut, "a.%41", "", RuleMQTTEscape, "%41"},
	{MQTTLevelsEscaped, opOut, "a.%2F", "", RuleMQTTEscape, "%2F"},
	{MQTTLevelsEscaped, opOut, "a.b/c", "", RuleMQTTSlashSegment, "b/c"},
	{MQTTLevelsEscaped, opOut, "a.#", "", RuleMQTTWildcardInName, "#"},
	{MQTTLevelsEscaped, opOut, "", "", RuleMQTTEmpty, ""},

	// nats-tokens/v1. The first rows are the acceptance list.
	{NATSTokens, opFilter, ">", "", RuleNATSOneOrMore, ">"},
	{NATSTokens, opFilter, "orders.>", "", RuleNATSOneOrMore, ">"},
	{NATSTokens, opFilter, "a.*", "a.*", "", ""},
	{NATSTokens, opFilter, "*", "*", "", ""},
	{NATSTokens, opFilter, "a.*.c", "a.*.c", "", ""},
	{NATSTokens, opFilter, "orders.eu.created", "orders.eu.created", "", ""},
	{NATSTokens, opFilter, "$SYS.*", "$SYS.*", "", ""},
	{NATSTokens, opFilter, "a>.b", "a>.b", "", ""},
	{NATSTokens, opFilter, "a.#", "", RuleNATSHashToken, "#"},
	{NATSTokens, opFilter, "a.b#", "", RuleNATSWildcardMix, "b#"},
	{NATSTokens, opFilter, "a.*b", "", RuleNATSWildcardMix, "*b"},
	{NATSTokens, opFilter, "a..b", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opFilter, "", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opFilter, "a b", "", RuleNATSWhitespace, "a b"},
	{NATSTokens, opFilter, ">.a", "", RuleNATSGtNotFinal, ">"},
	{NATSTokens, opFilter, "\xff", "", RuleInvalidUTF8, ""},
	{NATSTokens, opFilter, pad("a", '.', 256), pad("a", '.', 256), "", ""},
	{NATSTokens, opFilter, pad("a", '.', 257), "", RuleFilterTooLong, ""},
	{NATSTokens, opIn, "a.b", "a.b", "", ""},
	{NATSTokens, opIn, "p.*", "p.*", "", ""},
	{NATSTokens, opIn, "p.>", "p.>", "", ""},
	{NATSTokens, opIn, "a.#", "a.#", "", ""},
	{NATSTokens, opIn, "$X.y", "$X.y", "", ""},
	{NATSTokens, opIn, "p..b", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opIn, "\xffa", "", RuleInvalidUTF8, ""},
	{NATSTokens, opIn, pad("a", '.', 256), pad("a", '.', 256), "", ""},
	{NATSTokens, opIn, pad("a", '.', 257), "", RuleTopicTooLong, ""},
	{NATSTokens, opOut, "a.b", "a.b", "", ""},
	{NATSTokens, opOut, "a.#", "a.#", "", ""},
	{NATSTokens, opOut, "a*.b>", "a*.b>", "", ""},
	{NATSTokens, opOut, "$X.y", "$X.y", "", ""},
	{NATSTokens, opOut, "", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opOut, "a.", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opOut, ".a", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opOut, "a..b", "", RuleNATSEmptyToken, ""},
	{NATSTokens, opOut, "a.*", "", RuleNATSWildcardTok, "*"},
	{NATSTokens, opOut, "a.>", "", RuleNATSWildcardTok, ">"},
	{NATSTokens, opOut, "a b", "", RuleNATSWhitespace, "a b"},
	{NATSTokens, opOut, "a\tb", "", RuleNATSWhitespace, "a\tb"},

	// amqp-words/v1. The first rows are the acceptance list.
	{AMQPWords, opFilter, "audit.events.#", "audit.events.#", "", ""},
	{AMQPWords, opFilter, "#.leaf", "", RuleAMQPHashThenLiteral, "#.leaf"},
	{AMQPWords, opFilter, "a.#.b", "", RuleAMQPHashThenLiteral, "#.b"},
	{AMQPWords, opFilter, "", "", RuleAMQPEmptyBindingKey, ""},
	{AMQPWords, opFilter, "#", "#", "", ""},
	{AMQPWords, opFilter, "*", "*", "", ""},
	{AMQPWords, opFilter, "a..b", "a..b", "", ""},
	{AMQPWords, opFilter, ".#", ".#", "", ""},
	{AMQPWords, opFilter, "*.orange.*", "*.orange.*", "", ""},
	{AMQPWords, opFilter, "#.#", "#", "", ""},
	{AMQPWords, opFilter, "#.*", "*.#", "", ""},
	{AMQPWords, opFilter, "a.#.*", "a.*.#", "", ""},
	{AMQPWords, opFilter, "*.#.*", "*.*.#", "", ""},
	{AMQPWords, opFilter, "a.#.*.#.*.#", "a.*.*.#", "", ""},
	{AMQPWords, opFilter, "*.a.#.*", "*.a.*.#", "", ""},
	{AMQPWords, opFilter, "a.#.*.b", "", RuleAMQPHashThenLiteral, "#.*.b"},
	{AMQPWords, opFilter, "#.a.*", "", RuleAMQPHashThenLiteral, "#.a"},
	{AMQPWords, opFilter, "a.#.", "", RuleAMQPHashThenLiteral, "#."},
	{AMQPWords, opFilter, "a*b", "", RuleAMQPWildcardMix, "a*b"},
	{AMQPWords, opFilter, "a.b#", "", RuleAMQPWildcardMix, "b#"},
	{AMQPWords, opFilter, "\xff.#", "", RuleInvalidUTF8, ""},
	{AMQPWords, opFilter, strings.Repeat("x", 255), strings.Repeat("x", 255), "", ""},
	{AMQPWords, opFilter, strings.Repeat("x", 256), "", RuleAMQPTooLong, ""},
	{AMQPWords, opIn, "a.b", "a.b", "", ""},
	{AMQPWords, opIn, "a..b", "a..b", "", ""},
	{AMQPWords, opIn, ".", ".", "", ""},
	{AMQPWords, opIn, "a.*", "a.*", "", ""},
	{AMQPWords, opIn, "", "", RuleAMQPEmptyRoutingKey, ""},
	{AMQPWords, opIn, "\xff", "", RuleInvalidUTF8, ""},
	{AMQPWords, opIn, strings.Repeat("x", 255), strings.Repeat("x", 255), "", ""},
	{AMQPWords, opIn, strings.Repeat("x", 256), "", RuleAMQPTooLong, ""},
	{AMQPWords, opOut, "a.b", "a.b", "", ""},
	{AMQPWords, opOut, ".", ".", "", ""},
	{AMQPWords, opOut, "", "", RuleAMQPEmptyRoutingKey, ""},
	{AMQPWords, opOut, strings.Repeat("x", 255), strings.Repeat("x", 255), "", ""},
	{AMQPWords, opOut, strings.Repeat("x", 256), "", RuleAMQPTooLong, ""},
	{AMQPWords, opOut, strings.Repeat("x", 257), "", RuleTopicTooLong, ""},
}

func TestConversions(t *testing.T) {
	for _, c := range convCases {
		p, err := lookup(c.policy)
		if err != nil {
			t.Fatal(err)
		}
		out, err := c.op.apply(p, c.in)
		if c.rule == "" {
			if err != nil || out != c.out {
				t.Errorf("%s %s(%q) = %q, %v; want %q", c.policy, c.op, trunc(c.in), trunc(out), err, trunc(c.out))
			}
			if c.op == opFilter && err == nil {
				if verr := topic.ValidateFilter(out); verr != nil {
					t.Errorf("%s %s(%q) = %q, invalid weida: %v", c.policy, c.op, c.in, out, verr)
				}
			}
			continue
		}
		var r *Refusal
		if !errors.As(err, &r) {
			t.Errorf("%s %s(%q) = %q, %v; want refusal %s", c.policy, c.op, trunc(c.in), trunc(out), err, c.rule)
			continue
		}
		if out != "" || r.Rule != c.rule || r.Policy != c.policy || r.Input != c.in || r.Reason == "" {
			t.Errorf("%s %s(%q): out %q, refusal %+v; want rule %s by %s", c.policy, c.op, trunc(c.in), out, r, c.rule, c.policy)
		}
		if c.part != "" && r.Part != c.part {
			t.Errorf("%s %s(%q): part %q, want %q", c.policy, c.op, trunc(c.in), r.Part, c.part)
		}
		if c.op != opFilter {
			if _, ok := LossForRule(r.Rule); !ok {
				t.Errorf("%s %s(%q): topic refusal rule %s maps to no loss", c.policy, c.op, trunc(c.in), r.Rule)
			}
		}
	}
}

// TestAcceptanceRefusalReasons checks what the acceptance list asks of the
// words of a refusal, not only its code.
func TestAcceptanceRefusalReasons(t *testing.T) {
	p := defaultPolicy(NATS)
	for _, f := range []string{">", "orders.>"} {
		_, err := p.ConvertFilter(f)
		var r *Refusal
		if !errors.As(err, &r) {
			t.Fatalf("ConvertFilter(%q) = %v", f, err)
		}
		if !strings.Contains(r.Reason, "one or more") || !strings.Contains(r.Reason, "zero or more") || r.Hint == "" {
			t.Errorf("ConvertFilter(%q): reason %q hint %q must name one-or-more versus zero-or-more and give a hint", f, r.Reason, r.Hint)
		}
	}
	_, err := defaultPolicy(MQTT).ConvertFilter("a/b.c")
	var r *Refusal
	if !errors.As(err, &r) || !strings.Contains(r.Hint, MQTTLevelsEscaped) {
		t.Errorf("a/b.c under %s: %v, want a hint naming %s", MQTTLevels, err, MQTTLevelsEscaped)
	}
	if !strings.Contains(err.Error(), `"b.c"`) || !strings.Contains(err.Error(), RuleMQTTDottedLevel) {
		t.Errorf("Error() = %q, want the part and the rule", err)
	}
	_, err = defaultPolicy(MQTT).ConvertFilter("$share/g/a")
	if !errors.As(err, &r) || !strings.Contains(r.Hint, "share group") {
		t.Errorf("$share/g/a: %v, want a hint about the share group option", err)
	}
}

func TestAcceptanceMatches(t *testing.T) {
	// The acceptance rows that name matches on converted filters as well.
	for _, c := range []struct {
		proto         Protocol
		filter, topic string
		want          bool
	}{
		{MQTT, "sensors/us/#", "sensors/us", true},
		{MQTT, "#", "$SYS/broker", false},
		{AMQP, "audit.events.#", "audit.events", true},
		{NATS, "a.*", "a.b.c", false},
		{NATS, "*", "a.b", false},
		{NATS, "a.B.c", "a.b.c", false},
	} {
		p := defaultPolicy(c.proto)
		if got := p.Grammar().Match(c.filter, c.topic); got != c.want {
			t.Errorf("%s Match(%q, %q) = %v", c.proto, c.filter, c.topic, got)
		}
		w, err := p.ConvertFilter(c.filter)
		if err != nil {
			t.Fatal(err)
		}
		tw, err := p.TopicToWeida(c.topic)
		if err != nil {
			t.Fatal(err)
		}
		if got := topic.Match(w, tw) && p.Admit(c.filter, c.topic); got != c.want {
			t.Errorf("%s: weida Match(%q, %q) && Admit = %v", c.proto, w, tw, got)
		}
	}
}

func TestRegistry(t *testing.T) {
	want := []string{AMQPWords, MQTTLevelsEscaped, MQTTLevels, NATSTokensTail, NATSTokens} // byte order: '-' < '/'
	if got := Names(all()); !slices.Equal(got, want) {
		t.Fatalf("Names(all()) = %v, want %v", got, want)
	}
	Names(all())[0] = "changed"
	if Names(all())[0] != AMQPWords {
		t.Fatal("Names shares its slice")
	}
	for _, n := range want {
		p, err := lookup(n)
		if err != nil || p.Name() != n {
			t.Errorf("lookup(%q) = %v, %v", n, p, err)
		}
		if p.Grammar().Protocol() != p.Protocol() {
			t.Errorf("%s: grammar of %s", n, p.Grammar().Protocol())
		}
	}
	for proto, name := range map[Protocol]string{MQTT: MQTTLevels, NATS: NATSTokens, AMQP: AMQPWords} {
		if p := defaultPolicy(proto); p == nil || p.Name() != name || p.Protocol() != proto {
			t.Errorf("defaultPolicy(%s) = %v", proto, p)
		}
	}
	_, err := lookup("mqtt-levels/v2")
	var r *Refusal
	if !errors.As(err, &r) || r.Rule != RuleUnknownPolicy || !strings.Contains(r.Hint, MQTTLevels) {
		t.Errorf("lookup(unknown) = %v", err)
	}
}

func TestLosses(t *testing.T) {
	base := []Loss{LossOrdering, LossDeliveryBestEffort}
	with := func(ls ...Loss) []Loss { return lossSet(append(slices.Clone(base), ls...)...) }
	mqttIn := []Loss{LossRetain, LossProperties, LossExpiry, LossReplyTo, LossTopicLength}
	mqttOut := []Loss{LossSlashedSegments, LossWildcardNames, LossForbiddenChars, LossEmptySegments, LossTopicLength, LossDollarTopics}
	for _, c := range []struct {
		policy string
		dir    Direction
		opts   Options
		want   []Loss
	}{
		{MQTTLevels, Inbound, Options{QoS: 1}, with(append(mqttIn, LossDottedLevels)...)},
		{MQTTLevels, Inbound, Options{}, with(append(mqttIn, LossDottedLevels, LossAtMostOnce)...)},
		{MQTTLevels, Outbound, Options{QoS: 1}, with(mqttOut...)},
		{MQTTLevels, Outbound, Options{}, with(append(mqttOut, LossAtMostOnce)...)},
		{MQTTLevelsEscaped, Inbound, Options{QoS: 1}, with(mqttIn...)},
		{MQTTLevelsEscaped, Outbound, Options{QoS: 1}, with(append(mqttOut, LossUnescapedNames)...)},
		{MQTTLevelsEscaped, Outbound, Options{}, with(append(mqttOut, LossUnescapedNames, LossAtMostOnce)...)},
		{NATSTokens, Inbound, Options{}, with(LossAtMostOnce, LossProperties, LossReplyTo, LossTopicLength, LossNonUTF8Names)},
		{NATSTokens, Inbound, Options{JetStream: true}, with(LossProperties, LossReplyTo, LossTopicLength, LossNonUTF8Names)},
		{NATSTokens, Outbound, Options{}, with(LossAtMostOnce, LossEmptySegments, LossWildcardNames, LossForbiddenChars)},
		{NATSTokens, Outbound, Options{JetStream: true}, with(LossEmptySegments, LossWildcardNames, LossForbiddenChars)},
		{AMQPWords, Inbound, Options{}, with(LossEmptyRoutingKey, LossProperties, LossExpiry, LossReplyTo, LossNonUTF8Names)},
		{AMQPWords, Outbound, Options{}, with(LossEmptyRoutingKey, LossTopicLength)},
	} {
		p, _ := lookup(c.policy)
		got := p.Losses(c.dir, c.opts)
		if !slices.Equal(got, c.want) {
			t.Errorf("%s %s %+v: Losses = %v, want %v", c.policy, c.dir, c.opts, got, c.want)
		}
		if !slices.IsSorted(got) || len(slices.Compact(slices.Clone(got))) != len(got) {
			t.Errorf("%s %s: %v is not sorted and unique", c.policy, c.dir, got)
		}
		for _, l := range got {
			if !l.Valid() {
				t.Errorf("%s %s: %q is not in the vocabulary", c.policy, c.dir, l)
			}
		}
	}
	for _, n := range Names(all()) {
		p, _ := lookup(n)
		if ls := p.Losses("sideways", Options{}); ls != nil {
			t.Errorf("%s: Losses(sideways) = %v, want nil", n, ls)
		}
	}
}

// lossWitnesses gives, for each policy, direction and topic loss it
// declares, a topic that the policy drops under that loss. Together with
// TestLosses it shows that every declared topic loss really happens.
var lossWitnesses = []struct {
	policy string
	dir    Direction
	loss   Loss
	topic  string
}{
	{MQTTLevels, Inbound, LossDottedLevels, "a/b.c"},
	{MQTTLevels, Inbound, LossTopicLength, strings.Repeat("x", 257)},
	{MQTTLevels, Outbound, LossSlashedSegments, "a/b"},
	{MQTTLevels, Outbound, LossWildcardNames, "a.+"},
	{MQTTLevels, Outbound, LossForbiddenChars, "a\x00"},
	{MQTTLevels, Outbound, LossEmptySegments, ""},
	{MQTTLevels, Outbound, LossTopicLength, strings.Repeat(".", MQTTMaxLevels)},
	{MQTTLevelsEscaped, Inbound, LossTopicLength, strings.Repeat(".", 86)},
	{MQTTLevelsEscaped, Outbound, LossSlashedSegments, "a/b"},
	{MQTTLevelsEscaped, Outbound, LossWildcardNames, "a.#"},
	{MQTTLevelsEscaped, Outbound, LossForbiddenChars, "\x00"},
	{MQTTLevelsEscaped, Outbound, LossEmptySegments, ""},
	{MQTTLevelsEscaped, Outbound, LossTopicLength, strings.Repeat(".", MQTTMaxLevels)},
	{MQTTLevelsEscaped, Outbound, LossUnescapedNames, "a.%"},
	{NATSTokens, Inbound, LossTopicLength, strings.Repeat("x", 257)},
	{NATSTokens, Inbound, LossNonUTF8Names, "\xff"},
	{NATSTokens, Outbound, LossEmptySegments, "a..b"},
	{NATSTokens, Outbound, LossWildcardNames, "a.>"},
	{NATSTokens, Outbound, LossForbiddenChars, "a b"},
	{NATSTokensTail, Inbound, LossTopicLength, strings.Repeat("x", 257)},
	{NATSTokensTail, Inbound, LossNonUTF8Names, "\xff"},
	{NATSTokensTail, Outbound, LossEmptySegments, "a..b"},
	{NATSTokensTail, Outbound, LossWildcardNames, "a.>"},
	{NATSTokensTail, Outbound, LossForbiddenChars, "a b"},
	{AMQPWords, Inbound, LossEmptyRoutingKey, ""},
	{AMQPWords, Inbound, LossNonUTF8Names, "\xff"},
	{AMQPWords, Outbound, LossEmptyRoutingKey, ""},
	{AMQPWords, Outbound, LossTopicLength, strings.Repeat("x", 256)},
}

func TestLossWitnesses(t *testing.T) {
	covered := map[string]bool{}
	for _, w := range lossWitnesses {
		p, _ := lookup(w.policy)
		var err error
		if w.dir == Inbound {
			_, err = p.TopicToWeida(w.topic)
		} else {
			_, err = p.TopicFromWeida(w.topic)
		}
		var r *Refusal
		if !errors.As(err, &r) {
			t.Errorf("%s %s %q: not refused (%v)", w.policy, w.dir, trunc(w.topic), err)
			continue
		}
		if l, ok := LossForRule(r.Rule); !ok || l != w.loss {
			t.Errorf("%s %s %q: rule %s maps to %q, want %q", w.policy, w.dir, trunc(w.topic), r.Rule, l, w.loss)
		}
		covered[w.policy+" "+string(w.dir)+" "+string(w.loss)] = true
	}
	// Every topic loss a policy declares has a witness. The losses that are
	// not about topic names happen in the runtime, not here.
	notTopic := map[Loss]bool{LossOrdering: true, LossDeliveryBestEffort: true, LossAtMostOnce: true,
		LossRetain: true, LossProperties: true, LossExpiry: true, LossReplyTo: true, LossDollarTopics: true}
	for _, n := range Names(all()) {
		p, _ := lookup(n)
		for _, dir := range []Direction{Inbound, Outbound} {
			for _, l := range p.Losses(dir, Options{}) {
				if !notTopic[l] && !covered[n+" "+string(dir)+" "+string(l)] {
					t.Errorf("%s %s declares %s but no witness shows it", n, dir, l)
				}
			}
		}
	}
}

func TestLossVocabulary(t *testing.T) {
	all := AllLosses()
	seen := map[Loss]bool{}
	for _, i := range all {
		if seen[i.Loss] {
			t.Errorf("%s listed twice", i.Loss)
		}
		seen[i.Loss] = true
		if i.Description == "" || i.Loss.Description() != i.Description || !i.Loss.Valid() {
			t.Errorf("%s: description %q", i.Loss, i.Description)
		}
		for _, c := range string(i.Loss) {
			if (c < 'a' || c > 'z') && (c < '0' || c > '9') && c != '-' {
				t.Errorf("%q is not a lower-case dashed name", i.Loss)
			}
		}
	}
	if Loss("nonsense").Valid() || Loss("nonsense").Description() != "" {
		t.Error("an unknown loss is valid")
	}
	all[0].Loss = "changed"
	if AllLosses()[0].Loss == "changed" {
		t.Error("AllLosses shares its slice")
	}
	// Every loss LossForRule returns is in the vocabulary, and the dollar
	// guard has its rule.
	for _, rule := range []string{RuleTopicTooLong, RuleInvalidUTF8, RuleMQTTEmpty, RuleMQTTTooLong,
		RuleMQTTInvalidUTF8, RuleMQTTNul, RuleMQTTTooManyLevels, RuleMQTTWildcardInName, RuleMQTTDottedLevel,
		RuleMQTTSlashSegment, RuleMQTTEscape, RuleMQTTDollarTopic, RuleNATSEmptyToken, RuleNATSWhitespace,
		RuleNATSWildcardTok, RuleAMQPTooLong, RuleAMQPEmptyRoutingKey} {
		l, ok := LossForRule(rule)
		if !ok || !seen[l] {
			t.Errorf("LossForRule(%s) = %q, %v", rule, l, ok)
		}
	}
	if l, _ := LossForRule(RuleMQTTDollarTopic); l != LossDollarTopics {
		t.Errorf("the dollar guard maps to %q", l)
	}
	for _, rule := range []string{RuleNATSOneOrMore, RuleAMQPHashThenLiteral, RuleFilterTooLong, RuleUnknownPolicy, "bogus"} {
		if l, ok := LossForRule(rule); ok {
			t.Errorf("filter rule %s maps to %q", rule, l)
		}
	}
}

func TestAdmit(t *testing.T) {
	mq := defaultPolicy(MQTT)
	for _, c := range []struct {
		f, t string
		want bool
	}{
		{"#", "$SYS/x", false}, {"+/x", "$a/x", false}, {"+", "$", false},
		{"#", "a", true}, {"$SYS/#", "$SYS/x", true}, {"a/#", "a/$x", true}, {"/+", "/$x", true},
	} {
		if got := mq.Admit(c.f, c.t); got != c.want {
			t.Errorf("mqtt Admit(%q, %q) = %v", c.f, c.t, got)
		}
	}
	if !defaultPolicy(NATS).Admit(">", "$SYS.x") || !defaultPolicy(AMQP).Admit("#", "$x") {
		t.Error("only MQTT excludes '$' topics")
	}
}

// TestAdmitRule: a policy whose Admit can be false names the rule its drops
// are counted under, and that rule's loss is declared for outbound
// bridges, where Admit drops happen.
func TestAdmitRule(t *testing.T) {
	for _, name := range Names(all()) {
		p, err := lookup(name)
		if err != nil {
			t.Fatal(err)
		}
		rule := p.AdmitRule()
		if (rule != "") != (p.Protocol() == MQTT) {
			t.Errorf("%s: AdmitRule() = %q; only MQTT policies exclude topics", name, rule)
		}
		if rule == "" {
			continue
		}
		loss, ok := LossForRule(rule)
		if !ok || !slices.Contains(p.Losses(Outbound, Options{}), loss) {
			t.Errorf("%s: AdmitRule %q maps to loss %q (%v), not declared outbound", name, rule, loss, ok)
		}
	}
}

func TestRefusalError(t *testing.T) {
	r := &Refusal{Policy: "p", Input: "in", Part: "i", Rule: "r", Reason: "why", Hint: "do"}
	if got, want := r.Error(), `p refuses "in" at "i": why (r); do`; got != want {
		t.Errorf("Error() = %q, want %q", got, want)
	}
}
