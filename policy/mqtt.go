package policy

import (
	"strconv"
	"strings"
	"unicode/utf8"

	"weida.dev/connector/weida/topic"
)

// MQTT limits.
const (
	// MQTTMaxLen is the longest MQTT topic name or filter in bytes (MQTT 5
	// §1.5.4: a UTF-8 string has a two-byte length).
	MQTTMaxLen = 65535
	// MQTTMaxLevels is the most levels Mosquitto 2.0.11 accepts in a name
	// or filter (200 separators). The MQTT 5 specification sets no limit,
	// but a longer PUBLISH or SUBSCRIBE makes Mosquitto close the whole
	// connection, so the grammar refuses it.
	MQTTMaxLevels = 201
)

// MQTTGrammar returns the MQTT 5 topic grammar: '/' separates levels, which
// may be empty; '+' matches exactly one level; '#' matches the parent level
// and every level below it and must be last; wildcards must fill their
// level; a filter that starts with '+' or '#' never matches a topic that
// starts with '$'. Names and filters are 1 to 65,535 bytes of UTF-8 without
// U+0000, with at most [MQTTMaxLevels] levels. A shared subscription
// ($share/group/filter) is refused: the group is a subscription option, and
// only the inner filter is a filter.
//
// The grammar is stateless and safe for concurrent use.
func MQTTGrammar() Grammar { return mqttGrammar{} }

type mqttGrammar struct{}

func (mqttGrammar) Protocol() Protocol { return MQTT }

func (mqttGrammar) Separator() byte               { return '/' }
func (mqttGrammar) Wildcards() (one, many string) { return "+", "#" }

func (mqttGrammar) ValidateFilter(f string) error {
	if r := validateMQTT(f, true); r != nil {
		return r
	}
	return nil
}

func (mqttGrammar) ValidateTopic(t string) error {
	if r := validateMQTT(t, false); r != nil {
		return r
	}
	return nil
}

// Match follows MQTT 5 §4.7, including §4.7.2: a filter that starts with a
// wildcard does not match a topic that starts with '$'. That exclusion is
// the only difference between this Match and the level-by-level grammar;
// [Policy.Admit] states it on its own.
func (mqttGrammar) Match(filter, topic string) bool {
	return mqttAdmit(filter, topic) && mqttLevelMatch(filter, topic)
}

// mqttAdmit is MQTT 5 §4.7.2.
func mqttAdmit(filter, topic string) bool {
	if filter != "" && (filter[0] == '+' || filter[0] == '#') {
		return topic == "" || topic[0] != '$'
	}
	return true
}

// mqttLevelMatch walks filter and topic level by level, once, without
// allocating. The filter must be valid.
func mqttLevelMatch(filter, topic string) bool {
	fi, ti := 0, 0
	for {
		fe := nextSep(filter, fi, '/')
		pat := filter[fi:fe]
		if pat == "#" {
			return true // '#' is last by validity and includes the parent
		}
		if ti > len(topic) {
			return false // no level left
		}
		te := nextSep(topic, ti, '/')
		if pat != "+" && pat != topic[ti:te] {
			return false
		}
		if fe == len(filter) {
			return te == len(topic)
		}
		fi, ti = fe+1, te+1
	}
}

// validateMQTT checks a name (filter false) or a filter against the MQTT 5
// rules and Mosquitto's level limit. The refusal names the grammar "mqtt";
// policies rename it.
func validateMQTT(s string, filter bool) *Refusal {
	const who = string(MQTT)
	kind := "topic name"
	if filter {
		kind = "filter"
	}
	switch {
	case s == "":
		return refuse(who, s, "", RuleMQTTEmpty, "an MQTT "+kind+" is at least one character long", "")
	case len(s) > MQTTMaxLen:
		return refuse(who, s, s, RuleMQTTTooLong,
			"an MQTT "+kind+" is at most 65535 bytes, this one is "+strconv.Itoa(len(s)), "")
	case !utf8.ValidString(s):
		return refuse(who, s, s, RuleMQTTInvalidUTF8, "an MQTT "+kind+" is UTF-8 text", "")
	case strings.IndexByte(s, 0) >= 0:
		return refuse(who, s, s, RuleMQTTNul, "an MQTT "+kind+" must not contain U+0000", "")
	case filter && strings.HasPrefix(s, "$share/"):
		return refuse(who, s, "$share/", RuleMQTTShared,
			"a shared subscription ($share/group/filter) is not a filter: the group decides who receives a message, not which messages match",
			"write only the inner filter and set the share group in the resource (spec.broker.mqtt.sharedGroup)")
	}
	if !filter {
		// Names are checked at run time, once per message: one pass.
		levels := 1
		for i := 0; i < len(s); i++ {
			switch s[i] {
			case '/':
				levels++
			case '+', '#':
				return refuse(who, s, around(s, i, '/'), RuleMQTTWildcardInName,
					"an MQTT topic name must not contain '+' or '#'", "")
			}
		}
		return checkLevels(s, levels, kind)
	}
	levels := 0
	for i := 0; ; {
		e := nextSep(s, i, '/')
		lv := s[i:e]
		levels++
		last := e == len(s)
		if lv != "+" && strings.IndexByte(lv, '+') >= 0 {
			return refuse(who, s, lv, RuleMQTTPlusNotAlone, "'+' must fill its whole level", "")
		}
		if strings.IndexByte(lv, '#') >= 0 {
			if lv != "#" {
				return refuse(who, s, lv, RuleMQTTHashNotAlone, "'#' must fill its whole level", "")
			}
			if !last {
				return refuse(who, s, lv, RuleMQTTHashNotFinal, "'#' must be the last level", "")
			}
		}
		if last {
			break
		}
		i = e + 1
	}
	return checkLevels(s, levels, kind)
}

