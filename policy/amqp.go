package policy

import (
	"strconv"
	"strings"
)

// AMQPMaxLen is the longest AMQP 0-9-1 routing or binding key in bytes (a
// shortstr).
const AMQPMaxLen = 255

// AMQPGrammar returns the grammar of RabbitMQ's topic exchange (AMQP 0-9-1):
// keys are words separated by '.'; words may be empty; in a binding key a
// whole word '*' matches exactly one word and a whole word '#' matches zero
// or more words, in any position. The empty key is zero words (not one
// empty word): only a binding made solely of '#' words, or the empty
// binding, matches the empty routing key, and the empty binding matches
// nothing else. Keys are at most 255 bytes; RabbitMQ accepts every other
// byte string, so there are no other rules.
//
// The grammar is stateless and safe for concurrent use.
func AMQPGrammar() Grammar { return amqpGrammar{} }

type amqpGrammar struct{}

func (amqpGrammar) Protocol() Protocol { return AMQP }

func (amqpGrammar) Separator() byte               { return '.' }
func (amqpGrammar) Wildcards() (one, many string) { return "*", "#" }

func (amqpGrammar) ValidateFilter(f string) error {
	if r := validateAMQP(f, true); r != nil {
		return r
	}
	return nil
}

func (amqpGrammar) ValidateTopic(t string) error {
	if r := validateAMQP(t, false); r != nil {
		return r
	}
	return nil
}

func validateAMQP(s string, binding bool) *Refusal {
	if len(s) > AMQPMaxLen {
		kind := "routing key"
		if binding {
			kind = "binding key"
		}
		return refuse(string(AMQP), s, s, RuleAMQPTooLong,
			"an AMQP "+kind+" is a shortstr of at most 255 bytes, this one is "+strconv.Itoa(len(s)), "")
	}
	return nil
}

// Match matches words with the greedy wildcard algorithm: it remembers the
// last '#' seen and, on a mismatch, lets that '#' swallow one more word and
// retries from there. That is exact for one "zero or more" and one "exactly
// one" wildcard, runs in O(len(filter)·len(topic)) at worst, and allocates
// nothing. Positions are byte offsets; a key's end is marked by len+1, so
// that "" (zero words) and "a." (two words, the last empty) differ.
func (amqpGrammar) Match(filter, topic string) bool {
	fEnd, tEnd := len(filter)+1, len(topic)+1
	fi, ti := 0, 0
	if filter == "" {
		fi = fEnd
	}
	if topic == "" {
		ti = tEnd
	}
	starF, markT := -1, 0 // word after the last '#', and the topic word it resumes at
	for ti < tEnd {
		if fi < fEnd {
			fe := nextSep(filter, fi, '.')
			pat := filter[fi:fe]
			fn := fe + 1 // the next word, or fEnd
			if pat == "#" {
				starF, markT = fn, ti
				fi = fn
				continue
			}
			te := nextSep(topic, ti, '.')
			if pat == "*" || pat == topic[ti:te] {
				fi, ti = fn, te+1
				continue
			}
		}
		if starF < 0 {
			return false
		}
		// Let the last '#' take the word at markT too.
		markT = nextSep(topic, markT, '.') + 1
		fi, ti = starF, markT
	}
	// The topic is exhausted: what is left of the filter must be '#' words.
	for fi < fEnd {
		fe := nextSep(filter, fi, '.')
		if filter[fi:fe] != "#" {
			return false
		}
		fi = fe + 1
	}
	return true
}

// amqpWords implements amqp-words/v1: words are segments and keys are
// unchanged, except that a run of wildcard words holding a '#' is rewritten
// to the equal run of '*' words followed by one final '#'.
type amqpWords struct{}

func (amqpWords) Name() string       { return AMQPWords }
func (amqpWords) Protocol() Protocol { return AMQP }
func (amqpWords) Grammar() Grammar   { return amqpGrammar{} }

