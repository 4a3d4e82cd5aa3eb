package wire

import (
	"reflect"
	"testing"
)

// checkRoundTrip asserts that v, a decoded value, validates, encodes to a
// header that decodes to v again, and that the re-encoding is stable.
func checkRoundTrip(t testing.TB, kind Kind, v any) {
	t.Helper()
	if err := validate(v); err != nil {
		t.Fatalf("Validate(%#v) = %v", v, err)
	}
	b := encodeHeader(nil, v)
	w, err := decodeHeader(kind, b)
	if err != nil {
		t.Fatalf("re-decode %s % X: %v (value %#v)", kind, b, err, v)
	}
	if !reflect.DeepEqual(v, w) {
		t.Fatalf("round trip %s:\n got %#v\nwant %#v", kind, w, v)
	}
	if b2 := encodeHeader(nil, w); string(b2) != string(b) {
		t.Fatalf("unstable encoding % X then % X", b, b2)
	}
}
