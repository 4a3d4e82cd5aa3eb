package policy

import (
	"strconv"
	"strings"

	"weida.dev/connector/weida/topic"
)

// Mount places a subtree of the foreign namespace at a subtree of weida's.
// Both fields are prefixes that end with their separator ("factory/" for
// MQTT, "orders." for NATS and AMQP, "plants.berlin." for weida); the empty
// string means no prefix. The zero Mount changes nothing.
//
// A prefix names its parent topic too: with Mount{"factory/",
// "plants.berlin."} the foreign topic factory is the weida topic
// plants.berlin, and factory/r is plants.berlin. followed by the policy's
// conversion of r. That makes MQTT factory/# (which selects factory) and
// weida plants.berlin.# (which selects plants.berlin) the same set. The
// mapping is a bijection between the two subtrees; topics outside them are
// refused ([RuleMountOutside]).
//
// When only one side has a prefix, the other side has no parent topic:
//   - Foreign "" and Weida "w.": every foreign topic t is w.convert(t), and
//     no foreign topic is w itself. A filter converting to '#' becomes
//     w.*.# (one or more segments after w), so that w is never selected.
//   - Foreign "f/" and Weida "": f/r is convert(r), and the topic f has no
//     weida form: a filter that selects it (f, f/#) is refused
//     ([RuleMountParent]); write f/+/# for everything below f.
type Mount struct {
	Foreign string // foreign prefix, ending with the foreign separator; "" for none
	Weida   string // weida prefix, ending with '.'; "" for none
}

// Mounted is a [Policy] applied under a [Mount]. It converts foreign
// filters and topics inside the mount's foreign subtree into the weida
// subtree and back, with the wrapped policy's rules for what lies below the
// prefixes, and it refuses everything outside. Its Name, Protocol, Grammar,
// Admit and AdmitRule are the wrapped policy's: a mount is configuration of
// a policy, not another policy. Its exactness contract is the one the
// package documents, with Mounted's conversions.
//
// A Mounted is immutable and safe for concurrent use; make one with
// [NewMounted]. The zero value is not usable.
type Mounted struct {
	p       Policy
	m       Mount
	sep     byte   // the foreign separator
	fparent string // Foreign without its separator; "" when Foreign is ""
	wparent string // Weida without its '.'; "" when Weida is ""
}

var _ Policy = (*Mounted)(nil)

// wildcardLevel reports whether lv is a whole wildcard level in a filter of
// grammar g.
func wildcardLevel(g Grammar, lv string) bool {
	one, many := g.Wildcards()
	return lv == one || lv == many
}

