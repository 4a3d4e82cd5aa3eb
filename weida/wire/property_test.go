package wire

import (
	"bytes"
	"errors"
	"io"
	"reflect"
	"strings"
	"testing"

	"pgregory.net/rapid"
)

// genText draws a text value for a field capped at max bytes: mostly valid,
// sometimes exactly at the cap, over it, or not UTF-8.
func genText(t *rapid.T, label string, max int) string {
	return genTextOf(t, label, max, false)
}

// genTextOf draws like genText, only valid values when valid is set.
func genTextOf(t *rapid.T, label string, max int, valid bool) string {
	shape := rapid.IntRange(0, 9).Draw(t, label+"-shape")
	if valid && (shape == 2 || shape == 3) {
		shape = 9
	}
	switch shape {
	case 0:
		return ""
	case 1:
		return strings.Repeat("a", max)
	case 2:
		return strings.Repeat("b", max+1)
	case 3:
		return "bad\xff" + rapid.StringN(0, 4, -1).Draw(t, label+"-tail")
	case 4:
		return strings.Repeat("é", max/2) // 2 bytes each: at the cap
	default:
		return rapid.StringN(0, 12, max).Draw(t, label)
	}
}

// genUint draws small, boundary and large integers.
func genUint(t *rapid.T, label string) uint64 {
	return rapid.SampledFrom([]uint64{0, 1, 2, 5, 6, 15, 16, 17, 23, 24, 255, 256, 65535, 65536,
		1<<32 - 1, 1 << 32, 1<<64 - 1}).Draw(t, label)
}

// genData draws a DATA value; about half are built to follow every rule, the
// rest break some rule by chance.
func genData(t *rapid.T) Data {
	valid := rapid.Bool().Draw(t, "valid")
	d := Data{
		Endpoint:           genTextOf(t, "endpoint", MaxEndpointBytes, valid),
		HasEndpoint:        rapid.Bool().Draw(t, "hasEndpoint"),
		ContentLen:         genUint(t, "contentLen"),
		HasContentLen:      rapid.Bool().Draw(t, "hasContentLen"),
		ContentType:        genTextOf(t, "contentType", MaxContentTypeBytes, valid),
		Traceparent:        genTextOf(t, "traceparent", MaxTraceparentBytes, valid),
		Tracestate:         genTextOf(t, "tracestate", MaxTracestateBytes, valid),
		Topic:              genTextOf(t, "topic", MaxTopicBytes, valid),
		HasTopic:           rapid.Bool().Draw(t, "hasTopic"),
		Sequence:           genUint(t, "sequence"),
		HasSequence:        rapid.Bool().Draw(t, "hasSequence"),
		Achieved:           rapid.Uint64Range(0, 7).Draw(t, "achieved"),
		HasAchieved:        rapid.Bool().Draw(t, "hasAchieved"),
		ReportID:           genUint(t, "reportID"),
		HasReportID:        rapid.Bool().Draw(t, "hasReportID"),
		ReportMode:         rapid.Uint64Range(0, 2).Draw(t, "reportMode"),
		DeliveryAttempt:    genUint(t, "attempt"),
		HasDeliveryAttempt: rapid.Bool().Draw(t, "hasAttempt"),
		Segment:            genUint(t, "segment"),
		HasSegment:         rapid.Bool().Draw(t, "hasSegment"),
		Layer:              rapid.Uint64Range(0, 17).Draw(t, "layer"),
	}
	if rapid.Bool().Draw(t, "hasProducer") {
		d.Producer = rapid.SliceOfN(rapid.Byte(), 31, 33).Draw(t, "producer")
	}
	if rapid.Bool().Draw(t, "hasReport") {
		d.Report = rapid.SliceOfN(rapid.Uint64Range(0, 40), 0, 18).Draw(t, "report")
	}
	if valid {
		if d.Producer != nil {
			d.Producer = d.Producer[:0:0]
			d.Producer = append(d.Producer, sha256Test...)
		}
		d.Achieved = min(d.Achieved, MaxAcknowledgement)
		d.ReportMode = min(d.ReportMode, 1)
		d.Layer = min(d.Layer, MaxLayer)
		if d.Layer != 0 {
			d.HasSegment = true
		}
		if d.Report != nil {
			var r []uint64
			for _, v := range d.Report { // keep a strictly ascending run of defined levels
				if (v <= MaxAcknowledgement || v >= ApplicationLevel) && (len(r) == 0 || v > r[len(r)-1]) && len(r) < MaxReportItems {
					r = append(r, v)
				}
			}
			d.Report = append([]uint64{}, r...)
			d.HasReportID = true
		} else {
			d.ReportID, d.HasReportID = 0, false
		}
	}
	return d
}

