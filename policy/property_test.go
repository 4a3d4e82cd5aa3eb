package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
	"weida.dev/connector/weida/topic"
)

// The generators below build names from small sets of pieces chosen to hit
// the edges of every grammar: empty levels and words, '$' prefixes, the
// other grammars' separators and wildcards as literals, the escape's own
// sequences, non-ASCII UTF-8 and invalid UTF-8, and lengths around 255, 256
// and 257 bytes. Small alphabets make collisions and matches frequent.

var (
	mqttPieces  = []string{"", "a", "b", "A", "$", "$SYS", ".", "*", "%", "%2E", "%25", "%2A", "2E", "é", "€", " ", ">", "x.y"}
	natsPieces  = []string{"a", "b", "A", "*", ">", "#", "b#", "*b", "$", "é", "%", "a>", "/", "+"}
	amqpPieces  = []string{"", "a", "b", "*", "#", "a*", "é", "%", "$", "/", "+", ">"}
	weidaPieces = []string{"", "a", "b", "/", "+", "#", "*", ">", "%", "%2E", "%2A", "%25", "%2e", "%4", " ", "\x00", "é", "$", "$SYS"}
	// Lengths around the limits: weida's 256 bytes, AMQP's 255, and the
	// escaped policy's 256/3 (a level of dots triples).
	edgeLengths = []int{85, 86, 87, 200, 201, 202, 254, 255, 256, 257, 258}
	fillers     = []string{"x", ".", "%", "*", "é", "/"}
)

// join draws between lo and hi parts from part and joins them with sep.
func join(t *rapid.T, label string, lo, hi int, sep string, part func(*rapid.T) string) string {
	n := rapid.IntRange(lo, hi).Draw(t, label+"-count")
	parts := make([]string, n)
	for i := range parts {
		parts[i] = part(t)
	}
	return strings.Join(parts, sep)
}

func concat(pieces []string, lo, hi int) func(*rapid.T) string {
	return func(t *rapid.T) string {
		n := rapid.IntRange(lo, hi).Draw(t, "pieces")
		var b strings.Builder
		for range n {
			b.WriteString(rapid.SampledFrom(pieces).Draw(t, "piece"))
		}
		return b.String()
	}
}

// padEdge sometimes pads s with sep and a filler to one of edgeLengths, so
// that the output of a conversion lands on both sides of a limit.
func padEdge(t *rapid.T, s, sep string) string {
	if !rapid.Bool().Draw(t, "pad") {
		return s
	}
	target := rapid.SampledFrom(edgeLengths).Draw(t, "length")
	fill := rapid.SampledFrom(fillers).Draw(t, "filler")
	if fill == sep {
		fill = "x"
	}
	s += sep
	for len(s) < target {
		s += fill
	}
	return s
}

// protoGen draws names and filters of one protocol.
type protoGen struct {
	topic func(*rapid.T) string
	// filterFrom turns a topic into a filter that often matches it.
	filterFrom func(*rapid.T, string) string
	// confusable lists pairs of strings a conversion could merge; swapping
	// one for the other in a name gives a candidate collision.
	confusable [][2]string
}

func mqttTopic(t *rapid.T) string {
	return padEdge(t, join(t, "levels", 1, 5, "/", concat(mqttPieces, 0, 3)), "/")
}

func mqttFilterFrom(t *rapid.T, name string) string {
	lv := strings.Split(name, "/")
	for i := range lv {
		switch rapid.IntRange(0, 5).Draw(t, "level-op") {
		case 0, 1:
			lv[i] = "+"
		case 2:
			lv[i] = concat(mqttPieces, 0, 2)(t)
		}
	}
	if rapid.IntRange(0, 2).Draw(t, "hash") == 0 {
		k := rapid.IntRange(0, len(lv)).Draw(t, "hash-at")
		lv = append(lv[:k], "#")
	}
	return strings.Join(lv, "/")
}

func natsTopic(t *rapid.T) string {
	tok := func(t *rapid.T) string {
		switch rapid.IntRange(0, 30).Draw(t, "token-kind") {
		case 0:
			return "" // invalid: must be refused
		case 1:
			return "\xff" // invalid UTF-8: must be refused
		}
		return concat(natsPieces, 1, 2)(t)
	}
	return padEdge(t, join(t, "tokens", 1, 5, ".", tok), ".")
}