// NewMounted returns p applied under m, or a *Refusal (Policy: p's name,
// Input: the offending prefix) when m cannot be a bijection:
//
//   - [RuleMountBoundary]: a non-empty prefix does not end with its
//     separator ([Grammar.Separator]: '/' for MQTT, '.' for NATS, AMQP;
//     '.' for weida);
//   - [RuleMountEmptyJoint]: the last level or segment of a prefix is empty
//     ("a//", "a..", "/", "."), or the weida prefix is "";
//   - [RuleMountWildcard]: a prefix holds a wildcard level
//     ([Grammar.Wildcards]: '+', '#' for MQTT; '*', '>' for NATS; '*', '#'
//     for AMQP), or the weida prefix holds
//     '*' or '#' anywhere (a weida filter may not hold them as literals);
//   - the grammar's own rule when the foreign parent is not a valid foreign
//     topic name, and [RuleTopicTooLong] or [RuleInvalidUTF8] when the weida
//     prefix is no weida topic.
//
// A nil p gives a *Refusal with Rule [RuleUnknownPolicy].
func NewMounted(p Policy, m Mount) (*Mounted, error) {
	if p == nil {
		return nil, refuse("policy", "", "", RuleUnknownPolicy, "no policy to mount", "")
	}
	name, g := p.Name(), p.Grammar()
	mp := &Mounted{p: p, m: m, sep: g.Separator()}
	if f := m.Foreign; f != "" {
		if f[len(f)-1] != mp.sep {
			return nil, refuse(name, f, f, RuleMountBoundary,
				"the foreign prefix must end at a level boundary, with '"+string(mp.sep)+"'",
				"write "+strconv.Quote(f+string(mp.sep)))
		}
		mp.fparent = f[:len(f)-1]
		if mp.fparent == "" || mp.fparent[len(mp.fparent)-1] == mp.sep {
			return nil, refuse(name, f, f, RuleMountEmptyJoint,
				"the foreign prefix ends with an empty level, which would make its parent an empty level", "drop the trailing empty level")
		}
		if r := asRefusal(g.ValidateTopic(mp.fparent)); r != nil {
			r.Policy, r.Input = name, f
			return nil, r
		}
		for lv := range strings.SplitSeq(mp.fparent, string(mp.sep)) {
			if wildcardLevel(g, lv) {
				return nil, refuse(name, f, lv, RuleMountWildcard,
					"a prefix is one literal subtree; a wildcard level would make it many", "mount each subtree on its own")
			}
		}
	}
	if w := m.Weida; w != "" {
		if w[len(w)-1] != '.' {
			return nil, refuse(name, w, w, RuleMountBoundary,
				"the weida prefix must end at a segment boundary, with '.'", "write "+strconv.Quote(w+"."))
		}
		mp.wparent = w[:len(w)-1]
		if mp.wparent == "" || mp.wparent[len(mp.wparent)-1] == '.' {
			return nil, refuse(name, w, w, RuleMountEmptyJoint,
				"the weida prefix ends with an empty segment, which would make its parent an empty segment", "drop the trailing empty segment")
		}
		if r := checkWeidaTopic(name, w, w); r != nil {
			return nil, r
		}
		if i := strings.IndexAny(w, "*#"); i >= 0 {
			return nil, refuse(name, w, around(w, i, '.'), RuleMountWildcard,
				"the weida prefix holds '*' or '#', a wildcard or invalid in the weida filters it begins",
				"write the prefix with literal segments only; to mount several subtrees, use one resource for each")
		}
	}
	return mp, nil
}

func asRefusal(err error) *Refusal {
	if err == nil {
		return nil
	}
	r, _ := err.(*Refusal)
	if r == nil {
		r = &Refusal{Rule: RuleWeidaInvalid, Reason: err.Error()}
	}
	return r
}

// Mount returns the mount m applies.
func (m *Mounted) Mount() Mount { return m.m }

// Policy returns the wrapped policy.
func (m *Mounted) Policy() Policy { return m.p }

func (m *Mounted) Name() string       { return m.p.Name() }
func (m *Mounted) Protocol() Protocol { return m.p.Protocol() }
func (m *Mounted) Grammar() Grammar   { return m.p.Grammar() }

// Admit is the wrapped policy's. Under a foreign prefix every accepted
// filter starts with a literal level, so MQTT's '$' exclusion never applies
// and Admit is true for them.
func (m *Mounted) Admit(foreignFilter, foreignTopic string) bool {
	return m.p.Admit(foreignFilter, foreignTopic)
}

func (m *Mounted) AdmitRule() string { return m.p.AdmitRule() }

// rename makes a refusal of a part of input a refusal of input.
func (m *Mounted) rename(err error, input string) error {
	r := asRefusal(err)
	r.Policy, r.Input = m.Name(), input
	if !strings.Contains(input, r.Part) {
		r.Part = input
	}
	return r
}

// outside refuses input, which lies (or may select topics) outside the
// subtree named by prefix; what says which, as the start of the reason.
func (m *Mounted) outside(input, prefix, what, hint string) error {
	return refuse(m.Name(), input, input, RuleMountOutside,
		what+" outside the mounted subtree "+strconv.Quote(prefix), hint)
}

