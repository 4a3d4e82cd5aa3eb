package policy_test

import (
	"errors"
	"fmt"

	"weida.dev/connector/policy"
)

func show(out string, err error) {
	var r *policy.Refusal
	if errors.As(err, &r) {
		fmt.Printf("refused (%s) at %q\n", r.Rule, r.Part)
		return
	}
	fmt.Println(out)
}

func Example_mqttLevels() {
	p := policy.MQTTLevelsV1()
	show(p.ConvertFilter("sensors/+/california/+/temperature"))
	show(p.ConvertFilter("sensors/us/#"))
	show(p.ConvertFilter("a/b.c"))
	show(p.TopicToWeida("sensors/us/temperature"))
	show(p.TopicFromWeida("sensors.us.temperature"))
	show(p.TopicFromWeida("a/b"))
	// '#' matches the parent level too, but never a '$' topic.
	fmt.Println(p.Grammar().Match("sensors/us/#", "sensors/us"), p.Grammar().Match("#", "$SYS/broker"), p.Admit("#", "$SYS/broker"))
	fmt.Println(p.Losses(policy.Inbound, policy.Options{QoS: 1}))
	// Output:
	// sensors.*.california.*.temperature
	// sensors.us.#
	// refused (mqtt-dotted-level) at "b.c"
	// sensors.us.temperature
	// sensors/us/temperature
	// refused (mqtt-slash-segment) at "a/b"
	// true false false
	// [delivery-best-effort dotted-levels expiry ordering properties reply-to retain topic-length]
}

func Example_mqttLevelsEscaped() {
	p := policy.MQTTLevelsEscapedV1()
	show(p.ConvertFilter("a/b.c"))
	show(p.ConvertFilter("prices/*/100%"))
	show(p.TopicToWeida("v1.2/status"))
	show(p.TopicFromWeida("v1%2E2.status"))
	show(p.TopicFromWeida("v1%2e2.status"))
	// Output:
	// a.b%2Ec
	// prices.%2A.100%25
	// v1%2E2.status
	// v1.2/status
	// refused (mqtt-escape) at "v1%2e2"
}

func Example_natsTokens() {
	p := policy.NATSTokensV1()
	show(p.ConvertFilter("orders.*.created"))
	show(p.ConvertFilter("orders.>"))
	show(p.ConvertFilter("a.#"))
	show(p.TopicToWeida("orders.eu.created"))
	show(p.TopicFromWeida("orders..created"))
	fmt.Println(p.Grammar().Match("a.>", "a"), p.Grammar().Match("a.>", "a.b.c.d"))
	fmt.Println(p.Losses(policy.Outbound, policy.Options{}))
	// Output:
	// orders.*.created
	// refused (nats-one-or-more) at ">"
	// refused (nats-hash-token) at "#"
	// orders.eu.created
	// refused (nats-empty-token) at ""
	// false true
	// [at-most-once delivery-best-effort empty-segments forbidden-chars ordering wildcard-names]
}

func Example_amqpWords() {
	p := policy.AMQPWordsV1()
	show(p.ConvertFilter("audit.events.#"))
	show(p.ConvertFilter("audit.#.*"))
	show(p.ConvertFilter("#.critical"))
	show(p.ConvertFilter(""))
	show(p.TopicToWeida(""))
	fmt.Println(p.Grammar().Match("audit.events.#", "audit.events"), p.Grammar().Match("#.critical", "a.b.critical"))
	// Output:
	// audit.events.#
	// audit.*.#
	// refused (amqp-hash-then-literal) at "#.critical"
	// refused (amqp-empty-binding-key) at ""
	// refused (amqp-empty-routing-key) at ""
	// true true
}

func ExampleLossForRule() {
	p := policy.NATSTokensV1()
	_, err := p.TopicFromWeida("orders..eu")
	var r *policy.Refusal
	if errors.As(err, &r) {
		loss, _ := policy.LossForRule(r.Rule)
		fmt.Println(r.Rule, "→", loss)
		fmt.Println(loss.Description())
	}
	// Output:
	// nats-empty-token → empty-segments
	// weida topics with an empty segment the broker cannot carry are dropped and counted (any empty token for NATS, the empty topic for MQTT)
}

func ExampleLookup() {
	// A program's list: here, every policy of the package.
	list := []policy.Policy{policy.MQTTLevelsV1(), policy.MQTTLevelsEscapedV1(), policy.NATSTokensV1(), policy.AMQPWordsV1()}
	_, err := policy.Lookup(list, "mqtt-levels/v2")
	fmt.Println(err)
	p, _ := policy.Lookup(list, policy.AMQPWords)
	fmt.Println(p.Name())
	// Output:
	// policy refuses "mqtt-levels/v2": no conversion policy has this name (unknown-policy); known policies: amqp-words/v1, mqtt-levels-escaped/v1, mqtt-levels/v1, nats-tokens/v1
	// amqp-words/v1
}

func ExampleNATSTail() {
	p := policy.NATSTail()
	show(p.ConvertFilter("orders.>"))
	show(p.ConvertFilter(">"))
	show(p.ConvertFilter("orders.#"))
	back := p.(policy.WeidaFilterConverter)
	show(back.FilterFromWeida("orders.*.#"))
	show(back.FilterFromWeida("orders.#"))
	// Output:
	// orders.*.#
	// *.#
	// refused (nats-hash-token) at "#"
	// orders.>
	// refused (nats-zero-or-more) at "#"
}

func ExampleNewMounted() {
	m, err := policy.NewMounted(policy.MQTTLevelsV1(), policy.Mount{Foreign: "factory/", Weida: "plants.berlin."})
	if err != nil {
		fmt.Println(err)
		return
	}
	show(m.ConvertFilter("factory/#"))
	show(m.ConvertFilter("factory/+/temperature"))
	show(m.ConvertFilter("+/temperature"))
	show(m.TopicToWeida("factory"))
	show(m.TopicToWeida("factory/line1/temperature"))
	show(m.TopicFromWeida("plants.berlin.line1"))
	show(m.TopicFromWeida("plants.paris.line1"))
	_, err = policy.NewMounted(policy.MQTTLevelsV1(), policy.Mount{Foreign: "factory", Weida: "plants.berlin."})
	fmt.Println(err)
	// Output:
	// plants.berlin.#
	// plants.berlin.*.temperature
	// refused (mount-outside) at "+/temperature"
	// plants.berlin
	// plants.berlin.line1.temperature
	// factory/line1
	// refused (mount-outside) at "plants.paris.line1"
	// mqtt-levels/v1 refuses "factory": the foreign prefix must end at a level boundary, with '/' (mount-boundary); write "factory/"
}
