package wire

import (
	"bytes"
	"errors"
	"io"
	"runtime"
	"strings"
	"testing"
	"testing/iotest"
)

var preambleCases = []struct {
	name   string
	in     string // whole input
	max    uint64
	kind   Kind
	header string // expected header when rule is ""
	rule   string
}{
	{"minimal varint", "57 01 05 A1 00 62 2F 74", 16384, KindData, "A1 00 62 2F 74", ""},
	{"two-byte varint", "57 01 40 05 A1 00 62 2F 74", 16384, KindData, "A1 00 62 2F 74", ""},
	{"four-byte varint", "57 01 80 00 00 05 A1 00 62 2F 74", 16384, KindData, "A1 00 62 2F 74", ""},
	{"eight-byte varint", "57 01 C0 00 00 00 00 00 00 05 A1 00 62 2F 74", 16384, KindData, "A1 00 62 2F 74", ""},
	{"payload follows", "57 01 01 A0 68 69", 16384, KindData, "A0", ""},
	{"empty header", "57 03 00", 16384, KindSubscribe, "", ""},
	{"header exactly at max", "57 01 05 A1 00 62 2F 74", 5, KindData, "A1 00 62 2F 74", ""},
	{"zero max, empty header", "57 00 00", 0, KindHello, "", ""},
	{"CREDIT kind", "57 05 01 A0", 16384, KindCredit, "A0", ""},
	{"CURSOR kind", "57 06 01 A0", 16384, KindCursor, "A0", ""},
	{"FLOW kind", "57 07 01 A0", 16384, KindFlow, "A0", ""},

	{"header one over max", "57 01 05 A1 00 62 2F 74", 4, KindData, "", RuleHeaderTooLarge},
	{"header_len 2^62-1", "57 01 FF FF FF FF FF FF FF FF", 16384, KindData, "", RuleHeaderTooLarge},
	{"over max by one, header absent", "57 00 80 00 40 01", 16384, KindHello, "", RuleHeaderTooLarge},
	{"bad magic", "58 01 01 A0", 16384, 0, "", RuleBadMagic},
	{"bad magic alone", "00", 16384, 0, "", RuleBadMagic},
	{"TLS record instead of magic", "16 03 01", 16384, 0, "", RuleBadMagic},
	{"kind 8", "57 08 01 A0", 16384, 8, "", RuleReservedKind},
	{"kind 255", "57 FF 01 A0", 16384, 255, "", RuleReservedKind},
	{"kind 8, stream ends", "57 08", 16384, 8, "", RuleReservedKind},
	{"magic only", "57", 16384, 0, "", RuleTruncatedPreamble},
	{"no varint", "57 01", 16384, KindData, "", RuleTruncatedPreamble},
	{"varint cut", "57 01 40", 16384, KindData, "", RuleTruncatedPreamble},
	{"eight-byte varint cut", "57 01 C0 00 00 00", 16384, KindData, "", RuleTruncatedPreamble},
	{"header cut", "57 01 05 A1 00 62", 16384, KindData, "", RuleTruncatedPreamble},
	{"header missing", "57 01 05", 16384, KindData, "", RuleTruncatedPreamble},
}

func TestPreamble(t *testing.T) {
	readers := map[string]func([]byte) io.Reader{
		"whole":    func(b []byte) io.Reader { return bytes.NewReader(b) },
		"one byte": func(b []byte) io.Reader { return iotest.OneByteReader(bytes.NewReader(b)) },
		"data+EOF": func(b []byte) io.Reader { return iotest.DataErrReader(bytes.NewReader(b)) },
	}
	for _, c := range preambleCases {
		t.Run(c.name, func(t *testing.T) {
			in := unhex(t, c.in)
			want := unhex(t, c.header)
			check := func(how string, k Kind, h []byte, err error) {
				t.Helper()
				if c.rule == "" {
					if err != nil || k != c.kind || !bytes.Equal(h, want) {
						t.Fatalf("%s: got %v, % X, %v; want %v, % X", how, k, h, err, c.kind, want)
					}
					return
				}
				var we *Error
				if !errors.As(err, &we) || we.Rule != c.rule || we.Frame != c.kind || we.Key != -1 {
					t.Fatalf("%s: got %v, %v; want *Error %q for %v", how, k, err, c.rule, c.kind)
				}
				if (c.rule == RuleHeaderTooLarge) != errors.Is(err, ErrHeaderTooLarge) {
					t.Fatalf("%s: errors.Is(%v, ErrHeaderTooLarge) wrong", how, err)
				}
				if (c.rule == RuleTruncatedPreamble) != errors.Is(err, io.ErrUnexpectedEOF) {
					t.Fatalf("%s: errors.Is(%v, io.ErrUnexpectedEOF) wrong", how, err)
				}
			}
			k, h, n, err := ParsePreamble(in, c.max)
			check("ParsePreamble", k, h, err)
			if err == nil && !bytes.Equal(in[n:], in[len(in)-(len(in)-n):]) {
				t.Fatalf("ParsePreamble n = %d", n)
			}
			for name, mk := range readers {
				r := mk(in)
				k, h, err := ReadPreamble(r, c.max, nil)
				check("ReadPreamble "+name, k, h, err)
				if err == nil {
					// Nothing past the header was consumed: the payload is intact.
					rest, _ := io.ReadAll(r)
					if !bytes.Equal(rest, in[n:]) {
						t.Fatalf("ReadPreamble %s left % X, want % X", name, rest, in[n:])
					}
				}
			}
		})
	}
}

