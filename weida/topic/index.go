package topic

import (
	"strings"
	"sync"
)

// Index holds many (filter, value) entries and answers which values a topic
// selects without testing every filter. A publisher keeps one entry per
// subscription, with the subscriber as the value.
//
// It is a trie over filter segments, one level per segment: each node has a
// map of literal segments and dedicated children for '*' and '#', so a topic
// walks one literal branch plus the wildcard branches per segment, and the
// cost of a lookup depends on the topic and on the filters it matches, not on
// how many filters are stored: a lookup visits each trie node at most once,
// and only nodes on a path the topic can take. The empty filter, which
// matches every topic, is kept beside the trie.
//
// Values are compared with ==, as map keys; a subscriber's connection handle
// or id makes a good T.
//
// The zero Index is empty and ready to use; [NewIndex] returns a new one. An
// Index must not be copied after first use.
//
// An Index is safe for concurrent use by multiple goroutines: Insert and
// Remove take a write lock, Match, MatchFilters and Len a read lock. The
// Index keeps its own copies of filter strings, so callers may pass strings
// that alias buffers they will reuse.
type Index[T comparable] struct {
	mu   sync.RWMutex
	root node[T]         // filters with at least one segment; write lock to change
	all  node[T]         // values of the empty filter (only subs and filter are used)
	vals map[T]*value[T] // every value held by at least one filter
	n    int             // (filter, value) entries
	ids  int32           // value ids handed out so far; ids below it are in use or in free
	free []int32         // ids of deleted values, for reuse
	pool sync.Pool       // *scratch, the deduplication marks of Match
}

// value is the record shared by every entry of one value, so that Match can
// tell cheaply whether a value may be reached through more than one filter.
type value[T comparable] struct {
	v       T
	filters int   // entries holding v; write lock to change
	id      int32 // dense, so that Match can mark it in an array
}

// node is one trie level. subs are the values of the filter that ends here,
// which is filter (a private copy) while subs is non-empty.
type node[T comparable] struct {
	lit    map[string]*node[T] // literal next segments, keys are private copies
	star   *node[T]            // next segment '*'
	hash   *node[T]            // next segment '#'; always a leaf
	filter string
	subs   []*value[T]
	pos    map[*value[T]]int // index into subs, kept only while subs is long
}

// Lengths of subs at which node builds, and drops, its position map: below
// them a linear scan is faster than hashing and costs no memory.
const (
	posBuild = 32
	posDrop  = 16
)

// NewIndex returns an empty Index. It is the same as new(Index[T]).
func NewIndex[T comparable]() *Index[T] { return new(Index[T]) }

