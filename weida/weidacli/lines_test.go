package weidacli

import (
	"bytes"
	"encoding/base64"
	"flag"
	"io"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode/utf8"

	"pgregory.net/rapid"

	"weida.dev/connector/internal/cli"
	"weida.dev/connector/weida"
	"weida.dev/connector/weida/topic"
)

func TestParsePubLine(t *testing.T) {
	for _, tc := range []struct {
		name, line string
		path       string
		want       weida.Message
		err        string // a substring of the error; "" for success
	}{
		{"tsv", "a.b\thello", "", weida.Message{Topic: "a.b", Payload: []byte("hello")}, ""},
		{"tsv keeps later tabs", "a\tx\ty", "", weida.Message{Topic: "a", Payload: []byte("x\ty")}, ""},
		{"tsv empty payload", "a\t", "", weida.Message{Topic: "a", Payload: []byte{}}, ""},
		{"tsv empty topic", "\tp", "", weida.Message{Topic: "", Payload: []byte("p")}, ""},
		{"tsv wildcards are literal", "a.*.#\tp", "", weida.Message{Topic: "a.*.#", Payload: []byte("p")}, ""},
		{"tsv not UTF-8", "a\xff\tp", "", weida.Message{}, "invalid-utf8"},
		{"tsv topic too long", strings.Repeat("a", 257) + "\tp", "", weida.Message{}, "too-long"},
		{"no tab", "just text", "", weida.Message{}, "neither a JSON object"},
		{"json string payload", `{"topic":"a","payload":"h\u00e9\n"}`, "", weida.Message{Topic: "a", Payload: []byte("hé\n")}, ""},
		{"json object payload", `  {"topic":"a","payload":{"t": 21.5}}`, "", weida.Message{Topic: "a", Payload: []byte(`{"t": 21.5}`)}, ""},
		{"json number payload", `{"topic":"a","payload":42}`, "", weida.Message{Topic: "a", Payload: []byte("42")}, ""},
		{"json null payload", `{"topic":"a","payload":null}`, "", weida.Message{Topic: "a"}, ""},
		{"json no payload", `{"topic":"a"}`, "", weida.Message{Topic: "a"}, ""},
		{"json base64", `{"topic":"a","payloadBase64":"AP8="}`, "", weida.Message{Topic: "a", Payload: []byte{0, 0xff}}, ""},
		{"json metadata and endpoint", `{"endpoint":"/x","topic":"a","contentType":"c","traceparent":"tp","tracestate":"ts"}`,
			"/x", weida.Message{Topic: "a", ContentType: "c", Traceparent: "tp", Tracestate: "ts"}, ""},
		{"json sub line", `{"endpoint":"/x","topic":"a","contentType":"","traceparent":"","tracestate":"","payload":"p"}`,
			"/x", weida.Message{Topic: "a", Payload: []byte("p")}, ""},
		{"json no topic", `{"payload":"p"}`, "", weida.Message{}, `no "topic"`},
		{"json unknown field", `{"topic":"a","content_type":"x"}`, "", weida.Message{}, `unknown field "content_type"`},
		{"json both payloads", `{"topic":"a","payload":"p","payloadBase64":"AA=="}`, "", weida.Message{}, "not both"},
		{"json bad base64", `{"topic":"a","payloadBase64":"!!"}`, "", weida.Message{}, "payloadBase64"},
		{"json trailing value", `{"topic":"a"} {"topic":"b"}`, "", weida.Message{}, "more than one value"},
		{"json syntax", `{"topic":`, "", weida.Message{}, "JSON"},
		{"json empty endpoint", `{"topic":"a","endpoint":""}`, "", weida.Message{}, `"endpoint" is empty`},
		{"json topic too long", `{"topic":"` + strings.Repeat("a", 257) + `"}`, "", weida.Message{}, "too-long"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path, m, err := parsePubLine([]byte(tc.line))
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want one containing %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if path != tc.path || !equalMessage(m, tc.want) {
				t.Errorf("= %q, %+v; want %q, %+v", path, m, tc.path, tc.want)
			}
		})
	}
	for _, blank := range []string{"", " ", "\t", " \t \r"} {
		if _, _, err := parsePubLine([]byte(blank)); err != errBlank {
			t.Errorf("%q: %v, want errBlank", blank, err)
		}
	}
}

func equalMessage(a, b weida.Message) bool {
	return a.Endpoint == b.Endpoint && a.Topic == b.Topic && a.ContentType == b.ContentType &&
		a.Traceparent == b.Traceparent && a.Tracestate == b.Tracestate && bytes.Equal(a.Payload, b.Payload)
}

