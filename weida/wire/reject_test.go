package wire

import (
	"fmt"
	"strings"
	"testing"
)

// hexText returns the CBOR hex of a text string of n copies of 'a' (n < 65536).
func hexText(n int) string {
	var b []byte
	b = appendHead(b, majorText, uint64(n))
	return fmt.Sprintf("% X", b) + strings.Repeat(" 61", n)
}

// nest returns n nested one-item arrays around inner.
func nest(n int, inner string) string {
	return strings.Repeat("81 ", n) + inner
}

// uintArray returns the hex of an array of the values 0..n-1 (n < 24 items
// each below 24 would be simplest; any n works).
func uintArray(n int) string {
	var b []byte
	b = appendHead(b, majorArray, uint64(n))
	for i := range n {
		b = appendHead(b, majorUint, uint64(i))
	}
	return fmt.Sprintf("% X", b)
}

const helloKeys0to4 = "00 81 00 01 19 40 00 02 19 04 00 03 80 04 80"

// rejections: one row per decoding rule (several where a rule has distinct
// paths). Each row names the frame, the header bytes, and the key and rule
// the *Error must carry.
var rejections = []struct {
	name   string
	kind   Kind
	header string
	key    int
	rule   string
}{
	// Top level: one definite-length map, nothing after it.
	{"empty header", KindData, "", -1, RuleTruncated},
	{"array at top level", KindData, "80", -1, RuleNotMap},
	{"uint at top level", KindSubscribe, "00", -1, RuleNotMap},
	{"tag at top level", KindData, "C0 A0", -1, RuleTag},
	{"indefinite map", KindData, "BF FF", -1, RuleIndefinite},
	{"trailing byte", KindData, "A0 00", -1, RuleTrailingBytes},
	{"two maps", KindError, "A1 00 05 A0", -1, RuleTrailingBytes},
	{"map count beyond input", KindData, "A3 00 60", -1, RuleTruncated},
	{"map count 2^64-1", KindData, "BB FF FF FF FF FF FF FF FF", -1, RuleTruncated},
	{"truncated map argument", KindData, "B8", -1, RuleTruncated},

	// Keys: unsigned integers, strictly ascending.
	{"negative key", KindData, "A1 20 00", -1, RuleKeyNotUint},
	{"text key", KindData, "A1 61 61 00", -1, RuleKeyNotUint},
	{"tagged key", KindData, "A1 C0 00 00", -1, RuleKeyNotUint},
	{"duplicate known key", KindData, "A2 00 62 2F 74 00 62 2F 74", 0, RuleDuplicateKey},
	{"duplicate skipped key", KindData, "A2 18 40 00 18 40 00", 64, RuleDuplicateKey},
	{"duplicate key, non-minimal form", KindData, "A2 05 60 18 05 60", 5, RuleDuplicateKey},
	{"descending keys", KindData, "A2 05 60 00 60", 0, RuleKeyOrder},
	{"descending skipped keys", KindError, "A3 00 01 18 41 00 18 40 00", 64, RuleKeyOrder},
	{"truncated key argument", KindData, "A1 19 00", -1, RuleTruncated},

	// Items forbidden anywhere, here inside skipped values.
	{"indefinite array skipped", KindData, "A1 18 40 9F FF", 64, RuleIndefinite},
	{"indefinite bytes skipped", KindData, "A1 18 40 5F 41 00 FF", 64, RuleIndefinite},
	{"indefinite text skipped", KindData, "A1 18 40 7F 61 61 FF", 64, RuleIndefinite},
	{"indefinite map nested in skipped", KindData, "A1 18 40 81 BF FF", 64, RuleIndefinite},
	{"lone break", KindData, "A1 18 40 FF", 64, RuleIndefinite},
	{"indefinite uint", KindData, "A1 18 40 1F", 64, RuleMalformed},
	{"reserved additional information", KindData, "A1 18 40 1C", 64, RuleMalformed},
	{"reserved simple additional information", KindData, "A1 18 40 FC", 64, RuleMalformed},
	{"tag skipped", KindData, "A1 18 40 C1 00", 64, RuleTag},
	{"bignum tag skipped", KindData, "A1 18 40 C2 41 01", 64, RuleTag},
	{"half float skipped", KindData, "A1 18 40 F9 3C 00", 64, RuleHalfFloat},
	{"simple value 16", KindData, "A1 18 40 F0", 64, RuleSimpleValue},
	{"one-byte simple value", KindData, "A1 18 40 F8 20", 64, RuleSimpleValue},
	{"invalid UTF-8 skipped", KindData, "A1 18 40 61 FF", 64, RuleUTF8},
	{"skipped bytes beyond input", KindData, "A1 18 40 45 00", 64, RuleTruncated},
	{"skipped array count beyond input", KindData, "A1 18 40 9B 00 00 00 01 00 00 00 00", 64, RuleTruncated},
	{"skipped map count 2^63", KindData, "A1 18 40 BB 80 00 00 00 00 00 00 00", 64, RuleTruncated},
	{"truncated float", KindData, "A1 18 40 FB 00 00", 64, RuleTruncated},

	// Iterative skip, depth 8: nine non-empty nested containers fail.
	{"nine nested arrays", KindData, "A1 18 40 " + nest(9, "00"), 64, RuleSkipDepth},
	{"nine nested maps", KindData, "A1 18 40 " + strings.Repeat("A1 00 ", 9) + "00", 64, RuleSkipDepth},
	{"nine levels mixing maps and arrays", KindSubscribe, "A3 00 60 01 60 18 40 " + strings.Repeat("A1 00 81 ", 4) + "81 00", 64, RuleSkipDepth},

	// Wrong CBOR type for a known key.
	{"DATA endpoint as uint", KindData, "A1 00 01", 0, RuleType},
	{"DATA endpoint as bytes", KindData, "A1 00 42 2F 74", 0, RuleType},
	{"DATA content_len as text", KindData, "A1 01 60", 1, RuleType},
	{"DATA content_len negative", KindData, "A1 01 20", 1, RuleType},
	{"DATA content_len float", KindData, "A1 01 FA 00 00 00 00", 1, RuleType},
	{"DATA content_type null", KindData, "A1 02 F6", 2, RuleType},
	{"DATA topic undefined", KindData, "A1 05 F7", 5, RuleType},
	{"DATA sequence false", KindData, "A1 06 F4", 6, RuleType},
	{"DATA producer as text", KindData, "A1 07 60", 7, RuleType},
	{"DATA report as uint", KindData, "A2 09 01 0A 02", 10, RuleType},
	{"DATA report item as text", KindData, "A2 09 01 0A 81 60", 10, RuleType},
	{"DATA tagged endpoint", KindData, "A1 00 C0 62 2F 74", 0, RuleTag},
	{"DATA indefinite endpoint", KindData, "A1 00 7F 61 61 FF", 0, RuleIndefinite},
	{"SUBSCRIBE filter as bytes", KindSubscribe, "A2 00 60 01 40", 1, RuleType},
	{"SUBSCRIBE max_age_ms as text", KindSubscribe, "A3 00 60 01 60 02 60", 2, RuleType},
	{"ERROR code as text", KindError, "A1 00 60", 0, RuleType},
	{"ERROR message as uint", KindError, "A2 00 01 01 01", 1, RuleType},
	{"HELLO versions as uint", KindHello, "A5 00 00 01 00 02 00 03 80 04 80", 0, RuleType},
	{"HELLO version as text", KindHello, "A5 00 81 60 01 00 02 00 03 80 04 80", 0, RuleType},
	{"HELLO max_header_bytes as array", KindHello, "A5 00 80 01 80 02 00 03 80 04 80", 1, RuleType},
	{"HELLO guarantees_offered as array", KindHello, "A6 " + helloKeys0to4 + " 05 80", 5, RuleType},
	{"HELLO guarantee level as text", KindHello, "A6 " + helloKeys0to4 + " 05 A1 04 60", 5, RuleType},

	// Text: caps (checked before the bytes are), remaining input, UTF-8.
	{"DATA endpoint over cap", KindData, "A1 00 " + hexText(MaxEndpointBytes+1), 0, RuleTextTooLong},
	{"DATA content_type over cap", KindData, "A1 02 " + hexText(MaxContentTypeBytes+1), 2, RuleTextTooLong},
	{"DATA traceparent over cap", KindData, "A1 03 " + hexText(MaxTraceparentBytes+1), 3, RuleTextTooLong},
	{"DATA tracestate over cap", KindData, "A1 04 " + hexText(MaxTracestateBytes+1), 4, RuleTextTooLong},
	{"DATA topic over cap", KindData, "A1 05 " + hexText(MaxTopicBytes+1), 5, RuleTextTooLong},
	{"SUBSCRIBE endpoint over cap", KindSubscribe, "A2 00 " + hexText(MaxEndpointBytes+1) + " 01 60", 0, RuleTextTooLong},
	{"SUBSCRIBE filter over cap", KindSubscribe, "A2 00 60 01 " + hexText(MaxFilterBytes+1), 1, RuleTextTooLong},
	{"UNSUBSCRIBE filter over cap", KindUnsubscribe, "A2 00 60 01 " + hexText(MaxFilterBytes+1), 1, RuleTextTooLong},
	{"ERROR message over cap", KindError, "A2 00 01 01 " + hexText(MaxMessageBytes+1), 1, RuleTextTooLong},
	{"text length 2^64-1", KindData, "A1 00 7B FF FF FF FF FF FF FF FF", 0, RuleTextTooLong},
	{"text beyond input", KindData, "A1 00 62 2F", 0, RuleTruncated},
	{"text under cap beyond input", KindData, "A1 00 79 01 00 2F", 0, RuleTruncated},
	{"DATA endpoint invalid UTF-8", KindData, "A1 00 62 C3 28", 0, RuleUTF8},
	{"DATA topic surrogate", KindData, "A1 05 63 ED A0 80", 5, RuleUTF8},
	{"SUBSCRIBE filter invalid UTF-8", KindSubscribe, "A2 00 60 01 61 80", 1, RuleUTF8},
	{"ERROR message invalid UTF-8", KindError, "A2 00 01 01 61 FE", 1, RuleUTF8},

	// Lists: at most 64 items, checked before anything is reserved.
	{"HELLO versions 65 items", KindHello, "A5 00 " + uintArray(65) + " 01 00 02 00 03 80 04 80", 0, RuleListTooLong},
	{"HELLO capabilities 2^32 items", KindHello, "A5 00 81 00 01 00 02 00 03 9A FF FF FF FF 04 80", 3, RuleListTooLong},
	{"HELLO required_capabilities 65 items", KindHello, "A5 00 80 01 00 02 00 03 80 04 " + uintArray(65), 4, RuleListTooLong},
	{"HELLO list beyond input", KindHello, "A5 00 80 01 00 02 00 03 80 04 85 00", 4, RuleTruncated},
	{"HELLO indefinite list", KindHello, "A5 00 9F 00 FF 01 00 02 00 03 80 04 80", 0, RuleIndefinite},

	// Required keys.
	{"HELLO without versions", KindHello, "A4 01 00 02 00 03 80 04 80", 0, RuleMissingKey},
	{"HELLO without max_header_bytes", KindHello, "A4 00 80 02 00 03 80 04 80", 1, RuleMissingKey},
	{"HELLO without max_transfers", KindHello, "A4 00 80 01 00 03 80 04 80", 2, RuleMissingKey},
	{"HELLO without capabilities", KindHello, "A4 00 80 01 00 02 00 04 80", 3, RuleMissingKey},
	{"HELLO without required_capabilities", KindHello, "A4 00 80 01 00 02 00 03 80", 4, RuleMissingKey},
	{"HELLO empty", KindHello, "A0", 0, RuleMissingKey},
	{"SUBSCRIBE without endpoint", KindSubscribe, "A1 01 60", 0, RuleMissingKey},
	{"SUBSCRIBE without filter", KindSubscribe, "A1 00 60", 1, RuleMissingKey},
	{"UNSUBSCRIBE without filter", KindUnsubscribe, "A2 00 60 02 00", 1, RuleMissingKey},
	{"ERROR without code", KindError, "A1 01 60", 0, RuleMissingKey},

	// DATA value rules (PROTOCOL §6.2).
	{"producer 31 bytes", KindData, "A1 07 58 1F" + strings.Repeat(" 00", 31), 7, RuleProducerLength},
	{"producer 33 bytes", KindData, "A1 07 58 21" + strings.Repeat(" 00", 33), 7, RuleProducerLength},
	{"producer empty", KindData, "A1 07 40", 7, RuleProducerLength},
	{"producer 32 bytes declared, 1 present", KindData, "A1 07 58 20 00", 7, RuleTruncated},
	{"achieved 6", KindData, "A1 08 06", 8, RuleAchieved},
	{"report_id without report", KindData, "A2 00 62 2F 74 09 01", 9, RuleReportPair},
	{"report without report_id", KindData, "A1 0A 81 02", 10, RuleReportPair},
	{"report 17 levels", KindData, "A2 09 01 0A 91" + strings.Repeat(" 02", 17), 10, RuleReportTooLong},
	{"report 65 levels", KindData, "A2 09 01 0A " + uintArray(65), 10, RuleReportTooLong},
	{"report repeated level", KindData, "A2 09 01 0A 82 03 03", 10, RuleReportOrder},
	{"report descending", KindData, "A2 09 01 0A 82 11 03", 10, RuleReportOrder},
	{"report level 6", KindData, "A2 09 01 0A 81 06", 10, RuleReportLevel},
	{"report level 15", KindData, "A2 09 01 0A 82 03 0F", 10, RuleReportLevel},
	{"report_mode 2", KindData, "A1 0B 02", 11, RuleReportMode},
	{"layer 16", KindData, "A2 0D 05 0E 10", 14, RuleLayerRange},
	{"layer 0 without segment", KindData, "A1 0E 00", 14, RuleLayerWithoutSegment},

	// SUBSCRIBE value rules (PROTOCOL §6.4).
	{"max_layer 2^64-1", KindSubscribe, "A3 00 60 01 60 03 1B FF FF FF FF FF FF FF FF", 3, RuleLayerRange},

	// HELLO guarantee sets (PROTOCOL §6.5): nested maps under the rules of §5.
	{"guarantees indefinite map", KindHello, "A6 " + helloKeys0to4 + " 05 BF FF", 5, RuleIndefinite},
	{"guarantees descending keys", KindHello, "A6 " + helloKeys0to4 + " 05 A2 04 01 00 01", 5, RuleKeyOrder},
	{"guarantees duplicate key", KindHello, "A6 " + helloKeys0to4 + " 05 A2 04 01 04 01", 5, RuleDuplicateKey},
	{"guarantees text key", KindHello, "A6 " + helloKeys0to4 + " 05 A1 61 61 01", 5, RuleKeyNotUint},
	{"guarantees entries beyond input", KindHello, "A6 " + helloKeys0to4 + " 05 A2 04 01", 5, RuleTruncated},
	{"guarantees unknown dimension nested too deep", KindHello, "A6 " + helloKeys0to4 + " 05 A1 0A " + nest(9, "00"), 5, RuleSkipDepth},
	{"delivery 3", KindHello, "A6 " + helloKeys0to4 + " 05 A1 00 03", 5, RuleGuaranteeLevel},
	{"acknowledgement 6", KindHello, "A6 " + helloKeys0to4 + " 05 A1 01 06", 5, RuleGuaranteeLevel},
	{"durability 2", KindHello, "A6 " + helloKeys0to4 + " 05 A2 01 03 02 02", 5, RuleGuaranteeLevel},
	{"ordering 5", KindHello, "A6 " + helloKeys0to4 + " 05 A1 04 05", 5, RuleGuaranteeLevel},
	{"deduplication 3", KindHello, "A6 " + helloKeys0to4 + " 05 A1 05 03", 5, RuleGuaranteeLevel},
	{"backpressure 5", KindHello, "A6 " + helloKeys0to4 + " 05 A1 07 05", 5, RuleGuaranteeLevel},
	{"producer_naming 2", KindHello, "A6 " + helloKeys0to4 + " 05 A1 08 02", 5, RuleGuaranteeLevel},
	{"control_isolated 2", KindHello, "A6 " + helloKeys0to4 + " 05 A1 09 02", 5, RuleGuaranteeLevel},
	{"durability under core acknowledgement", KindHello, "A6 " + helloKeys0to4 + " 05 A1 02 00", 5, RuleGuaranteeCombination},
	{"durability under Accepted", KindHello, "A6 " + helloKeys0to4 + " 05 A2 01 02 02 01", 5, RuleGuaranteeCombination},
	{"replicas under Stored", KindHello, "A6 " + helloKeys0to4 + " 05 A2 01 03 03 02", 5, RuleGuaranteeCombination},
	{"replicas 1", KindHello, "A6 " + helloKeys0to4 + " 05 A2 01 04 03 01", 5, RuleGuaranteeCombination},
	{"Bounded without window", KindHello, "A6 " + helloKeys0to4 + " 05 A1 05 01", 5, RuleGuaranteeCombination},
	{"window without Bounded", KindHello, "A6 " + helloKeys0to4 + " 05 A1 06 18 64", 5, RuleGuaranteeCombination},
	{"Coalesce with reassemble", KindHello, "A6 " + helloKeys0to4 + " 05 A2 04 02 07 04", 5, RuleGuaranteeCombination},
	{"required combination forbidden", KindHello, "A6 " + helloKeys0to4 + " 06 A1 05 01", 6, RuleGuaranteeCombination},
	{"required ordering not offered", KindHello, "A6 " + helloKeys0to4 + " 06 A1 04 01", 6, RuleGuaranteeRequired},
	{"required ordering above offered", KindHello, "A7 " + helloKeys0to4 + " 05 A1 04 01 06 A1 04 02", 6, RuleGuaranteeRequired},
	{"required backpressure differs", KindHello, "A7 " + helloKeys0to4 + " 05 A1 07 02 06 A1 07 01", 6, RuleGuaranteeRequired},
	{"required window longer", KindHello, "A7 " + helloKeys0to4 + " 05 A2 05 01 06 0A 06 A2 05 01 06 0B", 6, RuleGuaranteeRequired},
	{"backpressure offered, core required", KindHello, "A6 " + helloKeys0to4 + " 05 A1 07 02", 6, RuleGuaranteeRequired},
	{"required control isolation not offered", KindHello, "A6 " + helloKeys0to4 + " 06 A1 09 01", 6, RuleGuaranteeRequired},
}

