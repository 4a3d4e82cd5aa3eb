package policy

import "strings"

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

// natsTokens implements nats-tokens/v1: tokens are segments, the subject is
// unchanged in both directions.
type natsTokens struct{}

func (natsTokens) Name() string       { return NATSTokens }
func (natsTokens) Protocol() Protocol { return NATS }
func (natsTokens) Grammar() Grammar   { return natsGrammar{} }

func (natsTokens) ConvertFilter(f string) (string, error) {
	if r := validateNATS(f, true); r != nil {
		return "", withPolicy(r, NATSTokens)
	}
	for i := 0; ; {
		e := nextSep(f, i, '.')
		switch tok := f[i:e]; {
		case tok == ">":
			return "", refuse(NATSTokens, f, tok, RuleNATSOneOrMore,
				"NATS '>' matches one or more tokens, but weida's '#' matches zero or more (it also matches the parent), so no token-for-token weida filter is exact",
				"list the depths you need with '*' (for orders.> write orders.* and orders.*.*), one route each")
		case tok == "#":
			return "", refuse(NATSTokens, f, tok, RuleNATSHashToken,
				"the token '#' is literal in NATS but a wildcard in weida, which would select more subjects", "")
		case tok != "*" && strings.ContainsAny(tok, "*#"):
			return "", refuse(NATSTokens, f, tok, RuleNATSWildcardMix,
				"the token mixes '*' or '#' with other characters: literal in NATS, an invalid filter in weida", "")
		}
		if e == len(f) {
			break
		}
		i = e + 1
	}
	if err := checkWeidaFilter(NATSTokens, f, f); err != nil {
		return "", err
	}
	return f, nil
}

func (natsTokens) TopicToWeida(t string) (string, error) {
	if r := validateNATS(t, false); r != nil {
		return "", withPolicy(r, NATSTokens)
	}
	if r := checkWeidaTopic(NATSTokens, t, t); r != nil {
		return "", r
	}
	return t, nil
}

func (natsTokens) TopicFromWeida(w string) (string, error) {
	if r := checkWeidaTopic(NATSTokens, w, w); r != nil {
		return "", r
	}
	if r := validateNATS(w, false); r != nil {
		return "", withPolicy(r, NATSTokens)
	}
	if strings.IndexByte(w, '*') < 0 && strings.IndexByte(w, '>') < 0 {
		return w, nil
	}
	for i := 0; ; {
		e := nextSep(w, i, '.')
		if tok := w[i:e]; tok == "*" || tok == ">" {
			return "", refuse(NATSTokens, w, tok, RuleNATSWildcardTok,
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
