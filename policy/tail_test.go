package policy

import (
	"errors"
	"slices"
	"strings"
	"testing"

	"pgregory.net/rapid"
	"weida.dev/connector/weida/topic"
)

// checkConv runs table rows against p, which need not be registered.
func checkConv(t *testing.T, p Policy, cases []convCase) {
	t.Helper()
	for _, c := range cases {
		out, err := c.op.apply(p, c.in)
		if c.rule == "" {
			if err != nil || out != c.out {
				t.Errorf("%s %s(%q) = %q, %v; want %q", p.Name(), c.op, trunc(c.in), trunc(out), err, trunc(c.out))
			}
			if c.op == opFilter && err == nil && topic.ValidateFilter(out) != nil {
				t.Errorf("%s %s(%q) = %q, invalid weida", p.Name(), c.op, trunc(c.in), out)
			}
			continue
		}
		var r *Refusal
		if !errors.As(err, &r) || out != "" || r.Rule != c.rule || r.Policy != p.Name() || r.Input != c.in || r.Reason == "" {
			t.Errorf("%s %s(%q) = %q, %v; want refusal %s", p.Name(), c.op, trunc(c.in), trunc(out), err, c.rule)
			continue
		}
		if c.part != "" && r.Part != c.part {
			t.Errorf("%s %s(%q): part %q, want %q", p.Name(), c.op, trunc(c.in), r.Part, c.part)
		}
	}
}

func TestNATSTailConversions(t *testing.T) {
	p := NATSTail()
	if p.Name() != NATSTokensTail || p.Protocol() != NATS || p.Grammar() != NATSGrammar() {
		t.Fatalf("NATSTail() = %s %s", p.Name(), p.Protocol())
	}
	cases := []convCase{
		{NATSTokensTail, opFilter, "orders.>", "orders.*.#", "", ""},
		{NATSTokensTail, opFilter, ">", "*.#", "", ""},
		{NATSTokensTail, opFilter, "*.>", "*.*.#", "", ""},
		{NATSTokensTail, opFilter, "a.*.>", "a.*.*.#", "", ""},
		{NATSTokensTail, opFilter, "a>.b", "a>.b", "", ""},
		{NATSTokensTail, opFilter, "orders.*.created", "orders.*.created", "", ""},
		{NATSTokensTail, opFilter, ">.a", "", RuleNATSGtNotFinal, ">"},
		{NATSTokensTail, opFilter, "a.#", "", RuleNATSHashToken, "#"},
		{NATSTokensTail, opFilter, "a.b#", "", RuleNATSWildcardMix, "b#"},
		{NATSTokensTail, opFilter, "a.>b", "a.>b", "", ""},
		{NATSTokensTail, opFilter, "a..>", "", RuleNATSEmptyToken, ""},
		{NATSTokensTail, opFilter, "a >", "", RuleNATSWhitespace, "a >"},
		{NATSTokensTail, opFilter, "\xff.>", "", RuleInvalidUTF8, ""},
		// '>' adds two bytes: 254 fits, 255 and 256 get their own rule,
		// 257 was too long already.
		{NATSTokensTail, opFilter, pad("a", '.', 252) + ".>", pad("a", '.', 252) + ".*.#", "", ""},
		{NATSTokensTail, opFilter, pad("a", '.', 253) + ".>", "", RuleNATSTailTooLong, ""},
		{NATSTokensTail, opFilter, pad("a", '.', 254) + ".>", "", RuleNATSTailTooLong, ""},
		{NATSTokensTail, opFilter, pad("a", '.', 255) + ".>", "", RuleFilterTooLong, ""},
		{NATSTokensTail, opFilter, pad("a", '.', 256), pad("a", '.', 256), "", ""},
		{NATSTokensTail, opIn, "p.>", "p.>", "", ""},
		{NATSTokensTail, opIn, "p..b", "", RuleNATSEmptyToken, ""},
		{NATSTokensTail, opOut, "a.b", "a.b", "", ""},
		{NATSTokensTail, opOut, "a.>", "", RuleNATSWildcardTok, ">"},
		{NATSTokensTail, opOut, "a.", "", RuleNATSEmptyToken, ""},
	}
	checkConv(t, p, cases)

	// The default's refusal of '>' names the opt-in policy.
	_, err := defaultPolicy(NATS).ConvertFilter("orders.>")
	var r *Refusal
	if !errors.As(err, &r) || r.Rule != RuleNATSOneOrMore || !strings.Contains(r.Hint, NATSTokensTail) {
		t.Errorf("nats-tokens/v1 orders.>: %v, want a hint naming %s", err, NATSTokensTail)
	}
	// Same losses as the default: the tail adds no drop.
	for _, dir := range []Direction{Inbound, Outbound, "sideways"} {
		for _, o := range []Options{{}, {JetStream: true}} {
			if got, want := p.Losses(dir, o), defaultPolicy(NATS).Losses(dir, o); !slices.Equal(got, want) {
				t.Errorf("Losses(%s, %+v) = %v, want the default's %v", dir, o, got, want)
			}
		}
	}
	if _, ok := defaultPolicy(NATS).(WeidaFilterConverter); ok {
		t.Error("nats-tokens/v1 claims a weida-to-NATS filter conversion")
	}
}