func TestReadPreambleEOF(t *testing.T) {
	if _, _, err := ReadPreamble(bytes.NewReader(nil), DefaultMaxHeaderBytes, nil); err != io.EOF {
		t.Fatalf("empty stream: got %v, want bare io.EOF", err)
	}
	if _, _, _, err := ParsePreamble(nil, DefaultMaxHeaderBytes); err != io.EOF {
		t.Fatalf("empty slice: got %v, want bare io.EOF", err)
	}
}

func TestReadPreambleReaderError(t *testing.T) {
	boom := errors.New("stream reset")
	for _, prefix := range []string{"", "57", "57 01", "57 01 40", "57 01 05 A1"} {
		r := io.MultiReader(bytes.NewReader(unhex(t, prefix)), iotest.ErrReader(boom))
		_, _, err := ReadPreamble(r, DefaultMaxHeaderBytes, nil)
		var we *Error
		if !errors.Is(err, boom) || errors.As(err, &we) {
			t.Fatalf("after %q: got %v; want the reader's error, not an *Error", prefix, err)
		}
	}
}

// countingReader counts Read calls and fails the test when more than limit
// bytes are requested in total after the preamble's fixed part.
type countingReader struct {
	r     io.Reader
	calls int
}

func (c *countingReader) Read(p []byte) (int, error) {
	c.calls++
	return c.r.Read(p)
}

func TestReadPreambleReadsInFewCalls(t *testing.T) {
	for _, c := range []struct {
		in    string
		calls int
	}{
		{"57 01 05 A1 00 62 2F 74", 2},                         // 3 fixed bytes, header
		{"57 01 C0 00 00 00 00 00 00 05 A1 00 62 2F 74 FF", 3}, // 3 fixed bytes, varint rest, header
	} {
		cr := &countingReader{r: bytes.NewReader(unhex(t, c.in))}
		if _, _, err := ReadPreamble(cr, DefaultMaxHeaderBytes, make([]byte, 0, 64)); err != nil {
			t.Fatal(err)
		}
		if cr.calls != c.calls {
			t.Errorf("%s: %d Read calls, want %d", c.in, cr.calls, c.calls)
		}
	}
}

// TestReadPreambleRefusesBeforeAllocating announces a header of 64 MiB
// against a limit one byte smaller: the refusal must come without reading
// the header and without allocating anything near its size.
func TestReadPreambleRefusesBeforeAllocating(t *testing.T) {
	const size = 64 << 20
	in := AppendPreamble(nil, KindData, nil)[:2]
	in = appendVarint(in, size)
	cr := &countingReader{r: io.MultiReader(bytes.NewReader(in), iotest.ErrReader(errors.New("read past the varint")))}
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	_, _, err := ReadPreamble(cr, size-1, nil)
	runtime.ReadMemStats(&after)
	if !errors.Is(err, ErrHeaderTooLarge) {
		t.Fatalf("got %v, want ErrHeaderTooLarge", err)
	}
	if grew := after.TotalAlloc - before.TotalAlloc; grew > 1<<20 {
		t.Fatalf("allocated %d bytes before refusing", grew)
	}
}

func TestReadPreambleReusesBuffer(t *testing.T) {
	buf := make([]byte, 0, 64)
	_, h, err := ReadPreamble(bytes.NewReader(unhex(t, "57 01 05 A1 00 62 2F 74")), DefaultMaxHeaderBytes, buf)
	if err != nil {
		t.Fatal(err)
	}
	if &h[0] != &buf[:1][0] {
		t.Fatal("header not read into the caller's buffer")
	}
	// A buffer too small for the header is replaced, not overrun.
	small := make([]byte, 0, 8)
	_, h, err = ReadPreamble(bytes.NewReader(AppendPreamble(nil, KindData, make([]byte, 100))), DefaultMaxHeaderBytes, small)
	if err != nil || len(h) != 100 {
		t.Fatalf("got %d bytes, %v", len(h), err)
	}
}

