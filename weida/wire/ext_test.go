package wire

import (
	"bytes"
	"encoding/hex"
	"errors"
	"slices"
	"testing"
)

func TestDataSourceSequenceBytes(t *testing.T) {
	d := Data{Endpoint: "/t", HasEndpoint: true, SourceSequence: 7}
	got := AppendData(nil, &d)
	// {0: "/t", 68: 7}: key 68 is 18 44.
	want, _ := hex.DecodeString("A200622F74184407")
	if !bytes.Equal(got, want) {
		t.Fatalf("AppendData = % X, want % X", got, want)
	}
	back, err := DecodeData(got)
	if err != nil || back.SourceSequence != 7 || back.Endpoint != "/t" {
		t.Fatalf("DecodeData = %+v, %v", back, err)
	}
	// Zero is absent.
	if b := AppendData(nil, &Data{Endpoint: "/t", HasEndpoint: true}); len(b) != 5 {
		t.Fatalf("a zero SourceSequence was written: % X", b)
	}
}

func TestDataSourceSequenceOfAnotherTypeIsSkipped(t *testing.T) {
	// {0: "/t", 68: "x"}: somebody else's use of the number.
	b, _ := hex.DecodeString("A200622F7418446178")
	d, err := DecodeData(b)
	if err != nil || d.SourceSequence != 0 {
		t.Fatalf("DecodeData = %+v, %v; want the key skipped", d, err)
	}
}

func TestHelloExtensionsRoundTrip(t *testing.T) {
	ad := AppendLastValueAd(nil, &LastValueAd{Version: 1, Paths: []string{"/a", "/b"}})
	h := NewHello(16384, 1024)
	h.Extensions = []Extension{{Key: HelloLastValue, Value: ad}, {Key: 200, Value: []byte{0x80}}}
	if err := h.Validate(); err != nil {
		t.Fatal(err)
	}
	b := AppendHello(nil, &h)
	// The v0 vector with two more entries, appended after key 4.
	v0, _ := hex.DecodeString("A5008100011940000219040003800480")
	if b[0] != 0xA7 || !bytes.Equal(b[1:len(v0)], v0[1:]) {
		t.Fatalf("AppendHello = % X", b)
	}
	back, err := DecodeHello(b)
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Extensions) != 2 || !bytes.Equal(back.Extension(HelloLastValue), ad) || back.Extension(65) != nil {
		t.Fatalf("extensions = %+v", back.Extensions)
	}
	got, err := DecodeLastValueAd(back.Extension(HelloLastValue))
	if err != nil || got.Version != 1 || !slices.Equal(got.Paths, []string{"/a", "/b"}) {
		t.Fatalf("DecodeLastValueAd = %+v, %v", got, err)
	}
	if !got.Covers("/a") || got.Covers("/c") {
		t.Fatal("Covers")
	}
}

func TestHelloExtensionsValidate(t *testing.T) {
	for name, exts := range map[string][]Extension{
		"key below 64":  {{Key: 63, Value: []byte{0x01}}},
		"out of order":  {{Key: 70, Value: []byte{0x01}}, {Key: 65, Value: []byte{0x01}}},
		"duplicate":     {{Key: 70, Value: []byte{0x01}}, {Key: 70, Value: []byte{0x01}}},
		"tag":           {{Key: 70, Value: []byte{0xC1, 0x01}}},
		"two items":     {{Key: 70, Value: []byte{0x01, 0x02}}},
		"no item":       {{Key: 70, Value: nil}},
		"indefinite":    {{Key: 70, Value: []byte{0x9F, 0xFF}}},
		"truncated map": {{Key: 70, Value: []byte{0xA1, 0x00}}},
	} {
		h := NewHello(16384, 1024)
		h.Extensions = exts
		var we *Error
		if err := h.Validate(); !errors.As(err, &we) {
			t.Errorf("%s: Validate = %v, want a *wire.Error", name, err)
		}
	}
}

func TestLastValueAdUnlisted(t *testing.T) {
	many := make([]string, MaxAdPaths+1)
	for i := range many {
		many[i] = "/p"
	}
	for name, paths := range map[string][]string{
		"nil":       nil,
		"too many":  many,
		"too large": {"/" + string(bytes.Repeat([]byte("y"), MaxEndpointBytes-1)), "/" + string(bytes.Repeat([]byte("z"), MaxAdPathBytes))},
	} {
		b := AppendLastValueAd(nil, &LastValueAd{Version: 1, Paths: paths})
		ad, err := DecodeLastValueAd(b)
		if err != nil || ad.Version != 1 || ad.Paths != nil || !ad.Covers("/any") {
			t.Errorf("%s: %+v, %v; want an unlisted advertisement", name, ad, err)
		}
	}
}

func TestLastValueAdRefused(t *testing.T) {
	for name, h := range map[string]string{
		"not a map":        "01",
		"no version":       "A0",
		"version not uint": "A1006176",
		"paths not array":  "A200010101",
		"key not uint":     "A20001F5F5",
	} {
		b, err := hex.DecodeString(h)
		if err != nil {
			t.Fatal(name, err)
		}
		if _, err := DecodeLastValueAd(b); err == nil {
			t.Errorf("%s: accepted % X", name, b)
		}
	}
	// An unknown key of a later version is skipped.
	b, _ := hex.DecodeString("A2000207F5")
	if ad, err := DecodeLastValueAd(b); err != nil || ad.Version != 2 {
		t.Errorf("later version: %+v, %v", ad, err)
	}
}

func TestHelloKeepsAtMostMaxExtensions(t *testing.T) {
	h := NewHello(16384, 1024)
	for k := uint64(FirstExtensionKey); k < FirstExtensionKey+MaxHelloExtensions+6; k++ {
		h.Extensions = append(h.Extensions, Extension{Key: k, Value: []byte{0xF5}})
	}
	// Validate refuses to send that many; a peer may still receive them.
	if err := h.Validate(); err == nil {
		t.Fatal("Validate accepted more than MaxHelloExtensions")
	}
	back, err := DecodeHello(AppendHello(nil, &h))
	if err != nil {
		t.Fatal(err)
	}
	if len(back.Extensions) != MaxHelloExtensions || back.Extensions[MaxHelloExtensions-1].Key != FirstExtensionKey+MaxHelloExtensions-1 {
		t.Fatalf("kept %d extensions", len(back.Extensions))
	}
	// Keys 7-63 are the specification's: skipped, never kept.
	b := AppendHello(nil, &Hello{Versions: []uint64{0}, Capabilities: []uint64{}, RequiredCapabilities: []uint64{}})
	b[0]++                        // one more entry ...
	b = append(b, 0x18, 40, 0x01) // ... key 40: 1
	if back, err := DecodeHello(b); err != nil || back.Extensions != nil {
		t.Fatalf("key 40: %+v, %v", back.Extensions, err)
	}
}
