package wire

import (
	"encoding/binary"
	"fmt"
	"math"
	"unicode/utf8"
)

// CBOR major types (RFC 8949 §3.1).
const (
	majorUint   = 0
	majorNegint = 1
	majorBytes  = 2
	majorText   = 3
	majorArray  = 4
	majorMap    = 5
	majorTag    = 6
	majorSimple = 7
)

// decoder reads one strict header. It never slices or reserves memory from a
// declared length before comparing that length with the bytes remaining.
type decoder struct {
	b     []byte
	off   int
	frame Kind

	// shared is string(b[sharedBase:]), made at the first text field; later
	// text fields are substrings of it, so one header costs one string
	// allocation however many text fields it carries. Keys ascend, so every
	// later text field lies after sharedBase.
	shared     string
	sharedBase int
	haveShared bool
}

func (d *decoder) fail(key int, rule string) error {
	return &Error{Frame: d.frame, Key: key, Rule: rule}
}

func (d *decoder) failf(key int, rule, format string, args ...any) error {
	return &Error{Frame: d.frame, Key: key, Rule: rule, Detail: fmt.Sprintf(format, args...)}
}

func (d *decoder) remaining() uint64 { return uint64(len(d.b) - d.off) }

// head reads one item's initial byte and argument, rejecting every head
// PROTOCOL §5 forbids: reserved additional information, indefinite lengths,
// a break, tags, half-precision floats and simple values other than
// false/true/null/undefined. For major type 7 it consumes a float's bytes and
// returns the additional information as arg.
//
// One case per forbidden head, as §5 lists them.
func (d *decoder) head(key int) (major byte, arg uint64, err error) {
	if d.off >= len(d.b) {
		return 0, 0, d.fail(key, RuleTruncated)
	}
	ib := d.b[d.off]
	major, ai := ib>>5, ib&0x1f
	switch {
	case major == majorTag:
		return 0, 0, d.fail(key, RuleTag)
	case major == majorSimple:
		switch {
		case ai >= 20 && ai <= 23: // false, true, null, undefined
			d.off++
			return major, uint64(ai), nil
		case ai == 25:
			return 0, 0, d.fail(key, RuleHalfFloat)
		case ai == 26 || ai == 27: // 32- and 64-bit floats are plain data
		case ai == 31:
			return 0, 0, d.fail(key, RuleIndefinite)
		case ai >= 28:
			return 0, 0, d.fail(key, RuleMalformed)
		default: // 0-19 and the one-byte simple values of ai 24
			return 0, 0, d.fail(key, RuleSimpleValue)
		}
	case ai == 31:
		if major == majorUint || major == majorNegint {
			return 0, 0, d.fail(key, RuleMalformed)
		}
		return 0, 0, d.fail(key, RuleIndefinite)
	case ai >= 28:
		return 0, 0, d.fail(key, RuleMalformed)
	}
	d.off++
	if ai < 24 {
		return major, uint64(ai), nil
	}
	n := 1 << (ai - 24) // 1, 2, 4 or 8 argument bytes
	if d.remaining() < uint64(n) {
		return 0, 0, d.fail(key, RuleTruncated)
	}
	p := d.b[d.off : d.off+n]
	d.off += n
	switch n {
	case 1:
		arg = uint64(p[0])
	case 2:
		arg = uint64(binary.BigEndian.Uint16(p))
	case 4:
		arg = uint64(binary.BigEndian.Uint32(p))
	default:
		arg = binary.BigEndian.Uint64(p)
	}
	if major == majorSimple {
		return major, uint64(ai), nil
	}
	return major, arg, nil
}

// openMap reads a definite-length map head. A header, and a nested map where
// a key's type calls for one, must be exactly that.
func (d *decoder) openMap(key int) (mapReader, error) {
	major, n, err := d.head(key)
	if err != nil {
		return mapReader{}, err
	}
	if major != majorMap {
		if key < 0 {
			return mapReader{}, d.fail(key, RuleNotMap)
		}
		return mapReader{}, d.fail(key, RuleType)
	}
	// Every entry takes at least two bytes; a count the input cannot hold is
	// refused now rather than after a long loop.
	if n > d.remaining()/2 {
		return mapReader{}, d.failf(key, RuleTruncated, "map of %d entries in %d bytes", n, d.remaining())
	}
	return mapReader{left: n, outer: key}, nil
}

// mapReader tracks one map's keys: how many remain and the last one read,
// which is all strict ascending order needs to reject duplicates anywhere in
// the map (skipped keys included) in constant space.
type mapReader struct {
	left    uint64
	last    uint64
	started bool
	outer   int // the HELLO key whose value this map is; -1 for the header map itself
}