func natsFilterFrom(t *rapid.T, name string) string {
	tk := strings.Split(name, ".")
	for i := range tk {
		switch rapid.IntRange(0, 5).Draw(t, "token-op") {
		case 0, 1:
			tk[i] = "*"
		case 2:
			tk[i] = concat(natsPieces, 1, 2)(t)
		}
	}
	if rapid.IntRange(0, 3).Draw(t, "gt") == 0 {
		k := rapid.IntRange(0, len(tk)).Draw(t, "gt-at")
		tk = append(tk[:k], ">")
	}
	return strings.Join(tk, ".")
}

func amqpKey(t *rapid.T) string {
	word := concat(amqpPieces, 0, 2)
	if rapid.IntRange(0, 30).Draw(t, "utf8") == 0 {
		word = func(*rapid.T) string { return "\xff" }
	}
	return padEdge(t, join(t, "words", 0, 5, ".", word), ".")
}

func amqpBindingFrom(t *rapid.T, key string) string {
	var ws []string
	if key != "" {
		ws = strings.Split(key, ".")
	}
	var out []string
	for _, w := range ws {
		switch rapid.IntRange(0, 7).Draw(t, "word-op") {
		case 0, 1:
			out = append(out, "*")
		case 2:
			out = append(out, "#")
		case 3:
			out = append(out, "#", w) // '#' before a word it may swallow
		case 4:
			// drop the word
		default:
			out = append(out, w)
		}
	}
	if rapid.IntRange(0, 2).Draw(t, "tail") == 0 {
		out = append(out, rapid.SampledFrom([]string{"#", "*", "#.#", "#.*", "*.#"}).Draw(t, "tail-run"))
	}
	return strings.Join(out, ".")
}

func weidaTopic(t *rapid.T) string {
	return padEdge(t, join(t, "segments", 1, 5, ".", concat(weidaPieces, 0, 2)), ".")
}

var protoGens = map[Protocol]protoGen{
	MQTT: {mqttTopic, mqttFilterFrom, [][2]string{{"/", "."}, {".", "%2E"}, {"%", "%25"}, {"*", "%2A"}, {"/", "%2F"}}},
	NATS: {natsTopic, natsFilterFrom, [][2]string{{".", "/"}, {"*", "#"}, {">", "*"}}},
	AMQP: {amqpKey, amqpBindingFrom, [][2]string{{".", ""}, {"*", "#"}, {"a.", ""}}},
}

var weidaConfusable = [][2]string{{".", "/"}, {"%2E", "."}, {"%25", "%"}, {"%2A", "*"}, {"%2e", "%2E"}}

// confuse applies one to three swaps from pairs to s.
func confuse(t *rapid.T, s string, pairs [][2]string) string {
	n := rapid.IntRange(1, 3).Draw(t, "swaps")
	for range n {
		p := rapid.SampledFrom(pairs).Draw(t, "pair")
		from, to := p[0], p[1]
		if rapid.Bool().Draw(t, "reverse") {
			from, to = to, from
		}
		if from == "" {
			at := rapid.IntRange(0, len(s)).Draw(t, "insert-at")
			s = s[:at] + to + s[at:]
			continue
		}
		if i := strings.Index(s, from); i >= 0 {
			s = s[:i] + to + s[i+len(from):]
		}
	}
	return s
}

// foreignFilter draws a filter that is either derived from topic (so that it
// often matches it) or from an unrelated topic.
func foreignFilter(t *rapid.T, g protoGen, name string) string {
	if rapid.IntRange(0, 3).Draw(t, "unrelated") == 0 {
		name = g.topic(t)
	}
	return g.filterFrom(t, name)
}

// instantiate draws a weida topic that the valid weida filter w matches.
func instantiate(t *rapid.T, w string) string {
	var segs []string
	for seg := range strings.SplitSeq(w, ".") {
		switch seg {
		case "*":
			segs = append(segs, concat(weidaPieces, 0, 2)(t))
		case "#":
			for range rapid.IntRange(0, 2).Draw(t, "hash-segments") {
				segs = append(segs, concat(weidaPieces, 0, 2)(t))
			}
		default:
			segs = append(segs, seg)
		}
	}
	return strings.Join(segs, ".")
}

