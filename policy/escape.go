package policy

import "strings"

// The escape of mqtt-levels-escaped/v1, applied to each MQTT level on its
// own (the level separator '/' is never escaped: it becomes '.'):
//
//	'%' → "%25"   (the escape byte itself, so that decoding is unambiguous)
//	'.' → "%2E"   (weida's separator)
//	'*' → "%2A"   (weida's one-segment wildcard; any level holding it is
//	               either a wildcard or invalid in a weida filter)
//
// Every other byte is copied. '#' and '+' need no escape: MQTT forbids them
// in names and in literal filter levels. The hex digits are upper case and
// the escape is canonical: decoding accepts exactly the three sequences
// above and refuses a bare '*' or any other '%', so decode(encode(l)) == l
// for every level and encode(decode(s)) == s for every accepted s.
//
// Because encoded levels never contain '.', '*' or '#', a literal MQTT level
// becomes exactly one literal weida segment, and equal segments come from
// equal levels. That is what makes the filter conversion exact.

// escapeCount returns how many bytes of s the escape replaces.
func escapeCount(s string) int {
	n := 0
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%', '.', '*':
			n++
		}
	}
	return n
}

func writeEscaped(b *strings.Builder, lv string) {
	for i := 0; i < len(lv); i++ {
		switch c := lv[i]; c {
		case '%':
			b.WriteString("%25")
		case '.':
			b.WriteString("%2E")
		case '*':
			b.WriteString("%2A")
		default:
			b.WriteByte(c)
		}
	}
}

// checkEscaped reports how many escape sequences seg holds, or, when seg is
// not in the escaped form, why not.
func checkEscaped(seg string) (n int, why string) {
	for i := 0; i < len(seg); i++ {
		switch seg[i] {
		case '*':
			return 0, "a bare '*' is not in the escaped form (a literal '*' is written %2A)"
		case '%':
			if i+2 >= len(seg) || seg[i+1] != '2' || (seg[i+2] != '5' && seg[i+2] != 'E' && seg[i+2] != 'A') {
				return 0, "'%' must start one of the escapes %25, %2E or %2A"
			}
			n++
			i += 2
		}
	}
	return n, ""
}

// writeUnescaped decodes a segment that checkEscaped accepted.
func writeUnescaped(b *strings.Builder, seg string) {
	for i := 0; i < len(seg); i++ {
		c := seg[i]
		if c == '%' {
			switch seg[i+2] {
			case '5':
				c = '%'
			case 'E':
				c = '.'
			case 'A':
				c = '*'
			}
			i += 2
		}
		b.WriteByte(c)
	}
}
