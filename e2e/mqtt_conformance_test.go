package e2e

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"weida.dev/connector/connectors/mqtt"
	"weida.dev/connector/internal/brokertest"
	"weida.dev/connector/policy"
	"weida.dev/connector/weida/topic"
)

// mqttEdgeLevels are the levels the generator draws from, biased to the
// edges of the MQTT grammar and of its conversions to weida: empty levels,
// '$' (which only counts at the start of a name), weida's separator and
// wildcards as literal characters, the escape's own sequences, non-ASCII,
// spaces, and long levels that push a name past weida's 256 bytes.
var mqttEdgeLevels = []string{
	"a", "a", "b", "b", "",
	"$", "$a", "*", "a*b", "**", ".", "a.b", "..",
	"%", "%2E", "%2A", "%25", "a%2Eb",
	"é", "日本", "ü.ß", "a b", " ",
	strings.Repeat("l", 120), strings.Repeat("m", 250),
}

func mqttLevel(r *rand.Rand) string { return mqttEdgeLevels[r.IntN(len(mqttEdgeLevels))] }

// genMQTTTopic draws 1 to 5 levels, plain ones dominating so that filters
// match often enough; about one in eight starts with '$'.
func genMQTTTopic(r *rand.Rand) string {
	n := 1 + r.IntN(5)
	lv := make([]string, n)
	for i := range lv {
		if r.IntN(3) == 0 {
			lv[i] = mqttLevel(r)
		} else {
			lv[i] = []string{"a", "b", ""}[r.IntN(3)]
		}
	}
	if r.IntN(8) == 0 {
		lv[0] = []string{"$a", "$", "$x.y"}[r.IntN(3)]
	}
	return strings.Join(lv, "/")
}

// genMQTTFilter draws 1 to 4 levels, a third of them '+', and ends one
// filter in four with '#'.
func genMQTTFilter(r *rand.Rand) string {
	n := 1 + r.IntN(4)
	lv := make([]string, n)
	for i := range lv {
		switch r.IntN(3) {
		case 0:
			lv[i] = "+"
		case 1:
			lv[i] = mqttLevel(r)
		default:
			lv[i] = []string{"a", "b", ""}[r.IntN(3)]
		}
	}
	if r.IntN(4) == 0 {
		lv[n-1] = "#"
	}
	return strings.Join(lv, "/")
}

// deriveMQTTTopic returns a name filter f matches ('+' filled with a level,
// '#' with zero to two levels), or one time in three a near miss: a level
// changed, dropped or added.
func deriveMQTTTopic(r *rand.Rand, f string) string {
	var lv []string
	for _, l := range strings.Split(f, "/") {
		switch l {
		case "+":
			lv = append(lv, mqttLevel(r))
		case "#":
			for range r.IntN(3) {
				lv = append(lv, mqttLevel(r))
			}
		default:
			lv = append(lv, l)
		}
	}
	if len(lv) == 0 {
		return "a"
	}
	if r.IntN(3) == 0 {
		switch i := r.IntN(len(lv)); r.IntN(3) {
		case 0:
			lv[i] = mqttLevel(r)
		case 1:
			if len(lv) > 1 {
				lv = append(lv[:i], lv[i+1:]...)
			}
		default:
			lv = append(lv, mqttLevel(r))
		}
	}
	return strings.Join(lv, "/")
}

// mqttConformanceFilters are always tested: the wildcard shapes whose
// corners matter ('#' includes the parent, '+' matches an empty level,
// a leading wildcard never matches a '$' name), filters each policy
// refuses, and filters Mosquitto itself would refuse (never subscribed).
var mqttConformanceFilters = []string{
	"#", "+", "+/+", "+/#", "/#", "/+", "+/", "//", "a/#", "a/+", "a/+/+", "a//b", "a/",
	"$a/#", "$a/+", "$/#", "$a", "+/a", "a/+/b", "#/", // '#/' is invalid: '#' must be last
	"a/*", "*", "a/b.c", "a.b/#", "%2E/#", "é/#", "a b/+",
	"$share/g/a", "a/b#", "sp+rt", "", "$SYS/#",
	strings.Repeat("f", 250) + "/#", strings.Repeat("f", 260) + "/#",
	// Inside the mount the test also applies ("a/"): its parent, and
	// wildcards right after the prefix.
	"a", "a/+/#", "a//#", "a/a/#", "a/+/a", "a/b/+", "a/$a/#", "a/+/+/+",
}

// mqttLongTopics are names around weida's 256-byte limit: some convert
// under one policy and not the other (the escape makes a name longer).
func mqttLongTopics() []string {
	l := func(n int) string { return strings.Repeat("x", n) }
	return []string{
		"a/" + l(252), "a/" + l(253), "a/" + l(254), "a/" + l(255), l(256), l(257), "a/" + l(298),
		"a/" + l(240) + ".....", "a/" + l(250) + ".", "a/" + l(251) + "*",
		strings.Repeat("f", 250) + "/x", strings.Repeat("f", 260) + "/x",
	}
}

