package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
	"weida.dev/connector/weida/topic"
)

func mustMount(t testing.TB, p Policy, m Mount) *Mounted {
	t.Helper()
	mp, err := NewMounted(p, m)
	if err != nil {
		t.Fatalf("NewMounted(%s, %+v): %v", p.Name(), m, err)
	}
	return mp
}

func TestMountValidation(t *testing.T) {
	mq, nats, amqp := defaultPolicy(MQTT), defaultPolicy(NATS), defaultPolicy(AMQP)
	for _, c := range []struct {
		p    Policy
		m    Mount
		rule string // "" when valid
		in   string // wanted Refusal.Input
	}{
		{mq, Mount{}, "", ""},
		{mq, Mount{"factory/", "plants.berlin."}, "", ""},
		{mq, Mount{"a.b/", "x."}, "", ""}, // a mount renames: the prefix need not convert
		{mq, Mount{"", "mqtt."}, "", ""},
		{mq, Mount{"factory/", ""}, "", ""},
		{nats, Mount{"orders.", "shop.orders."}, "", ""},
		{amqp, Mount{"audit.", "a."}, "", ""},
		{mq, Mount{"factory", "p."}, RuleMountBoundary, "factory"},
		{mq, Mount{"factory.", "p."}, RuleMountBoundary, "factory."},
		{nats, Mount{"orders/", "p."}, RuleMountBoundary, "orders/"},
		{mq, Mount{"factory/", "plants"}, RuleMountBoundary, "plants"},
		{mq, Mount{"/", "p."}, RuleMountEmptyJoint, "/"},
		{mq, Mount{"a//", "p."}, RuleMountEmptyJoint, "a//"},
		{amqp, Mount{".", "p."}, RuleMountEmptyJoint, "."},
		{mq, Mount{"a/", "."}, RuleMountEmptyJoint, "."},
		{mq, Mount{"a/", "p.."}, RuleMountEmptyJoint, "p.."},
		{mq, Mount{"+/", "p."}, RuleMQTTWildcardInName, "+/"}, // the grammar says it first
		{mq, Mount{"a/#/", "p."}, RuleMQTTWildcardInName, "a/#/"},
		{nats, Mount{"a.*.", "p."}, RuleMountWildcard, "a.*."},
		{nats, Mount{"a.>.", "p."}, RuleMountWildcard, "a.>."},
		{amqp, Mount{"#.", "p."}, RuleMountWildcard, "#."},
		{amqp, Mount{"a.*.", "p."}, RuleMountWildcard, "a.*."},
		{mq, Mount{"a/", "p.*."}, RuleMountWildcard, "p.*."},
		{mq, Mount{"a/", "p#."}, RuleMountWildcard, "p#."},
		{mq, Mount{"a/", "\xff."}, RuleInvalidUTF8, "\xff."},
		{mq, Mount{"a/", strings.Repeat("x", 257) + "."}, RuleTopicTooLong, strings.Repeat("x", 257) + "."},
		{nats, Mount{"a b.", "p."}, RuleNATSWhitespace, "a b."},
		{nats, Mount{"a..b.", "p."}, RuleNATSEmptyToken, "a..b."},
		{amqp, Mount{strings.Repeat("x", 256) + ".", "p."}, RuleAMQPTooLong, strings.Repeat("x", 256) + "."},
		{mq, Mount{"$share/", "p."}, "", ""},
	} {
		mp, err := NewMounted(c.p, c.m)
		if c.rule == "" {
			if err != nil || mp.Mount() != c.m || mp.Policy() != c.p {
				t.Errorf("%s %+v: %v", c.p.Name(), c.m, err)
			}
			continue
		}
		var r *Refusal
		if !errors.As(err, &r) || r.Rule != c.rule || r.Input != c.in || r.Policy != c.p.Name() || r.Reason == "" || !strings.Contains(r.Input, r.Part) {
			t.Errorf("%s %+v: %#v, want refusal %s of %q", c.p.Name(), c.m, err, c.rule, c.in)
		}
	}
	if _, err := NewMounted(nil, Mount{}); err == nil {
		t.Error("NewMounted(nil) succeeded")
	}
}

