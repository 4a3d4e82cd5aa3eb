package wire

import (
	"bytes"
	"reflect"
	"testing"
)

// TestAppendSubscribePadded pins the padded header's bytes (the padding is
// the last entry, so keys stay ascending) and shows that both decoders skip
// it: the padded header decodes to exactly what the plain one does.
func TestAppendSubscribePadded(t *testing.T) {
	cases := []struct {
		name string
		s    Subscribe
		pad  int
		want string
	}{
		{"short", Subscribe{Endpoint: "/md", Filter: "px."}, 4,
			"A3 00 63 2F 6D 64 01 63 70 78 2E 18 40 44 00 00 00 00"},
		{"empty filter", Subscribe{Endpoint: "/md"}, 1,
			"A3 00 63 2F 6D 64 01 60 18 40 41 00"},
		{"after radio keys", Subscribe{Endpoint: "/t", Filter: "a", MaxAgeMs: 150, MaxLayer: 1}, 2,
			"A5 00 62 2F 74 01 61 61 02 18 96 03 01 18 40 42 00 00"},
		{"two-byte length", Subscribe{Endpoint: "/t", Filter: "a"}, 24,
			"A3 00 62 2F 74 01 61 61 18 40 58 18" + " 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00 00"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := AppendSubscribePadded([]byte("xy"), &c.s, c.pad)
			if want := append([]byte("xy"), unhex(t, c.want)...); !bytes.Equal(got, want) {
				t.Fatalf("AppendSubscribePadded:\n got % X\nwant % X", got, want)
			}
			plain, err := DecodeSubscribe(AppendSubscribe(nil, &c.s))
			if err != nil {
				t.Fatal(err)
			}
			for _, decode := range []func([]byte) (Subscribe, error){DecodeSubscribe, DecodeUnsubscribe} {
				d, err := decode(got[2:])
				if err != nil {
					t.Fatalf("decode padded header: %v", err)
				}
				if !reflect.DeepEqual(d, plain) {
					t.Fatalf("padded header decodes to %#v, plain one to %#v", d, plain)
				}
			}
		})
	}
}

// TestAppendSubscribePaddedNone: no padding writes the plain header.
func TestAppendSubscribePaddedNone(t *testing.T) {
	s := Subscribe{Endpoint: "/md", Filter: "px."}
	for _, pad := range []int{0, -1} {
		if got, want := AppendSubscribePadded(nil, &s, pad), AppendSubscribe(nil, &s); !bytes.Equal(got, want) {
			t.Fatalf("pad %d: % X, want % X", pad, got, want)
		}
	}
}
