// Package policy converts topic filters and topic names between the grammars
// of MQTT 5, NATS and RabbitMQ AMQP 0-9-1 topic exchanges and weida's
// segmented grammar, exactly or not at all.
//
// A [Policy] is a named, versioned rule set. For a foreign filter it returns
// the weida filter that selects exactly the same converted topics, or a
// [*Refusal] that says which rule the input broke and what to do instead.
// It converts topic names in both directions, and it states, through
// [Policy.Losses], what a bridge using it cannot carry.
//
// Five policies exist: mqtt-levels/v1 and mqtt-levels-escaped/v1 for MQTT 5,
// nats-tokens/v1 and the opt-in nats-tokens-tail/v1 for NATS, and
// amqp-words/v1 for RabbitMQ topic exchanges ([MQTTLevelsV1],
// [MQTTLevelsEscapedV1], [NATSTokensV1], [NATSTail], [AMQPWordsV1]); any
// of them can be applied under a [Mount] ([NewMounted]);
// each broker driver lists the ones its protocol offers, and [Lookup] finds
// one by name in such a list. Their exactness contract, for every filter F a
// policy accepts and every foreign topic T it converts, is
//
//	p.Grammar().Match(F, T) == topic.Match(p.ConvertFilter(F), p.TopicToWeida(T)) && p.Admit(F, T)
//
// and topic conversion is injective: converting a topic there and back gives
// it back whenever both steps convert. Property tests and fuzz targets check
// both on inputs biased to the edges of each grammar.
//
// At run time a bridge drops a message whose topic a conversion refuses and
// counts it under [Policy.LossFor](refusal.Rule); outbound it also drops (as
// [Policy.AdmitRule]) a topic for which Admit is false. Every such loss
// is among those [Policy.Losses] declares for the direction.
//
// The package is pure: no I/O, no goroutines, no clock, no mutable globals.
package policy

import "fmt"

// Protocol names a foreign broker protocol.
type Protocol string

const (
	MQTT Protocol = "mqtt" // MQTT 5 topic names and filters
	NATS Protocol = "nats" // NATS core subjects
	AMQP Protocol = "amqp" // AMQP 0-9-1 topic exchange routing and binding keys
)

// Direction says which way messages cross a bridge.
type Direction string

const (
	Inbound  Direction = "inbound"  // foreign broker → weida
	Outbound Direction = "outbound" // weida → foreign broker
)

// Loss names one thing a bridge cannot carry. The set is closed and every
// value is stable: resource files and metrics name them.
type Loss string

// Options are the broker settings that change what a conversion loses. The
// zero value means MQTT QoS 0 and core NATS; AMQP has no such setting.
type Options struct {
	// QoS is the MQTT quality of service (0 or 1). QoS 0 incurs
	// LossAtMostOnce; any other value is treated as at-least-once.
	QoS int
	// JetStream is true when a NATS bridge consumes from or publishes to a
	// JetStream stream instead of core NATS.
	JetStream bool
	// LastValue is true when an inbound bridge keeps a last-value cache
	// that replays the broker's retained values to late weida
	// subscribers, which removes LossRetain.
	LastValue bool
}

// Grammar is one foreign protocol's topic grammar, modelled on what the real
// broker does.
type Grammar interface {
	Protocol() Protocol
	// ValidateFilter reports whether f may be subscribed (or bound) on the
	// broker. The error is a *Refusal.
	ValidateFilter(f string) error
	// ValidateTopic reports whether t may be published on the broker. The
	// error is a *Refusal.
	ValidateTopic(t string) error
	// Match reports whether the valid filter selects the valid topic, as
	// the broker routes it. For MQTT that includes the rule that a filter
	// starting with a wildcard never selects a topic starting with '$'
	// (the one rule Policy.Admit restates). Match allocates nothing; on
	// invalid input its answer is unspecified.
	Match(filter, topic string) bool
	// Separator is the byte between levels or words ('/' for MQTT, '.'
	// for NATS and AMQP). A mount's foreign prefix ends with it.
	Separator() byte
	// Wildcards are the filter levels that select any one level (one:
	// MQTT "+") and any number of them (many: MQTT "#", NATS ">"). A
	// mount's foreign prefix may hold neither.
	Wildcards() (one, many string)
}

// Policy is one named, versioned conversion between a foreign grammar and
// weida's. Implementations are immutable and safe for concurrent use.
type Policy interface {
	// Name is the policy's stable name, e.g. "mqtt-levels/v1".
	Name() string
	Protocol() Protocol
	Grammar() Grammar
	// ConvertFilter converts a foreign filter into the weida filter that
	// selects exactly the converted topics the foreign filter selects (up
	// to Admit). The error is a *Refusal.
	ConvertFilter(foreign string) (string, error)
	// TopicToWeida converts a foreign topic name for inbound bridging. The
	// error is a *Refusal whose Rule is a stable reason code for metrics.
	TopicToWeida(foreign string) (string, error)
	// TopicFromWeida converts a weida topic into a foreign topic name for
	// outbound bridging. The error is a *Refusal whose Rule is a stable
	// reason code for metrics. A conversion that changes nothing returns
	// its input and allocates nothing (both directions).
	TopicFromWeida(weida string) (string, error)
	// Admit is false only where the foreign protocol itself keeps a topic
	// from a filter that the grammar alone would match (MQTT: a filter
	// starting with a wildcard never matches a topic starting with '$').
	// Both arguments are in the foreign grammar.
	Admit(foreignFilter, foreignTopic string) bool
	// AdmitRule is the stable rule code under which a bridge counts the
	// topics Admit keeps out (MQTT: [RuleMQTTDollarTopic]); it is empty
	// when Admit is always true.
	AdmitRule() string
	// Losses returns, sorted and without duplicates, what a bridge using
	// this policy in dir with opts cannot carry, in a new slice. It returns
	// nil for a direction other than Inbound and Outbound.
	Losses(dir Direction, opts Options) []Loss
	// LossesUnder is Losses for a bridge that carries only topics inside
	// mount m (see [Mount]): a loss that no topic inside m can incur is
	// left out, so that a resource never has to declare what cannot
	// happen. LossesUnder(Mount{}, dir, opts) equals Losses(dir, opts).
	LossesUnder(m Mount, dir Direction, opts Options) []Loss
	// LossFor returns the loss under which a bridge counts a topic this
	// policy refused with rule (a [Refusal]'s Rule, or AdmitRule), and
	// which a resource using the policy declares. ok is false for rules
	// that never refuse a topic. Each policy maps its own rules, so that
	// one written outside this package is explained like the rest.
	LossFor(rule string) (loss Loss, ok bool)
}

// Refusal explains why an input cannot be converted exactly.
type Refusal struct {
	Policy string // the policy (or grammar) that refused
	Input  string // the whole input
	Part   string // the offending part of the input (a level, word, token...)
	Rule   string // stable rule code, e.g. "nats-one-or-more"
	Reason string // one sentence for an operator
	Hint   string // what to do instead; may be empty
}

func (r *Refusal) Error() string {
	msg := fmt.Sprintf("%s refuses %q", r.Policy, r.Input)
	if r.Part != "" && r.Part != r.Input {
		msg += fmt.Sprintf(" at %q", r.Part)
	}
	msg += fmt.Sprintf(": %s (%s)", r.Reason, r.Rule)
	if r.Hint != "" {
		msg += "; " + r.Hint
	}
	return msg
}