func forEachPolicy(t *testing.T, fn func(t *testing.T, p Policy, g protoGen)) {
	for _, n := range Names(all()) {
		p, _ := lookup(n)
		t.Run(n, func(t *testing.T) { fn(t, p, protoGens[p.Protocol()]) })
	}
}

// TestPropertyExactInbound: for every filter F the policy accepts and every
// foreign topic T it converts,
//
//	Grammar().Match(F, T) == topic.Match(ConvertFilter(F), TopicToWeida(T)) && Admit(F, T).
func TestPropertyExactInbound(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, p Policy, g protoGen) {
		var yes, no int
		rapid.Check(t, func(t *rapid.T) {
			for range 8 {
				name := g.topic(t)
				f := foreignFilter(t, g, name)
				w, err := p.ConvertFilter(f)
				if err != nil {
					continue
				}
				wt, err := p.TopicToWeida(name)
				if err != nil {
					continue
				}
				want := p.Grammar().Match(f, name)
				got := topic.Match(w, wt) && p.Admit(f, name)
				if want != got {
					t.Fatalf("foreign Match(%q, %q) = %v but weida Match(%q, %q) && Admit = %v", f, name, want, w, wt, got)
				}
				if want {
					yes++
				} else {
					no++
				}
			}
		})
		if yes == 0 || no == 0 {
			t.Errorf("the generators produced %d matching and %d non-matching convertible pairs; both must occur", yes, no)
		}
	})
}

// TestPropertyExactOutbound checks the same equation from the weida side:
// a weida topic w that the converted filter selects (or a random one) is
// converted to the foreign name t = TopicFromWeida(w), and the foreign
// filter must select t exactly when the weida filter selects w and Admit
// lets it through. This is the guard the runtime applies outbound.
func TestPropertyExactOutbound(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, p Policy, g protoGen) {
		var yes, no int
		rapid.Check(t, func(t *rapid.T) {
			for range 8 {
				f := foreignFilter(t, g, g.topic(t))
				w, err := p.ConvertFilter(f)
				if err != nil {
					continue
				}
				wt := weidaTopic(t)
				if rapid.Bool().Draw(t, "instantiate") {
					wt = instantiate(t, w)
				}
				name, err := p.TopicFromWeida(wt)
				if err != nil {
					continue
				}
				want := p.Grammar().Match(f, name)
				got := topic.Match(w, wt) && p.Admit(f, name)
				if want != got {
					t.Fatalf("foreign Match(%q, %q) = %v but weida Match(%q, %q) && Admit = %v", f, name, want, w, wt, got)
				}
				if want {
					yes++
				} else {
					no++
				}
			}
		})
		if yes == 0 || no == 0 {
			t.Errorf("%d matching and %d non-matching pairs; both must occur", yes, no)
		}
	})
}

// TestPropertyOutputsValid: whatever a policy accepts is valid in the
// grammar it came from, and whatever it returns is valid where it goes.
func TestPropertyOutputsValid(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, p Policy, g protoGen) {
		rapid.Check(t, func(t *rapid.T) {
			name := g.topic(t)
			f := foreignFilter(t, g, name)
			if w, err := p.ConvertFilter(f); err == nil {
				if e := p.Grammar().ValidateFilter(f); e != nil {
					t.Fatalf("ConvertFilter accepted %q, which the grammar refuses: %v", f, e)
				}
				if e := topic.ValidateFilter(w); e != nil || w == "" {
					t.Fatalf("ConvertFilter(%q) = %q, not a valid non-empty weida filter: %v", f, w, e)
				}
			} else {
				assertRefusal(t, p, err, f)
			}
			if wt, err := p.TopicToWeida(name); err == nil {
				if e := p.Grammar().ValidateTopic(name); e != nil {
					t.Fatalf("TopicToWeida accepted %q, which the grammar refuses: %v", name, e)
				}
				if e := topic.ValidateTopic(wt); e != nil {
					t.Fatalf("TopicToWeida(%q) = %q, not a valid weida topic: %v", name, wt, e)
				}
			} else {
				assertRefusal(t, p, err, name)
				// A refused topic the broker could deliver is counted
				// under a loss the policy declares inbound.
				if p.Grammar().ValidateTopic(name) == nil {
					assertDeclared(t, p, Inbound, err)
				}
			}
			wt := weidaTopic(t)
			if out, err := p.TopicFromWeida(wt); err == nil {
				if e := p.Grammar().ValidateTopic(out); e != nil {
					t.Fatalf("TopicFromWeida(%q) = %q, which the grammar refuses: %v", wt, out, e)
				}
			} else {
				assertRefusal(t, p, err, wt)
				if topic.ValidateTopic(wt) == nil {
					assertDeclared(t, p, Outbound, err)
				}
			}
		})
	})
}

