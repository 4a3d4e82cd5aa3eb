package policy

import (
	"errors"
	"strconv"
	"strings"

	"weida.dev/connector/weida/topic"
)

// RuleWeidaInvalid is returned only if a conversion produced a weida filter
// that weida's grammar rejects. That is a bug in this package: sending the
// filter would close the weida connection, so it is refused instead.
const RuleWeidaInvalid = "weida-invalid"

func refuse(policy, input, part, rule, reason, hint string) *Refusal {
	return &Refusal{Policy: policy, Input: input, Part: part, Rule: rule, Reason: reason, Hint: hint}
}

// checkWeidaFilter validates a converted filter against weida's grammar and
// turns a failure into a Refusal of the foreign input.
func checkWeidaFilter(policy, input, out string) error {
	err := topic.ValidateFilter(out)
	if err == nil {
		return nil
	}
	var fe *topic.FilterError
	if errors.As(err, &fe) {
		switch fe.Rule {
		case topic.RuleTooLong:
			return refuse(policy, input, input, RuleFilterTooLong,
				"the weida filter would be "+strconv.Itoa(len(out))+" bytes; weida carries at most 256",
				"shorten the filter or split the route")
		case topic.RuleInvalidUTF8:
			return refuse(policy, input, input, RuleInvalidUTF8,
				"the filter is not valid UTF-8; weida filters are text", "")
		}
	}
	return refuse(policy, input, input, RuleWeidaInvalid,
		"internal error: the conversion produced an invalid weida filter ("+err.Error()+")",
		"please report this as a bug")
}

// checkWeidaTopic refuses a topic (either the converted output of an inbound
// conversion or the input of an outbound one) that weida cannot carry.
func checkWeidaTopic(policy, input, t string) *Refusal {
	if len(t) > topic.MaxLen {
		return refuse(policy, input, input, RuleTopicTooLong,
			"the weida topic would be "+strconv.Itoa(len(t))+" bytes; weida carries at most 256", "")
	}
	if err := topic.ValidateTopic(t); err != nil {
		return refuse(policy, input, input, RuleInvalidUTF8,
			"the topic is not valid UTF-8; weida topics are text", "")
	}
	return nil
}

// withPolicy renames the refusing party of a grammar refusal to the policy
// that applied the grammar, so that the operator sees the name they wrote.
func withPolicy(r *Refusal, policy string) *Refusal {
	if r != nil {
		r.Policy = policy
	}
	return r
}

// nextSep returns the index of the next sep at or after i, or len(s).
func nextSep(s string, i int, sep byte) int {
	if j := strings.IndexByte(s[i:], sep); j >= 0 {
		return i + j
	}
	return len(s)
}

// around returns the part of s between the separators that enclose index i.
func around(s string, i int, sep byte) string {
	start := strings.LastIndexByte(s[:i], sep) + 1
	return s[start:nextSep(s, i, sep)]
}
