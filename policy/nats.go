package policy

import (
	"strconv"
	"strings"

	"weida.dev/connector/weida/topic"
)

// NATSGrammar returns the core NATS subject grammar as nats-server routes
// it: '.' separates tokens, which must not be empty and must not contain
// whitespace (space, tab, CR, LF, FF); in a filter, a whole token '*'
// matches exactly one token and a whole token '>' matches one or more and
// must be last. Wildcard characters anywhere else are literal.
//
// A published subject is a topic name. The server routes a published token
// '*' or '>' as a literal token (nats-server 2.9.10, probed; pedantic mode
// adds an error but still delivers), so ValidateTopic accepts them and Match
// treats them as literal; nats.go does not refuse them either. The policies
// never produce them (see RuleNATSWildcardTok). Neither the server nor this
// grammar bounds a subject's length below the 4 KiB protocol line.
//
// The grammar is stateless and safe for concurrent use.
func NATSGrammar() Grammar { return natsGrammar{} }

type natsGrammar struct{}

func (natsGrammar) Protocol() Protocol { return NATS }

func (natsGrammar) Separator() byte               { return '.' }
func (natsGrammar) Wildcards() (one, many string) { return "*", ">" }

func (natsGrammar) ValidateFilter(f string) error {
	if r := validateNATS(f, true); r != nil {
		return r
	}
	return nil
}

func (natsGrammar) ValidateTopic(t string) error {
	if r := validateNATS(t, false); r != nil {
		return r
	}
	return nil
}

// Match walks filter and topic token by token, once, without allocating.
// A subject with an empty token ("", "a.", ".a", "a..b") matches nothing:
// nats-server accepts such a publish and delivers it to nobody, not even to
// '>'.
func (natsGrammar) Match(filter, topic string) bool {
	fi, ti := 0, 0
	for {
		fe := nextSep(filter, fi, '.')
		pat := filter[fi:fe]
		if ti > len(topic) {
			return false // no token left, and every pattern needs one
		}
		if pat == ">" { // last by validity: the rest must be one or more tokens
			rest := topic[ti:]
			return rest != "" && rest[0] != '.' && rest[len(rest)-1] != '.' && !strings.Contains(rest, "..")
		}
		te := nextSep(topic, ti, '.')
		if te == ti {
			return false // an empty token
		}
		if pat != "*" && pat != topic[ti:te] {
			return false
		}
		if fe == len(filter) {
			return te == len(topic)
		}
		fi, ti = fe+1, te+1
	}
}

// validateNATS checks a subject (filter false) or a filter in one pass: it
// runs once per message.
func validateNATS(s string, filter bool) *Refusal {
	const who = string(NATS)
	start := 0 // of the current token
	for i := 0; i <= len(s); i++ {
		if i < len(s) {
			c := s[i]
			if c != '.' {
				if c <= ' ' && (c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '\f') {
					return refuse(who, s, s[start:nextSep(s, i, '.')], RuleNATSWhitespace,
						"a NATS subject must not contain whitespace, which splits the protocol line", "")
				}
				continue
			}
		}
		// The token s[start:i] ends here.
		if i == start {
			return refuse(who, s, "", RuleNATSEmptyToken,
				"a NATS subject has no empty tokens (no leading, trailing or doubled '.', and not \"\")", "")
		}
		if filter && i < len(s) && i-start == 1 && s[start] == '>' {
			return refuse(who, s, ">", RuleNATSGtNotFinal, "'>' must be the last token", "")
		}
		start = i + 1
	}
	return nil
}

// NATSTail returns nats-tokens-tail/v1: nats-tokens/v1 with one more
// exact conversion. A final '>' (one or more tokens) becomes weida's '*.#'
// (one segment, then zero or more): orders.> ↔ orders.*.# and > ↔ *.#.
// Topics convert exactly as under nats-tokens/v1, and the losses are the
// same (see [NATSTail] in docs/POLICIES.md for why no loss is added). Its
// weida filters convert back to NATS with FilterFromWeida (see
// [WeidaFilterConverter]).
//
// It is opt-in because it is not token-for-token: the weida filter has one
// segment more than the NATS filter has tokens. The value is immutable and
// safe for concurrent use.
func NATSTail() Policy { return natsTail{natsTokens{tail: true}} }

