package topic

import (
	"errors"
	"strings"
	"testing"
)

// long is a 254-byte literal filter: with ".x" appended it is exactly MaxLen.
var long = strings.Repeat("seg.", 63) + "zz"

// matchCases are the pairs of weida-wire.md §10 plus the edges of the
// grammar. They also seed FuzzMatch.
var matchCases = []struct {
	filter, topic string
	want          bool
}{
	// weida-wire.md §10, from the spec and the reference implementation.
	{"px.eur", "px.eur", true},
	{"px.*", "px.", true},
	{"px.", "px.", true},
	{"px.#", "px", true},
	{"sensors.*.temp", "sensors.a.temp", true},
	{"*.*", "px.*", true},
	{"px.#", "px.#", true},
	{"#", "", true},
	{"", "", true},
	{"px.eur", "px.eur.spot", false},
	{"px.*", "px", false},
	{"px.*", "px.eur.spot", false},
	{"px.#", "pxx", false},
	{"px.*", "PX.EUR", false},
	{"px.", "px.eur", false},
	{"px.*", "px.*", true},
	{"px.*", "px.eur", true},
	{"px.#", "px.eur", true},
	{"sensors.temp", "sensors.temperature", false},
	// '*' is one whole segment, possibly empty, never zero or two.
	{"sensors.*.temp", "sensors.a.b.temp", false},
	{"sensors.*.temp", "sensors..temp", true},
	{"sensors.*.temp", "sensors.temp", false},
	{"*", "", true},
	{"*", ".", false},
	{"*", "a.b", false},
	{"*.*", ".", true},
	{"*.*", "", false},
	{"a.*", "a.", true},
	{"a.*.", "a.b.", true},
	{"a.*.", "a.b", false},
	{"*.b", "a.b", true},
	{"*.b", "a.bb", false},
	{"*.b", "b", false},
	// '#' is zero or more trailing segments, the parent included.
	{"a.#", "a", true},
	{"a.#", "a.", true},
	{"a.#", "a.b.c", true},
	{"a.#", "ab", false},
	{"a.#", "", false},
	{"a.#", "b.a", false},
	{"#", ".", true},
	{"#", "a.b.c", true},
	{".#", "", true},
	{".#", ".a", true},
	{".#", "a", false},
	{"*.#", "", true},
	{"*.#", "a", true},
	{"*.#", "a.b", true},
	{"a..#", "a.", true},
	{"a..#", "a..b", true},
	{"a..#", "a", false},
	{"a.*.#", "a", false},
	{"a.*.#", "a.b", true},
	{"a.*.#", "a.b.c.d", true},
	// The empty filter matches everything, the empty topic is one empty segment.
	{"", "anything.at.all", true},
	{"", "*", true},
	{".", ".", true},
	{".", "", false},
	{"", ".", true},
	{"a", "", false},
	// Segment boundaries are exact in both directions.
	{"a.b", "a", false},
	{"a", "a.b", false},
	{"a.b", "a.bc", false},
	{"ab", "a.b", false},
	{"a.b", "ab", false},
	// A topic is never a pattern: its '*' and '#' are literal bytes.
	{"a.b", "a.*", false},
	{"a.b", "a.#", false},
	{"a", "#", false},
	{"*", "#", true},
	{"#", "*", true},
	// Bytes compare exactly: no case folding, no normalisation.
	{"é.*", "é.x", true},
	{"é", "e\u0301", false},
	{"日本.#", "日本.東京", true},
	{"日本.*", "日.本", false},
	// Long inputs near the 256-byte limit.
	{long + ".x", long + ".x", true},
	{long + ".*", long + ".y", true},
	{long + ".x", long + ".y", false},
	{long + ".#", long, true},
	{"*.#", long, true},
	{"seg.*.#", long, true},
}

func TestMatchTable(t *testing.T) {
	for _, c := range matchCases {
		if err := ValidateFilter(c.filter); err != nil {
			t.Fatalf("ValidateFilter(%q) = %v", c.filter, err)
		}
		if got := Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
		if ref := refMatch(c.filter, c.topic); ref != c.want {
			t.Errorf("refMatch(%q, %q) = %v, the table says %v", c.filter, c.topic, ref, c.want)
		}
	}
}