// Insert adds the entry (filter, v). It returns a [*FilterError] if filter is
// not valid, and changes nothing. Inserting an entry that is already present
// is a no-op that returns nil.
func (x *Index[T]) Insert(filter string, v T) error {
	if err := ValidateFilter(filter); err != nil {
		return err
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	n := &x.all
	if filter != "" {
		n = &x.root
		for f, more := filter, true; more; {
			var seg string
			seg, f, more = strings.Cut(f, ".")
			n = n.child(seg, true)
		}
	}
	rec := x.vals[v]
	if rec != nil && n.find(rec) >= 0 {
		return nil
	}
	if rec == nil {
		if x.vals == nil {
			x.vals = make(map[T]*value[T])
		}
		rec = &value[T]{v: v, id: x.ids}
		if k := len(x.free); k > 0 {
			rec.id = x.free[k-1]
			x.free = x.free[:k-1]
		} else {
			x.ids++
		}
		x.vals[v] = rec
	}
	if len(n.subs) == 0 {
		n.filter = strings.Clone(filter)
	}
	n.add(rec)
	rec.filters++
	x.n++
	return nil
}

// Remove deletes the entry (filter, v) and reports whether it was present;
// an invalid filter is never present. Trie nodes left without entries or
// children are freed, deepest first.
func (x *Index[T]) Remove(filter string, v T) bool {
	if len(filter) > MaxLen {
		return false // Insert would have refused it
	}
	x.mu.Lock()
	defer x.mu.Unlock()
	rec := x.vals[v]
	if rec == nil {
		return false
	}
	var ok bool
	if filter == "" {
		ok = x.all.drop(rec)
	} else {
		ok = x.root.remove(filter, rec)
	}
	if !ok {
		return false
	}
	x.n--
	if rec.filters--; rec.filters == 0 {
		delete(x.vals, v)
		x.free = append(x.free, rec.id)
	}
	return true
}

// Len returns the number of (filter, value) entries.
func (x *Index[T]) Len() int {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.n
}

// Match calls yield once for every value that has at least one filter
// matching topic (any string; see [Match] for the rules), in no particular
// order, until yield returns false. A value
// whose filters match the topic several times is still reported once, which
// is what a publisher sending one copy per subscriber needs.
//
// Match holds the read lock while it calls yield: yield must not call any
// method of the same Index (Insert and Remove would deadlock, and so may a
// nested Match while a writer waits), and writers wait until Match returns.
//
// Match allocates nothing in the steady state: values with a single entry
// are reported straight from the trie, and values with several entries are
// deduplicated by marking their ids in an array reused across calls (one
// uint32 per value, grown when the Index has gained values).
func (x *Index[T]) Match(topic string, yield func(T) bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := walker[T]{x: x, yield: yield}
	if w.emit(&x.all) {
		w.walk(&x.root, topic, 0)
	}
	if w.seen != nil {
		x.pool.Put(w.seen)
	}
}

// MatchFilters calls yield for every entry whose filter matches topic, with
// that filter and value, until yield returns false. Unlike [Index.Match] it
// does not deduplicate: a value is reported once per matching filter. The
// locking rules of Match apply.
func (x *Index[T]) MatchFilters(topic string, yield func(filter string, v T) bool) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	w := walker[T]{x: x, yieldFilter: yield}
	if w.emit(&x.all) {
		w.walk(&x.root, topic, 0)
	}
}

// walker carries one Match through the trie. It lives on Match's stack.
type walker[T comparable] struct {
	x           *Index[T]
	yield       func(T) bool
	yieldFilter func(string, T) bool
	seen        *scratch // taken from the pool at the first shared value
}

// walk reports the values of every filter below n that matches the topic
// segments from offset ti on; ti == len(topic)+1 means no segment is left.
// It returns false once yield has asked to stop.
func (w *walker[T]) walk(n *node[T], topic string, ti int) bool {
	// A '#' here matches whatever is left, including nothing.
	if n.hash != nil && !w.emit(n.hash) {
		return false
	}
	if ti > len(topic) {
		return w.emit(n)
	}
	te := len(topic)
	if i := strings.IndexByte(topic[ti:], '.'); i >= 0 {
		te = ti + i
	}
	if c := n.lit[topic[ti:te]]; c != nil && !w.walk(c, topic, te+1) {
		return false
	}
	if n.star != nil {
		return w.walk(n.star, topic, te+1)
	}
	return true
}

// emit reports the values of the filter ending at n.
func (w *walker[T]) emit(n *node[T]) bool {
	for _, rec := range n.subs {
		if w.yieldFilter != nil {
			if !w.yieldFilter(n.filter, rec.v) {
				return false
			}
			continue
		}
		if rec.filters > 1 {
			if w.seen == nil {
				w.seen = w.x.getScratch()
			}
			if !w.seen.add(rec.id) {
				continue
			}
		}
		if !w.yield(rec.v) {
			return false
		}
	}
	return true
}

// getScratch returns a scratch ready for one Match: large enough for every
// id handed out, and with no id marked. The read lock must be held.
func (x *Index[T]) getScratch() *scratch {
	s, _ := x.pool.Get().(*scratch)
	if s == nil {
		s = new(scratch)
	}
	s.prepare(int(x.ids))
	return s
}