func TestMountConversions(t *testing.T) {
	mq, esc, nats, amqp := defaultPolicy(MQTT), mqttLevels{escaped: true}, defaultPolicy(NATS), defaultPolicy(AMQP)
	for _, c := range []struct {
		p     Policy
		m     Mount
		cases []convCase
	}{
		{mq, Mount{"factory/", "plants.berlin."}, []convCase{
			{"", opFilter, "factory/#", "plants.berlin.#", "", ""},
			{"", opFilter, "factory/+", "plants.berlin.*", "", ""},
			{"", opFilter, "factory/+/temp", "plants.berlin.*.temp", "", ""},
			{"", opFilter, "factory", "plants.berlin", "", ""},
			{"", opFilter, "factory/", "plants.berlin.", "", ""},
			{"", opFilter, "factory//#", "plants.berlin..#", "", ""},
			{"", opFilter, "factory/$share/g/a", "plants.berlin.$share.g.a", "", ""},
			{"", opFilter, "factory/$SYS/#", "plants.berlin.$SYS.#", "", ""},
			{"", opFilter, "#", "", RuleMountOutside, ""},
			{"", opFilter, "+/x", "", RuleMountOutside, ""},
			{"", opFilter, "+", "", RuleMountOutside, ""},
			{"", opFilter, "factoryx/#", "", RuleMountOutside, ""},
			{"", opFilter, "fact", "", RuleMountOutside, ""},
			{"", opFilter, "factory/a.b", "", RuleMQTTDottedLevel, "a.b"},
			{"", opFilter, "factory/#/x", "", RuleMQTTHashNotFinal, "#"},
			{"", opFilter, "factory/" + strings.Repeat("x", 242), "plants.berlin." + strings.Repeat("x", 242), "", ""},
			{"", opFilter, "factory/" + strings.Repeat("x", 243), "", RuleFilterTooLong, ""},
			{"", opIn, "factory", "plants.berlin", "", ""},
			{"", opIn, "factory/", "plants.berlin.", "", ""},
			{"", opIn, "factory/a/b", "plants.berlin.a.b", "", ""},
			{"", opIn, "factory/$x", "plants.berlin.$x", "", ""},
			{"", opIn, "factoryx", "", RuleMountOutside, ""},
			{"", opIn, "other/a", "", RuleMountOutside, ""},
			{"", opIn, "factory/a.b", "", RuleMQTTDottedLevel, "a.b"},
			{"", opIn, "factory/" + strings.Repeat("x", 243), "", RuleTopicTooLong, ""},
			{"", opOut, "plants.berlin", "factory", "", ""},
			{"", opOut, "plants.berlin.", "factory/", "", ""},
			{"", opOut, "plants.berlin.a.b", "factory/a/b", "", ""},
			{"", opOut, "plants.berlinx", "", RuleMountOutside, ""},
			{"", opOut, "plants", "", RuleMountOutside, ""},
			{"", opOut, "plants.berlin.a/b", "", RuleMQTTSlashSegment, "a/b"},
			{"", opOut, "plants.berlin." + strings.Repeat(".", 200), "", RuleMQTTTooManyLevels, ""},
		}},
		{esc, Mount{"fw/", "firmware."}, []convCase{
			{"", opFilter, "fw/v1.2/+", "firmware.v1%2E2.*", "", ""},
			{"", opIn, "fw/v1.2", "firmware.v1%2E2", "", ""},
			{"", opOut, "firmware.v1%2E2", "fw/v1.2", "", ""},
			{"", opOut, "firmware.*", "", RuleMQTTEscape, "*"},
		}},
		{mq, Mount{"", "mqtt."}, []convCase{
			{"", opFilter, "#", "mqtt.*.#", "", ""},
			{"", opFilter, "+/#", "mqtt.*.#", "", ""},
			{"", opFilter, "a/#", "mqtt.a.#", "", ""},
			{"", opIn, "a", "mqtt.a", "", ""},
			{"", opOut, "mqtt.a", "a", "", ""},
			{"", opOut, "mqtt", "", RuleMountParent, ""},
			{"", opOut, "mqtt.", "", RuleMQTTEmpty, ""},
			{"", opOut, "other", "", RuleMountOutside, ""},
		}},
		{mq, Mount{"factory/", ""}, []convCase{
			{"", opFilter, "factory/+/#", "*.#", "", ""},
			{"", opFilter, "factory/a", "a", "", ""},
			{"", opFilter, "factory/#", "", RuleMountParent, ""},
			{"", opFilter, "factory/", "", RuleMountEmptyRest, ""},
			{"", opFilter, "factory", "", RuleMountParent, ""},
			{"", opIn, "factory/a", "a", "", ""},
			{"", opIn, "factory/", "", "", ""},
			{"", opIn, "factory", "", RuleMountParent, ""},
			{"", opOut, "a.b", "factory/a/b", "", ""},
			{"", opOut, "", "factory/", "", ""},
		}},
		{nats, Mount{"orders.", "shop.orders."}, []convCase{
			{"", opFilter, "orders.*", "shop.orders.*", "", ""},
			{"", opFilter, "orders", "shop.orders", "", ""},
			{"", opFilter, "orders.>", "", RuleNATSOneOrMore, ">"},
			{"", opFilter, ">", "", RuleMountOutside, ""},
			{"", opFilter, "*.x", "", RuleMountOutside, ""},
			{"", opFilter, "orders.", "", RuleNATSEmptyToken, ""},
			{"", opIn, "orders.eu", "shop.orders.eu", "", ""},
			{"", opIn, "orders", "shop.orders", "", ""},
			{"", opOut, "shop.orders.eu", "orders.eu", "", ""},
			{"", opOut, "shop.orders.", "", RuleNATSEmptyToken, ""},
			{"", opOut, "shop.orders.*", "", RuleNATSWildcardTok, "*"},
		}},
		{NATSTail(), Mount{"orders.", "shop.orders."}, []convCase{
			{"", opFilter, "orders.>", "shop.orders.*.#", "", ""},
			{"", opFilter, "orders.*.>", "shop.orders.*.*.#", "", ""},
		}},
		{NATSTail(), Mount{"", "nats."}, []convCase{
			{"", opFilter, ">", "nats.*.#", "", ""},
		}},
		{amqp, Mount{"audit.", "logs.audit."}, []convCase{
			{"", opFilter, "audit.#", "logs.audit.#", "", ""},
			{"", opFilter, "audit.#.*", "logs.audit.*.#", "", ""},
			{"", opFilter, "audit.", "logs.audit.", "", ""},
			{"", opFilter, "audit.*", "logs.audit.*", "", ""},
			{"", opFilter, "audit.#.x", "", RuleAMQPHashThenLiteral, "#.x"},
			{"", opFilter, "#", "", RuleMountOutside, ""},
			{"", opFilter, "#.audit.#", "", RuleMountOutside, ""},
			{"", opIn, "audit.", "logs.audit.", "", ""},
			{"", opIn, "audit", "logs.audit", "", ""},
			{"", opIn, "", "", RuleMountOutside, ""},
			{"", opOut, "logs.audit.", "audit.", "", ""},
		}},
		{amqp, Mount{"audit.long.", "a."}, []convCase{
			{"", opOut, "a." + strings.Repeat("x", 244), "audit.long." + strings.Repeat("x", 244), "", ""},
			{"", opOut, "a." + strings.Repeat("x", 245), "", RuleAMQPTooLong, ""},
		}},
		{amqp, Mount{"audit.", ""}, []convCase{
			{"", opFilter, "audit.#", "", RuleMountParent, ""},
			{"", opFilter, "audit.*.#", "*.#", "", ""},
			{"", opFilter, "audit.", "", RuleMountEmptyRest, ""},
			{"", opOut, "", "audit.", "", ""},
		}},
	} {
		mp := mustMount(t, c.p, c.m)
		for i := range c.cases {
			c.cases[i].policy = c.p.Name()
		}
		checkConv(t, mp, c.cases)
	}
}