func assertRefusal(t *rapid.T, p Policy, err error, in string) {
	var r *Refusal
	if !errors.As(err, &r) || r.Policy != p.Name() || r.Input != in || r.Rule == "" || r.Reason == "" {
		t.Fatalf("%s refused %q with %#v, want a complete *Refusal", p.Name(), in, err)
	}
	if !strings.Contains(in, r.Part) {
		t.Fatalf("%s refused %q at %q, which is not part of the input", p.Name(), in, r.Part)
	}
}

func assertDeclared(t *rapid.T, p Policy, dir Direction, err error) {
	var r *Refusal
	errors.As(err, &r)
	l, ok := p.LossFor(r.Rule)
	if lr, lok := LossForRule(r.Rule); lok != ok || lr != l {
		t.Fatalf("%s maps rule %s to %q, %v; LossForRule to %q, %v", p.Name(), r.Rule, l, ok, lr, lok)
	}
	if !ok {
		t.Fatalf("%s %s refusal rule %s maps to no loss", p.Name(), dir, r.Rule)
	}
	for _, opts := range []Options{{}, {QoS: 1, JetStream: true}} {
		if !slices.Contains(p.Losses(dir, opts), l) {
			t.Fatalf("%s %s drops %q under %s, which Losses(%s, %+v) does not declare", p.Name(), dir, r.Input, l, dir, opts)
		}
	}
}

// TestPropertyRoundTrip: foreign→weida→foreign and weida→foreign→weida are
// the identity where defined, which makes both topic conversions injective.
// For the MQTT and AMQP policies the way back is always defined; nats-tokens/v1
// carries a published token '*' or '>' inbound but never publishes one.
func TestPropertyRoundTrip(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, p Policy, g protoGen) {
		rapid.Check(t, func(t *rapid.T) {
			name := g.topic(t)
			if wt, err := p.TopicToWeida(name); err == nil {
				back, err := p.TopicFromWeida(wt)
				var r *Refusal
				switch {
				case err == nil && back != name:
					t.Fatalf("%q → %q → %q", name, wt, back)
				case err != nil && !(errors.As(err, &r) && r.Rule == RuleNATSWildcardTok):
					t.Fatalf("%q → %q → refused: %v", name, wt, err)
				}
			}
			wt := weidaTopic(t)
			if rapid.Bool().Draw(t, "confusable") {
				wt = confuse(t, wt, weidaConfusable)
			}
			if out, err := p.TopicFromWeida(wt); err == nil {
				back, err := p.TopicToWeida(out)
				if err != nil || back != wt {
					t.Fatalf("%q → %q → %q, %v", wt, out, back, err)
				}
			}
		})
	})
}

// TestPropertyInjective draws pairs of names that a careless conversion
// would merge (one is the other with a separator, wildcard or escape
// swapped) and checks that distinct names never convert to one.
func TestPropertyInjective(t *testing.T) {
	forEachPolicy(t, func(t *testing.T, p Policy, g protoGen) {
		rapid.Check(t, func(t *rapid.T) {
			a := g.topic(t)
			b := confuse(t, a, g.confusable)
			wa, ea := p.TopicToWeida(a)
			wb, eb := p.TopicToWeida(b)
			if ea == nil && eb == nil && a != b && wa == wb {
				t.Fatalf("TopicToWeida merges %q and %q into %q", a, b, wa)
			}
			x := weidaTopic(t)
			y := confuse(t, x, weidaConfusable)
			fx, ex := p.TopicFromWeida(x)
			fy, ey := p.TopicFromWeida(y)
			if ex == nil && ey == nil && x != y && fx == fy {
				t.Fatalf("TopicFromWeida merges %q and %q into %q", x, y, fx)
			}
		})
	})
}

