package wire

import (
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
)

// Magic is the first byte of every weida stream (ASCII 'W').
const Magic byte = 0x57

// DefaultMaxHeaderBytes is PROTOCOL §10's default max_header_bytes: the
// largest header a peer accepts unless configured otherwise.
const DefaultMaxHeaderBytes = 16384

// MaxListItems is the most items a list-valued header field may declare
// (PROTOCOL §5). The count is checked before memory is reserved.
const MaxListItems = 64

// MaxSkipDepth is how many containers may nest inside a skipped value
// (PROTOCOL §5): eight nested non-empty arrays or maps pass, nine fail. An
// empty container adds no depth.
const MaxSkipDepth = 8

// preambleMax is the longest preamble: magic, kind, an eight-byte varint.
const preambleMax = 10

// MaxVarint is the largest value a QUIC varint can carry (2^62-1).
const MaxVarint = 1<<62 - 1

// Kind is the frame kind byte that follows [Magic] (PROTOCOL §4).
type Kind byte

// The frame kinds of PROTOCOL §4. Kinds 8-255 are reserved and are a
// violation wherever they appear.
const (
	KindHello       Kind = 0 // header only; uni stream
	KindData        Kind = 1 // header, then payload until FIN; uni or either bidi half
	KindError       Kind = 2 // header only; reply half of a bidi stream only
	KindSubscribe   Kind = 3 // header only; uni stream
	KindUnsubscribe Kind = 4 // header only; uni stream
	KindCredit      Kind = 5 // header only; uni stream (L2 credit, ignored by a v0 Pub/Sub peer)
	KindCursor      Kind = 6 // head frame, then varint records; uni stream
	KindFlow        Kind = 7 // header, then nothing on QUIC; uni stream
)

var kindNames = [...]string{
	"HELLO", "DATA", "ERROR", "SUBSCRIBE", "UNSUBSCRIBE", "CREDIT", "CURSOR", "FLOW",
}

// String returns the PROTOCOL §4 name of k, or "kind(N)" for a reserved kind.
func (k Kind) String() string {
	if k.Defined() {
		return kindNames[k]
	}
	return "kind(" + strconv.Itoa(int(k)) + ")"
}

// Defined reports whether k is one of the kinds 0-7 PROTOCOL §4 defines.
func (k Kind) Defined() bool { return int(k) < len(kindNames) }

// ReadPreamble reads one preamble from r: the magic byte, the kind, the QUIC
// varint header_len (any of its four encoding lengths, non-minimal ones
// included) and then exactly header_len header bytes, which it returns in
// buf[:header_len] when buf has the capacity and in a new slice otherwise.
// It reads nothing past the header, so for DATA r is left at the first
// payload byte.
//
// header_len above maxHeader is refused before anything is allocated or
// read for the header; header_len equal to maxHeader is accepted.
//
// ReadPreamble may overwrite buf up to its capacity, also when it fails.
//
// ReadPreamble returns:
//   - io.EOF, bare, when r ends before the first byte (a clean, empty stream);
//   - an [*Error] for bad magic, a reserved kind, header_len over maxHeader
//     (wrapping [ErrHeaderTooLarge]) and a stream that ends inside the
//     preamble or the header ([RuleTruncatedPreamble]);
//   - any other error of r wrapped with context (never an *Error).
//
// The fixed part takes at most two io.ReadFull calls (three bytes, then the
// rest of a longer varint) and the header one more: never a read per byte.
// With a buf of capacity at least 10 that also fits the header, ReadPreamble
// does not allocate; with a nil buf it allocates once for headers up to 256
// bytes.
func ReadPreamble(r io.Reader, maxHeader uint64, buf []byte) (Kind, []byte, error) {
	// The fixed part is read into buf's spare capacity when there is room, so
	// that a reused buffer makes the call allocation-free (a stack array
	// would escape through the io.Reader interface).
	scratch := buf[:cap(buf)]
	if len(scratch) < preambleMax {
		// Room for the fixed part and, afterwards, for a typical header, so a
		// caller without a buffer pays one allocation for both.
		scratch = make([]byte, 256)
		buf = scratch[:0]
	}
	// scanPreamble, the one reading of the rules, says how many bytes it
	// needs to tell more: three at first, then the rest of a longer varint.
	have, need := 0, 3
	var k Kind
	var start, end int
	for {
		n, err := io.ReadFull(r, scratch[have:need])
		have += n
		var perr error
		k, start, end, perr = scanPreamble(scratch[:have], maxHeader)
		if perr != nil {
			return k, nil, perr
		}
		if err != nil {
			if have == 0 && err == io.EOF {
				return 0, nil, io.EOF
			}
			return k, nil, readErr(k, have >= 2, err)
		}
		if start > 0 {
			break
		}
		need = end
	}
	hl := end - start
	// hl <= maxHeader: the caller's own limit bounds this allocation.
	if cap(buf) >= hl {
		buf = buf[:hl]
	} else {
		buf = make([]byte, hl)
	}
	if _, err := io.ReadFull(r, buf); err != nil {
		return k, nil, readErr(k, true, err)
	}
	return k, buf, nil
}

