package topic

import "testing"

// FuzzMatch: Match never panics, and agrees with the naive reference matcher
// whenever ValidateFilter accepts the filter.
func FuzzMatch(f *testing.F) {
	for _, c := range matchCases {
		f.Add(c.filter, c.topic)
	}
	for _, c := range validateCases {
		f.Add(c.filter, c.filter)
	}
	f.Fuzz(func(t *testing.T, filter, topic string) {
		got := Match(filter, topic)
		if ValidateFilter(filter) != nil {
			return
		}
		if want := refMatch(filter, topic); got != want {
			t.Fatalf("Match(%q, %q) = %v, reference says %v", filter, topic, got, want)
		}
	})
}

// FuzzValidateFilter: ValidateFilter accepts exactly what the reference
// grammar, the length limit and UTF-8 allow, and a refusal names the first
// segment that breaks the rule it reports.
func FuzzValidateFilter(f *testing.F) {
	for _, c := range validateCases {
		f.Add(c.filter)
	}
	for _, v := range validFilters {
		f.Add(v)
	}
	f.Fuzz(func(t *testing.T, filter string) {
		checkValidate(t, filter)
	})
}