// ConvertFilter converts a foreign filter that selects only topics inside
// the mount: the foreign parent itself, or a filter that starts with the
// foreign prefix. The rest converts under the wrapped policy and follows
// the weida prefix; an empty rest (MQTT "f/", AMQP "f.") is one empty level
// and becomes one empty segment. A filter that could select a topic outside
// (MQTT '#' or '+/x' under "factory/") is refused with [RuleMountOutside].
//
// Its branches are the ways a filter can stand to the foreign prefix (no
// prefix, the parent itself, under it, outside it), then the two special
// weida results ("#" and the empty rest); the mount property test proves
// them together, so they stay in one place.
func (m *Mounted) ConvertFilter(f string) (string, error) {
	name := m.Name()
	if m.m.Foreign == "" && m.m.Weida == "" {
		return m.p.ConvertFilter(f)
	}
	if m.m.Foreign != "" {
		if r := asRefusal(m.Grammar().ValidateFilter(f)); r != nil {
			return "", withPolicy(r, name)
		}
	}
	rest, c := f, ""
	switch {
	case m.m.Foreign == "":
	case f == m.fparent:
		if m.m.Weida == "" {
			return "", m.parentless(f)
		}
		return m.wparent, nil
	case strings.HasPrefix(f, m.m.Foreign):
		rest = f[len(m.m.Foreign):]
	default:
		return "", m.outside(f, m.m.Foreign, "the filter may select topics", "start the filter with "+strconv.Quote(m.m.Foreign)+", or filter on "+strconv.Quote(m.fparent)+" itself")
	}
	switch {
	case m.m.Foreign != "" && rest == "":
		// One empty level: one empty segment.
	case m.m.Foreign != "":
		out, err := m.convertRest(rest)
		if err != nil {
			return "", m.rename(err, f)
		}
		c = out
	default:
		out, err := m.p.ConvertFilter(rest)
		if err != nil {
			return "", m.rename(err, f)
		}
		c = out
	}
	if c == "#" {
		switch {
		case m.m.Foreign == "":
			// No foreign topic is the weida parent: select one or more
			// segments below it, not the parent.
			c = "*.#"
		case m.m.Weida == "":
			return "", m.parentless(f)
		}
	}
	if c == "" && m.m.Weida == "" {
		return "", refuse(name, f, f, RuleMountEmptyRest,
			"the filter selects one empty level below the prefix, which is weida's topic \"\"; no weida filter selects only that (the empty filter selects everything)",
			"give the mount a weida prefix")
	}
	out := m.m.Weida + c
	if len(out) > topic.MaxLen {
		return "", refuse(name, f, f, RuleFilterTooLong,
			"under the weida prefix the filter would be "+strconv.Itoa(len(out))+" bytes; weida carries at most 256",
			"shorten the filter or the weida prefix")
	}
	if err := checkWeidaFilter(name, f, out); err != nil {
		return "", err
	}
	return out, nil
}

// convertRest converts what follows the foreign prefix in a filter. The
// rest is never the start of a foreign filter, but a policy may read a
// filter's first level specially (MQTT reads a leading $share as a shared
// subscription, where inside a filter it is a literal level). So the rest
// is converted behind a literal level, which is then dropped again. Where
// the rest alone is refused too, or converts to a filter the literal level
// would push past weida's 256 bytes, the rest alone decides; a rest that
// is valid only at the start of a filter is refused.
func (m *Mounted) convertRest(rest string) (string, error) {
	const lit = "x"
	out, err := m.p.ConvertFilter(lit + string(m.sep) + rest)
	if err == nil && strings.HasPrefix(out, lit+".") {
		return out[len(lit)+1:], nil
	}
	direct, derr := m.p.ConvertFilter(rest)
	if derr != nil || err == nil || len(direct)+len(lit)+1 > topic.MaxLen {
		return direct, derr
	}
	return "", err
}

// parentless refuses a filter that selects the foreign parent when it has
// no weida form. The hint selects everything below the parent with the
// grammar's own wildcards, asking the grammar whether its multi-level
// wildcard also selects the parent (MQTT '#' and AMQP '#' do, NATS '>'
// does not).
func (m *Mounted) parentless(f string) error {
	sep := string(m.sep)
	one, many := m.Grammar().Wildcards()
	below := m.m.Foreign + many
	if m.Grammar().Match(below, m.fparent) {
		below = m.m.Foreign + one + sep + many
	}
	return refuse(m.Name(), f, f, RuleMountParent,
		"the filter selects "+strconv.Quote(m.fparent)+", the foreign prefix's parent, which has no weida form when the weida prefix is empty",
		"select only what is below it, e.g. "+strconv.Quote(below))
}