// TestSubJSONFeedsPub: every line sub prints with --output json is a line
// pub publishes as the same message, whatever the payload bytes.
func TestSubJSONFeedsPub(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		m := weida.Message{
			Endpoint:    "/" + rapid.StringMatching(`[a-z/]{0,10}`).Draw(t, "path"),
			Topic:       rapid.StringN(0, 40, 256).Filter(func(s string) bool { return topic.ValidateTopic(s) == nil }).Draw(t, "topic"),
			ContentType: rapid.StringN(0, 10, -1).Draw(t, "ct"),
			Traceparent: rapid.StringN(0, 10, -1).Draw(t, "tp"),
			Tracestate:  rapid.StringN(0, 10, -1).Draw(t, "ts"),
			Payload:     rapid.OneOf(rapid.SliceOf(rapid.Byte()), rapid.Map(rapid.String(), func(s string) []byte { return []byte(s) })).Draw(t, "payload"),
		}
		line := writeSubJSON(nil, &m)
		if bytes.Count(line, []byte{'\n'}) != 1 || line[len(line)-1] != '\n' {
			t.Fatalf("not one line: %q", line)
		}
		path, got, err := parsePubLine(line[:len(line)-1])
		if err != nil {
			t.Fatalf("pub refuses sub's line %q: %v", line, err)
		}
		want := m
		want.Endpoint = ""
		if got.Payload == nil {
			got.Payload = []byte{}
		}
		if want.Payload == nil {
			want.Payload = []byte{}
		}
		if path != m.Endpoint || !equalMessage(got, want) {
			t.Fatalf("line %q read back as %q, %+v; want %+v", line, path, got, want)
		}
	})
}

// FuzzParsePubLine: stdin is untrusted; a line never panics the parser,
// and an accepted line carries a valid topic.
func FuzzParsePubLine(f *testing.F) {
	for _, s := range []string{"a.b\thello", `{"topic":"a","payload":{"x":[1,2]}}`, `{"topic":"a","payloadBase64":"AP8="}`,
		`{"endpoint":"/x","topic":"a","contentType":"c"}`, "", "\xff\t", `{"topic":"a"}{`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, line []byte) {
		_, m, err := parsePubLine(line)
		if err == nil {
			if verr := topic.ValidateTopic(m.Topic); verr != nil {
				t.Fatalf("accepted %q with topic %q: %v", line, m.Topic, verr)
			}
		}
	})
}