func checkLevels(s string, levels int, kind string) *Refusal {
	if levels > MQTTMaxLevels {
		return refuse(string(MQTT), s, s, RuleMQTTTooManyLevels,
			"the "+kind+" has "+strconv.Itoa(levels)+" levels; Mosquitto closes the connection beyond 201", "")
	}
	return nil
}

// mqttLevels implements mqtt-levels/v1 and, with escaped set,
// mqtt-levels-escaped/v1. Levels are segments: '/'↔'.', '+'↔'*', '#'↔'#'.
type mqttLevels struct{ escaped bool }

func (p mqttLevels) Name() string {
	if p.escaped {
		return MQTTLevelsEscaped
	}
	return MQTTLevels
}

func (mqttLevels) Protocol() Protocol { return MQTT }
func (mqttLevels) Grammar() Grammar   { return mqttGrammar{} }

const hintEscaped = "use policy " + MQTTLevelsEscaped + ", which escapes '%' as %25, '.' as %2E and '*' as %2A inside levels"

func (p mqttLevels) ConvertFilter(f string) (string, error) {
	name := p.Name()
	if r := validateMQTT(f, true); r != nil {
		return "", withPolicy(r, name)
	}
	extra, change := 0, false
	for i := 0; ; {
		e := nextSep(f, i, '/')
		lv := f[i:e]
		switch lv {
		case "+":
			change = true
		case "#":
		default:
			if p.escaped {
				extra += 2 * escapeCount(lv)
			} else if strings.IndexByte(lv, '.') >= 0 {
				return "", refuse(name, f, lv, RuleMQTTDottedLevel,
					"the level holds '.', which weida reads as a separator: it would become two segments", hintEscaped)
			} else if strings.IndexByte(lv, '*') >= 0 {
				return "", refuse(name, f, lv, RuleMQTTStarLevel,
					"the level holds '*', which is literal in MQTT but a wildcard (or invalid) in weida", hintEscaped)
			}
		}
		if e == len(f) {
			break
		}
		change = true // the '/' becomes '.'
		i = e + 1
	}
	if len(f)+extra > 256 {
		return "", refuse(name, f, f, RuleFilterTooLong,
			"the weida filter would be "+strconv.Itoa(len(f)+extra)+" bytes; weida carries at most 256",
			"shorten the filter or split the route")
	}
	out := f
	if change || extra > 0 {
		var b strings.Builder
		b.Grow(len(f) + extra)
		for i := 0; ; {
			e := nextSep(f, i, '/')
			switch lv := f[i:e]; {
			case lv == "+":
				b.WriteByte('*')
			case p.escaped:
				writeEscaped(&b, lv)
			default:
				b.WriteString(lv)
			}
			if e == len(f) {
				break
			}
			b.WriteByte('.')
			i = e + 1
		}
		out = b.String()
	}
	if err := checkWeidaFilter(name, f, out); err != nil {
		return "", err
	}
	return out, nil
}

func (p mqttLevels) TopicToWeida(t string) (string, error) {
	name := p.Name()
	if r := validateMQTT(t, false); r != nil {
		return "", withPolicy(r, name)
	}
	extra := 0
	if p.escaped {
		extra = 2 * escapeCount(t)
	} else if strings.IndexByte(t, '.') >= 0 {
		for i := 0; ; {
			e := nextSep(t, i, '/')
			if lv := t[i:e]; strings.IndexByte(lv, '.') >= 0 {
				return "", refuse(name, t, lv, RuleMQTTDottedLevel,
					"the level holds '.', which weida reads as a separator: the topic would collide with one that has more levels", hintEscaped)
			}
			if e == len(t) {
				break
			}
			i = e + 1
		}
	}
	if n := len(t) + extra; n > 256 {
		return "", refuse(name, t, t, RuleTopicTooLong,
			"the weida topic would be "+strconv.Itoa(n)+" bytes; weida carries at most 256", "")
	}
	if extra == 0 && strings.IndexByte(t, '/') < 0 {
		return t, nil // nothing to change
	}
	var b strings.Builder
	b.Grow(len(t) + extra)
	for i := 0; ; {
		e := nextSep(t, i, '/')
		if p.escaped {
			writeEscaped(&b, t[i:e])
		} else {
			b.WriteString(t[i:e])
		}
		if e == len(t) {
			break
		}
		b.WriteByte('.')
		i = e + 1
	}
	return b.String(), nil
}

