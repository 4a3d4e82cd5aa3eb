package policy

import (
	"strings"
	"testing"
)

// identityCases are conversions that change nothing: they must return their
// input without allocating.
var identityCases = []struct {
	policy string
	op     op
	in     string
}{
	{MQTTLevels, opIn, "temperature"},
	{MQTTLevels, opOut, "temperature"},
	{MQTTLevels, opFilter, "temperature"},
	{MQTTLevels, opFilter, "#"},
	{MQTTLevelsEscaped, opIn, "temperature"},
	{MQTTLevelsEscaped, opOut, "temperature"},
	{NATSTokens, opIn, "orders.eu.created"},
	{NATSTokens, opOut, "orders.eu.created"},
	{NATSTokens, opFilter, "orders.*.created"},
	{AMQPWords, opIn, "audit.events.login"},
	{AMQPWords, opOut, "audit.events.login"},
	{AMQPWords, opFilter, "audit.*.#"},
}

func TestIdentityAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range identityCases {
		p, _ := lookup(c.policy)
		var out string
		allocs := testing.AllocsPerRun(100, func() { out, _ = c.op.apply(p, c.in) })
		if out != c.in {
			t.Errorf("%s %s(%q) = %q, not the identity", c.policy, c.op, c.in, out)
		}
		if allocs != 0 {
			t.Errorf("%s %s(%q): %v allocations, want 0", c.policy, c.op, c.in, allocs)
		}
	}
}

func TestMatchAllocatesNothing(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector allocates")
	}
	for _, c := range []struct {
		g    Grammar
		f, t string
	}{
		{MQTTGrammar(), "sensors/+/california/#", "sensors/us/california/sf/temperature"},
		{NATSGrammar(), "orders.*.>", "orders.eu.created.v2"},
		{AMQPGrammar(), "#.audit.#.login", "eu.west.audit.x.y.login"},
	} {
		if n := testing.AllocsPerRun(100, func() { c.g.Match(c.f, c.t) }); n != 0 {
			t.Errorf("%s Match: %v allocations", c.g.Protocol(), n)
		}
	}
}

var sink string

func benchConv(b *testing.B, name string, o op, in string) {
	p, err := lookup(name)
	if err != nil {
		b.Fatal(err)
	}
	if _, err := o.apply(p, in); err != nil {
		b.Fatalf("%s %s(%q): %v", name, o, in, err)
	}
	b.ReportAllocs()
	for b.Loop() {
		sink, _ = o.apply(p, in)
	}
}

// BenchmarkTopicToWeida measures inbound topic conversion. "identity" needs
// no change; "typical" is a five-level topic; "escaped" needs escapes.
func BenchmarkTopicToWeida(b *testing.B) {
	b.Run("mqtt-levels/identity", func(b *testing.B) { benchConv(b, MQTTLevels, opIn, "temperature") })
	b.Run("mqtt-levels/typical", func(b *testing.B) { benchConv(b, MQTTLevels, opIn, "sensors/us/california/sf/temperature") })
	b.Run("mqtt-levels-escaped/typical", func(b *testing.B) {
		benchConv(b, MQTTLevelsEscaped, opIn, "sensors/us/california/sf/temperature")
	})
	b.Run("mqtt-levels-escaped/escaped", func(b *testing.B) { benchConv(b, MQTTLevelsEscaped, opIn, "fw/v1.2.3/100%/*") })
	b.Run("nats-tokens/identity", func(b *testing.B) { benchConv(b, NATSTokens, opIn, "sensors.us.california.sf.temperature") })
	b.Run("amqp-words/identity", func(b *testing.B) { benchConv(b, AMQPWords, opIn, "sensors.us.california.sf.temperature") })
	b.Run("refused", func(b *testing.B) { benchConv2(b, MQTTLevels, "sensors/v1.2/temperature") })
}

func benchConv2(b *testing.B, name, in string) {
	p, _ := lookup(name)
	b.ReportAllocs()
	for b.Loop() {
		_, err := p.TopicToWeida(in)
		if err == nil {
			b.Fatal("not refused")
		}
	}
}

// BenchmarkTopicFromWeida measures outbound topic conversion.
func BenchmarkTopicFromWeida(b *testing.B) {
	b.Run("mqtt-levels/identity", func(b *testing.B) { benchConv(b, MQTTLevels, opOut, "temperature") })
	b.Run("mqtt-levels/typical", func(b *testing.B) { benchConv(b, MQTTLevels, opOut, "sensors.us.california.sf.temperature") })
	b.Run("mqtt-levels-escaped/escaped", func(b *testing.B) { benchConv(b, MQTTLevelsEscaped, opOut, "fw.v1%2E2%2E3.100%25.%2A") })
	b.Run("nats-tokens/identity", func(b *testing.B) { benchConv(b, NATSTokens, opOut, "sensors.us.california.sf.temperature") })
	b.Run("amqp-words/identity", func(b *testing.B) { benchConv(b, AMQPWords, opOut, "sensors.us.california.sf.temperature") })
}

// BenchmarkBaseline is the floor the MQTT conversions are measured against:
// the standard library's replacement of one byte by another.
func BenchmarkBaseline(b *testing.B) {
	b.Run("strings.ReplaceAll", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			sink = strings.ReplaceAll("sensors/us/california/sf/temperature", "/", ".")
		}
	})
}

func BenchmarkConvertFilter(b *testing.B) {
	b.Run("mqtt-levels", func(b *testing.B) { benchConv(b, MQTTLevels, opFilter, "sensors/+/california/+/temperature") })
	b.Run("nats-tokens", func(b *testing.B) { benchConv(b, NATSTokens, opFilter, "orders.*.created") })
	b.Run("amqp-words/normalized", func(b *testing.B) { benchConv(b, AMQPWords, opFilter, "audit.#.*") })
}

func BenchmarkMatch(b *testing.B) {
	for _, c := range []struct {
		g    Grammar
		f, t string
	}{
		{MQTTGrammar(), "sensors/+/california/#", "sensors/us/california/sf/temperature"},
		{NATSGrammar(), "sensors.*.california.>", "sensors.us.california.sf.temperature"},
		{AMQPGrammar(), "#.california.#.temperature", "sensors.us.california.sf.temperature"},
	} {
		b.Run(string(c.g.Protocol()), func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				if !c.g.Match(c.f, c.t) {
					b.Fatal("no match")
				}
			}
		})
	}
}
