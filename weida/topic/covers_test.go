package topic

import (
	"strings"
	"testing"

	"pgregory.net/rapid"
)

func TestCovers(t *testing.T) {
	for _, c := range []struct {
		scope, filter string
		want          bool
	}{
		// A final '#' in the scope takes any further segments, none included.
		{"plant.a.#", "plant.a.x", true},
		{"plant.a.#", "plant.a", true},
		{"plant.a.#", "plant.a.*", true},
		{"plant.a.#", "plant.a.#", true},
		{"plant.a.#", "plant.a.x.#", true},
		{"plant.a.#", "plant.a.*.y.#", true},
		{"plant.a.#", "plant.#", false},
		{"plant.a.#", "#", false},
		{"plant.a.#", "", false},
		{"plant.a.#", "plant.*", false},   // plant.b
		{"plant.a.#", "plant.*.x", false}, // plant.b.x
		{"plant.a.#", "plant", false},
		{"plant.a.#", "plant.ab", false},
		// The whole namespace.
		{"#", "#", true},
		{"#", "", true},
		{"", "a.*.#", true},
		{"", "", true},
		// '#' matches the parent: "a.#" has the topic "a", which a scope
		// asking for a second segment lacks.
		{"a.*.#", "a.#", false},
		{"a.*.#", "a.*.#", true},
		{"a.*.#", "a.*", true},
		{"a.*", "a.#", false},
		{"a.*", "a.*", true},
		{"a.*", "a.x", true},
		{"a.*", "a.", true}, // '*' matches the empty segment
		{"a.*", "a", false},
		{"a.*", "a.x.y", false},
		// Every topic has at least one segment, so "*.#" is everything.
		{"*.#", "#", true},
		{"*.#", "", true},
		{"*.*.#", "#", false}, // the one-segment topics
		{"*", "#", false},
		// '*' in the filter is covered only by '*'.
		{"a.x", "a.*", false},
		{"*.x", "*.x", true},
		{"*.x", "a.x", true},
		{"*.x", "a.*", false},
		// Literals are bytes: no prefix, no case folding, empty segments count.
		{"a.b", "a.b", true},
		{"a.b", "a.B", false},
		{"a.b", "a.bc", false},
		{"a.", "a.", true},
		{"a.", "a", false},
		{"a", "a.", false},
		{".#", ".x", true},
		{".#", "x", false},
		// A scope without '#' covers a fixed length only.
		{"a.b", "a.b.#", false},
		{"a.b", "a.#", false},
		{"a", "a.#", false},
		// A topic's '*' is a byte: the filter matching it literally is "*" too.
		{"a.*", "a.*", true},
	} {
		if got := Covers(c.scope, c.filter); got != c.want {
			t.Errorf("Covers(%q, %q) = %v, want %v", c.scope, c.filter, got, c.want)
		}
		if got := CoveredBy(c.filter, []string{c.scope}); got != c.want {
			t.Errorf("CoveredBy(%q, [%q]) = %v, want %v", c.filter, c.scope, got, c.want)
		}
	}
}

func TestCoveredByUnion(t *testing.T) {
	for _, c := range []struct {
		filter string
		scopes []string
		want   bool
	}{
		{"a.x", nil, false},
		{"a.#", []string{"a", "a.*.#"}, true},          // one segment, then the rest
		{"a.#", []string{"a", "a.*", "a.*.*.#"}, true}, // lengths 1, 2, and 3 on
		{"a.#", []string{"a", "a.*.*.#"}, false},       // "a.x" falls between
		{"a.#", []string{"a.*.#"}, false},
		{"#", []string{"*", "*.*.#"}, true},
		{"#", []string{"*", "*.*"}, false},
		{"*.*", []string{"a.*", "*.b"}, false}, // "c.c"
		{"*.*", []string{"a.*", "*.*"}, true},
		{"plant.a.x", []string{"plant.b.#", "plant.a.#"}, true},
		{"plant.#", []string{"plant.a.#", "plant.b.#"}, false},
		{"a.b.#", []string{"a.b", "a.b.*", "a.*.*.*.#"}, true},
		{"a.b.#", []string{"a.b", "a.b.*", "a.c.*.*.#"}, false},
		{"a.b", []string{"a.b.#", "x"}, true},
	} {
		if got := CoveredBy(c.filter, c.scopes); got != c.want {
			t.Errorf("CoveredBy(%q, %q) = %v, want %v", c.filter, c.scopes, got, c.want)
		}
	}
}

func TestCoversAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	scopes := []string{"plant.a", "plant.a.*.#", "x.*.y"}
	if n := testing.AllocsPerRun(100, func() {
		_ = Covers("plant.a.#", "plant.a.*.b")
		_ = CoveredBy("plant.a.#", scopes)
	}); n != 0 {
		t.Fatalf("%v allocations, want 0", n)
	}
}

// fresh is a segment no generator draws, so that no scope literal equals it.
const fresh = "\x01"

// TestCoveredByProperties checks CoveredBy against Match: when it admits a
// filter, every topic the filter matches (drawn near the filter) is
// matched by a scope (soundness); when it refuses, a topic the filter
// matches and no scope matches exists, and the witness is built as the
// comment on coverage says (completeness, over topics of any length).
// Covers is CoveredBy with one scope.
func TestCoveredByProperties(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		scopes := make([]string, rapid.IntRange(0, 3).Draw(t, "scopes"))
		for i := range scopes {
			if rapid.IntRange(0, 2).Draw(t, "near") == 0 && i > 0 {
				scopes[i] = mutateFilter(t, scopes[i-1])
			} else {
				scopes[i] = genFilter(t, "scope")
			}
		}
		f := genFilter(t, "filter")
		if rapid.Bool().Draw(t, "derive") && len(scopes) > 0 {
			f = mutateFilter(t, scopes[0])
		}
		if !refValid(f) {
			t.Skip()
		}
		for _, s := range scopes {
			if !refValid(s) {
				t.Skip()
			}
		}
		got := CoveredBy(f, scopes)
		if len(scopes) == 1 && Covers(scopes[0], f) != got {
			t.Fatalf("Covers(%q, %q) = %v, CoveredBy says %v", scopes[0], f, !got, got)
		}
		if got {
			for range 8 {
				tp := genTopic(t, "topic", f)
				if refMatch(f, tp) && !anyMatch(scopes, tp) {
					t.Fatalf("CoveredBy(%q, %q) admitted, but no scope matches %q", f, scopes, tp)
				}
			}
			return
		}
		if w, ok := witness(f, scopes); !ok {
			t.Fatalf("CoveredBy(%q, %q) refused, but no witness topic exists", f, scopes)
		} else if !refMatch(f, w) || anyMatch(scopes, w) {
			t.Fatalf("witness %q is not one", w) // unreachable by construction
		}
	})
}

func anyMatch(scopes []string, tp string) bool {
	for _, s := range scopes {
		if refMatch(s, tp) {
			return true
		}
	}
	return false
}

// witness searches the topics of f built from its literals and fresh
// segments elsewhere, at every length up to one past the longest scope
// prefix, for one no scope matches. Beyond that length the scopes answer
// the same, so the search is complete.
func witness(f string, scopes []string) (string, bool) {
	fp, n, _ := shape(f)
	var lit []string
	if n > 0 {
		lit = strings.Split(fp, ".")
	}
	lo, hi := lengths(f)
	top := lo
	for _, s := range scopes {
		_, m, _ := shape(s)
		top = max(top, m+1)
	}
	for l := lo; l <= min(hi, top); l++ {
		segs := make([]string, l)
		for i := range segs {
			if i < n && lit[i] != "*" {
				segs[i] = lit[i]
			} else {
				segs[i] = fresh
			}
		}
		tp := strings.Join(segs, ".")
		if refMatch(f, tp) && !anyMatch(scopes, tp) {
			return tp, true
		}
	}
	return "", false
}

// mutateFilter draws a filter close to f: a segment widened to '*',
// narrowed to a literal, a '#' added or dropped, a segment added or cut,
// so that scopes and filters share structure and coverage is often
// nearly true.
func mutateFilter(t *rapid.T, f string) string {
	var segs []string
	if f != "" {
		segs = strings.Split(f, ".")
	}
	hash := len(segs) > 0 && segs[len(segs)-1] == "#"
	if hash {
		segs = segs[:len(segs)-1]
	}
	switch rapid.IntRange(0, 5).Draw(t, "mutation") {
	case 0:
		if len(segs) > 0 {
			segs[rapid.IntRange(0, len(segs)-1).Draw(t, "at")] = "*"
		}
	case 1:
		if len(segs) > 0 {
			segs[rapid.IntRange(0, len(segs)-1).Draw(t, "at")] = rapid.SampledFrom(litSegs).Draw(t, "lit")
		}
	case 2:
		hash = !hash
	case 3:
		segs = append(segs, rapid.SampledFrom([]string{"*", "a", ""}).Draw(t, "extra"))
	case 4:
		if len(segs) > 0 {
			segs = segs[:len(segs)-1]
		}
	}
	if hash {
		segs = append(segs, "#")
	}
	return strings.Join(segs, ".")
}