func TestAppendPreambleVarintForms(t *testing.T) {
	for _, c := range []struct {
		n, varint int
	}{{0, 1}, {63, 1}, {64, 2}, {16383, 2}, {16384, 4}} {
		header := make([]byte, c.n)
		frame := AppendPreamble(nil, KindData, header)
		if got := len(frame) - c.n - 2; got != c.varint {
			t.Errorf("header %d: varint of %d bytes, want %d", c.n, got, c.varint)
		}
		k, h, n, err := ParsePreamble(frame, uint64(c.n))
		if err != nil || k != KindData || len(h) != c.n || n != len(frame) {
			t.Errorf("header %d: ParsePreamble = %v, %d, %d, %v", c.n, k, len(h), n, err)
		}
		ins := InsertPreamble(append([]byte(nil), header...), 0, KindData)
		if !bytes.Equal(ins, frame) {
			t.Errorf("header %d: InsertPreamble differs from AppendPreamble", c.n)
		}
	}
	// The longer forms, checked on the varint alone.
	for _, c := range []struct {
		v uint64
		n int
	}{{1<<30 - 1, 4}, {1 << 30, 8}, {MaxVarint, 8}} {
		v := c.v
		b := appendVarint(nil, v)
		got, n, ok := consumeVarint(b)
		if len(b) != c.n || !ok || n != c.n || got != v {
			t.Errorf("varint %d: % X -> %d, %d, %v", v, b, got, n, ok)
		}
	}
	// RFC 9000 §A.1 examples.
	for _, c := range []struct {
		hex string
		v   uint64
	}{{"C2 19 7C 5E FF 14 E8 8C", 151288809941952652}, {"9D 7F 3E 7D", 494878333}, {"7B BD", 15293}, {"25", 37}, {"40 25", 37}} {
		got, _, ok := consumeVarint(unhex(t, c.hex))
		if !ok || got != c.v {
			t.Errorf("%s: got %d, want %d", c.hex, got, c.v)
		}
	}
}

func TestKindAndCodeNames(t *testing.T) {
	for k, want := range map[Kind]string{
		KindHello: "HELLO", KindData: "DATA", KindError: "ERROR", KindSubscribe: "SUBSCRIBE",
		KindUnsubscribe: "UNSUBSCRIBE", KindCredit: "CREDIT", KindCursor: "CURSOR", KindFlow: "FLOW", 8: "kind(8)",
	} {
		if got := k.String(); got != want {
			t.Errorf("Kind(%d).String() = %q, want %q", k, got, want)
		}
	}
	for c, want := range map[Code]string{
		CodeNoError: "NO_ERROR", CodeProtocolViolation: "PROTOCOL_VIOLATION", CodeUnsupported: "UNSUPPORTED", 10: "code(10)",
	} {
		if got := c.String(); got != want {
			t.Errorf("Code(%d).String() = %q, want %q", c, got, want)
		}
	}
}

func TestErrorMessages(t *testing.T) {
	for _, c := range []struct {
		err  *Error
		want string
	}{
		{&Error{Key: -1, Rule: RuleBadMagic, Detail: "got 0x58"}, "wire: preamble: magic byte is not 0x57 (got 0x58)"},
		{&Error{Frame: KindData, Key: -1, Rule: RuleHeaderTooLarge}, "wire: preamble of DATA: header_len exceeds max_header_bytes"},
		{&Error{Frame: KindSubscribe, Key: 1, Rule: RuleTextTooLong, Detail: "257 > 256 bytes"}, "wire: SUBSCRIBE header key 1: text longer than its cap (257 > 256 bytes)"},
		{&Error{Frame: KindHello, Key: -1, Rule: RuleTrailingBytes}, "wire: HELLO header: bytes after the header map"},
	} {
		if got := c.err.Error(); got != c.want {
			t.Errorf("got %q\nwant %q", got, c.want)
		}
	}
	if !strings.HasPrefix(ErrHeaderTooLarge.Error(), "wire: ") {
		t.Error("sentinel without package prefix")
	}
}

// TestPreambleNeedAgreesWithParse: for every prefix of good and bad
// preambles, PreambleNeed reports a violation exactly when ParsePreamble
// reports the same one, and a length no greater than the prefix exactly
// when ParsePreamble succeeds on it.
func TestPreambleNeedAgreesWithParse(t *testing.T) {
	for _, s := range [][]byte{
		{0x57, 0x01, 0x05, 0xA1, 0x00, 0x62, 0x2F, 0x74, 'p'},
		{0x57, 0x01, 0x40, 0x05, 0xA1, 0x00, 0x62, 0x2F, 0x74},
		{0x57, 0x03, 0xC0, 0, 0, 0, 0, 0, 0x40, 0x01},
		{0x57, 0x00, 0x00},
		{0x57, 0x08, 0x01, 0xA0},
		{0x58, 0x01},
		{0x57, 0x01, 0x3F},
	} {
		for cut := 0; cut <= len(s); cut++ {
			b := s[:cut]
			need, err := PreambleNeed(b, 32)
			_, _, n, perr := ParsePreamble(b, 32)
			var pe *Error
			truncated := errors.As(perr, &pe) && pe.Rule == RuleTruncatedPreamble || perr == io.EOF
			switch {
			case err != nil:
				if perr == nil || err.Error() != perr.Error() {
					t.Errorf("% X: PreambleNeed %v, ParsePreamble %v", b, err, perr)
				}
			case need <= len(b):
				if perr != nil || n != need {
					t.Errorf("% X: PreambleNeed %d, ParsePreamble %d %v", b, need, n, perr)
				}
			case !truncated:
				t.Errorf("% X: PreambleNeed wants %d bytes, ParsePreamble %v", b, need, perr)
			}
		}
	}
}