func TestMountLosses(t *testing.T) {
	has := func(ls []Loss, l Loss) bool { return slices.Contains(ls, l) }
	amqp := mustMount(t, defaultPolicy(AMQP), Mount{"a.", "long.prefix."})
	if ls := amqp.Losses(Inbound, Options{}); !has(ls, LossTopicLength) || has(ls, LossEmptyRoutingKey) {
		t.Errorf("amqp a. → long.prefix. inbound: %v", ls)
	}
	if _, err := amqp.TopicToWeida("a." + strings.Repeat("x", 253)); err == nil {
		t.Error("a 255-byte key under a longer weida prefix converted past 256 bytes")
	}
	same := mustMount(t, defaultPolicy(AMQP), Mount{"ab.", "c."})
	if ls := same.Losses(Inbound, Options{}); has(ls, LossTopicLength) {
		t.Errorf("amqp ab. → c. inbound declares topic-length: %v", ls)
	}
	if ls := mustMount(t, defaultPolicy(AMQP), Mount{"", "c."}).Losses(Outbound, Options{}); !has(ls, LossEmptyRoutingKey) {
		t.Errorf("without a foreign prefix the empty key is still lost: %v", ls)
	}
	mq := mustMount(t, defaultPolicy(MQTT), Mount{"f/", "w."})
	if ls := mq.Losses(Outbound, Options{}); has(ls, LossEmptySegments) || !has(ls, LossSlashedSegments) {
		t.Errorf("mqtt f/ outbound: %v", ls)
	}
	if mq.Losses("sideways", Options{}) != nil {
		t.Error("Losses(sideways) is not nil")
	}
	if !slices.Equal(mustMount(t, defaultPolicy(NATS), Mount{}).Losses(Inbound, Options{}), defaultPolicy(NATS).Losses(Inbound, Options{})) {
		t.Error("the zero Mount changes the losses")
	}
}