// next reads the next key; ok is false when the map is exhausted.
func (d *decoder) next(m *mapReader) (key uint64, ok bool, err error) {
	if m.left == 0 {
		return 0, false, nil
	}
	m.left--
	if d.off >= len(d.b) {
		return 0, false, d.fail(m.outer, RuleTruncated)
	}
	if d.b[d.off]>>5 != majorUint {
		return 0, false, d.fail(m.outer, RuleKeyNotUint)
	}
	_, key, err = d.head(m.outer)
	if err != nil {
		return 0, false, err
	}
	if m.started {
		switch {
		case key == m.last:
			return 0, false, d.fail(m.errKey(key), RuleDuplicateKey)
		case key < m.last:
			return 0, false, d.failf(m.errKey(key), RuleKeyOrder, "%d after %d", key, m.last)
		}
	}
	m.last, m.started = key, true
	return key, true, nil
}

// errKey is the Error.Key for a fault about key k of m: k itself at top
// level, the enclosing HELLO key inside a nested map.
func (m *mapReader) errKey(k uint64) int {
	if m.outer >= 0 {
		return m.outer
	}
	return keyInt(k)
}

func keyInt(k uint64) int {
	if k > math.MaxInt32 {
		return math.MaxInt32
	}
	return int(k)
}

// finish rejects bytes after the header map.
func (d *decoder) finish() error {
	if d.off != len(d.b) {
		return d.failf(-1, RuleTrailingBytes, "%d bytes", len(d.b)-d.off)
	}
	return nil
}

// uint reads an unsigned integer value (any argument length is accepted:
// minimal encoding binds encoders only).
func (d *decoder) uint(key int) (uint64, error) {
	return d.want(key, majorUint)
}

// want reads a head that must have major type major (after the head itself
// passed the checks every item gets) and returns its argument.
func (d *decoder) want(key int, major byte) (uint64, error) {
	m, arg, err := d.head(key)
	if err != nil {
		return 0, err
	}
	if m != major {
		return 0, d.fail(key, RuleType)
	}
	return arg, nil
}

// textSpan reads a text string of at most max bytes and returns its bounds
// in d.b. The cap and the remaining input are checked before slicing, and the
// bytes must be valid UTF-8.
func (d *decoder) textSpan(key int, max int) (start, end int, err error) {
	n, err := d.want(key, majorText)
	if err != nil {
		return 0, 0, err
	}
	if n > uint64(max) {
		return 0, 0, d.failf(key, RuleTextTooLong, "%d > %d bytes", n, max)
	}
	if n > d.remaining() {
		return 0, 0, d.fail(key, RuleTruncated)
	}
	start, end = d.off, d.off+int(n)
	if !utf8.Valid(d.b[start:end]) {
		return 0, 0, d.fail(key, RuleUTF8)
	}
	d.off = end
	return start, end, nil
}

// text reads a capped text string and returns it as a substring of the
// header's one shared string.
func (d *decoder) text(key int, max int) (string, error) {
	start, end, err := d.textSpan(key, max)
	if err != nil {
		return "", err
	}
	if !d.haveShared {
		d.shared, d.sharedBase, d.haveShared = string(d.b[start:]), start, true
	}
	return d.shared[start-d.sharedBase : end-d.sharedBase], nil
}

// bytesExact reads a byte string that must be exactly n bytes long.
func (d *decoder) bytesExact(key int, n int, rule string) ([]byte, error) {
	l, err := d.want(key, majorBytes)
	if err != nil {
		return nil, err
	}
	if l != uint64(n) {
		return nil, d.failf(key, rule, "%d bytes", l)
	}
	if l > d.remaining() {
		return nil, d.fail(key, RuleTruncated)
	}
	out := make([]byte, n)
	copy(out, d.b[d.off:])
	d.off += n
	return out, nil
}

// arrayLen reads a definite array head whose count may not exceed max
// (checked here, before the caller reserves anything), failing with rule.
func (d *decoder) arrayLen(key int, max int, rule string) (int, error) {
	n, err := d.want(key, majorArray)
	if err != nil {
		return 0, err
	}
	if n > uint64(max) {
		return 0, d.failf(key, rule, "%d items", n)
	}
	if n > d.remaining() {
		return 0, d.fail(key, RuleTruncated)
	}
	return int(n), nil
}