func genGuarantees(t *rapid.T, label string) map[uint64]uint64 {
	if rapid.IntRange(0, 3).Draw(t, label+"-nil") == 0 {
		return nil
	}
	return rapid.MapOfN(rapid.Uint64Range(0, 11), rapid.Uint64Range(0, 5), 0, 5).Draw(t, label)
}

func genHello(t *rapid.T) Hello {
	list := func(label string) []uint64 {
		if rapid.IntRange(0, 4).Draw(t, label+"-nil") == 0 {
			return nil
		}
		return rapid.SliceOfN(rapid.Uint64(), 0, MaxListItems+1).Draw(t, label)
	}
	return Hello{
		Versions:             list("versions"),
		MaxHeaderBytes:       genUint(t, "mhb"),
		MaxTransfers:         genUint(t, "mt"),
		Capabilities:         list("caps"),
		RequiredCapabilities: list("reqCaps"),
		GuaranteesOffered:    genGuarantees(t, "offered"),
		GuaranteesRequired:   genGuarantees(t, "required"),
	}
}

func genSubscribe(t *rapid.T) Subscribe {
	return Subscribe{
		Endpoint:    genText(t, "endpoint", MaxEndpointBytes),
		Filter:      genText(t, "filter", MaxFilterBytes),
		MaxAgeMs:    genUint(t, "maxAge"),
		HasMaxAgeMs: rapid.Bool().Draw(t, "hasMaxAge"),
		MaxLayer:    rapid.Uint64Range(0, 17).Draw(t, "maxLayer"),
		HasMaxLayer: rapid.Bool().Draw(t, "hasMaxLayer"),
	}
}

func genErrorFrame(t *rapid.T) ErrorFrame {
	return ErrorFrame{Code: genUint(t, "code"), Message: genText(t, "message", MaxMessageBytes)}
}

// normalize is what decoding v's encoding yields: presence flags set for
// every key the encoder writes, lists present, and guarantee sets reduced to
// their known dimensions not at core.
func normalize(v any) any {
	switch v := v.(type) {
	case Data:
		v.HasEndpoint = v.HasEndpoint || v.Endpoint != ""
		v.HasContentLen = v.HasContentLen || v.ContentLen != 0
		v.HasTopic = v.HasTopic || v.Topic != ""
		v.HasSequence = v.HasSequence || v.Sequence != 0
		v.HasAchieved = v.HasAchieved || v.Achieved != 0
		v.HasReportID = v.HasReportID || v.ReportID != 0
		v.HasDeliveryAttempt = v.HasDeliveryAttempt || v.DeliveryAttempt != 0
		v.HasSegment = v.HasSegment || v.Segment != 0
		return v
	case Hello:
		present := func(l []uint64) []uint64 {
			if l == nil {
				return []uint64{}
			}
			return l
		}
		v.Versions = present(v.Versions)
		v.Capabilities = present(v.Capabilities)
		v.RequiredCapabilities = present(v.RequiredCapabilities)
		v.GuaranteesOffered = reduceGuarantees(v.GuaranteesOffered)
		v.GuaranteesRequired = reduceGuarantees(v.GuaranteesRequired)
		return v
	case Subscribe:
		v.HasMaxAgeMs = v.HasMaxAgeMs || v.MaxAgeMs != 0
		v.HasMaxLayer = v.HasMaxLayer || v.MaxLayer != 0
		return v
	}
	return v
}

