package topic

import (
	"strings"
	"unicode/utf8"

	"pgregory.net/rapid"
)

// refValid is the grammar of weida-wire.md §5 written the obvious way, with
// strings.Split. It ignores the length and UTF-8 rules.
func refValid(f string) bool {
	segs := strings.Split(f, ".")
	for i, s := range segs {
		if strings.Contains(s, "*") && s != "*" {
			return false
		}
		if strings.Contains(s, "#") && (s != "#" || i != len(segs)-1) {
			return false
		}
	}
	return true
}

// refMatch is the naive matcher of weida-wire.md §5: split both strings and
// compare segment by segment.
func refMatch(f, t string) bool {
	if f == "" {
		return true
	}
	rest := strings.Split(t, ".")
	for _, p := range strings.Split(f, ".") {
		if p == "#" {
			return true
		}
		if len(rest) == 0 {
			return false
		}
		if p != "*" && p != rest[0] {
			return false
		}
		rest = rest[1:]
	}
	return len(rest) == 0
}

// refAccepts is what ValidateFilter must decide: the grammar plus the length
// and UTF-8 rules.
func refAccepts(f string) bool {
	return len(f) <= MaxLen && utf8.ValidString(f) && refValid(f)
}

// Segments the generators draw from: empty, short, overlapping prefixes
// ("a", "ab"), non-ASCII, and, for topics only, the wildcard bytes as literal
// content.
var (
	litSegs   = []string{"", "a", "b", "ab", "px", "eur", "temp", "temperature", "é", "日本", "a-b_c", "\u00ff"}
	topicSegs = append([]string{"*", "#", "a*", "#b", "**"}, litSegs...)
)

// genLiteral draws a literal segment, now and then a long one so that
// filters and topics reach the 256-byte limit.
func genLiteral(t *rapid.T, label string, pool []string) string {
	if rapid.IntRange(0, 19).Draw(t, label+"-long") == 0 {
		return strings.Repeat("x", rapid.IntRange(60, 260).Draw(t, label+"-len"))
	}
	return rapid.SampledFrom(pool).Draw(t, label)
}

// genFilter draws a filter that is valid by the grammar (it may still be too
// long), or the empty filter.
func genFilter(t *rapid.T, label string) string {
	if rapid.IntRange(0, 9).Draw(t, label+"-empty") == 0 {
		return ""
	}
	n := rapid.IntRange(1, 6).Draw(t, label+"-n")
	segs := make([]string, n)
	for i := range segs {
		switch k := rapid.IntRange(0, 3).Draw(t, label+"-kind"); {
		case k == 0:
			segs[i] = "*"
		case k == 1 && i == n-1:
			segs[i] = "#"
		default:
			segs[i] = genLiteral(t, label+"-seg", litSegs)
		}
	}
	return strings.Join(segs, ".")
}

// genTopic draws a topic: usually filter with its wildcards filled in and
// maybe one segment changed, so that matches and near misses are common;
// otherwise a random one.
func genTopic(t *rapid.T, label, filter string) string {
	if filter == "" || rapid.IntRange(0, 3).Draw(t, label+"-free") == 0 {
		n := rapid.IntRange(1, 6).Draw(t, label+"-n")
		segs := make([]string, n)
		for i := range segs {
			segs[i] = genLiteral(t, label+"-seg", topicSegs)
		}
		return strings.Join(segs, ".")
	}
	var segs []string
	for _, p := range strings.Split(filter, ".") {
		switch p {
		case "*":
			segs = append(segs, genLiteral(t, label+"-star", topicSegs))
		case "#":
			for range rapid.IntRange(0, 3).Draw(t, label+"-hash") {
				segs = append(segs, genLiteral(t, label+"-rest", topicSegs))
			}
		default:
			segs = append(segs, p)
		}
	}
	switch rapid.IntRange(0, 6).Draw(t, label+"-mutate") {
	case 0: // change one segment
		if len(segs) > 0 {
			segs[rapid.IntRange(0, len(segs)-1).Draw(t, label+"-at")] = genLiteral(t, label+"-new", topicSegs)
		}
	case 1: // drop the last segment
		if len(segs) > 0 {
			segs = segs[:len(segs)-1]
		}
	case 2: // insert one anywhere
		i := rapid.IntRange(0, len(segs)).Draw(t, label+"-at")
		segs = append(segs[:i:i], append([]string{genLiteral(t, label+"-extra", topicSegs)}, segs[i:]...)...)
	case 3: // extend one, so that it only starts like the filter's
		if len(segs) > 0 {
			i := rapid.IntRange(0, len(segs)-1).Draw(t, label+"-at")
			segs[i] += rapid.SampledFrom([]string{"x", "*", "#", "é"}).Draw(t, label+"-suffix")
		}
	case 4: // join two, so that a separator goes missing
		if len(segs) > 1 {
			i := rapid.IntRange(0, len(segs)-2).Draw(t, label+"-at")
			segs = append(segs[:i:i], append([]string{segs[i] + segs[i+1]}, segs[i+2:]...)...)
		}
	}
	return strings.Join(segs, ".")
}

// genAny draws a short string over an alphabet made of the grammar's special
// bytes, two letters and a multi-byte rune: most are invalid filters, which is
// the point.
func genAny(t *rapid.T, label string) string {
	return rapid.StringOfN(rapid.SampledFrom([]rune{'.', '*', '#', 'a', 'b', 'é'}), 0, 10, -1).Draw(t, label)
}
