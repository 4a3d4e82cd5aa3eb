package wire

import (
	"bytes"
	"errors"
	"io"
	"testing"
	"testing/iotest"
)

// headerKinds are the kinds with a decoder in this package.
var headerKinds = []Kind{KindHello, KindData, KindError, KindSubscribe, KindUnsubscribe}

// addHeaderSeeds seeds f with every header the tables know: the golden
// vectors, the must-reject headers, the rejection rows and the accepted rows.
func addHeaderSeeds(f *testing.F) {
	for _, g := range goldenVectors {
		_, h, _, err := ParsePreamble(unhex(f, g.frame), DefaultMaxHeaderBytes)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(h)
	}
	for _, r := range mustReject {
		f.Add(unhex(f, r.header))
	}
	for _, r := range rejections {
		f.Add(unhex(f, r.header))
	}
	for _, a := range accepted {
		f.Add(unhex(f, a.header))
	}
}

// FuzzDecodeHeaders feeds arbitrary bytes to every header decoder. None may
// panic; every failure must be an *Error; and whatever decodes must pass
// Validate, re-encode, and decode to the same value with a stable encoding.
func FuzzDecodeHeaders(f *testing.F) {
	addHeaderSeeds(f)
	f.Fuzz(func(t *testing.T, b []byte) {
		for _, k := range headerKinds {
			v, err := decodeHeader(k, b)
			if err != nil {
				var we *Error
				if !errors.As(err, &we) || we.Rule == "" || we.Frame != k {
					t.Fatalf("decode %s % X: error %v is not a proper *Error", k, b, err)
				}
				continue
			}
			checkRoundTrip(t, k, v)
		}
	})
}

// FuzzReadPreamble reads arbitrary bytes as a stream, whole and one byte at a
// time, and compares with ParsePreamble: the same kind, header and rule, a
// header never longer than the limit, and the payload left unread.
func FuzzReadPreamble(f *testing.F) {
	for _, g := range goldenVectors {
		f.Add(unhex(f, g.frame), uint16(DefaultMaxHeaderBytes))
	}
	for _, c := range preambleCases {
		f.Add(unhex(f, c.in), uint16(c.max))
	}
	f.Fuzz(func(t *testing.T, b []byte, max16 uint16) {
		max := uint64(max16)
		pk, ph, n, perr := ParsePreamble(b, max)
		for _, r := range []io.Reader{bytes.NewReader(b), iotest.OneByteReader(bytes.NewReader(b))} {
			k, h, err := ReadPreamble(r, max, nil)
			if (err == nil) != (perr == nil) {
				t.Fatalf("% X: ReadPreamble %v, ParsePreamble %v", b, err, perr)
			}
			if err != nil {
				if err == io.EOF {
					if perr != io.EOF {
						t.Fatalf("% X: io.EOF vs %v", b, perr)
					}
					continue
				}
				var we, pwe *Error
				if !errors.As(err, &we) || !errors.As(perr, &pwe) || we.Rule != pwe.Rule || we.Frame != pwe.Frame {
					t.Fatalf("% X: ReadPreamble %v, ParsePreamble %v", b, err, perr)
				}
				continue
			}
			if k != pk || !bytes.Equal(h, ph) || uint64(len(h)) > max {
				t.Fatalf("% X: ReadPreamble %v % X, ParsePreamble %v % X", b, k, h, pk, ph)
			}
			rest, _ := io.ReadAll(r)
			if !bytes.Equal(rest, b[n:]) {
				t.Fatalf("% X: payload % X left, want % X", b, rest, b[n:])
			}
			// The frame re-encodes minimally and parses back to the same parts.
			again := AppendPreamble(nil, k, h)
			if k2, h2, _, err := ParsePreamble(again, max); err != nil || k2 != k || !bytes.Equal(h2, h) {
				t.Fatalf("% X: re-encoded % X parses to %v % X %v", b, again, k2, h2, err)
			}
		}
	})
}
