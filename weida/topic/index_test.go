package topic

import (
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"
	"sync"
	"testing"
	"unsafe"

	"pgregory.net/rapid"
)

// collect returns what Match reports for topic, failing on a value reported
// twice.
func collect[T comparable](t tb, x *Index[T], topic string) map[T]bool {
	t.Helper()
	got := map[T]bool{}
	x.Match(topic, func(v T) bool {
		if got[v] {
			t.Fatalf("Match(%q) reported %v twice", topic, v)
		}
		got[v] = true
		return true
	})
	return got
}

// tb is what the helpers need of *testing.T and *rapid.T.
type tb interface {
	Helper()
	Fatalf(format string, args ...any)
}

// entry is one (filter, value) pair of a model index.
type entry struct {
	filter string
	v      int
}

// scan is what Index.Match must equal: a linear scan of Match over entries.
func scan(entries map[entry]bool, topic string) map[int]bool {
	want := map[int]bool{}
	for e := range entries {
		if Match(e.filter, topic) {
			want[e.v] = true
		}
	}
	return want
}

// checkTrie verifies the Index's internal invariants: no empty node below
// the root, every stored filter equal to its path, position maps in step
// with subs, and value records counting their entries.
func checkTrie[T comparable](t tb, x *Index[T]) {
	t.Helper()
	x.mu.RLock()
	defer x.mu.RUnlock()
	counts := map[*value[T]]int{}
	total := 0
	var visit func(n *node[T], path string, root bool)
	checkSubs := func(n *node[T], path string) {
		if len(n.subs) > 0 && n.filter != path {
			t.Fatalf("node %q holds filter %q", path, n.filter)
		}
		if len(n.subs) >= posBuild && n.pos == nil || len(n.subs) < posDrop && n.pos != nil {
			t.Fatalf("node %q: %d subs, position map %v", path, len(n.subs), n.pos != nil)
		}
		if n.pos != nil && len(n.pos) != len(n.subs) {
			t.Fatalf("node %q: %d positions for %d subs", path, len(n.pos), len(n.subs))
		}
		seen := map[*value[T]]bool{}
		for i, rec := range n.subs {
			if seen[rec] {
				t.Fatalf("node %q holds %v twice", path, rec.v)
			}
			seen[rec] = true
			if n.pos != nil && n.pos[rec] != i {
				t.Fatalf("node %q: %v at %d, position map says %d", path, rec.v, i, n.pos[rec])
			}
			counts[rec]++
			total++
		}
	}
	visit = func(n *node[T], path string, root bool) {
		if !root && n.empty() {
			t.Fatalf("empty node %q left in the trie", path)
		}
		if root && len(n.subs) > 0 {
			t.Fatalf("the root holds values")
		}
		checkSubs(n, path)
		join := func(seg string) string {
			if root {
				return seg
			}
			return path + "." + seg
		}
		if n.hash != nil {
			if n.hash.star != nil || n.hash.hash != nil || len(n.hash.lit) > 0 {
				t.Fatalf("node %q has children", join("#"))
			}
			visit(n.hash, join("#"), false)
		}
		if n.star != nil {
			visit(n.star, join("*"), false)
		}
		for seg, c := range n.lit {
			visit(c, join(seg), false)
		}
	}
	visit(&x.root, "", true)
	checkSubs(&x.all, "")
	if total != x.n {
		t.Fatalf("trie holds %d entries, Len says %d", total, x.n)
	}
	if len(counts) != len(x.vals) {
		t.Fatalf("trie holds %d values, the value map %d", len(counts), len(x.vals))
	}
	ids := map[int32]bool{}
	for rec, c := range counts {
		if x.vals[rec.v] != rec || rec.filters != c {
			t.Fatalf("value %v: %d entries, record says %d", rec.v, c, rec.filters)
		}
		if rec.id < 0 || rec.id >= x.ids || ids[rec.id] {
			t.Fatalf("value %v: id %d in use twice or out of range", rec.v, rec.id)
		}
		ids[rec.id] = true
	}
	for _, id := range x.free {
		if id < 0 || id >= x.ids || ids[id] {
			t.Fatalf("free id %d in use twice or out of range", id)
		}
		ids[id] = true
	}
	if len(ids) != int(x.ids) {
		t.Fatalf("%d ids handed out, %d accounted for", x.ids, len(ids))
	}
}

