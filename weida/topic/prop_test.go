package topic

import (
	"errors"
	"testing"

	"pgregory.net/rapid"
)

// TestMatchAgreesWithReference checks Match against the naive split-and-
// compare matcher on filters and topics biased to the grammar's edges.
func TestMatchAgreesWithReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var f string
		if rapid.Bool().Draw(t, "structured") {
			f = genFilter(t, "filter")
		} else {
			f = genAny(t, "filter")
		}
		var tp string
		if rapid.Bool().Draw(t, "from-filter") {
			tp = genTopic(t, "topic", f)
		} else {
			tp = genAny(t, "topic")
		}
		got := Match(f, tp) // must not panic, valid filter or not
		if refValid(f) {
			if want := refMatch(f, tp); got != want {
				t.Fatalf("Match(%q, %q) = %v, reference says %v", f, tp, got, want)
			}
		}
	})
}

// TestValidateFilterAgreesWithReference checks that ValidateFilter accepts
// exactly the filters the reference grammar, the length limit and UTF-8
// allow, and that a refusal names a segment that really breaks its rule.
func TestValidateFilterAgreesWithReference(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		var f string
		switch rapid.IntRange(0, 2).Draw(t, "kind") {
		case 0:
			f = genFilter(t, "filter")
		case 1:
			f = genAny(t, "filter")
		default:
			f = genTopic(t, "filter", genFilter(t, "base")) // wildcard bytes inside segments
		}
		checkValidate(t, f)
	})
}

// checkValidate is the property shared by the rapid test and the fuzz target.
func checkValidate(t interface{ Fatalf(string, ...any) }, f string) {
	err := ValidateFilter(f)
	if want := refAccepts(f); (err == nil) != want {
		t.Fatalf("ValidateFilter(%q) = %v, reference accepts: %v", f, err, want)
	}
	if err == nil {
		return
	}
	var fe *FilterError
	if !errors.As(err, &fe) || fe.Filter != f {
		t.Fatalf("ValidateFilter(%q) = %#v, want a *FilterError for the input", f, err)
	}
	segs := splitDots(f)
	switch fe.Rule {
	case RuleTooLong, RuleInvalidUTF8:
		if fe.Segment != -1 {
			t.Fatalf("ValidateFilter(%q): %s names segment %d", f, fe.Rule, fe.Segment)
		}
		return
	}
	if fe.Segment < 0 || fe.Segment >= len(segs) {
		t.Fatalf("ValidateFilter(%q): segment %d out of range", f, fe.Segment)
	}
	// Every segment before the named one is fine on its own.
	if !refValid(joinDots(segs[:fe.Segment])) {
		t.Fatalf("ValidateFilter(%q) names segment %d, an earlier one is already wrong", f, fe.Segment)
	}
	s, last := segs[fe.Segment], fe.Segment == len(segs)-1
	var broken bool
	switch fe.Rule {
	case RuleStarNotAlone:
		broken = s != "*" && contains(s, '*')
	case RuleHashNotAlone:
		broken = s != "#" && contains(s, '#')
	case RuleHashNotFinal:
		broken = s == "#" && !last
	}
	if !broken {
		t.Fatalf("ValidateFilter(%q): segment %d (%q) does not break %s", f, fe.Segment, s, fe.Rule)
	}
}

func splitDots(s string) []string {
	var out []string
	for {
		i := 0
		for i < len(s) && s[i] != '.' {
			i++
		}
		out = append(out, s[:i])
		if i == len(s) {
			return out
		}
		s = s[i+1:]
	}
}

func joinDots(segs []string) string {
	out := ""
	for i, s := range segs {
		if i > 0 {
			out += "."
		}
		out += s
	}
	return out
}

func contains(s string, b byte) bool {
	for i := 0; i < len(s); i++ {
		if s[i] == b {
			return true
		}
	}
	return false
}