func TestSafeText(t *testing.T) {
	for _, tc := range []struct{ in, want string }{
		{"", ""},
		{"sensors.a.temp", "sensors.a.temp"},
		{"with space", "with space"},
		{"grüße.日本", "grüße.日本"},
		{"a\tb", `"a\tb"`},
		{"a\nb", `"a\nb"`},
		{`"quoted"`, `"\"quoted\""`},
		{"bad\xff", `"bad\xff"`},
		{"\u200b", `"\u200b"`}, // not printable
	} {
		if got := safeText(tc.in); got != tc.want {
			t.Errorf("safeText(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

func TestSafePayload(t *testing.T) {
	for _, tc := range []struct {
		in   []byte
		want string
	}{
		{nil, ""},
		{[]byte("21.5"), "21.5"},
		{[]byte(`{"a": 1}`), `{"a": 1}`},
		{[]byte("{\n  \"a\": 1\n}"), `"{\n  \"a\": 1\n}"`},
		{[]byte(`"s"`), `"\"s\""`},
		{[]byte("base64:abc"), `"base64:abc"`},
		{[]byte{0, 1, 0xff}, "base64:AAH/"},
		{[]byte{0}, `"\x00"`}, // valid UTF-8, a control character
	} {
		if got := safePayload(tc.in); got != tc.want {
			t.Errorf("safePayload(%q) = %s, want %s", tc.in, got, tc.want)
		}
	}
}

// TestSafePayloadProperty: the text form is one field of one line, and it
// gives the payload back.
func TestSafePayloadProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		p := rapid.OneOf(rapid.SliceOf(rapid.Byte()), rapid.Map(rapid.String(), func(s string) []byte { return []byte(s) })).Draw(t, "p")
		s := safePayload(p)
		if strings.ContainsAny(s, "\t\n\r") {
			t.Fatalf("safePayload(%q) = %q spans fields or lines", p, s)
		}
		var back []byte
		switch {
		case strings.HasPrefix(s, payloadMarker):
			b, err := base64.StdEncoding.DecodeString(s[len(payloadMarker):])
			if err != nil {
				t.Fatal(err)
			}
			back = b
		case strings.HasPrefix(s, `"`):
			u, err := unquote(s)
			if err != nil {
				t.Fatalf("%q: %v", s, err)
			}
			back = []byte(u)
		default:
			back = []byte(s)
		}
		if !bytes.Equal(back, p) && !(len(back) == 0 && len(p) == 0) {
			t.Fatalf("safePayload(%q) = %q reads back as %q", p, s, back)
		}
		if !utf8.Valid(p) && !strings.HasPrefix(s, payloadMarker) {
			t.Fatalf("invalid UTF-8 %q not in base64: %q", p, s)
		}
	})
}

func TestWriteSubText(t *testing.T) {
	m := weida.Message{Topic: "a.b", Payload: []byte("x"), ContentType: "text/plain", Tracestate: "k=v\tw"}
	if got, want := string(writeSubText(nil, &m)), "a.b\tx\tcontent-type=text/plain\ttracestate=\"k=v\\tw\"\n"; got != want {
		t.Errorf("= %q, want %q", got, want)
	}
}

func TestReadLines(t *testing.T) {
	const limit = 10
	in := "one\r\ntwo\n\n" + strings.Repeat("x", 70000) + "\n" + strings.Repeat("y", limit) + "\r\n" + strings.Repeat("z", limit+1) + "\nlast"
	out := make(chan inputLine)
	stop := make(chan struct{})
	defer close(stop)
	go readLines(strings.NewReader(in), limit, out, stop)
	var got []inputLine
	for l := range out {
		got = append(got, l)
		if l.eof || l.err != nil {
			break
		}
	}
	want := []inputLine{
		{n: 1, text: []byte("one")}, {n: 2, text: []byte("two")}, {n: 3, text: []byte{}},
		{n: 4, tooLong: true}, {n: 5, text: []byte(strings.Repeat("y", limit))}, {n: 6, tooLong: true}, {n: 7, text: []byte("last")}, {eof: true},
	}
	if len(got) != len(want) {
		t.Fatalf("got %d lines, want %d: %+v", len(got), len(want), got)
	}
	for i := range want {
		g, w := got[i], want[i]
		if g.n != w.n || !bytes.Equal(g.text, w.text) || g.tooLong != w.tooLong || g.eof != w.eof || g.err != nil {
			t.Errorf("line %d = %+v, want %+v", i, g, w)
		}
	}

	// Closing stop ends a reader that has a line to deliver.
	stop2 := make(chan struct{})
	done := make(chan struct{})
	go func() { readLines(strings.NewReader("a\nb\n"), limit, make(chan inputLine), stop2); close(done) }()
	close(stop2)
	<-done

	// A read error ends the lines.
	out3 := make(chan inputLine)
	go readLines(io.MultiReader(strings.NewReader("a\n"), errReader{}), limit, out3, stop)
	if l := <-out3; string(l.text) != "a" {
		t.Errorf("first line %+v", l)
	}
	if l := <-out3; l.err == nil {
		t.Errorf("after a read error: %+v", l)
	}
}

type errReader struct{}

func (errReader) Read([]byte) (int, error) { return 0, io.ErrClosedPipe }

func TestParseInterspersed(t *testing.T) {
	for _, tc := range []struct {
		args    []string
		pos     []string
		filters []string
	}{
		{[]string{"u", "--filter", "a"}, []string{"u"}, []string{"a"}},
		{[]string{"--filter", "a", "u", "--filter", "b"}, []string{"u"}, []string{"a", "b"}},
		{[]string{"u", "v"}, []string{"u", "v"}, nil},
		{[]string{"--filter", "a", "--", "--filter", "u"}, []string{"--filter", "u"}, []string{"a"}},
		{nil, nil, nil},
	} {
		fs := flag.NewFlagSet("t", flag.ContinueOnError)
		var filters cli.StringList
		fs.Var(&filters, "filter", "")
		pos, code, done := parseInterspersed(fs, tc.args, io.Discard)
		if done || code != cli.ExitOK || !slices.Equal(pos, tc.pos) || !slices.Equal(filters, tc.filters) {
			t.Errorf("%q: pos %q, filters %q, code %d, done %v", tc.args, pos, filters, code, done)
		}
	}
}

func TestParseCounts(t *testing.T) {
	if got, err := parseCounts("1, 10,100"); err != nil || !slices.Equal(got, []int{1, 10, 100}) {
		t.Errorf("= %v, %v", got, err)
	}
	for _, bad := range []string{"", "0", "-1", "1,,2", "x", "2,2"} {
		if _, err := parseCounts(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999.4: "999", 999.6: "1,000", 1234567: "1,234,567", 100000: "100,000"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

func TestExplainFilterError(t *testing.T) {
	err := topic.ValidateFilter("a.b*.c")
	if got, want := explainFilterError(err), `"a.b*.c": segment 2 ("b*"): '*' must be a whole segment, as in a.*.c [rule star-not-alone]`; got != want {
		t.Errorf("= %s\nwant %s", got, want)
	}
	err = topic.ValidateFilter(strings.Repeat("a", 300))
	if got := explainFilterError(err); !strings.Contains(got, "longer than 256 bytes [rule too-long]") || strings.Contains(got, "segment") {
		t.Errorf("= %s", got)
	}
}

// unquote reads a Go-quoted string, as safePayload writes it.
func unquote(s string) (string, error) { return strconv.Unquote(s) }
