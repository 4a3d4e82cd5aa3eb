package policy

import (
	"slices"
	"strings"
)

// Policy names, as resources and `connector explain` write them.
const (
	MQTTLevels        = "mqtt-levels/v1"         // MQTT levels are segments; refuses what it cannot carry
	MQTTLevelsEscaped = "mqtt-levels-escaped/v1" // the same, with '%', '.' and '*' escaped inside levels
	NATSTokens        = "nats-tokens/v1"         // NATS tokens are segments; refuses '>'
	AMQPWords         = "amqp-words/v1"          // AMQP words are segments; '#' only where weida allows it
)

// policies lists every policy, in the order of [Names]. It is a function so
// that the registry cannot be changed at run time.
func policies() []Policy {
	return []Policy{amqpWords{}, mqttLevels{}, mqttLevels{escaped: true}, natsTokens{}}
}

// Names returns the name of every policy, sorted. The slice is new on every
// call.
func Names() []string {
	ps := policies()
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name()
	}
	slices.Sort(names)
	return names
}

// Lookup returns the policy with the given name. An unknown name gives a
// *Refusal with Rule RuleUnknownPolicy whose Hint lists the known names.
// Policies are immutable values, safe to share between goroutines.
func Lookup(name string) (Policy, error) {
	for _, p := range policies() {
		if p.Name() == name {
			return p, nil
		}
	}
	return nil, refuse("policy", name, name, RuleUnknownPolicy,
		"no conversion policy has this name",
		"known policies: "+strings.Join(Names(), ", "))
}

// Default returns the policy used when a resource or `connector explain`
// names none: mqtt-levels/v1 for MQTT, nats-tokens/v1 for NATS and
// amqp-words/v1 for AMQP. It returns nil for any other protocol.
func Default(p Protocol) Policy {
	switch p {
	case MQTT:
		return mqttLevels{}
	case NATS:
		return natsTokens{}
	case AMQP:
		return amqpWords{}
	}
	return nil
}

// Protocols returns every foreign protocol, in a fixed order.
func Protocols() []Protocol { return []Protocol{MQTT, NATS, AMQP} }

// ParseProtocol returns the protocol named s ("mqtt", "nats" or "amqp"). An
// unknown name gives a *Refusal with Rule RuleUnknownProtocol.
func ParseProtocol(s string) (Protocol, error) {
	for _, p := range Protocols() {
		if string(p) == s {
			return p, nil
		}
	}
	return "", refuse("policy", s, s, RuleUnknownProtocol,
		"not a supported protocol", "use mqtt, nats or amqp")
}

// GrammarOf returns the grammar of protocol p, or nil for an unknown
// protocol.
func GrammarOf(p Protocol) Grammar {
	switch p {
	case MQTT:
		return mqttGrammar{}
	case NATS:
		return natsGrammar{}
	case AMQP:
		return amqpGrammar{}
	}
	return nil
}
