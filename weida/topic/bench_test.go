package topic

import (
	"bytes"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
)

// sink keeps benchmark results alive.
var sink bool

// benchLong is a realistic long topic (about 200 bytes, nine segments).
var benchLong = "tenant-4f1c9e2a.region-eu-central-1.cluster-prod-07.namespace-payments-settlement." +
	"deployment-ledger-writer-v3.pod-ledger-writer-v3-6d9f8b7c5-x2k4p." +
	"container-main.metric-jvm-heap-used-bytes.unit-bytes"

// matchBench pairs each filter with a topic and with the byte prefix that
// weida's former grammar (a filter was a byte prefix of the topic, decision
// 0007 §1) would use for the same subscription, so that BenchmarkHasPrefix
// does the comparable work on the same topic. '*' has no prefix form; there
// the prefix is the whole topic, so that both read the same bytes.
var matchBench = []struct {
	name, filter, prefix, topic string
}{
	{"literal", "orders.eu.created", "orders.eu.created", "orders.eu.created"},
	{"star", "sensors.*.temp", "sensors.kitchen-3.temp", "sensors.kitchen-3.temp"},
	{"hash", "orders.eu.#", "orders.eu.", "orders.eu.de.berlin.created"},
	{"long-literal", benchLong, benchLong, benchLong},
	{"long-star", strings.Replace(benchLong, "pod-ledger-writer-v3-6d9f8b7c5-x2k4p", "*", 1), benchLong, benchLong},
	{"miss-early", "orders.eu.#", "orders.eu.", "metrics.cpu.load"},
	{"miss-late", benchLong[:len(benchLong)-1] + "X", benchLong[:len(benchLong)-1] + "X", benchLong},
}

// BenchmarkMatch measures Match; compare it with BenchmarkHasPrefix of the
// same run (see docs/PERFORMANCE.md).
func BenchmarkMatch(b *testing.B) {
	for _, c := range matchBench {
		// Own copies: equal literals share memory, and string comparison
		// would stop at the identical pointers without reading a byte.
		c.filter, c.topic = strings.Clone(c.filter), strings.Clone(c.topic)
		if Match(c.filter, c.topic) != bytes.HasPrefix([]byte(c.topic), []byte(c.prefix)) {
			b.Fatalf("%s: Match and HasPrefix disagree; the pair does not do comparable work", c.name)
		}
		b.Run("case="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.topic)))
			for b.Loop() {
				sink = Match(c.filter, c.topic)
			}
		})
	}
}

// BenchmarkHasPrefix is the baseline of BenchmarkMatch: bytes.HasPrefix of
// the same topic against the equivalent byte prefix.
func BenchmarkHasPrefix(b *testing.B) {
	for _, c := range matchBench {
		topic, prefix := []byte(c.topic), []byte(c.prefix)
		b.Run("case="+c.name, func(b *testing.B) {
			b.ReportAllocs()
			b.SetBytes(int64(len(c.topic)))
			for b.Loop() {
				sink = bytes.HasPrefix(topic, prefix)
			}
		})
	}
}

// benchSet builds n subscriptions in the shape of a multi-tenant telemetry
// publisher, one subscriber value each: most filters name one device
// exactly, some use '*' for the site or the metric, some take a whole
// site with '#'. It also returns 1,024 topics that each match a few of them.
func benchSet(n int) (entries []entry, topics []string) {
	const tenants, sites = 97, 13
	for i := range n {
		t, s := i%tenants, i%sites
		var f string
		switch i % 10 {
		case 0, 1, 2, 3, 4, 5:
			f = fmt.Sprintf("tenant%d.site%d.dev%d.temp", t, s, i)
		case 6, 7:
			f = fmt.Sprintf("tenant%d.*.dev%d.temp", t, i)
		case 8:
			f = fmt.Sprintf("tenant%d.site%d.#", t, s)
		case 9:
			f = fmt.Sprintf("*.site%d.dev%d.*", s, i)
		}
		entries = append(entries, entry{f, i})
	}
	r := rand.New(rand.NewPCG(1, 2))
	for range 1024 {
		i := r.IntN(n)
		topics = append(topics, fmt.Sprintf("tenant%d.site%d.dev%d.temp", i%tenants, i%sites, i))
	}
	return entries, topics
}

var benchSizes = []int{10, 1_000, 100_000}

// BenchmarkIndex measures Index.Match per topic; BenchmarkScan is its
// baseline, a linear scan of Match over the same entries.
func BenchmarkIndex(b *testing.B) {
	for _, n := range benchSizes {
		entries, topics := benchSet(n)
		x := NewIndex[int]()
		for _, e := range entries {
			if err := x.Insert(e.filter, e.v); err != nil {
				b.Fatal(err)
			}
		}
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			b.ReportAllocs()
			matched, i := 0, 0
			yield := func(int) bool { matched++; return true }
			for b.Loop() {
				x.Match(topics[i%len(topics)], yield)
				i++
			}
			b.ReportMetric(float64(matched)/float64(i), "matches/op")
		})
	}
}

// BenchmarkScan is the baseline of BenchmarkIndex. Every entry has its own
// value, so the scan needs no deduplication.
func BenchmarkScan(b *testing.B) {
	for _, n := range benchSizes {
		entries, topics := benchSet(n)
		b.Run(fmt.Sprint("n=", n), func(b *testing.B) {
			b.ReportAllocs()
			matched, i := 0, 0
			for b.Loop() {
				tp := topics[i%len(topics)]
				for _, e := range entries {
					if Match(e.filter, tp) {
						matched++
					}
				}
				i++
			}
			b.ReportMetric(float64(matched)/float64(i), "matches/op")
		})
	}
}

// BenchmarkIndexShared measures the cost of Match's deduplication: 256
// subscribers (weida's max_subscriptions per connection, as if each were one
// connection) with four filters each, all matching the topic. Match reports
// 256 values; MatchFilters, which does not deduplicate, reports 1,024
// entries.
func BenchmarkIndexShared(b *testing.B) {
	x := NewIndex[int]()
	for v := range 256 {
		for _, f := range []string{"orders.eu.created", "orders.*.created", "orders.#", "orders.eu.#"} {
			if err := x.Insert(f, v); err != nil {
				b.Fatal(err)
			}
		}
	}
	const tp = "orders.eu.created"
	b.Run("op=Match", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		yield := func(int) bool { n++; return true }
		for b.Loop() {
			x.Match(tp, yield)
		}
	})
	b.Run("op=MatchFilters", func(b *testing.B) {
		b.ReportAllocs()
		n := 0
		yield := func(string, int) bool { n++; return true }
		for b.Loop() {
			x.MatchFilters(tp, yield)
		}
	})
}