// ConvertFilter refuses the empty binding key, words that mix wildcard
// characters with others, and a '#' followed (after any '*' and '#' words)
// by a literal word. It rewrites a run of '*' and '#' words that holds a
// '#' into k '*' words and a final '#', k being the run's number of '*':
// both select exactly the word sequences of k or more words. With the run
// at the end, the result is a valid weida filter.
//
// Exactness holds over every routing key the policy converts, that is every
// key but "": for such a key, AMQP's words are weida's segments. On "" the
// two sides differ (AMQP: zero words; weida: one empty segment), which is
// why TopicToWeida and TopicFromWeida refuse it.
func (amqpWords) ConvertFilter(f string) (string, error) {
	if r := validateAMQP(f, true); r != nil {
		return "", withPolicy(r, AMQPWords)
	}
	if f == "" {
		return "", refuse(AMQPWords, f, "", RuleAMQPEmptyBindingKey,
			"the empty binding key selects only the empty routing key, and no weida filter selects only that (weida's empty filter selects everything)",
			"the empty routing key is not carried anyway; bind a non-empty key")
	}
	needRewrite := false
	runStart, inRun, runHasHash := 0, false, false
	for i := 0; ; {
		e := nextSep(f, i, '.')
		w := f[i:e]
		switch {
		case w == "*" || w == "#":
			if !inRun {
				runStart, inRun, runHasHash = i, true, false
			}
			if w == "#" {
				runHasHash = true
				if e != len(f) {
					needRewrite = true
				}
			}
		case strings.ContainsAny(w, "*#"):
			return "", refuse(AMQPWords, f, w, RuleAMQPWildcardMix,
				"the word mixes '*' or '#' with other characters: literal in AMQP, an invalid filter in weida", "")
		default:
			if inRun && runHasHash {
				return "", refuse(AMQPWords, f, f[runStart:e], RuleAMQPHashThenLiteral,
					"a literal word follows '#': AMQP '#' may match any number of words before it, weida's '#' must be last",
					"bind the prefix with a final '#' and filter the rest downstream, or bind each depth with '*'")
			}
			inRun = false
		}
		if e == len(f) {
			break
		}
		i = e + 1
	}
	out := f
	if needRewrite {
		// Only the last run holds '#' (any other was refused above), and
		// it ends the key.
		stars := 0
		for i := runStart; ; {
			e := nextSep(f, i, '.')
			if f[i:e] == "*" {
				stars++
			}
			if e == len(f) {
				break
			}
			i = e + 1
		}
		var b strings.Builder
		b.Grow(runStart + 2*stars + 1)
		b.WriteString(f[:runStart])
		for range stars {
			b.WriteString("*.")
		}
		b.WriteByte('#')
		out = b.String()
	}
	if err := checkWeidaFilter(AMQPWords, f, out); err != nil {
		return "", err
	}
	return out, nil
}

func (amqpWords) TopicToWeida(t string) (string, error) {
	if r := validateAMQP(t, false); r != nil {
		return "", withPolicy(r, AMQPWords)
	}
	if t == "" {
		return "", refuse(AMQPWords, t, "", RuleAMQPEmptyRoutingKey,
			"the empty routing key is zero words in AMQP but one empty segment in weida, where '*' would select it", "")
	}
	if r := checkWeidaTopic(AMQPWords, t, t); r != nil {
		return "", r
	}
	return t, nil
}

func (amqpWords) TopicFromWeida(w string) (string, error) {
	if r := checkWeidaTopic(AMQPWords, w, w); r != nil {
		return "", r
	}
	if w == "" {
		return "", refuse(AMQPWords, w, "", RuleAMQPEmptyRoutingKey,
			"the empty weida topic is one empty segment, but the empty routing key is zero words in AMQP, where '*' would not select it", "")
	}
	if r := validateAMQP(w, false); r != nil {
		return "", withPolicy(r, AMQPWords)
	}
	return w, nil
}

func (amqpWords) Admit(string, string) bool { return true }
func (amqpWords) AdmitRule() string         { return "" }

func (p amqpWords) Losses(dir Direction, opts Options) []Loss {
	return p.LossesUnder(Mount{}, dir, opts)
}

// LossesUnder accounts for what a mount does to lengths and to the empty
// routing key. Routing keys convert unchanged, so a key of f bytes under
// the foreign prefix F is a weida topic of f-len(F)+len(W) bytes under the
// weida prefix W: inbound, a 255-byte key passes weida's 256 bytes only
// when W is two or more bytes longer than F; outbound, a 256-byte weida
// topic fits AMQP's 255 whenever W is longer than F. Under a foreign
// prefix the empty key is outside the mount (an empty rest is one empty
// word, which both sides carry).
func (amqpWords) LossesUnder(m Mount, dir Direction, _ Options) []Loss {
	ls := []Loss{LossOrdering, LossDeliveryBestEffort}
	if m.Foreign == "" {
		ls = append(ls, LossEmptyRoutingKey)
	}
	grow := len(m.Weida) - len(m.Foreign)
	switch dir {
	case Inbound:
		ls = append(ls, LossProperties, LossExpiry, LossReplyTo, LossNonUTF8Names)
		if grow >= 2 {
			ls = append(ls, LossTopicLength)
		}
	case Outbound:
		if grow <= 0 {
			ls = append(ls, LossTopicLength)
		}
	default:
		return nil
	}
	return lossSet(ls...)
}

func (amqpWords) LossFor(rule string) (Loss, bool) { return LossForRule(rule) }
