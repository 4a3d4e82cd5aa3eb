// Package topic implements weida's segmented topic grammar: topics and
// filters cut at '.', where a filter segment '*' matches exactly one segment
// and a final '#' matches zero or more. Every other byte is literal: there
// are no escapes and no case folding, and a topic is never a pattern.
//
// The rules are those of weida's PROTOCOL §6.4 and decision 0007. [Match]
// tests one filter in one left-to-right pass with no backtracking and no
// allocation; [Index] holds many filters and finds those a topic selects
// without testing each.
package topic

import (
	"fmt"
	"strings"
)

// MaxLen is the largest topic or filter, in bytes, that weida carries
// (PROTOCOL §6.2 key 5 and §6.4 key 1).
const MaxLen = 256

// Rule names a grammar rule a filter or topic broke. The values are stable:
// they appear in logs, metrics and the JSON of the command line.
type Rule string

const (
	RuleTooLong      Rule = "too-long"       // more than MaxLen bytes
	RuleInvalidUTF8  Rule = "invalid-utf8"   // weida carries topics as CBOR text
	RuleStarNotAlone Rule = "star-not-alone" // '*' shares its segment with other bytes
	RuleHashNotAlone Rule = "hash-not-alone" // '#' shares its segment with other bytes
	RuleHashNotFinal Rule = "hash-not-final" // '#' is a whole segment but not the last one
)

// FilterError reports why a filter or topic is not valid weida.
type FilterError struct {
	Filter  string // the whole input
	Segment int    // zero-based index of the offending segment, -1 when the whole input is at fault
	Rule    Rule
}

func (e *FilterError) Error() string {
	if e.Segment < 0 {
		return fmt.Sprintf("topic: %q: %s", e.Filter, e.Rule)
	}
	return fmt.Sprintf("topic: %q: segment %d: %s", e.Filter, e.Segment, e.Rule)
}

// ValidateFilter reports whether f is a legal weida filter. The empty filter
// is legal and matches every topic. A refusal is a [*FilterError] naming the
// first offending segment and the rule it breaks, or segment -1 when f is too
// long or not UTF-8.
func ValidateFilter(f string) error {
	if len(f) > MaxLen {
		return &FilterError{Filter: f, Segment: -1, Rule: RuleTooLong}
	}
	if !utf8Valid(f) {
		return &FilterError{Filter: f, Segment: -1, Rule: RuleInvalidUTF8}
	}
	seg, start := 0, 0
	for i := 0; i <= len(f); i++ {
		if i < len(f) && f[i] != '.' {
			continue
		}
		s := f[start:i]
		last := i == len(f)
		if strings.IndexByte(s, '*') >= 0 && s != "*" {
			return &FilterError{Filter: f, Segment: seg, Rule: RuleStarNotAlone}
		}
		if strings.IndexByte(s, '#') >= 0 {
			if s != "#" {
				return &FilterError{Filter: f, Segment: seg, Rule: RuleHashNotAlone}
			}
			if !last {
				return &FilterError{Filter: f, Segment: seg, Rule: RuleHashNotFinal}
			}
		}
		seg++
		start = i + 1
	}
	return nil
}

// ValidateTopic reports whether t can be carried as a weida topic: at most
// MaxLen bytes of valid UTF-8. Every other byte string is a topic; '*' and '#'
// in it are ordinary bytes.
func ValidateTopic(t string) error {
	if len(t) > MaxLen {
		return &FilterError{Filter: t, Segment: -1, Rule: RuleTooLong}
	}
	if !utf8Valid(t) {
		return &FilterError{Filter: t, Segment: -1, Rule: RuleInvalidUTF8}
	}
	return nil
}

// Match reports whether filter selects topic.
//
// The filter must be valid (see [ValidateFilter]); for an invalid filter the
// answer is unspecified, but Match never panics. The topic is any byte
// string: '*' and '#' in it are ordinary bytes. The empty filter and the
// filter "#" match every topic, including the empty one.
//
// Match is a single left-to-right pass over both strings with no backtracking
// and no allocation.
func Match(filter, topic string) bool {
	if filter == "" {
		return true
	}
	// By validity a '#' can only be the whole last segment, so a filter that
	// contains one ends with it. Strip ".#" and remember that the topic may
	// go on after what the rest of the filter matches.
	rest := false
	if filter[len(filter)-1] == '#' {
		if len(filter) == 1 {
			return true
		}
		filter = filter[:len(filter)-2]
		rest = true
	}
	// filter is what is left to match (empty, or starting at a segment or
	// at the '.' before one); ti is the offset in topic it must match from,
	// at the same kind of boundary.
	ti := 0
	for {
		// If the rest of the filter equals the topic's bytes and both end at
		// a boundary, it matches: literal segments are equal, and each '*'
		// meets a topic segment "*", which it matches. This settles a
		// literal filter, or the tail after a '*', in one comparison, and
		// the length test makes most misses free.
		if r := len(topic) - ti; (r == len(filter) || rest && r > len(filter) && topic[ti+len(filter)] == '.') &&
			topic[ti:ti+len(filter)] == filter {
			return true
		}
		s := strings.IndexByte(filter, '*')
		if s < 0 {
			return false // a literal rest matches only by equality
		}
		// filter[:s] is literal: empty, or ending with '.'. filter[s] is a
		// whole '*' segment and takes one topic segment, possibly empty.
		if len(topic)-ti < s || topic[ti:ti+s] != filter[:s] {
			return false
		}
		ti += s
		if e := strings.IndexByte(topic[ti:], '.'); e < 0 {
			ti = len(topic)
		} else {
			ti += e
		}
		filter = filter[s+1:]
		if filter == "" {
			return ti == len(topic) || rest && topic[ti] == '.'
		}
	}
}
