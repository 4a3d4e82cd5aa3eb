package topic

import (
	"fmt"
	"maps"
	"slices"
	"sync"
	"testing"

	"pgregory.net/rapid"
)

// storeTopics are the topics the table of TestStoreMatchFilter stores.
var storeTopics = []string{
	"a", "a.b", "a.b.c", "a.x.c", "a.b.d", "b", "b.b", "", ".", "a.", ".a",
	"a.*", "a.#", "*", "#", "sensors.kitchen.temp", "sensors.hall.temp", "sensors.hall.hum",
}

func TestStoreMatchFilter(t *testing.T) {
	s := NewStore[int]()
	for i, tp := range storeTopics {
		s.Set(tp, i)
	}
	for _, c := range []struct {
		filter string
		want   []string
	}{
		{"", storeTopics},
		{"#", storeTopics},
		{"a", []string{"a"}},
		{"a.b", []string{"a.b"}},
		{"a.#", []string{"a", "a.b", "a.b.c", "a.x.c", "a.b.d", "a.", "a.*", "a.#"}},
		{"a.*", []string{"a.b", "a.", "a.*", "a.#"}},
		{"a.*.c", []string{"a.b.c", "a.x.c"}},
		{"*", []string{"a", "b", "", "*", "#"}},
		{"*.b", []string{"a.b", "b.b"}},
		{"*.*", []string{"a.b", "b.b", ".", "a.", ".a", "a.*", "a.#"}},
		{"sensors.*.temp", []string{"sensors.kitchen.temp", "sensors.hall.temp"}},
		{"sensors.hall.#", []string{"sensors.hall.temp", "sensors.hall.hum"}},
		{"nothing", nil},
		{"nothing.#", nil},
		{"a.b.c.d", nil},
		{"a.b.c.#", []string{"a.b.c"}},
		{"a..", nil},   // valid: three segments, two of them empty
		{"a.#.b", nil}, // invalid: matches nothing
	} {
		got := storeMatches(s, c.filter)
		want := slices.Clone(c.want)
		slices.Sort(want)
		if !slices.Equal(got, want) {
			t.Errorf("MatchFilter(%q) = %q, want %q", c.filter, got, want)
		}
		// The reference: every stored topic Match selects.
		var scan []string
		if ValidateFilter(c.filter) == nil {
			for _, tp := range storeTopics {
				if Match(c.filter, tp) {
					scan = append(scan, tp)
				}
			}
		}
		slices.Sort(scan)
		if !slices.Equal(got, scan) {
			t.Errorf("MatchFilter(%q) = %q, a scan with Match gives %q", c.filter, got, scan)
		}
	}
}

func storeMatches(s *Store[int], filter string) []string {
	var got []string
	s.MatchFilter(filter, func(tp string, v int) bool {
		got = append(got, tp)
		return true
	})
	slices.Sort(got)
	return got
}

func TestStoreSetGetDelete(t *testing.T) {
	var s Store[string]
	if _, ok := s.Get("a"); ok {
		t.Fatal("Get on an empty Store found a value")
	}
	if _, replaced := s.Set("a.b", "1"); replaced {
		t.Fatal("first Set reported a replaced value")
	}
	if old, replaced := s.Set("a.b", "2"); !replaced || old != "1" {
		t.Fatalf("second Set = %q, %v; want \"1\", true", old, replaced)
	}
	s.Set("a", "3")
	if s.Len() != 2 {
		t.Fatalf("Len = %d, want 2", s.Len())
	}
	if v, ok := s.Get("a.b"); !ok || v != "2" {
		t.Fatalf("Get(a.b) = %q, %v", v, ok)
	}
	if _, ok := s.Delete("a.b.c"); ok {
		t.Fatal("Delete of an absent topic below a stored one reported a value")
	}
	if old, ok := s.Delete("a"); !ok || old != "3" {
		t.Fatalf("Delete(a) = %q, %v", old, ok)
	}
	if _, ok := s.Get("a"); ok {
		t.Fatal("a is still there after Delete")
	}
	if v, ok := s.Get("a.b"); !ok || v != "2" {
		t.Fatalf("deleting a lost a.b: %q, %v", v, ok)
	}
	s.Delete("a.b")
	if s.Len() != 0 || s.root.kids != nil {
		t.Fatalf("an emptied Store keeps nodes: Len %d, root %v", s.Len(), s.root.kids)
	}
}