func TestRejections(t *testing.T) {
	for _, r := range rejections {
		t.Run(r.name, func(t *testing.T) {
			checkReject(t, r.kind, unhex(t, r.header), r.key, r.rule)
		})
	}
}

// accepted are edge cases that must decode: limits met exactly, and items
// PROTOCOL §5 allows inside skipped values.
var accepted = []struct {
	name   string
	kind   Kind
	header string
}{
	{"eight nested arrays", KindData, "A1 18 40 " + nest(8, "00")},
	{"nine nested arrays, innermost empty", KindData, "A1 18 40 " + nest(8, "80")},
	{"eight nested maps", KindData, "A1 18 40 " + strings.Repeat("A1 00 ", 8) + "00"},
	{"empty containers add no depth", KindData, "A1 18 40 84 80 A0 40 " + nest(7, "A0")},
	{"false true null undefined skipped", KindData, "A4 18 40 F4 18 41 F5 18 42 F6 18 43 F7"},
	{"float32 and float64 skipped", KindData, "A2 18 40 FA 3F 80 00 00 18 41 FB 3F F0 00 00 00 00 00 00"},
	{"negative and bytes skipped", KindData, "A2 18 40 3B FF FF FF FF FF FF FF FF 18 41 43 FF FE FD"},
	{"map with any keys inside a skipped value", KindData, "A1 18 40 A2 61 62 00 61 61 00"},
	{"unknown keys before and after known", KindSubscribe, "A4 00 60 01 60 04 00 19 FF FF 82 61 61 A0"},
	{"key 63 then 64", KindError, "A3 00 01 18 3F 00 18 40 00"},
	{"largest key", KindError, "A2 00 01 1B FF FF FF FF FF FF FF FF 00"},
	{"non-minimal integers", KindData, "A2 18 00 62 2F 74 19 00 01 1A 00 00 00 05"},
	{"endpoint at cap", KindData, "A1 00 " + hexText(MaxEndpointBytes)},
	{"content_type at cap", KindData, "A1 02 " + hexText(MaxContentTypeBytes)},
	{"traceparent at cap", KindData, "A1 03 " + hexText(MaxTraceparentBytes)},
	{"tracestate at cap", KindData, "A1 04 " + hexText(MaxTracestateBytes)},
	{"topic at cap", KindData, "A1 05 " + hexText(MaxTopicBytes)},
	{"filter at cap", KindSubscribe, "A2 00 60 01 " + hexText(MaxFilterBytes)},
	{"message at cap", KindError, "A2 00 01 01 " + hexText(MaxMessageBytes)},
	{"HELLO lists of 64", KindHello, "A5 00 " + uintArray(64) + " 01 00 02 00 03 " + uintArray(64) + " 04 " + uintArray(64)},
	{"report of 16 levels", KindData, "A2 09 01 0A 90 00 01 02 03 04 05 10 11 12 13 14 15 16 17 18 18 18 19"},
	{"report empty", KindData, "A2 09 00 0A 80"},
	{"achieved 0", KindData, "A1 08 00"},
	{"achieved 5", KindData, "A1 08 05"},
	{"report_mode 0", KindData, "A1 0B 00"},
	{"layer 15", KindData, "A2 0D 00 0E 0F"},
	{"max_layer 15", KindSubscribe, "A3 00 60 01 60 03 0F"},
	{"ERROR undefined code", KindError, "A1 00 19 03 E7"},
	{"guarantee set stated at core", KindHello, "A7 " + helloKeys0to4 + " 05 A2 00 00 01 01 06 A0"},
	{"guarantees with an unknown dimension", KindHello, "A6 " + helloKeys0to4 + " 05 A2 04 01 18 40 82 F5 F6"},
	{"guarantees full L2 set", KindHello, "A6 " + helloKeys0to4 + " 05 A7 00 02 01 04 02 01 03 03 04 03 05 01 06 19 03 E8"},
	{"same backpressure offered and required", KindHello, "A7 " + helloKeys0to4 + " 05 A1 07 02 06 A1 07 02"},
	{"required below offered", KindHello, "A7 " + helloKeys0to4 + " 05 A2 04 02 09 01 06 A1 04 01"},
	{"unknown HELLO key", KindHello, "A6 " + helloKeys0to4 + " 18 40 A1 00 00"},
}

func TestAccepted(t *testing.T) {
	for _, a := range accepted {
		t.Run(a.name, func(t *testing.T) {
			b := unhex(t, a.header)
			v, err := decodeHeader(a.kind, b)
			if err != nil {
				t.Fatalf("decode %s % X: %v", a.kind, b, err)
			}
			// What decodes re-encodes to something that decodes to the same value.
			checkRoundTrip(t, a.kind, v)
		})
	}
}
