// Package topic implements weida's segmented topic grammar: topics and
// filters cut at '.', where a filter segment '*' matches exactly one segment
// and a final '#' matches zero or more. Every other byte is literal: there
// are no escapes and no case folding, and a topic is never a pattern.
//
// The rules are those of weida's PROTOCOL §6.4 and decision 0007. Matching is
// one left-to-right pass with no backtracking and no allocation.
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
// is legal and matches every topic.
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

// Match reports whether filter selects topic. The filter must be valid (see
// [ValidateFilter]); an invalid filter gives an unspecified answer. Match
// walks both strings once, left to right, and allocates nothing.
func Match(filter, topic string) bool {
	if filter == "" {
		return true
	}
	fi, ti := 0, 0
	for {
		// The filter has a segment at fi; find its end.
		fe := fi
		for fe < len(filter) && filter[fe] != '.' {
			fe++
		}
		pat := filter[fi:fe]
		if pat == "#" {
			return true // '#' is final by validity
		}
		if ti > len(topic) {
			return false // the topic has no segment left
		}
		te := ti
		for te < len(topic) && topic[te] != '.' {
			te++
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