// TestMountLossesExact: a mount leaves out exactly the losses no topic
// inside it can incur (issue 24, item 7). Each row names a loss the mount
// removes or keeps and, where kept, a weida topic under the mount that
// incurs it, so that a kept loss is shown to occur and a removed one is
// shown by reasoning in LossesUnder and by TestPropertyMounted.
func TestMountLossesExact(t *testing.T) {
	long := func(n int) string { return strings.Repeat(".", n) } // n+1 empty segments
	for _, c := range []struct {
		p       Policy
		m       Mount
		dir     Direction
		loss    Loss
		want    bool
		witness string // a weida topic (outbound) or foreign topic (inbound) dropped under loss; "" when none exists
	}{
		{MQTTLevelsV1(), Mount{"factory/", "plants.berlin."}, Outbound, LossDollarTopics, false, ""},
		{MQTTLevelsEscapedV1(), Mount{"factory/", "plants.berlin."}, Outbound, LossDollarTopics, false, ""},
		{MQTTLevelsV1(), Mount{"factory/", ""}, Outbound, LossDollarTopics, false, ""},
		{MQTTLevelsV1(), Mount{"$SYS/", "sys."}, Outbound, LossDollarTopics, true, ""},
		{MQTTLevelsV1(), Mount{"", "plants."}, Outbound, LossDollarTopics, true, ""},
		{MQTTLevelsV1(), Mount{"factory/", "plants.berlin."}, Outbound, LossEmptySegments, false, ""},
		{MQTTLevelsV1(), Mount{"", "plants."}, Outbound, LossEmptySegments, true, "plants."},
		// 257-len(W) segments plus the foreign levels: at 201 levels no
		// topic is too long, at 202 one is.
		{MQTTLevelsV1(), Mount{"f/", "w" + strings.Repeat("x", 55) + "."}, Outbound, LossTopicLength, false, ""},
		{MQTTLevelsV1(), Mount{"f/", "w" + strings.Repeat("x", 54) + "."}, Outbound, LossTopicLength, true, "w" + strings.Repeat("x", 54) + "." + long(256-56)},
		{MQTTLevelsV1(), Mount{"factory/", "plants.berlin."}, Outbound, LossTopicLength, true, "plants.berlin." + long(256-14)},
		{MQTTLevelsV1(), Mount{"factory/", "plants.berlin."}, Outbound, LossSlashedSegments, true, "plants.berlin.a/b"},
		{AMQPWordsV1(), Mount{"a.", "bb."}, Outbound, LossTopicLength, false, ""},
		{AMQPWordsV1(), Mount{"aa.", "bb."}, Outbound, LossTopicLength, true, "bb." + strings.Repeat("x", 253)},
		{AMQPWordsV1(), Mount{"a.", "b."}, Inbound, LossTopicLength, false, ""},
		{AMQPWordsV1(), Mount{"a.", "bbb."}, Inbound, LossTopicLength, true, "a." + strings.Repeat("x", 253)},
		{NATSTokensV1(), Mount{"orders.", "shop."}, Outbound, LossEmptySegments, true, "shop."},
	} {
		mp := mustMount(t, c.p, c.m)
		if got := slices.Contains(mp.Losses(c.dir, Options{QoS: 1}), c.loss); got != c.want {
			t.Errorf("%s under %+v %s: declares %s = %v, want %v", c.p.Name(), c.m, c.dir, c.loss, got, c.want)
		}
		if c.witness == "" {
			continue
		}
		conv := mp.TopicFromWeida
		if c.dir == Inbound {
			conv = mp.TopicToWeida
		}
		_, err := conv(c.witness)
		r := asRefusal(err)
		if r == nil {
			t.Errorf("%s under %+v: witness %q converts; want it dropped under %s", c.p.Name(), c.m, c.witness, c.loss)
			continue
		}
		if l, _ := mp.LossFor(r.Rule); l != c.loss {
			t.Errorf("%s under %+v: witness %q refused as %s (%s), want %s", c.p.Name(), c.m, c.witness, r.Rule, l, c.loss)
		}
	}
}