func reduceGuarantees(m map[uint64]uint64) map[uint64]uint64 {
	var out map[uint64]uint64
	for k, v := range m {
		if k >= numDimensions || (dimensions[k].hasCore && v == dimensions[k].core) {
			continue
		}
		if out == nil {
			out = map[uint64]uint64{}
		}
		out[k] = v
	}
	return out
}

// TestPropertyValidateAgreesWithDecode: for any value, Validate accepts it
// exactly when its encoding decodes; a refusal names the same key and rule
// both ways; an accepted value decodes to its normalized self; and encoding
// is canonical (re-encoding the decoded value gives the same bytes).
func TestPropertyValidateAgreesWithDecode(t *testing.T) {
	for _, c := range []struct {
		kind Kind
		gen  func(*rapid.T) any
	}{
		{KindData, func(t *rapid.T) any { return genData(t) }},
		{KindHello, func(t *rapid.T) any { return genHello(t) }},
		{KindSubscribe, func(t *rapid.T) any { return genSubscribe(t) }},
		{KindError, func(t *rapid.T) any { return genErrorFrame(t) }},
	} {
		t.Run(c.kind.String(), func(t *testing.T) {
			rapid.Check(t, func(t *rapid.T) {
				v := c.gen(t)
				b := encodeHeader(nil, v)
				got, derr := decodeHeader(c.kind, b)
				verr := validate(v)
				if (verr == nil) != (derr == nil) {
					t.Fatalf("Validate: %v; decode of % X: %v", verr, b, derr)
				}
				if verr != nil {
					var ve, de *Error
					if !errors.As(verr, &ve) || !errors.As(derr, &de) || ve.Rule != de.Rule || ve.Key != de.Key {
						t.Fatalf("Validate: %v; decode: %v", verr, derr)
					}
					return
				}
				if want := normalize(v); !reflect.DeepEqual(got, want) {
					t.Fatalf("decode(encode(v)):\n got %#v\nwant %#v", got, want)
				}
				if again := encodeHeader(nil, got); !bytes.Equal(again, b) {
					t.Fatalf("not canonical: % X then % X", b, again)
				}
			})
		})
	}
}

// TestPropertyPreambleRoundTrip: any header under any limit at least its
// length frames and parses back, from memory and from a stream read in
// arbitrary pieces.
func TestPropertyPreambleRoundTrip(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		k := Kind(rapid.IntRange(0, 7).Draw(t, "kind"))
		h := rapid.SliceOfN(rapid.Byte(), 0, 20000).Draw(t, "header")
		payload := rapid.SliceOfN(rapid.Byte(), 0, 10).Draw(t, "payload")
		max := uint64(len(h)) + rapid.Uint64Range(0, 100).Draw(t, "slack")
		frame := append(AppendPreamble(nil, k, h), payload...)
		gk, gh, n, err := ParsePreamble(frame, max)
		if err != nil || gk != k || !bytes.Equal(gh, h) || !bytes.Equal(frame[n:], payload) {
			t.Fatalf("ParsePreamble: %v %d %v", gk, n, err)
		}
		r := &chunkReader{b: frame, sizes: rapid.SliceOfN(rapid.IntRange(1, 7), 1, 50).Draw(t, "chunks")}
		rk, rh, err := ReadPreamble(r, max, nil)
		if err != nil || rk != k || !bytes.Equal(rh, h) || !bytes.Equal(r.b, payload) {
			t.Fatalf("ReadPreamble: %v %v", rk, err)
		}
		if len(h) > 0 {
			if _, _, _, err := ParsePreamble(frame, uint64(len(h)-1)); !errors.Is(err, ErrHeaderTooLarge) {
				t.Fatalf("one under the header: %v", err)
			}
		}
	})
}

// chunkReader returns its bytes in reads of the given sizes, cycling.
type chunkReader struct {
	b     []byte
	sizes []int
	i     int
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if len(c.b) == 0 {
		return 0, io.EOF
	}
	n := min(len(p), c.sizes[c.i%len(c.sizes)], len(c.b))
	c.i++
	copy(p, c.b[:n])
	c.b = c.b[n:]
	return n, nil
}