// scratch marks the values one Match has reported among those with several
// entries: value id i is marked when mark[i] == gen. Each Match starts with
// a new gen, so nothing is ever cleared, and a check is one array access.
type scratch struct {
	mark []uint32
	gen  uint32
}

// prepare readies s for ids below n, none of them marked.
func (s *scratch) prepare(n int) {
	if len(s.mark) < n {
		// Grow with headroom so that a slowly growing index does not
		// reallocate at every new value.
		s.mark = append(s.mark, make([]uint32, n-len(s.mark)+n/4)...)
	}
	if s.gen++; s.gen == 0 { // wrapped: old marks could look current
		clear(s.mark)
		s.gen = 1
	}
}

// add marks id and reports whether it was not marked yet.
func (s *scratch) add(id int32) bool {
	if s.mark[id] == s.gen {
		return false
	}
	s.mark[id] = s.gen
	return true
}

// child returns the child of n for segment seg, creating it if create is set
// and it is missing (nil otherwise).
func (n *node[T]) child(seg string, create bool) *node[T] {
	switch seg {
	case "*":
		if n.star == nil && create {
			n.star = new(node[T])
		}
		return n.star
	case "#":
		if n.hash == nil && create {
			n.hash = new(node[T])
		}
		return n.hash
	}
	c := n.lit[seg]
	if c == nil && create {
		if n.lit == nil {
			n.lit = make(map[string]*node[T])
		}
		c = new(node[T])
		n.lit[strings.Clone(seg)] = c
	}
	return c
}

// remove deletes rec from the filter below n that filter spells (at least
// one segment), pruning nodes that end up empty on the way back up, and
// reports whether rec was there.
func (n *node[T]) remove(filter string, rec *value[T]) bool {
	seg, rest, more := strings.Cut(filter, ".")
	c := n.child(seg, false)
	if c == nil {
		return false
	}
	var ok bool
	if more {
		ok = c.remove(rest, rec)
	} else {
		ok = c.drop(rec)
	}
	if ok && c.empty() {
		switch seg {
		case "*":
			n.star = nil
		case "#":
			n.hash = nil
		default:
			delete(n.lit, seg)
			if len(n.lit) == 0 {
				n.lit = nil
			}
		}
	}
	return ok
}

func (n *node[T]) empty() bool {
	return len(n.subs) == 0 && len(n.lit) == 0 && n.star == nil && n.hash == nil
}

// find returns the index of rec in n.subs, or -1.
func (n *node[T]) find(rec *value[T]) int {
	if n.pos != nil {
		if i, ok := n.pos[rec]; ok {
			return i
		}
		return -1
	}
	for i, r := range n.subs {
		if r == rec {
			return i
		}
	}
	return -1
}

func (n *node[T]) add(rec *value[T]) {
	n.subs = append(n.subs, rec)
	if n.pos != nil {
		n.pos[rec] = len(n.subs) - 1
	} else if len(n.subs) >= posBuild {
		n.pos = make(map[*value[T]]int, 2*len(n.subs))
		for i, r := range n.subs {
			n.pos[r] = i
		}
	}
}

// drop removes rec from n.subs and reports whether it was there.
func (n *node[T]) drop(rec *value[T]) bool {
	i := n.find(rec)
	if i < 0 {
		return false
	}
	last := len(n.subs) - 1
	if i != last {
		n.subs[i] = n.subs[last]
		if n.pos != nil {
			n.pos[n.subs[i]] = i
		}
	}
	n.subs[last] = nil
	n.subs = n.subs[:last]
	if n.pos != nil {
		delete(n.pos, rec)
		if len(n.subs) < posDrop {
			n.pos = nil
		}
	}
	if len(n.subs) == 0 {
		n.subs = nil
		n.filter = ""
	}
	return true
}
