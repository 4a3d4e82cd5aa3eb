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

func TestCheckReplicas(t *testing.T) {
	fp := "sha256:" + strings.Repeat("ab", 32)
	other := "sha256:" + strings.Repeat("cd", 32)
	cases := []struct {
		name  string
		raws  []string
		rules []string // the Rule of each error, in order
		at    []int    // and its Index
	}{
		{"one", []string{"weida://" + fp + "@h:1/p"}, nil, nil},
		{"same path and pin", []string{"weida://" + fp + "@a:1/p", "weida://" + fp + "@b:1/p", "weida://" + fp + "@a:2/p"}, nil, nil},
		{"no pins", []string{"weida://a:1/p", "weida://[::1]:1/p"}, nil, nil},
		{"other path", []string{"weida://a:1/p", "weida://b:1/q"}, []string{"replica-path"}, []int{1}},
		{"other pin", []string{"weida://" + fp + "@a:1/p", "weida://" + other + "@b:1/p"}, []string{"replica-pin"}, []int{1}},
		{"pin missing", []string{"weida://" + fp + "@a:1/p", "weida://b:1/p"}, []string{"replica-pin"}, []int{1}},
		{"pin added", []string{"weida://a:1/p", "weida://" + fp + "@b:1/p"}, []string{"replica-pin"}, []int{1}},
		{"duplicate", []string{"weida://a:1/p", "weida://b:1/p", "weida://a:1/p"}, []string{"replica-duplicate"}, []int{2}},
		{"duplicate IPv6, another spelling", []string{"weida://[::1]:1/p", "weida://[0:0::1]:1/p"}, []string{"replica-duplicate"}, []int{1}},
		{"duplicate IPv4 as mapped IPv6", []string{"weida://127.0.0.1:1/p", "weida://[::ffff:127.0.0.1]:1/p"}, []string{"replica-duplicate"}, []int{1}},
		{"duplicate name, other case", []string{"weida://Replica-A:1/p", "weida://replica-a:1/p"}, []string{"replica-duplicate"}, []int{1}},
		{"every fault", []string{"weida://a:1/p", "weida://b:1/q", "weida://" + fp + "@c:1/p", "weida://a:1/p"},
			[]string{"replica-path", "replica-pin", "replica-duplicate"}, []int{1, 2, 3}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			addrs := make([]Address, len(c.raws))
			for i, r := range c.raws {
				a, err := Parse(r)
				if err != nil {
					t.Fatal(err)
				}
				addrs[i] = a
			}
			errs := CheckReplicas(addrs, c.raws)
			if len(errs) != len(c.rules) {
				t.Fatalf("CheckReplicas = %v, want rules %v", errs, c.rules)
			}
			for i, e := range errs {
				if e.Rule != c.rules[i] || e.Index != c.at[i] || e.Value != c.raws[e.Index] {
					t.Errorf("error %d = %+v, want rule %s at %d", i, e, c.rules[i], c.at[i])
				}
				if !strings.Contains(e.Error(), e.Value) {
					t.Errorf("%q does not name the address", e.Error())
				}
			}
		})
	}
}

func TestValidateIdentity(t *testing.T) {
	for id, ok := range map[string]bool{
		"dns:dash-7.plant-a.example": true,
		"uri:spiffe://plant-a/dash":  true,
		"email:ops@plant-a.example":  true,
		"cn:dash 7":                  true,
		"cn:":                        false,
		"ip:10.0.0.1":                false,
		"dash-7":                     false,
		"dns: dash-7":                false,
		"cn:dash\n7":                 false,
		"DNS:dash-7":                 false,
	} {
		if err := ValidateIdentity(id); (err == nil) != ok {
			t.Errorf("ValidateIdentity(%q) = %v, want ok=%v", id, err, ok)
		}
	}
}
