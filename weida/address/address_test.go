package address

import (
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	fp := "sha256:" + strings.Repeat("ab", 32)
	good := []struct {
		raw  string
		want Address
	}{
		{"weida://127.0.0.1:7000/orders", Address{Host: "127.0.0.1", Port: 7000, Path: "/orders"}},
		{"weida://[::1]:7000/a/b", Address{Host: "::1", Port: 7000, Path: "/a/b"}},
		{"weida://" + fp + "@localhost:1/", Address{Fingerprint: fp, Host: "localhost", Port: 1, Path: "/"}},
		{"weida://h:2/x@y", Address{Host: "h", Port: 2, Path: "/x@y"}},
	}
	for _, c := range good {
		got, err := Parse(c.raw)
		if err != nil || got != c.want {
			t.Errorf("Parse(%q) = %+v, %v; want %+v", c.raw, got, err, c.want)
			continue
		}
		if again, err := Parse(got.String()); err != nil || again != got {
			t.Errorf("round trip of %q: %+v, %v", c.raw, again, err)
		}
	}
	bad := []string{
		"", "http://h:1/p", "weida://h/p", "weida://h:1", "weida://:1/p", "weida://h:0/p",
		"weida://h:70000/p", "weida://h:1/p\x01", "weida://sha256:XX@h:1/p",
		"weida://sha256:" + strings.Repeat("AB", 32) + "@h:1/p",
		"weida://h:1/" + strings.Repeat("a", MaxPathLen),
	}
	for _, raw := range bad {
		if _, err := Parse(raw); err == nil {
			t.Errorf("Parse(%q) succeeded, want error", raw)
		}
	}
}