// validateCases are the filters ValidateFilter refuses, with the segment and
// rule it must name. They also seed FuzzValidateFilter.
var validateCases = []struct {
	filter  string
	segment int
	rule    Rule
}{
	{"a*b", 0, RuleStarNotAlone},
	{"a.b*", 1, RuleStarNotAlone},
	{"**", 0, RuleStarNotAlone},
	{"*a", 0, RuleStarNotAlone},
	{"a.*.b*", 2, RuleStarNotAlone},
	{"a#", 0, RuleHashNotAlone},
	{"##", 0, RuleHashNotAlone},
	{"#a", 0, RuleHashNotAlone},
	{"a.#b", 1, RuleHashNotAlone},
	{"*#", 0, RuleStarNotAlone},
	{"#.a", 0, RuleHashNotFinal},
	{"#.", 0, RuleHashNotFinal},
	{"a.#.b", 1, RuleHashNotFinal},
	{"a.#.#", 1, RuleHashNotFinal},
	{"a.\xff", -1, RuleInvalidUTF8},
	{"\xc3", -1, RuleInvalidUTF8},
	{string(make([]byte, MaxLen+1)), -1, RuleTooLong},
	{long + ".xyz", -1, RuleTooLong},
}

// validFilters are legal; the long ones are exactly MaxLen bytes.
var validFilters = []string{"", "*", "#", ".", "..", "*.#", "a..#", "*.*.*", "a.*.b.#", "é.日本", long + ".x", long + ".#", string(make([]byte, MaxLen))}

func TestValidateFilterTable(t *testing.T) {
	for _, c := range validateCases {
		err := ValidateFilter(c.filter)
		var fe *FilterError
		if !errors.As(err, &fe) {
			t.Errorf("ValidateFilter(%q) = %v, want *FilterError", c.filter, err)
			continue
		}
		if fe.Filter != c.filter || fe.Segment != c.segment || fe.Rule != c.rule {
			t.Errorf("ValidateFilter(%q) = segment %d rule %s, want segment %d rule %s", c.filter, fe.Segment, fe.Rule, c.segment, c.rule)
		}
	}
	for _, f := range validFilters {
		if err := ValidateFilter(f); err != nil {
			t.Errorf("ValidateFilter(%q) = %v, want nil", f, err)
		}
	}
}

func TestValidateTopic(t *testing.T) {
	for _, tp := range []string{"", ".", "*", "#", "a.*.#", "é", string(make([]byte, MaxLen))} {
		if err := ValidateTopic(tp); err != nil {
			t.Errorf("ValidateTopic(%q) = %v, want nil", tp, err)
		}
	}
	for _, c := range []struct {
		topic string
		rule  Rule
	}{
		{string(make([]byte, MaxLen+1)), RuleTooLong},
		{"a.\xff", RuleInvalidUTF8},
	} {
		var fe *FilterError
		if err := ValidateTopic(c.topic); !errors.As(err, &fe) || fe.Rule != c.rule || fe.Segment != -1 {
			t.Errorf("ValidateTopic(%q) = %v, want rule %s", c.topic, err, c.rule)
		}
	}
}

func TestFilterErrorMessage(t *testing.T) {
	for _, c := range []struct {
		err  *FilterError
		want string
	}{
		{&FilterError{Filter: "a.b*", Segment: 1, Rule: RuleStarNotAlone}, `topic: "a.b*": segment 1: star-not-alone`},
		{&FilterError{Filter: "a.\xff", Segment: -1, Rule: RuleInvalidUTF8}, `topic: "a.\xff": invalid-utf8`},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("Error() = %s, want %s", got, c.want)
		}
	}
}

// TestMatchAllocs proves the claim of Match's doc comment.
func TestMatchAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range matchCases {
		if n := testing.AllocsPerRun(100, func() { Match(c.filter, c.topic) }); n != 0 {
			t.Errorf("Match(%q, %q) allocates %v times", c.filter, c.topic, n)
		}
	}
}