// TestMQTTConformance checks the MQTT policies against the real Mosquitto:
// for every filter a policy accepts, Mosquitto's deliveries of every
// generated topic equal the MQTT grammar's Match and, for every topic the
// policy converts, equal topic.Match(ConvertFilter(F), TopicToWeida(T)) &&
// Admit(F, T). Filters a policy refuses are listed with their rule.
//
// The broker is a private Mosquitto process, so that filters such as '#'
// see only this test's names. Each filter gets its own subscriber
// connection; a barrier message after the last topic (Mosquitto delivers a
// publisher's messages to a subscriber in order) says when a connection has
// received everything it will.
//
// WEIDA_MQTT_SEED picks another seed than the fixed default;
// WEIDA_MQTT_TOPICS and WEIDA_MQTT_FILTERS change the generated counts.
func TestMQTTConformance(t *testing.T) {
	broker := brokertest.StartMosquitto(t)
	seed := envUint(t, "WEIDA_MQTT_SEED", 20261129)
	nTopics := int(envUint(t, "WEIDA_MQTT_TOPICS", 200))
	nFilters := int(envUint(t, "WEIDA_MQTT_FILTERS", 160))
	r := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	g := policy.MQTTGrammar()
	policies := []policy.Policy{mustPolicy(t, policy.MQTTLevels), mustPolicy(t, "mqtt-levels-escaped/v1")}
	// Each policy also runs through a mount, checked against the same
	// deliveries: the generators favour the level "a", so that many
	// filters and topics lie inside it.
	mount := policy.Mount{Foreign: "a/", Weida: "plants.berlin."}
	for _, p := range policies[:2] {
		mp, err := policy.NewMounted(p, mount)
		if err != nil {
			t.Fatal(err)
		}
		policies = append(policies, mp)
	}
	label := func(p policy.Policy) string {
		if mp, ok := p.(*policy.Mounted); ok {
			return fmt.Sprintf("%s mounting %q at %q", p.Name(), mp.Mount().Foreign, mp.Mount().Weida)
		}
		return p.Name()
	}

	// Topics: generated plus the long ones; distinct, valid MQTT names
	// (Mosquitto disconnects on an invalid one), never $SYS (Mosquitto
	// refuses to let clients publish there).
	seen := map[string]bool{}
	var topics []string
	addTopic := func(s string) {
		if seen[s] || g.ValidateTopic(s) != nil || strings.HasPrefix(s, "$SYS") {
			return
		}
		seen[s] = true
		topics = append(topics, s)
	}
	for _, s := range mqttLongTopics() {
		addTopic(s)
	}

	// Filters: the fixed corners plus generated ones. A filter is
	// subscribed when at least one policy accepts it.
	type filterCase struct {
		f      string
		weida  []string // per policy; "" = refused
		reason []string // per policy refusal rule
	}
	fseen := map[string]bool{}
	var filters []filterCase
	refused := map[string][]string{} // policy → "filter: rule"
	addFilter := func(f string) {
		if fseen[f] {
			return
		}
		fseen[f] = true
		fc := filterCase{f: f, weida: make([]string, len(policies)), reason: make([]string, len(policies))}
		accepted := false
		for i, p := range policies {
			wf, err := p.ConvertFilter(f)
			if err != nil {
				fc.reason[i] = refusalRuleOf(err)
				refused[label(p)] = append(refused[label(p)], fmt.Sprintf("%-40q %s", abbreviate(f), fc.reason[i]))
				continue
			}
			if g.ValidateFilter(f) != nil {
				t.Errorf("%s accepts %q, which the MQTT grammar refuses", label(p), f)
				continue
			}
			fc.weida[i] = wf
			accepted = true
		}
		if accepted {
			filters = append(filters, fc)
		}
	}
	for _, f := range mqttConformanceFilters {
		addFilter(f)
	}
	for len(fseen) < len(mqttConformanceFilters)+nFilters {
		addFilter(genMQTTFilter(r))
	}
	// Half the topics are drawn on their own, half derived from a filter:
	// a name it matches or a near miss, so that deliveries are common.
	for len(topics) < nTopics {
		if r.IntN(2) == 0 {
			addTopic(genMQTTTopic(r))
		} else {
			addTopic(deriveMQTTTopic(r, filters[r.IntN(len(filters))].f))
		}
	}

	// One subscriber connection per filter, plus the barrier.
	barrier := "$zbarrier/" + unique()
	type delivery struct {
		mu   sync.Mutex
		got  map[string]int
		done chan struct{}
	}
	deliveries := make([]*delivery, len(filters))
	for i, fc := range filters {
		d := &delivery{got: map[string]int{}, done: make(chan struct{})}
		deliveries[i] = d
		var once sync.Once
		c, err := mqttDial(ctx(t, 10*time.Second), broker.Addr(), fmt.Sprintf("conf-%d", i), func(m mqttMsg) {
			if m.Topic == barrier {
				once.Do(func() { close(d.done) })
				return
			}
			d.mu.Lock()
			d.got[m.Topic]++
			d.mu.Unlock()
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(c.close)
		c.subscribe(t, 1, fc.f, barrier)
	}

	pub := mqttConnect(t, broker.Addr(), "conf-pub")
	for _, s := range topics {
		pub.publish(t, 1, s, "x")
	}
	pub.publish(t, 1, barrier, "barrier")
	for i, d := range deliveries {
		select {
		case <-d.done:
		case <-time.After(30 * time.Second):
			t.Fatalf("subscriber of %q never received the barrier", filters[i].f)
		}
	}

	// Compare.
	pairs, deliveredPairs := 0, 0
	perPolicy := make([]int, len(policies))
	unconvertible := make([]int, len(policies))
	var mismatches []string
	for i, fc := range filters {
		d := deliveries[i]
		d.mu.Lock()
		got := d.got
		d.mu.Unlock()
		for s := range got {
			// Mosquitto publishes its own $SYS topics; a '$SYS/...' filter
			// is valid and gets them.
			if !seen[s] && !strings.HasPrefix(s, "$SYS/") {
				mismatches = append(mismatches, fmt.Sprintf("filter %q: delivered %q, which was never published", fc.f, s))
			}
		}
		for _, s := range topics {
			pairs++
			n := got[s]
			if n > 1 {
				mismatches = append(mismatches, fmt.Sprintf("filter %q, topic %q: delivered %d times", fc.f, abbreviate(s), n))
			}
			delivered := n > 0
			if delivered {
				deliveredPairs++
			}
			if want := g.Match(fc.f, s); want != delivered {
				mismatches = append(mismatches, fmt.Sprintf("filter %q, topic %q: Mosquitto delivered=%t, grammar Match=%t", fc.f, abbreviate(s), delivered, want))
			}
			for k, p := range policies {
				if fc.weida[k] == "" {
					continue
				}
				wt, err := p.TopicToWeida(s)
				if err != nil {
					unconvertible[k]++
					continue
				}
				perPolicy[k]++
				if want := topic.Match(fc.weida[k], wt) && p.Admit(fc.f, s); want != delivered {
					mismatches = append(mismatches, fmt.Sprintf("%s: filter %q (weida %q), topic %q (weida %q): Mosquitto delivered=%t, weida Match&&Admit=%t",
						label(p), fc.f, fc.weida[k], abbreviate(s), abbreviate(wt), delivered, want))
				}
			}
		}
	}
	for _, p := range policies {
		list := refused[label(p)]
		sort.Strings(list)
		t.Logf("%s refuses %d filters:\n  %s", label(p), len(list), strings.Join(list, "\n  "))
	}
	t.Logf("seed %d: %d filters subscribed × %d topics = %d (filter, topic) pairs checked against Mosquitto's deliveries (%d delivered, %d not)",
		seed, len(filters), len(topics), pairs, deliveredPairs, pairs-deliveredPairs)
	for k, p := range policies {
		accepted := 0
		for _, fc := range filters {
			if fc.weida[k] != "" {
				accepted++
			}
		}
		t.Logf("%s: %d accepted filters; %d pairs with a convertible topic checked against weida's matcher, %d pairs skipped (topic not convertible)",
			label(p), accepted, perPolicy[k], unconvertible[k])
		// A mount is only proven on enough pairs inside it.
		if _, mounted := p.(*policy.Mounted); mounted && perPolicy[k] < 500 && nTopics >= 200 && nFilters >= 160 {
			t.Errorf("%s: only %d pairs checked against weida; want at least 500", label(p), perPolicy[k])
		}
	}
	if len(mismatches) > 0 {
		slices.Sort(mismatches)
		if len(mismatches) > 40 {
			mismatches = append(mismatches[:40], fmt.Sprintf("... and %d more", len(mismatches)-40))
		}
		t.Errorf("%d mismatches:\n  %s", len(mismatches), strings.Join(mismatches, "\n  "))
	} else {
		t.Logf("result: 0 mismatches")
	}
}

func mustPolicy(t testing.TB, name string) policy.Policy {
	t.Helper()
	p, err := policy.Lookup(mqtt.Driver.Policies(), name)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func envUint(t testing.TB, name string, def uint64) uint64 {
	t.Helper()
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	v, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%s: %v", name, err)
	}
	return v
}

func refusalRuleOf(err error) string {
	var r *policy.Refusal
	if errors.As(err, &r) && r.Rule != "" {
		return r.Rule
	}
	return err.Error()
}

// abbreviate shortens long names for the log.
func abbreviate(s string) string {
	if len(s) <= 48 {
		return s
	}
	return fmt.Sprintf("%s…(%d bytes)", s[:24], len(s))
}