// Prefix generators: levels drawn from pieces that are valid in a prefix
// most of the time, so that both valid and refused mounts occur.
var (
	mountForeignLevels = map[Protocol][]string{
		MQTT: {"f", "g", "a.b", "$SYS", "*", "%", "+"},
		NATS: {"f", "g", "$SYS", "a#", "*", ">"},
		AMQP: {"f", "g", "$", "%", "*", ""},
	}
	mountWeidaSegments = []string{"w", "v", "$", "%", "/", "+", "*", ""}
)

func mountPrefix(t *rapid.T, label string, levels []string, sep string) string {
	if rapid.IntRange(0, 4).Draw(t, label+"-empty") == 0 {
		return ""
	}
	return join(t, label, 1, 3, sep, func(t *rapid.T) string { return rapid.SampledFrom(levels).Draw(t, label+"-level") }) + sep
}

// mountedTopic draws a foreign topic that is inside the mount most of the
// time: the parent, the prefix plus a rest (possibly empty), or anything.
func mountedTopic(t *rapid.T, g protoGen, foreign, sep string) string {
	switch rapid.IntRange(0, 7).Draw(t, "where") {
	case 0:
		return g.topic(t) // anywhere
	case 1:
		if foreign != "" {
			return strings.TrimSuffix(foreign, sep)
		}
	case 2:
		return foreign
	}
	return foreign + g.topic(t)
}

// mountedFilter draws a filter: mostly the prefix followed by a filter
// derived from the rest of an inside topic, sometimes one derived from the
// whole topic (which may reach outside).
func mountedFilter(t *rapid.T, g protoGen, name, foreign, sep string) string {
	if foreign != "" && strings.HasPrefix(name, foreign) && rapid.IntRange(0, 3).Draw(t, "whole") != 0 {
		rest := name[len(foreign):]
		if rest == "" || rapid.IntRange(0, 4).Draw(t, "tail-only") == 0 {
			return foreign + rapid.SampledFrom([]string{"#", "+", "*", ">", "#.*", ""}).Draw(t, "tail")
		}
		return foreign + g.filterFrom(t, rest)
	}
	return foreignFilter(t, g, name)
}

type mountStats struct{ yes, no, outside int }

// TestPropertyMounted checks, for random mounts over every policy: the
// exactness equation in both directions, topic round trips both ways,
// refusal of topics outside the mount, and that an accepted filter never
// selects a topic outside it.
func TestPropertyMounted(t *testing.T) {
	for _, p := range all() {
		t.Run(p.Name(), func(t *testing.T) {
			g := protoGens[p.Protocol()]
			sep := string(p.Grammar().Separator())
			var st mountStats
			rapid.Check(t, func(t *rapid.T) {
				m := Mount{
					Foreign: mountPrefix(t, "foreign", mountForeignLevels[p.Protocol()], sep),
					Weida:   mountPrefix(t, "weida", mountWeidaSegments, "."),
				}
				mp, err := NewMounted(p, m)
				if err != nil {
					assertRefusal(t, p, err, asRefusal(err).Input)
					return
				}
				for range 4 {
					checkMounted(t, mp, g, sep, &st)
				}
			})
			if st.yes == 0 || st.no == 0 || st.outside == 0 {
				t.Errorf("%d matching, %d non-matching pairs, %d outside topics: all must occur", st.yes, st.no, st.outside)
			}
		})
	}
}