func (p mqttLevels) TopicFromWeida(w string) (string, error) {
	name := p.Name()
	if r := checkWeidaTopic(name, w, w); r != nil {
		return "", r
	}
	if w == "" {
		return "", refuse(name, w, "", RuleMQTTEmpty,
			"the empty weida topic has no MQTT form: an MQTT topic name is at least one character long", "")
	}
	// One pass over the topic: this runs once per message.
	levels, shrink := 1, 0
	for i := 0; i < len(w); i++ {
		switch w[i] {
		case '.':
			levels++
		case '/':
			return "", refuse(name, w, around(w, i, '.'), RuleMQTTSlashSegment,
				"the segment holds '/', which MQTT reads as a level separator", "")
		case '+', '#':
			return "", refuse(name, w, around(w, i, '.'), RuleMQTTWildcardInName,
				"the segment holds '+' or '#', which MQTT forbids in a topic name", "")
		case 0:
			return "", refuse(name, w, around(w, i, '.'), RuleMQTTNul,
				"the segment holds U+0000, which MQTT forbids in a topic name", "")
		case '*':
			if p.escaped {
				return "", refuse(name, w, around(w, i, '.'), RuleMQTTEscape,
					"a bare '*' is not in the escaped form (a literal '*' is written %2A)", hintEscapedForm)
			}
		case '%':
			if p.escaped {
				if !escapeAt(w, i) {
					return "", refuse(name, w, around(w, i, '.'), RuleMQTTEscape,
						"'%' must start one of the escapes %25, %2E or %2A", hintEscapedForm)
				}
				shrink += 2
				i += 2
			}
		}
	}
	if levels > MQTTMaxLevels {
		return "", refuse(name, w, w, RuleMQTTTooManyLevels,
			"the topic has "+strconv.Itoa(levels)+" segments; Mosquitto closes the connection beyond 201 levels", "")
	}
	if levels == 1 && shrink == 0 {
		return w, nil // nothing to change
	}
	var b strings.Builder
	b.Grow(len(w) - shrink)
	for i := 0; ; {
		e := nextSep(w, i, '.')
		if p.escaped {
			writeUnescaped(&b, w[i:e])
		} else {
			b.WriteString(w[i:e])
		}
		if e == len(w) {
			break
		}
		b.WriteByte('/')
		i = e + 1
	}
	return b.String(), nil
}

const hintEscapedForm = "publish the escaped form: '%' as %25, '.' inside a level as %2E, '*' as %2A"

func (mqttLevels) Admit(foreignFilter, foreignTopic string) bool {
	return mqttAdmit(foreignFilter, foreignTopic)
}

func (mqttLevels) AdmitRule() string { return RuleMQTTDollarTopic }

func (p mqttLevels) Losses(dir Direction, opts Options) []Loss {
	return p.LossesUnder(Mount{}, dir, opts)
}

// LossesUnder leaves out, on the way to MQTT, what a mount makes
// impossible. Under a foreign prefix every MQTT topic starts with it, so
// the empty topic (empty-segments) is outside the mount, and so is every
// topic starting with '$' (dollar-topics) unless the prefix itself starts
// with '$'. A weida topic under a weida prefix of w bytes has at most
// 257-w segments, one MQTT level each after the foreign prefix's levels;
// when that cannot pass [MQTTMaxLevels], topic-length cannot occur.
func (p mqttLevels) LossesUnder(m Mount, dir Direction, opts Options) []Loss {
	ls := p.losses(dir, opts)
	if dir != Outbound {
		return ls
	}
	if m.Foreign != "" {
		ls = without(ls, LossEmptySegments)
		if m.Foreign[0] != '$' {
			ls = without(ls, LossDollarTopics)
		}
	}
	if strings.Count(m.Foreign, "/")+topic.MaxLen+1-len(m.Weida) <= MQTTMaxLevels {
		ls = without(ls, LossTopicLength)
	}
	return ls
}

func (mqttLevels) LossFor(rule string) (Loss, bool) { return LossForRule(rule) }

func (p mqttLevels) losses(dir Direction, opts Options) []Loss {
	ls := []Loss{LossOrdering, LossDeliveryBestEffort}
	if opts.QoS == 0 {
		ls = append(ls, LossAtMostOnce)
	}
	switch dir {
	case Inbound:
		ls = append(ls, LossProperties, LossExpiry, LossReplyTo, LossTopicLength)
		if !opts.LastValue {
			ls = append(ls, LossRetain)
		}
		if !p.escaped {
			ls = append(ls, LossDottedLevels)
		}
	case Outbound:
		ls = append(ls, LossSlashedSegments, LossWildcardNames, LossForbiddenChars,
			LossEmptySegments, LossTopicLength, LossDollarTopics)
		if p.escaped {
			ls = append(ls, LossUnescapedNames)
		}
	default:
		return nil
	}
	return lossSet(ls...)
}