// TestScratchWraps: when the generation wraps, old marks are cleared rather
// than mistaken for marks of the current Match.
func TestScratchWraps(t *testing.T) {
	s := &scratch{mark: []uint32{1, 7}, gen: math.MaxUint32}
	s.prepare(3)
	if s.gen != 1 || len(s.mark) < 3 {
		t.Fatalf("after wrapping: gen %d, %d marks", s.gen, len(s.mark))
	}
	for id := range int32(3) {
		if !s.add(id) || s.add(id) {
			t.Fatalf("id %d: add is not mark-once", id)
		}
	}
	s.prepare(3)
	if !s.add(0) {
		t.Fatal("a mark survived into the next Match")
	}
}

func TestIndexZeroValue(t *testing.T) {
	var x Index[string]
	if x.Len() != 0 || len(collect(t, &x, "a")) != 0 || x.Remove("a", "v") {
		t.Fatal("the zero Index is not empty")
	}
	if err := x.Insert("a.*", "v"); err != nil {
		t.Fatal(err)
	}
	if got := collect(t, &x, "a.b"); !got["v"] || len(got) != 1 {
		t.Fatalf("Match = %v", got)
	}
}

func TestIndexInsertInvalid(t *testing.T) {
	x := NewIndex[int]()
	for _, c := range validateCases {
		err := x.Insert(c.filter, 1)
		var fe *FilterError
		if !errors.As(err, &fe) || fe.Rule != c.rule {
			t.Errorf("Insert(%q) = %v, want rule %s", c.filter, err, c.rule)
		}
		if x.Remove(c.filter, 1) {
			t.Errorf("Remove(%q) of an invalid filter = true", c.filter)
		}
	}
	if x.Len() != 0 {
		t.Fatalf("Len = %d after invalid inserts", x.Len())
	}
	checkTrie(t, x)
}

func TestIndexIdempotent(t *testing.T) {
	x := NewIndex[int]()
	for range 3 {
		for _, f := range []string{"", "#", "a.*", "a.#"} {
			if err := x.Insert(f, 7); err != nil {
				t.Fatal(err)
			}
		}
	}
	if x.Len() != 4 {
		t.Fatalf("Len = %d, want 4", x.Len())
	}
	checkTrie(t, x)
	if !x.Remove("a.*", 7) || x.Remove("a.*", 7) {
		t.Fatal("Remove is not exact")
	}
	if x.Len() != 3 {
		t.Fatalf("Len = %d, want 3", x.Len())
	}
	checkTrie(t, x)
}

// TestIndexDedup: a value with several matching filters is reported once by
// Match and once per filter by MatchFilters, whether its filters are few
// (the list) or many (the set) and whether values with a single filter come
// between them.
func TestIndexDedup(t *testing.T) {
	for _, extra := range []int{0, 40} {
		t.Run(fmt.Sprintf("others=%d", extra), func(t *testing.T) {
			x := NewIndex[int]()
			filters := []string{"", "#", "a.#", "a.b.#", "a.b.c", "a.*.c", "*.b.c", "*.*.*", "a.b.*", "*.*.#"}
			for v := range extra + 1 {
				for _, f := range filters {
					if err := x.Insert(f, v); err != nil {
						t.Fatal(err)
					}
				}
				if err := x.Insert("a.b.c", 1000+v); err != nil { // single-filter values
					t.Fatal(err)
				}
			}
			checkTrie(t, x)
			for range 2 { // the second time reuses the scratch set
				if got := collect(t, x, "a.b.c"); len(got) != 2*(extra+1) {
					t.Fatalf("Match reported %d values, want %d", len(got), 2*(extra+1))
				}
			}
			pairs := map[entry]bool{}
			x.MatchFilters("a.b.c", func(f string, v int) bool {
				e := entry{f, v}
				if pairs[e] {
					t.Fatalf("MatchFilters reported %v twice", e)
				}
				pairs[e] = true
				return true
			})
			if want := (len(filters) + 1) * (extra + 1); len(pairs) != want {
				t.Fatalf("MatchFilters reported %d entries, want %d", len(pairs), want)
			}
		})
	}
}