func inside(m Mount, sep, foreignTopic string) bool {
	return m.Foreign == "" || foreignTopic == strings.TrimSuffix(m.Foreign, sep) || strings.HasPrefix(foreignTopic, m.Foreign)
}

func insideWeida(m Mount, w string) bool {
	return m.Weida == "" || w == strings.TrimSuffix(m.Weida, ".") || strings.HasPrefix(w, m.Weida)
}

func checkMounted(t *rapid.T, mp *Mounted, g protoGen, sep string, st *mountStats) {
	m := mp.Mount()
	name := mountedTopic(t, g, m.Foreign, sep)
	f := mountedFilter(t, g, mountedTopic(t, g, m.Foreign, sep), m.Foreign, sep)
	if rapid.Bool().Draw(t, "related") {
		f = mountedFilter(t, g, name, m.Foreign, sep)
	}

	// Topics: inside converts or is refused by the policy's rules; outside
	// is refused as outside; round trips are the identity.
	wt, terr := mp.TopicToWeida(name)
	switch {
	case terr == nil:
		if !inside(m, sep, name) {
			t.Fatalf("%+v: outside topic %q converted to %q", m, name, wt)
		}
		if topic.ValidateTopic(wt) != nil || !insideWeida(m, wt) {
			t.Fatalf("%+v: %q → %q, invalid or outside the weida prefix", m, name, wt)
		}
		// NATS carries a published token '*' or '>' inbound but never
		// publishes one.
		back, err := mp.TopicFromWeida(wt)
		if r := asRefusal(err); (err == nil && back != name) || (err != nil && r.Rule != RuleNATSWildcardTok) {
			t.Fatalf("%+v: %q → %q → %q, %v", m, name, wt, back, err)
		}
	default:
		assertRefusal(t, mp, terr, name)
		if r := asRefusal(terr); !inside(m, sep, name) && mp.Grammar().ValidateTopic(name) == nil {
			if r.Rule != RuleMountOutside {
				t.Fatalf("%+v: outside topic %q refused as %s, want %s", m, name, r.Rule, RuleMountOutside)
			}
			st.outside++
		} else if r.Rule != RuleMountOutside && r.Rule != RuleMountParent && mp.Grammar().ValidateTopic(name) == nil {
			assertDeclared(t, mp, Inbound, terr)
		}
	}

	w, ferr := mp.ConvertFilter(f)
	if ferr != nil {
		assertRefusal(t, mp, ferr, f)
	} else {
		if e := topic.ValidateFilter(w); e != nil || w == "" {
			t.Fatalf("%+v: ConvertFilter(%q) = %q, invalid weida: %v", m, f, w, e)
		}
		if terr == nil {
			want := mp.Grammar().Match(f, name)
			if got := topic.Match(w, wt) && mp.Admit(f, name); got != want {
				t.Fatalf("%+v: foreign Match(%q, %q) = %v, weida Match(%q, %q) && Admit = %v", m, f, name, want, w, wt, got)
			}
			if want {
				st.yes++
			} else {
				st.no++
			}
		}
		if mp.Grammar().ValidateTopic(name) == nil && !inside(m, sep, name) && mp.Grammar().Match(f, name) {
			t.Fatalf("%+v: accepted filter %q selects %q, outside the mount", m, f, name)
		}
	}

	// The weida side: a topic the converted filter selects (or any) must
	// convert back consistently, and outside topics are refused.
	var wt2 string
	switch {
	case ferr == nil && rapid.Bool().Draw(t, "instantiate"):
		wt2 = instantiate(t, w)
	case rapid.Bool().Draw(t, "under-prefix"):
		wt2 = m.Weida + weidaTopic(t)
	default:
		wt2 = weidaTopic(t)
	}
	out, err := mp.TopicFromWeida(wt2)
	if err != nil {
		assertRefusal(t, mp, err, wt2)
		r := asRefusal(err)
		if topic.ValidateTopic(wt2) == nil && !insideWeida(m, wt2) && r.Rule != RuleMountOutside {
			t.Fatalf("%+v: outside weida topic %q refused as %s", m, wt2, r.Rule)
		}
		if topic.ValidateTopic(wt2) == nil && r.Rule != RuleMountOutside && r.Rule != RuleMountParent {
			assertDeclared(t, mp, Outbound, err)
		}
		if ferr == nil && r.Rule == RuleMountParent && topic.Match(w, wt2) {
			t.Fatalf("%+v: filter %q → %q selects %q, which has no foreign form", m, f, w, wt2)
		}
		return
	}
	if e := mp.Grammar().ValidateTopic(out); e != nil || !inside(m, sep, out) {
		t.Fatalf("%+v: TopicFromWeida(%q) = %q: invalid or outside (%v)", m, wt2, out, e)
	}
	if back, err := mp.TopicToWeida(out); err != nil || back != wt2 {
		t.Fatalf("%+v: %q → %q → %q, %v", m, wt2, out, back, err)
	}
	if ferr == nil && topic.Match(w, wt2) && !mp.Admit(f, out) {
		// The runtime drops it under the AdmitRule's loss, which the
		// mount must not have left out.
		assertDeclared(t, mp, Outbound, &Refusal{Input: wt2, Rule: mp.AdmitRule()})
	}
	if ferr == nil {
		want := mp.Grammar().Match(f, out)
		if got := topic.Match(w, wt2) && mp.Admit(f, out); got != want {
			t.Fatalf("%+v outbound: foreign Match(%q, %q) = %v, weida Match(%q, %q) && Admit = %v", m, f, out, want, w, wt2, got)
		}
	}
}