func TestStoreStop(t *testing.T) {
	s := NewStore[int]()
	for i := range 100 {
		s.Set(fmt.Sprintf("t.%d", i), i)
	}
	for _, f := range []string{"#", "t.*", "t.#"} {
		n := 0
		s.MatchFilter(f, func(string, int) bool { n++; return n < 3 })
		if n != 3 {
			t.Errorf("MatchFilter(%q) went on after yield returned false: %d calls", f, n)
		}
	}
}

func TestStoreMatchFilterAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	s := NewStore[int]()
	for i := range 1000 {
		s.Set(fmt.Sprintf("sensors.room-%d.temp", i), i)
	}
	n := 0
	yield := func(string, int) bool { n++; return true }
	for _, f := range []string{"sensors.*.temp", "sensors.room-7.temp", "#"} {
		if a := testing.AllocsPerRun(50, func() { s.MatchFilter(f, yield) }); a != 0 {
			t.Errorf("MatchFilter(%q) allocates %v times", f, a)
		}
	}
}

// TestStoreAgreesWithScan runs random Sets and Deletes against a map and
// checks every MatchFilter against a scan of the map with Match.
func TestStoreAgreesWithScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		s := NewStore[int]()
		ref := map[string]int{}
		var filters []string
		for i := range rapid.IntRange(1, 60).Draw(t, "ops") {
			switch rapid.IntRange(0, 3).Draw(t, "op") {
			case 0, 1:
				var tp string
				if len(filters) > 0 && rapid.Bool().Draw(t, "from-filter") {
					tp = genTopic(t, "topic", rapid.SampledFrom(filters).Draw(t, "base"))
				} else {
					tp = genTopic(t, "topic", "")
				}
				s.Set(tp, i)
				ref[tp] = i
			case 2:
				if len(ref) == 0 {
					continue
				}
				tp := rapid.SampledFrom(slices.Sorted(maps.Keys(ref))).Draw(t, "delete")
				if v, ok := s.Delete(tp); !ok || v != ref[tp] {
					t.Fatalf("Delete(%q) = %d, %v; want %d", tp, v, ok, ref[tp])
				}
				delete(ref, tp)
			default:
				f := genFilter(t, "filter")
				filters = append(filters, f)
				got := map[string]int{}
				s.MatchFilter(f, func(tp string, v int) bool {
					if _, dup := got[tp]; dup {
						t.Fatalf("MatchFilter(%q) reported %q twice", f, tp)
					}
					got[tp] = v
					return true
				})
				want := map[string]int{}
				for tp, v := range ref {
					if Match(f, tp) {
						want[tp] = v
					}
				}
				if !maps.Equal(got, want) {
					t.Fatalf("MatchFilter(%q) = %v, a scan gives %v", f, got, want)
				}
			}
		}
		if s.Len() != len(ref) {
			t.Fatalf("Len = %d, want %d", s.Len(), len(ref))
		}
	})
}

// BenchmarkStoreMatchFilter compares MatchFilter with a scan of every topic
// through Match, over 10,000 topics (100 rooms × 100 metrics).
func BenchmarkStoreMatchFilter(b *testing.B) {
	s := NewStore[int]()
	var topics []string
	for r := range 100 {
		for m := range 100 {
			tp := fmt.Sprintf("site.room-%d.metric-%d", r, m)
			topics = append(topics, tp)
			s.Set(tp, r*100+m)
		}
	}
	for _, f := range []string{"site.room-42.metric-7", "site.room-42.#", "site.*.metric-7", "#"} {
		n := 0
		yield := func(string, int) bool { n++; return true }
		b.Run("trie/"+f, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				s.MatchFilter(f, yield)
			}
		})
		b.Run("scan/"+f, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				for _, tp := range topics {
					if Match(f, tp) {
						n++
					}
				}
			}
		})
	}
}

// TestStoreConcurrent runs writers and readers at once; the race detector
// checks the locking, and every match must be a topic the filter selects.
func TestStoreConcurrent(t *testing.T) {
	s := NewStore[int]()
	var wg sync.WaitGroup
	for w := range 2 {
		wg.Go(func() {
			for i := range 2000 {
				tp := fmt.Sprintf("t.%d.%d", w, i%50)
				if i%3 == 0 {
					s.Delete(tp)
				} else {
					s.Set(tp, i)
				}
			}
		})
	}
	for range 2 {
		wg.Go(func() {
			for range 500 {
				s.MatchFilter("t.*.7", func(tp string, _ int) bool {
					if !Match("t.*.7", tp) {
						t.Errorf("MatchFilter(t.*.7) reported %q", tp)
					}
					return true
				})
				s.Len()
			}
		})
	}
	wg.Wait()
}