// readErr classifies a read failure inside a preamble: the stream ending
// early is the peer's violation, anything else is the reader's own error.
func readErr(k Kind, haveKind bool, err error) error {
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return &Error{Frame: k, Key: -1, Rule: RuleTruncatedPreamble, Err: io.ErrUnexpectedEOF}
	}
	if haveKind {
		return fmt.Errorf("wire: reading %v preamble: %w", k, err)
	}
	return fmt.Errorf("wire: reading preamble: %w", err)
}

// ParsePreamble is [ReadPreamble] for a preamble already in memory: it parses
// the start of b and returns the kind, the header (a subslice of b, not a
// copy) and the number of bytes the preamble and header occupy, so that
// b[n:] is the payload. The rules and errors are those of ReadPreamble; a b
// too short for the preamble or the header it announces is
// [RuleTruncatedPreamble], and an empty b is io.EOF.
func ParsePreamble(b []byte, maxHeader uint64) (k Kind, header []byte, n int, err error) {
	if len(b) == 0 {
		return 0, nil, 0, io.EOF
	}
	k, start, end, err := scanPreamble(b, maxHeader)
	if err != nil {
		return k, nil, 0, err
	}
	if start == 0 || end > len(b) {
		if len(b) < 2 {
			return 0, nil, 0, &Error{Key: -1, Rule: RuleTruncatedPreamble, Err: io.ErrUnexpectedEOF}
		}
		return k, nil, 0, &Error{Frame: k, Key: -1, Rule: RuleTruncatedPreamble, Err: io.ErrUnexpectedEOF}
	}
	return k, b[start:end:end], end, nil
}

// PreambleNeed is [ParsePreamble] for a reader that peeks a stream as it
// arrives: given the stream's first bytes b, it returns how long b must be
// for ParsePreamble to succeed, or, while b does not yet hold the whole
// preamble, how long it must be to tell more. It applies ParsePreamble's
// rules to what b holds, as early as the bytes allow (magic and kind before
// header_len, header_len against maxHeader before a header of that size is
// waited for), and returns the same violations; a short b is no violation
// here. It allocates only for a violation.
func PreambleNeed(b []byte, maxHeader uint64) (int, error) {
	_, _, end, err := scanPreamble(b, maxHeader)
	return end, err
}

