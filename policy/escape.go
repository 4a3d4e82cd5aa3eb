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

// escapeAt reports whether s[i], a '%', starts one of the three escapes.
func escapeAt(s string, i int) bool {
	return i+2 < len(s) && s[i+1] == '2' && (s[i+2] == '5' || s[i+2] == 'E' || s[i+2] == 'A')
}

// writeUnescaped decodes a segment in the escaped form (see escapeAt).
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
