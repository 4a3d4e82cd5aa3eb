package topic

import (
	"strings"
	"sync"
)

// Store holds one value per topic and answers which topics a filter selects
// without testing every topic: the mirror image of [Index], which holds
// filters and is searched with a topic. A last-value cache keeps the latest
// message of each topic in a Store and replays what a new subscription's
// filter selects.
//
// It is a trie over topic segments, one level per segment, each node mapping
// its literal next segments to children. A filter walks it segment by
// segment: a literal segment follows one child, '*' follows every child, and
// '#' takes the whole subtree below (the node it stands at included, since
// '#' also matches nothing). The cost of MatchFilter is the nodes the filter
// can reach, not the number of topics stored: a literal filter visits one
// path, "a.*.c" the children of "a" and one grandchild each.
//
// Topics are any strings (see [Match]): '*' and '#' in a topic are ordinary
// bytes and are matched only by wildcards or by the same byte in a filter
// segment, which validity forbids, so such a segment is reached only through
// wildcards. The Store keeps its own copies of topic strings.
//
// The zero Store is empty and ready to use; [NewStore] returns a new one. A
// Store must not be copied after first use. It is safe for concurrent use:
// Set and Delete take a write lock, Get, MatchFilter and Len a read lock.
type Store[V any] struct {
	mu   sync.RWMutex
	root storeNode[V] // holds no value: every topic has at least one segment
	n    int
}

// storeNode is one trie level; the node of a topic holds its value and its
// full topic string, which MatchFilter hands to yield without building it.
type storeNode[V any] struct {
	kids  map[string]*storeNode[V] // keys are private copies
	topic string                   // set, with val, while has
	val   V
	has   bool
}

// NewStore returns an empty Store. It is the same as new(Store[V]).
func NewStore[V any]() *Store[V] { return new(Store[V]) }

// Set stores v as the value of topic and returns the value it replaces, if
// any (replaced reports whether there was one).
func (s *Store[V]) Set(topic string, v V) (old V, replaced bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := &s.root
	for t, more := topic, true; more; {
		var seg string
		seg, t, more = strings.Cut(t, ".")
		c := n.kids[seg]
		if c == nil {
			if n.kids == nil {
				n.kids = make(map[string]*storeNode[V])
			}
			c = new(storeNode[V])
			n.kids[strings.Clone(seg)] = c
		}
		n = c
	}
	old, replaced = n.val, n.has
	if !replaced {
		n.topic = strings.Clone(topic)
		n.has = true
		s.n++
	}
	n.val = v
	return old, replaced
}

// Get returns the value of topic.
func (s *Store[V]) Get(topic string) (v V, ok bool) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	n := &s.root
	for t, more := topic, true; more; {
		var seg string
		seg, t, more = strings.Cut(t, ".")
		if n = n.kids[seg]; n == nil {
			return v, false
		}
	}
	return n.val, n.has
}

// Delete removes topic and returns its value, if it had one. Trie nodes
// left without a value or children are freed, deepest first.
func (s *Store[V]) Delete(topic string) (old V, ok bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	old, ok = s.root.delete(topic)
	if ok {
		s.n--
	}
	return old, ok
}

// delete removes the topic below n (at least one segment left) and prunes
// the children it empties.
func (n *storeNode[V]) delete(topic string) (old V, ok bool) {
	seg, rest, more := strings.Cut(topic, ".")
	c := n.kids[seg]
	if c == nil {
		return old, false
	}
	if more {
		old, ok = c.delete(rest)
	} else if c.has {
		old, ok = c.val, true
		var zero V
		c.val, c.has, c.topic = zero, false, ""
	}
	if ok && !c.has && len(c.kids) == 0 {
		delete(n.kids, seg)
		if len(n.kids) == 0 {
			n.kids = nil
		}
	}
	return old, ok
}

// Len returns the number of topics stored.
func (s *Store[V]) Len() int {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.n
}

// MatchFilter calls yield with every stored topic that filter matches (as
// [Match] decides) and its value, in no particular order, until yield
// returns false. An invalid filter (see [ValidateFilter]) matches nothing.
//
// MatchFilter holds the read lock while it calls yield: yield must not call
// Set or Delete on the same Store (that would deadlock), and writers wait
// until MatchFilter returns. It allocates nothing.
func (s *Store[V]) MatchFilter(filter string, yield func(topic string, v V) bool) {
	if ValidateFilter(filter) != nil {
		return
	}
	s.mu.RLock()
	defer s.mu.RUnlock()
	if filter == "" { // every topic
		s.root.all(yield)
		return
	}
	s.root.walk(filter, yield)
}

// walk reports the topics below n that filter (at least one segment left)
// matches; false means yield asked to stop.
func (n *storeNode[V]) walk(filter string, yield func(string, V) bool) bool {
	seg, rest, more := strings.Cut(filter, ".")
	// "#" can only be the last segment of a valid filter.
	if seg == "#" {
		return n.all(yield)
	}
	step := func(c *storeNode[V]) bool {
		if !more {
			return !c.has || yield(c.topic, c.val)
		}
		// "x.#" matches "x" itself too; walk handles it as the '#' case.
		return c.walk(rest, yield)
	}
	if seg == "*" {
		for _, c := range n.kids {
			if !step(c) {
				return false
			}
		}
		return true
	}
	if c := n.kids[seg]; c != nil {
		return step(c)
	}
	return true
}

// all reports n's topic and every one below it.
func (n *storeNode[V]) all(yield func(string, V) bool) bool {
	if n.has && !yield(n.topic, n.val) {
		return false
	}
	for _, c := range n.kids {
		if !c.all(yield) {
			return false
		}
	}
	return true
}