// scanPreamble is the one reading of the preamble rules. When b holds the
// whole preamble it returns the kind and the header's bounds in the stream
// (start > 0; end may lie beyond b); while it does not, start is 0 and end
// the length b must reach to tell more. err is a violation b already shows.
func scanPreamble(b []byte, maxHeader uint64) (k Kind, start, end int, err error) {
	// Magic, kind and the varint's first byte: three bytes every preamble has.
	const fixed = 3
	if len(b) == 0 {
		return 0, 0, fixed, nil
	}
	if b[0] != Magic {
		return 0, 0, 0, &Error{Key: -1, Rule: RuleBadMagic, Detail: fmt.Sprintf("got 0x%02x", b[0])}
	}
	if len(b) < 2 {
		return 0, 0, fixed, nil
	}
	k = Kind(b[1])
	if !k.Defined() {
		return k, 0, 0, &Error{Frame: k, Key: -1, Rule: RuleReservedKind}
	}
	if len(b) < fixed {
		return k, 0, fixed, nil
	}
	hl, vn, ok := consumeVarint(b[2:])
	if !ok {
		return k, 0, 2 + 1<<(b[2]>>6), nil
	}
	if hl > maxHeader {
		return k, 0, 0, &Error{Frame: k, Key: -1, Rule: RuleHeaderTooLarge,
			Detail: fmt.Sprintf("%d > %d", hl, maxHeader), Err: ErrHeaderTooLarge}
	}
	start = 2 + vn
	if hl > uint64(math.MaxInt-start) {
		// Only a limit no buffer can meet gets here (a 32-bit int): the
		// header cannot arrive whole, so it stays truncated.
		return k, start, math.MaxInt, nil
	}
	return k, start, start + int(hl), nil
}

// AppendPreamble appends the preamble for a header of len(header) bytes
// (magic, k, header_len as a minimal QUIC varint) and then header itself, and
// returns the extended slice. It allocates only when dst lacks capacity.
func AppendPreamble(dst []byte, k Kind, header []byte) []byte {
	dst = append(dst, Magic, byte(k))
	dst = appendVarint(dst, uint64(len(header)))
	return append(dst, header...)
}

// InsertPreamble turns the header that occupies b[start:] into a whole frame
// start: it inserts the preamble for kind k in front of it, moving the header
// up, and returns the extended slice. It lets a caller encode a header
// straight into its output buffer:
//
//	start := len(out)
//	out = wire.AppendData(out, &d)
//	out = wire.InsertPreamble(out, start, wire.KindData)
//
// It allocates only when b lacks capacity for the at most 10 preamble bytes.
func InsertPreamble(b []byte, start int, k Kind) []byte {
	hl := uint64(len(b) - start)
	pn := 2 + varintLen(hl)
	b = append(b, make([]byte, pn)...) // grows in place; the compiler does not allocate the temporary
	copy(b[start+pn:], b[start:len(b)-pn])
	b[start] = Magic
	b[start+1] = byte(k)
	putVarint(b[start+2:start+pn], hl)
	return b
}

// varintLen is the length of v's minimal QUIC varint encoding.
func varintLen(v uint64) int {
	switch {
	case v <= 63:
		return 1
	case v <= 16383:
		return 2
	case v <= 1<<30-1:
		return 4
	default:
		return 8
	}
}

// appendVarint appends v as a minimal QUIC varint (RFC 9000 §16). v must not
// exceed [MaxVarint].
func appendVarint(dst []byte, v uint64) []byte {
	n := varintLen(v)
	var tmp [8]byte
	putVarint(tmp[:n], v)
	return append(dst, tmp[:n]...)
}

// putVarint writes v into b, whose length (1, 2, 4 or 8) selects the form.
func putVarint(b []byte, v uint64) {
	if v > MaxVarint {
		panic("wire: varint value exceeds 2^62-1")
	}
	for i := len(b) - 1; i >= 0; i-- {
		b[i] = byte(v)
		v >>= 8
	}
	switch len(b) {
	case 2:
		b[0] |= 0x40
	case 4:
		b[0] |= 0x80
	case 8:
		b[0] |= 0xc0
	}
}

// consumeVarint parses a QUIC varint at the start of b, in any of its four
// lengths, and returns it with the number of bytes it took.
func consumeVarint(b []byte) (v uint64, n int, ok bool) {
	if len(b) == 0 {
		return 0, 0, false
	}
	n = 1 << (b[0] >> 6)
	if len(b) < n {
		return 0, 0, false
	}
	v = uint64(b[0] & 0x3f)
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n, true
}
