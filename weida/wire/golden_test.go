package wire

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// unhex parses space-separated hex octets as written in PROTOCOL §8.
func unhex(t testing.TB, s string) []byte {
	t.Helper()
	b, err := hex.DecodeString(strings.ReplaceAll(s, " ", ""))
	if err != nil {
		t.Fatalf("bad hex %q: %v", s, err)
	}
	return b
}

// encodeHeader encodes v, whose type selects the frame, as a header.
func encodeHeader(dst []byte, v any) []byte {
	switch v := v.(type) {
	case Hello:
		return AppendHello(dst, &v)
	case Data:
		return AppendData(dst, &v)
	case Subscribe:
		return AppendSubscribe(dst, &v)
	case ErrorFrame:
		return AppendErrorFrame(dst, &v)
	}
	panic("encodeHeader: unexpected type")
}

// decodeHeader decodes b with the decoder of kind k.
func decodeHeader(k Kind, b []byte) (any, error) {
	switch k {
	case KindHello:
		return DecodeHello(b)
	case KindData:
		return DecodeData(b)
	case KindError:
		return DecodeErrorFrame(b)
	case KindSubscribe:
		return DecodeSubscribe(b)
	case KindUnsubscribe:
		return DecodeUnsubscribe(b)
	}
	panic("decodeHeader: kind without a decoder: " + k.String())
}

// validate calls v's Validate method.
func validate(v any) error {
	switch v := v.(type) {
	case Hello:
		return v.Validate()
	case Data:
		return v.Validate()
	case Subscribe:
		return v.Validate()
	case ErrorFrame:
		return v.Validate()
	}
	panic("validate: unexpected type")
}

// sha256Test is the producer of the relayed DATA vector: SHA-256("test").
var sha256Test = func() []byte { s := sha256.Sum256([]byte("test")); return s[:] }()