// TopicToWeida converts a foreign topic inside the mount: the parent
// becomes the weida parent, prefix+rest becomes the weida prefix followed by
// the wrapped policy's conversion of rest. A topic outside is refused with
// [RuleMountOutside].
func (m *Mounted) TopicToWeida(t string) (string, error) {
	name := m.Name()
	if m.m.Foreign == "" && m.m.Weida == "" {
		return m.p.TopicToWeida(t)
	}
	rest, c := t, ""
	if m.m.Foreign != "" {
		if r := asRefusal(m.Grammar().ValidateTopic(t)); r != nil {
			return "", withPolicy(r, name)
		}
		switch {
		case t == m.fparent:
			if m.m.Weida == "" {
				return "", refuse(name, t, t, RuleMountParent,
					"the foreign prefix's parent has no weida form when the weida prefix is empty", "")
			}
			return m.wparent, nil
		case strings.HasPrefix(t, m.m.Foreign):
			rest = t[len(m.m.Foreign):]
		default:
			return "", m.outside(t, m.m.Foreign, "the topic is", "")
		}
	}
	if m.m.Foreign == "" || rest != "" {
		out, err := m.p.TopicToWeida(rest)
		if err != nil {
			return "", m.rename(err, t)
		}
		c = out
	}
	out := m.m.Weida + c
	if len(out) > topic.MaxLen {
		return "", refuse(name, t, t, RuleTopicTooLong,
			"under the weida prefix the topic would be "+strconv.Itoa(len(out))+" bytes; weida carries at most 256", "")
	}
	return out, nil
}

// TopicFromWeida converts a weida topic inside the mount back: the weida
// parent becomes the foreign parent, prefix+rest the foreign prefix
// followed by the wrapped policy's conversion of rest. The result must be a
// valid foreign topic as a whole (MQTT level count, AMQP length, NATS empty
// tokens). A topic outside is refused with [RuleMountOutside].
func (m *Mounted) TopicFromWeida(w string) (string, error) {
	name := m.Name()
	if m.m.Foreign == "" && m.m.Weida == "" {
		return m.p.TopicFromWeida(w)
	}
	if r := checkWeidaTopic(name, w, w); r != nil {
		return "", r
	}
	rest := w
	if m.m.Weida != "" {
		switch {
		case w == m.wparent:
			if m.m.Foreign == "" {
				return "", refuse(name, w, w, RuleMountParent,
					"the weida prefix's parent has no foreign form when the foreign prefix is empty", "")
			}
			return m.fparent, nil
		case strings.HasPrefix(w, m.m.Weida):
			rest = w[len(m.m.Weida):]
		default:
			return "", m.outside(w, m.m.Weida, "the topic is", "")
		}
	}
	if m.m.Foreign == "" {
		out, err := m.p.TopicFromWeida(rest)
		if err != nil {
			return "", m.rename(err, w)
		}
		return out, nil
	}
	c := ""
	if rest != "" {
		out, err := m.p.TopicFromWeida(rest)
		if err != nil {
			return "", m.rename(err, w)
		}
		c = out
	}
	out := m.m.Foreign + c
	if r := asRefusal(m.Grammar().ValidateTopic(out)); r != nil {
		r.Policy, r.Input, r.Part = name, w, ""
		return "", r
	}
	return out, nil
}

// Losses are the wrapped policy's under the mount
// ([Policy.LossesUnder]): the policy knows which of its losses the
// prefixes make impossible (MQTT's empty topic and '$' topics under a
// foreign prefix) or possible (AMQP keys pushed past weida's 256 bytes by a
// longer weida prefix).
func (m *Mounted) Losses(dir Direction, opts Options) []Loss {
	return m.p.LossesUnder(m.m, dir, opts)
}

// LossesUnder is Losses: a Mounted already carries its mount, and mounting
// it again is not a mount of the wrapped policy.
func (m *Mounted) LossesUnder(_ Mount, dir Direction, opts Options) []Loss {
	return m.Losses(dir, opts)
}

// LossFor is the wrapped policy's: no mount rule refuses a topic that a
// route of the same Mounted selects.
func (m *Mounted) LossFor(rule string) (Loss, bool) { return m.p.LossFor(rule) }