// TestLossesUnderNoMount: LossesUnder with the zero Mount is Losses, for
// every policy, direction and setting, and a Mounted's losses are its
// policy's LossesUnder its mount; its LossFor is its policy's.
func TestLossesUnderNoMount(t *testing.T) {
	for _, p := range all() {
		for _, dir := range []Direction{Inbound, Outbound, "sideways"} {
			for _, o := range []Options{{}, {QoS: 1}, {JetStream: true}, {LastValue: true, QoS: 1}} {
				if got, want := p.LossesUnder(Mount{}, dir, o), p.Losses(dir, o); !slices.Equal(got, want) {
					t.Errorf("%s %s %+v: LossesUnder(Mount{}) = %v, Losses = %v", p.Name(), dir, o, got, want)
				}
				m := Mount{Foreign: "f" + string(p.Grammar().Separator()), Weida: "w."}
				mp := mustMount(t, p, m)
				if got, want := mp.Losses(dir, o), p.LossesUnder(m, dir, o); !slices.Equal(got, want) {
					t.Errorf("%s under %+v %s: Mounted.Losses = %v, LossesUnder = %v", p.Name(), m, dir, got, want)
				}
			}
		}
		for _, rule := range []string{RuleTopicTooLong, RuleMQTTDottedLevel, RuleMountOutside, "no-such-rule"} {
			l1, ok1 := p.LossFor(rule)
			l2, ok2 := mustMount(t, p, Mount{Weida: "w."}).LossFor(rule)
			if l1 != l2 || ok1 != ok2 {
				t.Errorf("%s: LossFor(%s) = %q %v, mounted %q %v", p.Name(), rule, l1, ok1, l2, ok2)
			}
		}
	}
}

// TestMountRestAtWeidaLength: a rest is converted behind a literal level
// (so that MQTT reads a $share inside it as a literal), and that level
// never refuses a rest whose own weida form fits 256 bytes.
func TestMountRestAtWeidaLength(t *testing.T) {
	for _, p := range all() {
		sep := string(p.Grammar().Separator())
		for _, n := range []int{255, 256} {
			rest := strings.Repeat("a", n)
			if p.Grammar().ValidateFilter("f"+sep+rest) != nil {
				continue // too long for the broker itself (AMQP's 255 bytes)
			}
			got, err := mustMount(t, p, Mount{Foreign: "f" + sep}).ConvertFilter("f" + sep + rest)
			if err != nil || got != rest {
				t.Errorf("%s: a %d-byte rest under f%s: %q, %v", p.Name(), n, sep, got, err)
			}
		}
	}
}
