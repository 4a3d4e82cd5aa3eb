package cli

import "testing"

func TestSuggest(t *testing.T) {
	names := []string{"run", "check", "explain", "demo", "weida", "identity", "schema", "version"}
	for s, want := range map[string]string{
		"rnu": "run", "ru": "run", "chekc": "check", "explian": "explain", "versoin": "version",
		"idenity": "identity", "schmea": "schema", "demos": "demo",
		"xyz": "", "": "", "deploy": "", "status": "",
	} {
		if got := Suggest(s, names); got != want {
			t.Errorf("Suggest(%q) = %q, want %q", s, got, want)
		}
	}
}