// uintList reads a list of at most MaxListItems unsigned integers. A present
// empty list decodes to a non-nil empty slice.
func (d *decoder) uintList(key int) ([]uint64, error) {
	n, err := d.arrayLen(key, MaxListItems, RuleListTooLong)
	if err != nil {
		return nil, err
	}
	out := make([]uint64, n) // n <= MaxListItems and <= the bytes left
	for i := range out {
		if out[i], err = d.uint(key); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// skip passes over one value of an unknown key. It is iterative, with a fixed
// stack of MaxSkipDepth outstanding counts: a non-empty array or map inside
// the value takes one level, an empty one takes none, and a ninth level is
// RuleSkipDepth. The forbidden heads are refused here as everywhere, and text
// strings must be valid UTF-8 even when skipped. Maps inside a skipped value
// are plain CBOR: their keys are not held to the header's key rules.
func (d *decoder) skip(key int) error {
	var stack [MaxSkipDepth]uint64
	depth := 0
	left := uint64(1)
	for {
		if left == 0 {
			if depth == 0 {
				return nil
			}
			depth--
			left = stack[depth]
			continue
		}
		left--
		major, arg, err := d.head(key)
		if err != nil {
			return err
		}
		switch major {
		case majorBytes, majorText:
			if arg > d.remaining() {
				return d.fail(key, RuleTruncated)
			}
			end := d.off + int(arg)
			if major == majorText && !utf8.Valid(d.b[d.off:end]) {
				return d.fail(key, RuleUTF8)
			}
			d.off = end
		case majorArray, majorMap:
			count := arg
			if major == majorMap {
				if arg > math.MaxUint64/2 {
					return d.fail(key, RuleTruncated)
				}
				count = 2 * arg
			}
			if count == 0 {
				continue
			}
			if depth == MaxSkipDepth {
				return d.fail(key, RuleSkipDepth)
			}
			if count > d.remaining() { // each item takes at least one byte
				return d.fail(key, RuleTruncated)
			}
			stack[depth] = left
			depth++
			left = count
		}
	}
}

// cborTrue is the simple value true.
const cborTrue = 0xf5

// optTrue reads an extension key's boolean: true for CBOR true; false for
// any other item, which it skips under the rules every skipped value obeys.
func (d *decoder) optTrue(key int) (bool, error) {
	if d.off < len(d.b) && d.b[d.off] == cborTrue {
		d.off++
		return true, nil
	}
	return false, d.skip(key)
}

// optUint reads an extension key's unsigned integer, or skips an item of
// another type and reports it absent.
func (d *decoder) optUint(key int) (uint64, bool, error) {
	if d.off < len(d.b) && d.b[d.off]>>5 == majorUint {
		v, err := d.uint(key)
		return v, err == nil, err
	}
	return 0, false, d.skip(key)
}

// Encoding helpers. Every integer is written in its shortest form.

func appendHead(dst []byte, major byte, v uint64) []byte {
	m := major << 5
	switch {
	case v < 24:
		return append(dst, m|byte(v))
	case v <= math.MaxUint8:
		return append(dst, m|24, byte(v))
	case v <= math.MaxUint16:
		return append(dst, m|25, byte(v>>8), byte(v))
	case v <= math.MaxUint32:
		return append(dst, m|26, byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	default:
		return append(dst, m|27, byte(v>>56), byte(v>>48), byte(v>>40), byte(v>>32),
			byte(v>>24), byte(v>>16), byte(v>>8), byte(v))
	}
}

func appendUintKV(dst []byte, key, v uint64) []byte {
	return appendHead(appendHead(dst, majorUint, key), majorUint, v)
}

func appendTextKV(dst []byte, key uint64, s string) []byte {
	dst = appendHead(dst, majorUint, key)
	dst = appendHead(dst, majorText, uint64(len(s)))
	return append(dst, s...)
}

func appendUintList(dst []byte, key uint64, l []uint64) []byte {
	dst = appendHead(dst, majorUint, key)
	dst = appendHead(dst, majorArray, uint64(len(l)))
	for _, v := range l {
		dst = appendHead(dst, majorUint, v)
	}
	return dst
}

// checkText applies a text key's cap and UTF-8 rule to an outgoing value.
func checkText(frame Kind, key int, s string, max int) error {
	if len(s) > max {
		return &Error{Frame: frame, Key: key, Rule: RuleTextTooLong, Detail: fmt.Sprintf("%d > %d bytes", len(s), max)}
	}
	if !utf8.ValidString(s) {
		return &Error{Frame: frame, Key: key, Rule: RuleUTF8}
	}
	return nil
}
