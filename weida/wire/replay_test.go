package wire

import (
	"errors"
	"reflect"
	"testing"
)

// replayVectors pin the replay marks' bytes: extension keys 65-67 after the
// specification's keys, CBOR true for the flags, a minimal uint for the age.
var replayVectors = []struct {
	name  string
	frame string
	value Data
}{
	{"replayed", "57 01 0B A3 00 62 2F 74 05 61 61 18 41 F5",
		Data{Endpoint: "/t", HasEndpoint: true, Topic: "a", HasTopic: true, Replay: ReplayMarks{Replayed: true}}},
	{"replayed, age 1500 ms, stale", "57 01 13 A5 00 62 2F 74 05 61 61 18 41 F5 18 42 19 05 DC 18 43 F5",
		Data{Endpoint: "/t", HasEndpoint: true, Topic: "a", HasTopic: true,
			Replay: ReplayMarks{Replayed: true, AgeMillis: 1500, HasAge: true, Stale: true}}},
	{"replayed, age 0", "57 01 0E A4 00 62 2F 74 05 61 61 18 41 F5 18 42 00",
		Data{Endpoint: "/t", HasEndpoint: true, Topic: "a", HasTopic: true,
			Replay: ReplayMarks{Replayed: true, HasAge: true}}},
}

func TestReplayMarkVectors(t *testing.T) {
	for _, v := range replayVectors {
		t.Run(v.name, func(t *testing.T) { checkGolden(t, KindData, unhex(t, v.frame), v.value) })
	}
}

// TestReplayMarksSkippedByAnyDecoder: every mark is a plain data item, so a
// decoder that knows none of the keys skips them under PROTOCOL §5 (the
// skipper here is the one every unknown key goes through).
func TestReplayMarksSkippedByAnyDecoder(t *testing.T) {
	for _, v := range replayVectors {
		_, h, _, err := ParsePreamble(unhex(t, v.frame), DefaultMaxHeaderBytes)
		if err != nil {
			t.Fatal(err)
		}
		d := decoder{b: h, frame: KindData}
		m, err := d.openMap(-1)
		if err != nil {
			t.Fatal(err)
		}
		for {
			key, ok, err := d.next(&m)
			if err != nil {
				t.Fatalf("%s: %v", v.name, err)
			}
			if !ok {
				break
			}
			if err := d.skip(keyInt(key)); err != nil {
				t.Fatalf("%s: skipping key %d: %v", v.name, key, err)
			}
		}
		if err := d.finish(); err != nil {
			t.Fatalf("%s: %v", v.name, err)
		}
	}
}

// TestReplayMarksOfAnotherType: the extension space has no registry, so a
// value of another type under keys 65-67 is another extension's and reads
// as absent; the header's general rules still apply to it.
func TestReplayMarksOfAnotherType(t *testing.T) {
	for _, c := range []struct {
		name, header string
		want         ReplayMarks
	}{
		{"65 as uint", "A2 05 61 61 18 41 01", ReplayMarks{}},
		{"65 false", "A2 05 61 61 18 41 F4", ReplayMarks{}},
		{"66 as text", "A3 05 61 61 18 41 F5 18 42 61 78", ReplayMarks{Replayed: true}},
		{"67 as array", "A2 05 61 61 18 43 82 01 02", ReplayMarks{}},
	} {
		d, err := DecodeData(unhex(t, c.header))
		if err != nil {
			t.Fatalf("%s: %v", c.name, err)
		}
		if !reflect.DeepEqual(d.Replay, c.want) {
			t.Fatalf("%s: marks %+v, want %+v", c.name, d.Replay, c.want)
		}
	}
	for _, c := range []struct{ name, header, rule string }{
		{"65 as a tag", "A2 05 61 61 18 41 C1 01", RuleTag},
		{"66 duplicated", "A3 05 61 61 18 42 01 18 42 02", RuleDuplicateKey},
		{"67 before 66", "A3 05 61 61 18 43 F5 18 42 01", RuleKeyOrder},
	} {
		_, err := DecodeData(unhex(t, c.header))
		var we *Error
		if !errors.As(err, &we) || we.Rule != c.rule {
			t.Fatalf("%s: %v, want rule %q", c.name, err, c.rule)
		}
	}
}