// Reference matchers: obvious, allocating, recursive. The real matchers
// must agree with them.

func mqttRef(f, t string) bool {
	if (f[0] == '+' || f[0] == '#') && strings.HasPrefix(t, "$") {
		return false
	}
	fl, tl := strings.Split(f, "/"), strings.Split(t, "/")
	for i, p := range fl {
		if p == "#" {
			return true
		}
		if i >= len(tl) || (p != "+" && p != tl[i]) {
			return false
		}
	}
	return len(fl) == len(tl)
}

func natsRef(f, t string) bool {
	fl, tl := strings.Split(f, "."), strings.Split(t, ".")
	if slices.Contains(tl, "") {
		return false
	}
	for i, p := range fl {
		if p == ">" {
			return len(tl) > i
		}
		if i >= len(tl) || (p != "*" && p != tl[i]) {
			return false
		}
	}
	return len(fl) == len(tl)
}

func amqpWordsOf(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ".")
}

func amqpRef(p, w []string) bool {
	switch {
	case len(p) == 0:
		return len(w) == 0
	case p[0] == "#":
		return amqpRef(p[1:], w) || (len(w) > 0 && amqpRef(p, w[1:]))
	case len(w) == 0:
		return false
	case p[0] == "*" || p[0] == w[0]:
		return amqpRef(p[1:], w[1:])
	}
	return false
}

func TestPropertyMatchReference(t *testing.T) {
	for _, c := range []struct {
		proto Protocol
		ref   func(f, t string) bool
	}{
		{MQTT, mqttRef},
		{NATS, natsRef},
		{AMQP, func(f, t string) bool { return amqpRef(amqpWordsOf(f), amqpWordsOf(t)) }},
	} {
		g, pg := grammarOf(c.proto), protoGens[c.proto]
		t.Run(string(c.proto), func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				name := pg.topic(t)
				f := foreignFilter(t, pg, name)
				if c.proto == AMQP && rapid.Bool().Draw(t, "raw") {
					f = join(t, "words", 0, 6, ".", concat([]string{"", "a", "b", "*", "#"}, 0, 1))
				}
				if g.ValidateFilter(f) != nil || (c.proto != NATS && g.ValidateTopic(name) != nil) {
					return
				}
				if got, want := g.Match(f, name), c.ref(f, name); got != want {
					t.Fatalf("%s Match(%q, %q) = %v, reference %v", c.proto, f, name, got, want)
				}
			})
		})
	}
}

// TestAMQPEmptyKeyDifference shows why the empty routing key is refused in
// both directions: for converted filters, AMQP and weida disagree on it and
// on nothing else.
func TestAMQPEmptyKeyDifference(t *testing.T) {
	p := defaultPolicy(AMQP)
	for _, c := range []struct {
		binding string
		amqp    bool // AMQP's answer on ""
		weida   bool // weida's answer on "" with the converted filter
	}{
		{"#", true, true},
		{"#.#", true, true},
		{"*", false, true},
		{"#.*", false, true},
		{"*.#", false, true},
		{".#", false, true},
		{"a.#", false, false},
	} {
		w, err := p.ConvertFilter(c.binding)
		if err != nil {
			t.Fatal(err)
		}
		if got := p.Grammar().Match(c.binding, ""); got != c.amqp {
			t.Errorf("AMQP Match(%q, \"\") = %v", c.binding, got)
		}
		if got := topic.Match(w, ""); got != c.weida {
			t.Errorf("weida Match(%q, \"\") = %v", w, got)
		}
	}
	if _, err := p.TopicToWeida(""); err == nil {
		t.Error("the empty routing key converted")
	}
	if _, err := p.TopicFromWeida(""); err == nil {
		t.Error("the empty weida topic converted")
	}
}
