package topic

import "testing"

func TestMatchTable(t *testing.T) {
	cases := []struct {
		filter, topic string
		want          bool
	}{
		{"px.eur", "px.eur", true},
		{"px.*", "px.", true},
		{"px.", "px.", true},
		{"px.#", "px", true},
		{"sensors.*.temp", "sensors.a.temp", true},
		{"*.*", "px.*", true},
		{"px.#", "px.#", true},
		{"#", "", true},
		{"", "", true},
		{"", "anything.at.all", true},
		{"px.eur", "px.eur.spot", false},
		{"px.*", "px", false},
		{"px.*", "px.eur.spot", false},
		{"px.#", "pxx", false},
		{"px.*", "PX.EUR", false},
		{"px.", "px.eur", false},
		{"sensors.temp", "sensors.temperature", false},
		{"sensors.*.temp", "sensors.a.b.temp", false},
		{"a.#", "a", true},
		{"a.#", "a.b.c", true},
		{"*", "", true},
		{"*", "a.b", false},
		{"a..#", "a.", true},
		{"a..#", "a", false},
		{"a.b", "a", false},
		{"a", "a.b", false},
		{".", ".", true},
		{".", "", false},
	}
	for _, c := range cases {
		if err := ValidateFilter(c.filter); err != nil {
			t.Fatalf("ValidateFilter(%q) = %v", c.filter, err)
		}
		if got := Match(c.filter, c.topic); got != c.want {
			t.Errorf("Match(%q, %q) = %v, want %v", c.filter, c.topic, got, c.want)
		}
	}
}

func TestValidateFilterTable(t *testing.T) {
	cases := []struct {
		filter  string
		segment int
		rule    Rule
	}{
		{"a*b", 0, RuleStarNotAlone},
		{"a.b*", 1, RuleStarNotAlone},
		{"a#", 0, RuleHashNotAlone},
		{"##", 0, RuleHashNotAlone},
		{"#.a", 0, RuleHashNotFinal},
		{"a.#.b", 1, RuleHashNotFinal},
		{"a.\xff", -1, RuleInvalidUTF8},
		{string(make([]byte, MaxLen+1)), -1, RuleTooLong},
	}
	for _, c := range cases {
		err := ValidateFilter(c.filter)
		fe, ok := err.(*FilterError)
		if !ok {
			t.Errorf("ValidateFilter(%q) = %v, want *FilterError", c.filter, err)
			continue
		}
		if fe.Segment != c.segment || fe.Rule != c.rule {
			t.Errorf("ValidateFilter(%q) = segment %d rule %s, want segment %d rule %s", c.filter, fe.Segment, fe.Rule, c.segment, c.rule)
		}
	}
	for _, f := range []string{"", "*", "#", ".", "*.#", "a..#", string(make([]byte, MaxLen))} {
		if err := ValidateFilter(f); err != nil {
			t.Errorf("ValidateFilter(%q) = %v, want nil", f, err)
		}
	}
}