// goldenVectors are every PROTOCOL §8 vector for HELLO, DATA, ERROR,
// SUBSCRIBE and UNSUBSCRIBE (repository cebor/weida, docs/PROTOCOL.md at
// 7094fc7c), as whole frames: preamble and header.
var goldenVectors = []struct {
	name  string
	kind  Kind
	frame string
	value any
}{
	{"DATA initiating", KindData, "57 01 05 A1 00 62 2F 74",
		Data{Endpoint: "/t", HasEndpoint: true}},
	{"DATA reply", KindData, "57 01 01 A0",
		Data{}},
	{"DATA reply confirm", KindData, "57 01 03 A1 08 02",
		Data{Achieved: 2, HasAchieved: true}},
	{"HELLO v0", KindHello, "57 00 10 A5 00 81 00 01 19 40 00 02 19 04 00 03 80 04 80",
		NewHello(16384, 1024)},
	{"HELLO guarantees", KindHello, "57 00 18 A7 00 81 00 01 19 40 00 02 19 04 00 03 80 04 80 05 A1 04 01 06 A1 04 01",
		Hello{Versions: []uint64{0}, MaxHeaderBytes: 16384, MaxTransfers: 1024,
			Capabilities: []uint64{}, RequiredCapabilities: []uint64{},
			GuaranteesOffered:  map[uint64]uint64{GuaranteeOrdering: 1},
			GuaranteesRequired: map[uint64]uint64{GuaranteeOrdering: 1}}},
	{"HELLO datagram", KindHello, "57 00 11 A5 00 81 00 01 19 40 00 02 19 04 00 03 81 01 04 80",
		Hello{Versions: []uint64{0}, MaxHeaderBytes: 16384, MaxTransfers: 1024,
			Capabilities: []uint64{1}, RequiredCapabilities: []uint64{}}},
	{"ERROR no reply", KindError, "57 02 03 A1 00 05",
		ErrorFrame{Code: ErrorNoReply}},
	{"DATA fan-out copy", KindData, "57 01 0E A2 00 63 2F 6D 64 05 66 70 78 2E 65 75 72",
		Data{Endpoint: "/md", HasEndpoint: true, Topic: "px.eur", HasTopic: true}},
	{"DATA literal wildcard topic", KindData, "57 01 0C A2 00 63 2F 6D 64 05 64 70 78 2E 2A",
		Data{Endpoint: "/md", HasEndpoint: true, Topic: "px.*", HasTopic: true}},
	{"DATA sequence", KindData, "57 01 07 A2 00 62 2F 74 06 01",
		Data{Endpoint: "/t", HasEndpoint: true, Sequence: 1, HasSequence: true}},
	{"DATA sequence producer", KindData, "57 01 2A A3 00 62 2F 74 06 01 07 58 20 " +
		"9F 86 D0 81 88 4C 7D 65 9A 2F EA A0 C5 5A D0 15 A3 BF 4F 1B 2B 0B 82 2C D1 5D 6C 15 B0 F0 0A 08",
		Data{Endpoint: "/t", HasEndpoint: true, Sequence: 1, HasSequence: true, Producer: sha256Test}},
	{"DATA report", KindData, "57 01 0A A3 00 62 2F 74 09 01 0A 81 02",
		Data{Endpoint: "/t", HasEndpoint: true, ReportID: 1, HasReportID: true, Report: []uint64{2}}},
	{"DATA report final-only", KindData, "57 01 0D A4 00 62 2F 74 09 01 0A 82 03 11 0B 01",
		Data{Endpoint: "/t", HasEndpoint: true, ReportID: 1, HasReportID: true, Report: []uint64{3, 17}, ReportMode: 1}},
	{"DATA segment", KindData, "57 01 07 A2 00 62 2F 74 0D 05",
		Data{Endpoint: "/t", HasEndpoint: true, Segment: 5, HasSegment: true}},
	{"DATA segment layer", KindData, "57 01 09 A3 00 62 2F 74 0D 05 0E 02",
		Data{Endpoint: "/t", HasEndpoint: true, Segment: 5, HasSegment: true, Layer: 2}},
	{"SUBSCRIBE px.", KindSubscribe, "57 03 0B A2 00 63 2F 6D 64 01 63 70 78 2E",
		Subscribe{Endpoint: "/md", Filter: "px."}},
	{"UNSUBSCRIBE px.", KindUnsubscribe, "57 04 0B A2 00 63 2F 6D 64 01 63 70 78 2E",
		Subscribe{Endpoint: "/md", Filter: "px."}},
	{"SUBSCRIBE literal", KindSubscribe, "57 03 0E A2 00 63 2F 6D 64 01 66 70 78 2E 65 75 72",
		Subscribe{Endpoint: "/md", Filter: "px.eur"}},
	{"SUBSCRIBE one-segment wildcard", KindSubscribe, "57 03 16 A2 00 63 2F 6D 64 01 6E 73 65 6E 73 6F 72 73 2E 2A 2E 74 65 6D 70",
		Subscribe{Endpoint: "/md", Filter: "sensors.*.temp"}},
	{"SUBSCRIBE rest wildcard", KindSubscribe, "57 03 0D A2 00 63 2F 6D 64 01 65 63 74 6C 2E 23",
		Subscribe{Endpoint: "/md", Filter: "ctl.#"}},
	{"SUBSCRIBE every topic", KindSubscribe, "57 03 08 A2 00 63 2F 6D 64 01 60",
		Subscribe{Endpoint: "/md", Filter: ""}},
	{"SUBSCRIBE max_age_ms", KindSubscribe, "57 03 0B A3 00 62 2F 74 01 61 61 02 18 96",
		Subscribe{Endpoint: "/t", Filter: "a", MaxAgeMs: 150, HasMaxAgeMs: true}},
	{"SUBSCRIBE max_layer", KindSubscribe, "57 03 0A A3 00 62 2F 74 01 61 61 03 01",
		Subscribe{Endpoint: "/t", Filter: "a", MaxLayer: 1, HasMaxLayer: true}},
}

