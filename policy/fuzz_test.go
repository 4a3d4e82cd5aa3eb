package policy

import (
	"errors"
	"strings"
	"testing"

	"weida.dev/connector/weida/topic"
)

// Foreign filters and names arrive from configuration files and from
// brokers: untrusted input. The fuzz targets check, on every input and for
// every policy, what the property tests check on generated ones. Their seeds
// are the table rows.

func seedStrings(f *testing.F) {
	for _, c := range convCases {
		f.Add(c.in)
	}
	for _, c := range amqpMatchCases {
		f.Add(c.filter)
		f.Add(c.topic)
	}
}

func FuzzConvert(f *testing.F) {
	seedStrings(f)
	f.Fuzz(func(t *testing.T, in string) {
		for _, n := range Names(all()) {
			p, _ := lookup(n)
			if w, err := p.ConvertFilter(in); err == nil {
				if topic.ValidateFilter(w) != nil || w == "" || p.Grammar().ValidateFilter(in) != nil {
					t.Fatalf("%s ConvertFilter(%q) = %q", n, in, w)
				}
			} else {
				checkFuzzRefusal(t, n, in, err)
			}
			if w, err := p.TopicToWeida(in); err == nil {
				if topic.ValidateTopic(w) != nil || p.Grammar().ValidateTopic(in) != nil {
					t.Fatalf("%s TopicToWeida(%q) = %q", n, in, w)
				}
				if back, err := p.TopicFromWeida(w); err == nil && back != in {
					t.Fatalf("%s: %q → %q → %q", n, in, w, back)
				}
			} else {
				checkFuzzRefusal(t, n, in, err)
			}
			if out, err := p.TopicFromWeida(in); err == nil {
				if p.Grammar().ValidateTopic(out) != nil {
					t.Fatalf("%s TopicFromWeida(%q) = %q, invalid", n, in, out)
				}
				if back, err := p.TopicToWeida(out); err != nil || back != in {
					t.Fatalf("%s: %q → %q → %q, %v", n, in, out, back, err)
				}
			} else {
				checkFuzzRefusal(t, n, in, err)
			}
		}
	})
}

func checkFuzzRefusal(t *testing.T, policy, in string, err error) {
	t.Helper()
	var r *Refusal
	if !errors.As(err, &r) || r.Policy != policy || r.Input != in || r.Rule == "" || !strings.Contains(in, r.Part) {
		t.Fatalf("%s refused %q with %#v", policy, in, err)
	}
}

// FuzzExact checks the exactness equation on arbitrary pairs.
func FuzzExact(f *testing.F) {
	for _, c := range amqpMatchCases {
		f.Add(c.filter, c.topic)
	}
	f.Add("sensors/+/california/#", "sensors/us/california")
	f.Add("#", "$SYS/broker")
	f.Add("a/+", "a/b.c")
	f.Add("a.*", "a.b")
	f.Fuzz(func(t *testing.T, filter, name string) {
		for _, n := range Names(all()) {
			p, _ := lookup(n)
			w, err := p.ConvertFilter(filter)
			if err != nil {
				continue
			}
			wt, err := p.TopicToWeida(name)
			if err != nil {
				continue
			}
			if want, got := p.Grammar().Match(filter, name), topic.Match(w, wt) && p.Admit(filter, name); want != got {
				t.Fatalf("%s: foreign Match(%q, %q) = %v, weida Match(%q, %q) && Admit = %v", n, filter, name, want, w, wt, got)
			}
		}
	})
}

// FuzzAMQPMatch compares the greedy matcher with the recursive reference.
func FuzzAMQPMatch(f *testing.F) {
	for _, c := range amqpMatchCases {
		f.Add(c.filter, c.topic)
	}
	f.Fuzz(func(t *testing.T, filter, key string) {
		// The reference is exponential in the number of '#' words.
		if strings.Count(filter, "#") > 6 || len(filter) > 64 || len(key) > 64 {
			return
		}
		if got, want := AMQPGrammar().Match(filter, key), amqpRef(amqpWordsOf(filter), amqpWordsOf(key)); got != want {
			t.Fatalf("Match(%q, %q) = %v, reference %v", filter, key, got, want)
		}
	})
}