func TestNATSTailFilterFromWeida(t *testing.T) {
	p := NATSTail().(WeidaFilterConverter)
	for _, c := range []struct{ in, out, rule string }{
		{"orders.*.#", "orders.>", ""},
		{"*.#", ">", ""},
		{"a.*.*.#", "a.*.>", ""},
		{"#", ">", ""},
		{"", ">", ""},
		{"a.*", "a.*", ""},
		{"a.b", "a.b", ""},
		{"a>.b", "a>.b", ""},
		{"orders.#", "", RuleNATSZeroOrMore},
		{"a.b.#", "", RuleNATSZeroOrMore},
		{"a.>", "", RuleNATSWildcardTok},
		{">.*.#", "", RuleNATSWildcardTok},
		{"a..b", "", RuleNATSEmptyToken},
		{"a.*.", "", RuleNATSEmptyToken},
		{"a b.*", "", RuleNATSWhitespace},
		{"a.#.b", "", RuleWeidaInvalid},
	} {
		out, err := p.FilterFromWeida(c.in)
		var r *Refusal
		switch {
		case c.rule == "" && (err != nil || out != c.out):
			t.Errorf("FilterFromWeida(%q) = %q, %v; want %q", c.in, out, err, c.out)
		case c.rule != "" && (!errors.As(err, &r) || r.Rule != c.rule || r.Input != c.in || r.Policy != NATSTokensTail || !strings.Contains(c.in, r.Part)):
			t.Errorf("FilterFromWeida(%q) = %q, %v; want refusal %s", c.in, out, err, c.rule)
		}
	}
}

// natsTailFilter draws NATS filters that often end in '>', including the
// bare '>' and '*.>', next to a subject they may select.
func natsTailFilter(t *rapid.T, name string) string {
	switch rapid.IntRange(0, 5).Draw(t, "shape") {
	case 0:
		return ">"
	case 1:
		return "*.>"
	case 2:
		f := natsFilterFrom(t, name)
		if !strings.HasSuffix(f, ">") {
			f += ".>"
		}
		return f
	}
	return natsFilterFrom(t, name)
}

// TestPropertyNATSTailExact: whenever nats-tokens-tail/v1 accepts a filter
// and converts a subject, NATS and weida agree (against the reference
// matcher too), and its weida filters convert back to NATS filters that
// agree on every weida topic with a NATS form.
func TestPropertyNATSTailExact(t *testing.T) {
	p := NATSTail()
	back := p.(WeidaFilterConverter)
	var yes, no, gt int
	rapid.Check(t, func(t *rapid.T) {
		name := natsTopic(t)
		if rapid.Bool().Draw(t, "shorter") {
			name = strings.Join(strings.Split(name, ".")[:1], ".")
		}
		f := natsTailFilter(t, name)
		w, err := p.ConvertFilter(f)
		if err != nil {
			assertRefusal(t, p, err, f)
			return
		}
		if strings.HasSuffix(f, ">") {
			gt++
		}
		if nf, err := back.FilterFromWeida(w); err != nil || nf != f {
			t.Fatalf("FilterFromWeida(ConvertFilter(%q) = %q) = %q, %v", f, w, nf, err)
		}
		if wt, err := p.TopicToWeida(name); err == nil {
			want := p.Grammar().Match(f, name)
			if want != natsRef(f, name) {
				t.Fatalf("NATS Match(%q, %q) disagrees with the reference", f, name)
			}
			if got := topic.Match(w, wt); got != want {
				t.Fatalf("NATS Match(%q, %q) = %v, weida Match(%q, %q) = %v", f, name, want, w, wt, got)
			}
			if want {
				yes++
			} else {
				no++
			}
		}
		wt := weidaTopic(t)
		if rapid.Bool().Draw(t, "instantiate") {
			wt = instantiate(t, w)
		}
		if nt, err := p.TopicFromWeida(wt); err == nil {
			if p.Grammar().Match(f, nt) != topic.Match(w, wt) {
				t.Fatalf("outbound: NATS Match(%q, %q) != weida Match(%q, %q)", f, nt, w, wt)
			}
		}
	})
	if yes == 0 || no == 0 || gt == 0 {
		t.Errorf("%d matching, %d non-matching pairs, %d filters ending in '>': all must occur", yes, no, gt)
	}
}

// TestPropertyNATSTailFromWeida: FilterFromWeida is exact on weida filters
// drawn at random, over weida topics that have a NATS form.
func TestPropertyNATSTailFromWeida(t *testing.T) {
	p := NATSTail()
	back := p.(WeidaFilterConverter)
	var yes int
	rapid.Check(t, func(t *rapid.T) {
		wf := join(t, "segments", 1, 4, ".", func(t *rapid.T) string {
			return rapid.SampledFrom([]string{"a", "b", "*", "", ">", "a>"}).Draw(t, "segment")
		})
		if rapid.Bool().Draw(t, "hash") {
			wf += rapid.SampledFrom([]string{".#", ".*.#"}).Draw(t, "tail")
		}
		if topic.ValidateFilter(wf) != nil {
			return
		}
		nf, err := back.FilterFromWeida(wf)
		if err != nil {
			assertRefusal(t, p, err, wf)
			return
		}
		if e := p.Grammar().ValidateFilter(nf); e != nil {
			t.Fatalf("FilterFromWeida(%q) = %q, invalid NATS: %v", wf, nf, e)
		}
		wt := instantiate(t, wf)
		if rapid.Bool().Draw(t, "random") {
			wt = weidaTopic(t)
		}
		nt, err := p.TopicFromWeida(wt)
		if err != nil {
			return
		}
		want := topic.Match(wf, wt)
		if got := p.Grammar().Match(nf, nt); got != want {
			t.Fatalf("weida Match(%q, %q) = %v, NATS Match(%q, %q) = %v", wf, wt, want, nf, nt, got)
		}
		if want {
			yes++
		}
	})
	if yes == 0 {
		t.Error("no matching pair was drawn")
	}
}