func TestGoldenVectors(t *testing.T) {
	for _, g := range goldenVectors {
		t.Run(g.name, func(t *testing.T) {
			frame := unhex(t, g.frame)
			checkGolden(t, g.kind, frame, g.value)
			// "UNSUBSCRIBE for any SUBSCRIBE vector = same bytes with byte 2 = 04."
			if g.kind == KindSubscribe {
				un := bytes.Clone(frame)
				un[1] = byte(KindUnsubscribe)
				checkGolden(t, KindUnsubscribe, un, g.value)
			}
		})
	}
}

func checkGolden(t *testing.T, kind Kind, frame []byte, value any) {
	t.Helper()
	// Value -> bytes.
	header := encodeHeader(nil, value)
	if got := AppendPreamble(nil, kind, header); !bytes.Equal(got, frame) {
		t.Fatalf("encode %s:\n got % X\nwant % X", kind, got, frame)
	}
	if err := validate(value); err != nil {
		t.Fatalf("Validate: %v", err)
	}
	// Bytes -> value, both from memory and from a stream.
	k, h, n, err := ParsePreamble(frame, DefaultMaxHeaderBytes)
	if err != nil || k != kind || n != len(frame) || !bytes.Equal(h, header) {
		t.Fatalf("ParsePreamble = %v, % X, %d, %v", k, h, n, err)
	}
	k, h, err = ReadPreamble(bytes.NewReader(frame), DefaultMaxHeaderBytes, nil)
	if err != nil || k != kind || !bytes.Equal(h, header) {
		t.Fatalf("ReadPreamble = %v, % X, %v", k, h, err)
	}
	got, err := decodeHeader(kind, h)
	if err != nil {
		t.Fatalf("decode %s % X: %v", kind, h, err)
	}
	if !reflect.DeepEqual(got, value) {
		t.Fatalf("decode %s:\n got %#v\nwant %#v", kind, got, value)
	}
	// Decoded value -> the same bytes again.
	if again := encodeHeader(nil, got); !bytes.Equal(again, header) {
		t.Fatalf("re-encode %s:\n got % X\nwant % X", kind, again, header)
	}
	// InsertPreamble builds the same frame in one buffer.
	buf := append([]byte("xyz"), header...)
	if got := InsertPreamble(buf, 3, kind); !bytes.Equal(got[3:], frame) || string(got[:3]) != "xyz" {
		t.Fatalf("InsertPreamble = % X", got)
	}
}

// mustReject are the headers PROTOCOL §8 says close the connection with
// PROTOCOL_VIOLATION for a decoder that knows the keys.
var mustReject = []struct {
	name   string
	kind   Kind
	header string
	key    int
	rule   string
}{
	{"DATA layer 16", KindData, "A2 0D 05 0E 10", dataLayer, RuleLayerRange},
	{"DATA layer without segment", KindData, "A1 0E 01", dataLayer, RuleLayerWithoutSegment},
	{"SUBSCRIBE max_layer 16", KindSubscribe, "A3 00 62 2F 74 01 61 61 03 10", subMaxLayer, RuleLayerRange},
}

func TestGoldenMustReject(t *testing.T) {
	for _, r := range mustReject {
		t.Run(r.name, func(t *testing.T) {
			checkReject(t, r.kind, unhex(t, r.header), r.key, r.rule)
		})
	}
}

// checkReject asserts that decoding b as kind fails with exactly key and rule.
func checkReject(t *testing.T, kind Kind, b []byte, key int, rule string) {
	t.Helper()
	v, err := decodeHeader(kind, b)
	var we *Error
	if !errors.As(err, &we) {
		t.Fatalf("decode %s % X = %#v, %v; want *Error %q", kind, b, v, err, rule)
	}
	if we.Rule != rule || we.Key != key || we.Frame != kind {
		t.Fatalf("decode %s % X: got frame %s key %d rule %q (%v); want key %d rule %q",
			kind, b, we.Frame, we.Key, we.Rule, err, key, rule)
	}
	if we.Error() == "" {
		t.Fatal("empty Error()")
	}
}