func TestIndexStop(t *testing.T) {
	x := NewIndex[int]()
	for v := range 10 {
		for _, f := range []string{"", "a.#", "*", "a"} {
			if err := x.Insert(f, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	for stop := 1; stop <= 10; stop++ {
		n := 0
		x.Match("a", func(int) bool { n++; return n < stop })
		if n != stop {
			t.Fatalf("Match went on after yield returned false: %d calls, want %d", n, stop)
		}
		n = 0
		x.MatchFilters("a", func(string, int) bool { n++; return n < stop })
		if n != stop {
			t.Fatalf("MatchFilters went on after yield returned false: %d calls, want %d", n, stop)
		}
	}
}

// TestIndexPrunes: removing every entry leaves the trie as empty as new.
func TestIndexPrunes(t *testing.T) {
	x := NewIndex[int]()
	filters := []string{"a.b.c", "a.b", "a.*.c", "a.#", "*.#", "#", "", "a..", long + ".x"}
	for v := range 40 { // enough values to build position maps
		for _, f := range filters {
			if err := x.Insert(f, v); err != nil {
				t.Fatal(err)
			}
		}
	}
	checkTrie(t, x)
	for v := range 40 {
		for _, f := range slices.Backward(filters) {
			if !x.Remove(f, v) {
				t.Fatalf("Remove(%q, %d) = false", f, v)
			}
		}
		checkTrie(t, x)
	}
	if !x.root.empty() || len(x.all.subs) != 0 || len(x.vals) != 0 || x.Len() != 0 {
		t.Fatal("the index is not empty after removing everything")
	}
}

// TestIndexCopiesFilters: the Index does not keep the caller's string, which
// may alias a buffer the caller reuses (a decoded frame, say).
func TestIndexCopiesFilters(t *testing.T) {
	x := NewIndex[int]()
	buf := []byte("sensors.*.temp")
	if err := x.Insert(unsafe.String(&buf[0], len(buf)), 1); err != nil {
		t.Fatal(err)
	}
	copy(buf, "xxxxxxxxxxxxxx")
	if got := collect(t, x, "sensors.a.temp"); !got[1] {
		t.Fatal("the index lost its filter when the caller's buffer changed")
	}
	x.MatchFilters("sensors.a.temp", func(f string, _ int) bool {
		if f != "sensors.*.temp" {
			t.Fatalf("MatchFilters reported filter %q", f)
		}
		return true
	})
}

// TestIndexAgreesWithScan runs random inserts and removes against a model
// and checks after each step that Match reports exactly the values a linear
// scan of Match finds, and MatchFilters exactly the matching entries.
func TestIndexAgreesWithScan(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		x := NewIndex[int]()
		model := map[entry]bool{}
		// A small pool of filters and values makes repeats, shared values
		// and removals of present entries common.
		pool := rapid.SliceOfN(rapid.Custom(func(t *rapid.T) string { return genFilter(t, "f") }), 1, 10).Draw(t, "filters")
		value := rapid.IntRange(0, 5)
		pick := func(t *rapid.T) entry {
			return entry{rapid.SampledFrom(pool).Draw(t, "filter"), value.Draw(t, "value")}
		}
		t.Repeat(map[string]func(*rapid.T){
			"insert": func(t *rapid.T) {
				e := pick(t)
				err := x.Insert(e.filter, e.v)
				if (err == nil) != refAccepts(e.filter) {
					t.Fatalf("Insert(%q) = %v", e.filter, err)
				}
				if err == nil {
					model[e] = true
				}
			},
			"insert-many": func(t *rapid.T) { // fills nodes past posBuild
				f := rapid.SampledFrom(pool).Draw(t, "filter")
				if !refAccepts(f) {
					return
				}
				for v := range rapid.IntRange(posBuild, 2*posBuild).Draw(t, "values") {
					if err := x.Insert(f, 100+v); err != nil {
						t.Fatalf("Insert(%q) = %v", f, err)
					}
					model[entry{f, 100 + v}] = true
				}
			},
			"remove-many": func(t *rapid.T) { // empties them in a random order
				f := rapid.SampledFrom(pool).Draw(t, "filter")
				many := make([]int, 2*posBuild)
				for i := range many {
					many[i] = 100 + i
				}
				order := rapid.Permutation(many).Draw(t, "order")
				for _, v := range order[:rapid.IntRange(0, len(order)).Draw(t, "count")] {
					e := entry{f, v}
					if got := x.Remove(f, v); got != model[e] {
						t.Fatalf("Remove(%q, %d) = %v, model has it: %v", f, v, got, model[e])
					}
					delete(model, e)
				}
			},
			"remove": func(t *rapid.T) {
				e := pick(t)
				if got := x.Remove(e.filter, e.v); got != model[e] {
					t.Fatalf("Remove(%q, %d) = %v, model has it: %v", e.filter, e.v, got, model[e])
				}
				delete(model, e)
			},
			"": func(t *rapid.T) {
				if x.Len() != len(model) {
					t.Fatalf("Len = %d, model has %d", x.Len(), len(model))
				}
				checkTrie(t, x)
				tp := genTopic(t, "topic", rapid.SampledFrom(pool).Draw(t, "base"))
				if got, want := collect(t, x, tp), scan(model, tp); !maps.Equal(got, want) {
					t.Fatalf("Match(%q) = %v, scan says %v", tp, keys(got), keys(want))
				}
				pairs := map[entry]bool{}
				x.MatchFilters(tp, func(f string, v int) bool { pairs[entry{f, v}] = true; return true })
				for e := range model {
					if Match(e.filter, tp) != pairs[e] {
						t.Fatalf("MatchFilters(%q): entry %v reported %v", tp, e, pairs[e])
					}
				}
				if len(pairs) > len(model) {
					t.Fatalf("MatchFilters(%q) reported entries the index does not hold", tp)
				}
			},
		})
	})
}

func keys(m map[int]bool) []int {
	out := slices.Collect(maps.Keys(m))
	sort.Ints(out)
	return out
}

// TestIndexConcurrent runs inserts, removes and matches at once; run it with
// -race. Each writer owns its values, so the final state is known.
func TestIndexConcurrent(t *testing.T) {
	x := NewIndex[int]()
	filters := []string{"", "#", "a.#", "a.*", "a.b", "*.b", "a.b.c", "*.*.#"}
	const writers, rounds = 4, 200
	var wg sync.WaitGroup
	stop := make(chan struct{})
	for w := range writers {
		wg.Go(func() {
			for r := range rounds {
				v := w*rounds + r
				for _, f := range filters {
					if err := x.Insert(f, v); err != nil {
						t.Error(err)
						return
					}
				}
				if r%2 == 0 { // keep the odd ones
					for _, f := range filters {
						x.Remove(f, v)
					}
				}
			}
		})
	}
	var readers sync.WaitGroup
	for range 2 {
		readers.Go(func() {
			for {
				select {
				case <-stop:
					return
				default:
				}
				seen := map[int]bool{}
				x.Match("a.b", func(v int) bool {
					if seen[v] {
						t.Errorf("Match reported %d twice", v)
					}
					seen[v] = true
					return true
				})
				x.MatchFilters("a.b.c", func(string, int) bool { return true })
				_ = x.Len()
			}
		})
	}
	wg.Wait()
	close(stop)
	readers.Wait()
	if want := writers * rounds / 2 * len(filters); x.Len() != want {
		t.Fatalf("Len = %d, want %d", x.Len(), want)
	}
	checkTrie(t, x)
	if got := collect(t, x, "a.b"); len(got) != writers*rounds/2 {
		t.Fatalf("Match reported %d values, want %d", len(got), writers*rounds/2)
	}
}

// TestIndexMatchAllocs proves the claim of Match's doc comment, on values
// with one filter and on values with several (the deduplication set).
func TestIndexMatchAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	x := NewIndex[int]()
	for v := range 100 {
		for _, f := range []string{"a.b.c", "a.*.c", "a.#", "#"} {
			if err := x.Insert(f, v); err != nil {
				t.Fatal(err)
			}
		}
		if err := x.Insert(fmt.Sprintf("a.b.c%d", v), 1000+v); err != nil {
			t.Fatal(err)
		}
	}
	n := 0
	yield := func(int) bool { n++; return true }
	for _, tp := range []string{"a.b.c", "a.b.c7", "x.y", "a"} {
		if allocs := testing.AllocsPerRun(100, func() { x.Match(tp, yield) }); allocs != 0 {
			t.Errorf("Match(%q) allocates %v times", tp, allocs)
		}
		if allocs := testing.AllocsPerRun(100, func() { x.MatchFilters(tp, func(string, int) bool { return true }) }); allocs != 0 {
			t.Errorf("MatchFilters(%q) allocates %v times", tp, allocs)
		}
	}
}
