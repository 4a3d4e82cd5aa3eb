package weida

import (
	"bytes"
	"errors"
	"io"
	"os"
	"testing"

	"weida.dev/connector/weida/wire"
)

// bytesPeeker is a stream whose first avail bytes have arrived. A peek
// beyond them ends with io.EOF when they are all of the stream (final) and
// with a passed read deadline otherwise, as a quic-go stream would.
type bytesPeeker struct {
	data  []byte
	avail int
	final bool
}

func (p *bytesPeeker) Peek(b []byte) (int, error) {
	n := copy(b, p.data[:p.avail])
	if n == len(b) {
		return n, nil
	}
	if p.final {
		return n, io.EOF
	}
	return n, os.ErrDeadlineExceeded
}

func (p *bytesPeeker) Read([]byte) (int, error) { panic("peekHeader must not consume") }

func peekSeeds(f *testing.F) {
	for _, s := range [][]byte{
		{0x57, 0x01, 0x05, 0xA1, 0x00, 0x62, 0x2F, 0x74},
		{0x57, 0x00, 0x10, 0xA5, 0x00, 0x81, 0x00, 0x01, 0x19, 0x40, 0x00, 0x02, 0x19, 0x04, 0x00, 0x03, 0x80, 0x04, 0x80},
		{0x57, 0x03, 0x0B, 0xA2, 0x00, 0x63, 0x2F, 0x6D, 0x64, 0x01, 0x63, 0x70, 0x78, 0x2E},
		{0x57, 0x01, 0x40, 0x05, 0xA1, 0x00, 0x62, 0x2F, 0x74, 'p', 'a', 'y'},
		{0x57, 0x03, 0xC0, 0, 0, 0, 0, 0, 0x40, 0x01},
		{0x57, 0x08, 0x01, 0xA0},
		{0x58},
		{0x57},
		{},
	} {
		f.Add(s, uint16(len(s)), uint16(64))
	}
}

// FuzzPeekHeader: peeking a preamble agrees with wire.ParsePreamble on the
// whole stream, and never calls the peer's bytes a violation before they
// are one: a violation found in a prefix that is still arriving is a
// violation of the whole stream too.
func FuzzPeekHeader(f *testing.F) {
	peekSeeds(f)
	f.Fuzz(func(t *testing.T, data []byte, cut uint16, max uint16) {
		limit := uint64(max)
		whole := &bytesPeeker{data: data, avail: len(data), final: true}
		k, hdr, n, err := peekHeader(whole, newStreamBuf(), limit)
		wk, whdr, wn, werr := wire.ParsePreamble(data, limit)
		switch {
		case len(data) == 0:
			if !errors.Is(err, errEmptyStream) {
				t.Fatalf("empty stream: %v", err)
			}
		case werr == nil:
			if err != nil || k != wk || n != wn || !bytes.Equal(hdr, whdr) {
				t.Fatalf("peekHeader = %v %x %d %v, ParsePreamble = %v %x %d", k, hdr, n, err, wk, whdr, wn)
			}
		default:
			var a, b *wire.Error
			if !errors.As(err, &a) || !errors.As(werr, &b) || a.Rule != b.Rule {
				t.Fatalf("peekHeader error %v, ParsePreamble error %v", err, werr)
			}
		}
		// The same stream with only a prefix arrived so far.
		partial := &bytesPeeker{data: data, avail: int(cut) % (len(data) + 1)}
		_, _, _, perr := peekHeader(partial, newStreamBuf(), limit)
		var pe *wire.Error
		if errors.As(perr, &pe) {
			var we *wire.Error
			if !errors.As(werr, &we) || we.Rule != pe.Rule {
				t.Fatalf("prefix of %d bytes called a violation (%v) that the whole stream is not (%v)", partial.avail, perr, werr)
			}
		} else if perr != nil && !errors.Is(perr, os.ErrDeadlineExceeded) {
			t.Fatalf("prefix: %v", perr)
		}
	})
}

// TestPeekHeaderAllocs: peeking a well-formed preamble and header costs
// nothing, both in peekHeader and in the connection's peekPreamble around
// it, which every stream of either role goes through.
func TestPeekHeaderAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	st := &bytesPeeker{data: []byte{0x57, 0x01, 0x05, 0xA1, 0x00, 0x62, 0x2F, 0x74, 'x'}, avail: 9, final: true}
	sb := newStreamBuf()
	if a := testing.AllocsPerRun(100, func() { _, _, _, _ = peekHeader(st, sb, 16384) }); a != 0 {
		t.Errorf("peekHeader: %v allocations, want 0", a)
	}
	c := &conn{limits: &Limits{MaxHeaderBytes: 16384}}
	if a := testing.AllocsPerRun(100, func() {
		if _, _, _, r := c.peekPreamble(st, sb); r != peekOK {
			t.Fatalf("peekPreamble = %v, want peekOK", r)
		}
	}); a != 0 {
		t.Errorf("peekPreamble: %v allocations, want 0", a)
	}
}

// TestPeekHeaderRefusesAsParsePreamble: a bad preamble is refused by the
// peeking reader with exactly the error wire.ParsePreamble gives for the
// same bytes (rule, frame, detail, wrapped error), whether the stream ends
// there or keeps arriving, since both go through the one parser.
func TestPeekHeaderRefusesAsParsePreamble(t *testing.T) {
	for _, bad := range [][]byte{
		{0x58, 0x01, 0x00},                         // bad magic
		{0x57, 0x08, 0x01, 0xA0},                   // reserved kind
		{0x57, 0x01, 0x40, 0x41, 0x00},             // header_len 65 over the limit of 64
		{0x57, 0x03, 0xC0, 0, 0, 0, 0, 0, 0x40, 0}, // header_len 16384 in an 8-byte varint
		{0x57, 0x01, 0x05, 0xA1, 0x00},             // the stream ends inside the header
		{0x57, 0x01, 0x40},                         // and inside header_len
		{0x57},                                     // and after the magic
	} {
		_, _, _, want := wire.ParsePreamble(bad, 64)
		for _, final := range []bool{true, false} {
			st := &bytesPeeker{data: bad, avail: len(bad), final: final}
			_, _, _, err := peekHeader(st, newStreamBuf(), 64)
			var got, exp *wire.Error
			if !final && errors.As(want, &exp) && exp.Rule == wire.RuleTruncatedPreamble {
				if !errors.Is(err, os.ErrDeadlineExceeded) {
					t.Errorf("% X still arriving: %v, want to wait for more", bad, err)
				}
				continue
			}
			if !errors.As(err, &got) || !errors.As(want, &exp) || *got != *exp {
				t.Errorf("% X (final %v): peekHeader %#v, ParsePreamble %#v", bad, final, err, want)
			}
		}
	}
}