// natsTail is nats-tokens-tail/v1: natsTokens with tail set, plus the
// weida-to-NATS filter conversion that only the tail makes complete.
type natsTail struct{ natsTokens }

// WeidaFilterConverter is implemented by a [Policy] that can also convert a
// weida filter into the foreign filter selecting exactly the same converted
// topics: for every weida topic w whose foreign form TopicFromWeida(w)
// exists, topic.Match(wf, w) == Grammar().Match(FilterFromWeida(wf),
// TopicFromWeida(w)). The error is a *Refusal. Callers check for it with a
// type assertion; nats-tokens-tail/v1 implements it.
type WeidaFilterConverter interface {
	FilterFromWeida(weida string) (string, error)
}

// natsTokens implements nats-tokens/v1: tokens are segments, the subject is
// unchanged in both directions. With tail set it implements
// nats-tokens-tail/v1, which also rewrites a final '>' as '*.#'.
type natsTokens struct{ tail bool }

func (p natsTokens) Name() string {
	if p.tail {
		return NATSTokensTail
	}
	return NATSTokens
}

func (natsTokens) Protocol() Protocol { return NATS }
func (natsTokens) Grammar() Grammar   { return natsGrammar{} }

const hintTail = "use policy " + NATSTokensTail + ", which writes orders.> exactly as orders.*.# (one segment, then zero or more); or list the depths you need with '*' (orders.* and orders.*.*), one route each"

func (p natsTokens) ConvertFilter(f string) (string, error) {
	name := p.Name()
	if r := validateNATS(f, true); r != nil {
		return "", withPolicy(r, name)
	}
	gt := -1 // index of a final '>' token
	for i := 0; ; {
		e := nextSep(f, i, '.')
		switch tok := f[i:e]; {
		case tok == ">" && p.tail:
			gt = i // last by validity
		case tok == ">":
			return "", refuse(name, f, tok, RuleNATSOneOrMore,
				"NATS '>' matches one or more tokens, but weida's '#' matches zero or more (it also matches the parent), so no token-for-token weida filter is exact",
				hintTail)
		case tok == "#":
			return "", refuse(name, f, tok, RuleNATSHashToken,
				"the token '#' is literal in NATS but a wildcard in weida, which would select more subjects", "")
		case tok != "*" && strings.ContainsAny(tok, "*#"):
			return "", refuse(name, f, tok, RuleNATSWildcardMix,
				"the token mixes '*' or '#' with other characters: literal in NATS, an invalid filter in weida", "")
		}
		if e == len(f) {
			break
		}
		i = e + 1
	}
	if gt < 0 {
		if err := checkWeidaFilter(name, f, f); err != nil {
			return "", err
		}
		return f, nil
	}
	// '*' takes the one token '>' requires, '#' the rest: exact because a
	// NATS subject has no empty token, and the weida topics with an empty
	// segment that '*' would also take have no NATS form at all.
	if len(f) <= topic.MaxLen && len(f)+2 > topic.MaxLen {
		return "", refuse(name, f, f, RuleNATSTailTooLong,
			"writing the final '>' as '*.#' makes the weida filter "+strconv.Itoa(len(f)+2)+" bytes; weida carries at most 256",
			"shorten the filter by "+strconv.Itoa(len(f)+2-topic.MaxLen)+" byte(s)")
	}
	out := f[:gt] + "*.#"
	if err := checkWeidaFilter(name, f, out); err != nil {
		return "", err
	}
	return out, nil
}

