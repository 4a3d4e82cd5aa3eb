package topic

import "strings"

// Coverage is a question about two filters rather than about a topic: may
// a subscriber that is allowed the topics of some scopes hold a filter,
// without ever receiving a topic outside them? Testing the filter's
// topics one by one is impossible (there are infinitely many), so the
// answer comes from the filters' shapes.
//
// A valid filter other than "" and "#" is a prefix of n segments, each a
// literal or '*', optionally followed by a final '#'. The topics it
// matches are a product: exactly n segments (no '#') or at least n and at
// least one (with '#', since a topic has at least one segment), position i
// holding exactly the literal, or any segment under '*' and past the
// prefix. A scope matches a topic by the same per-position rule. So a
// scope matches every topic of the filter with ℓ segments exactly when it
// accepts length ℓ and, position by position up to its own prefix, it has
// '*' or the filter has the same literal (past the filter's prefix, where
// the filter allows anything, only '*' will do). Each scope therefore
// covers an interval of the filter's lengths: none, one length, or every
// length from its prefix length on; the scopes together cover the filter
// when their intervals cover the filter's lengths.
//
// This is exact over topics of any length: when the scopes do not cover
// a filter, the topic built from the filter's literals and, under each
// '*', a segment no scope names at that position, at a length no scope
// covers, is matched by the filter and by no scope. The one place it is
// conservative is the MaxLen limit on topics: a filter whose longest
// topics would pass MaxLen bytes matches fewer real topics than the
// grammar says, and scopes that would cover only those real ones are not
// recognised. It refuses, it never admits too much.

// shape describes a valid filter: its segments before any final '#' (n of
// them, in prefix) and whether it ends with '#'. "" and "#" are both n = 0
// and hash.
func shape(f string) (prefix string, n int, hash bool) {
	switch {
	case f == "" || f == "#":
		return "", 0, true
	case strings.HasSuffix(f, ".#"):
		prefix, hash = f[:len(f)-2], true
	default:
		prefix = f
	}
	return prefix, strings.Count(prefix, ".") + 1, hash
}

// unbounded is the upper end of the lengths of a filter ending with '#'.
const unbounded = int(^uint(0) >> 1)

// lengths returns the segment counts of the topics f matches: [n, n], or
// [max(n, 1), unbounded) with a final '#'.
func lengths(f string) (lo, hi int) {
	_, n, hash := shape(f)
	if !hash {
		return n, n
	}
	return max(n, 1), unbounded
}

// interval returns the lengths of filter's topics that scope matches all
// of, as [lo, hi]; ok is false when it matches all of none.
func interval(scope, filter string) (lo, hi int, ok bool) {
	sp, m, sh := shape(scope)
	fp, n, fh := shape(filter)
	flo, fhi := lengths(filter)
	// Walk the scope's prefix against the filter's, a segment at a time.
	for i := 0; i < m; i++ {
		var s, f string
		s, sp, _ = strings.Cut(sp, ".")
		if i < n {
			f, fp, _ = strings.Cut(fp, ".")
		} else if fh {
			f = "*" // past the filter's prefix its '#' allows any segment
		} else {
			return 0, 0, false // the scope wants more segments than the filter's topics have
		}
		if s != "*" && (f == "*" || f != s) {
			return 0, 0, false
		}
	}
	lo, hi = m, m
	if sh {
		hi = unbounded
	}
	lo, hi = max(lo, flo), min(hi, fhi)
	return lo, hi, lo <= hi
}

// Covers reports whether every topic filter matches is also matched by
// scope, so that a subscriber allowed the topics of scope may hold filter.
// Both must be valid filters (see [ValidateFilter]); for invalid ones the
// answer is unspecified, but Covers never panics.
//
// For example "plant.a.#" covers "plant.a", "plant.a.*" and
// "plant.a.x.#", but not "plant.#" or "plant.*.x". A '*' in the scope
// covers any segment, a literal in the scope only that literal, and a
// final '#' in the scope any further segments, none included; a '*' in
// the filter is covered only by a '*' in the scope, since it matches
// segments no literal names. '*' takes exactly one segment, which may be
// empty: "a.*" matches "a." but not "a", so it does not cover "a.#",
// while "a.#" covers "a.*".
//
// Covers allocates nothing. [CoveredBy] answers for several scopes.
func Covers(scope, filter string) bool {
	lo, hi, ok := interval(scope, filter)
	flo, fhi := lengths(filter)
	return ok && lo == flo && hi == fhi
}

// CoveredBy reports whether every topic filter matches is matched by at
// least one of scopes. It is exact for the union: the scopes "a" and
// "a.*.#" together cover "a.#", which neither covers alone, because the
// first takes its one-segment topics and the second the longer ones. Like
// [Covers], it needs valid filters, never panics, and allocates nothing.
func CoveredBy(filter string, scopes []string) bool {
	flo, fhi := lengths(filter)
	// from is the least length from which on some scope covers every
	// longer one; points marks the single lengths below it that a scope
	// without '#' covers.
	from := unbounded
	var points [MaxLen + 2]bool
	for _, s := range scopes {
		lo, hi, ok := interval(s, filter)
		switch {
		case !ok:
		case lo == flo && hi == fhi:
			return true
		case hi == unbounded:
			from = min(from, lo)
		case lo < len(points):
			for l := lo; l <= hi && l < len(points); l++ {
				points[l] = true
			}
		}
	}
	if fhi != unbounded {
		return false // a single length, and no scope covered it
	}
	for l := flo; l < from; l++ {
		if l >= len(points) || !points[l] {
			return false
		}
	}
	return true
}