// FilterFromWeida converts a weida filter into the NATS filter that selects
// exactly the weida topics that have a NATS form: a final "*.#" becomes
// '>', "#" alone becomes '>' (every NATS subject has a token), '*' stays
// '*', and literal segments stay as they are. It refuses what NATS cannot
// say: a '#' after a literal segment (zero or more: NATS needs two
// subscriptions, X and X.>), empty segments, whitespace and a literal
// segment '>'.
func (p natsTail) FilterFromWeida(w string) (string, error) {
	name := p.Name()
	if err := topic.ValidateFilter(w); err != nil {
		return "", refuse(name, w, w, RuleWeidaInvalid, "not a valid weida filter ("+err.Error()+")", "")
	}
	body, hash := w, false
	switch {
	case w == "" || w == "#":
		return ">", nil // both select every topic; each NATS subject is one
	case strings.HasSuffix(w, ".#"):
		body, hash = w[:len(w)-2], true
	}
	out := body
	if hash {
		if body != "*" && !strings.HasSuffix(body, ".*") {
			return "", refuse(name, w, "#", RuleNATSZeroOrMore,
				"weida's final '#' after a literal segment also selects the parent, and NATS has no zero-or-more wildcard",
				"subscribe to the parent and to the parent followed by '.*.#' (in NATS: X and X.>), one route each")
		}
		out = body[:len(body)-1] + ">"
	}
	for i := 0; ; {
		e := nextSep(body, i, '.')
		tok := body[i:e]
		if tok == ">" {
			return "", refuse(name, w, tok, RuleNATSWildcardTok,
				"a literal segment '>' would be a wildcard in NATS", "")
		}
		if e == len(body) {
			break
		}
		i = e + 1
	}
	if r := validateNATS(out, true); r != nil {
		r = withPolicy(r, name)
		r.Input = w
		if !strings.Contains(w, r.Part) {
			r.Part = ""
		}
		return "", r
	}
	return out, nil
}

func (p natsTokens) TopicToWeida(t string) (string, error) {
	name := p.Name()
	if r := validateNATS(t, false); r != nil {
		return "", withPolicy(r, name)
	}
	if r := checkWeidaTopic(name, t, t); r != nil {
		return "", r
	}
	return t, nil
}

func (p natsTokens) TopicFromWeida(w string) (string, error) {
	name := p.Name()
	if r := checkWeidaTopic(name, w, w); r != nil {
		return "", r
	}
	if r := validateNATS(w, false); r != nil {
		return "", withPolicy(r, name)
	}
	if strings.IndexByte(w, '*') < 0 && strings.IndexByte(w, '>') < 0 {
		return w, nil
	}
	for i := 0; ; {
		e := nextSep(w, i, '.')
		if tok := w[i:e]; tok == "*" || tok == ">" {
			return "", refuse(name, w, tok, RuleNATSWildcardTok,
				"a token '"+tok+"' is a wildcard in NATS: the docs forbid it in a published subject and pedantic servers reject it", "")
		}
		if e == len(w) {
			return w, nil
		}
		i = e + 1
	}
}

func (natsTokens) Admit(string, string) bool { return true }
func (natsTokens) AdmitRule() string         { return "" }

// LossesUnder is Losses: no NATS loss depends on where a subject starts.
// Under a foreign prefix an empty rest still makes a subject ending with
// '.', an empty token.
func (p natsTokens) LossesUnder(_ Mount, dir Direction, opts Options) []Loss {
	return p.Losses(dir, opts)
}

func (natsTokens) LossFor(rule string) (Loss, bool) { return LossForRule(rule) }

func (natsTokens) Losses(dir Direction, opts Options) []Loss {
	ls := []Loss{LossOrdering, LossDeliveryBestEffort}
	if !opts.JetStream {
		ls = append(ls, LossAtMostOnce)
	}
	switch dir {
	case Inbound:
		ls = append(ls, LossProperties, LossReplyTo, LossTopicLength, LossNonUTF8Names)
	case Outbound:
		ls = append(ls, LossEmptySegments, LossWildcardNames, LossForbiddenChars)
	default:
		return nil
	}
	return lossSet(ls...)
}
