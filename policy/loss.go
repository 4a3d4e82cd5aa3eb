package policy

import "slices"

// The closed vocabulary of losses. Each one is something that happens at run
// time: a message the bridge drops and counts, or a piece of a message it
// does not carry. Names are stable; resource files declare them and metrics
// label drops with them.
const (
	// LossOrdering: weida sends every message on its own stream, so a
	// subscriber may see messages in another order than they were published.
	LossOrdering Loss = "ordering"
	// LossDeliveryBestEffort: weida keeps no session and no retained copy;
	// a copy that does not fit a slow subscriber's buffer, or that is
	// published while the bridge is reconnecting, is dropped, and so is an
	// inbound message no subscriber wants unless the resource holds it
	// (spec.delivery.whenNoSubscriber: hold), which avoids that part only.
	LossDeliveryBestEffort Loss = "delivery-best-effort"
	// LossAtMostOnce: the broker side does not acknowledge or redeliver
	// (MQTT QoS 0, core NATS without JetStream), so a message in flight
	// when a connection breaks is gone.
	LossAtMostOnce Loss = "at-most-once"
	// LossRetain: MQTT retained messages are forwarded as ordinary
	// messages; the retain flag is dropped and weida keeps nothing for
	// subscribers that arrive later. An inbound resource with a
	// last-value cache (Options.LastValue) replays them and does not
	// incur it.
	LossRetain Loss = "retain"
	// LossProperties: broker metadata other than the content type and W3C
	// trace context (MQTT 5 user properties, payload format, correlation
	// data; NATS headers; AMQP headers and basic properties) is not
	// carried into weida.
	LossProperties Loss = "properties"
	// LossExpiry: a message's expiry (MQTT Message Expiry Interval, AMQP
	// expiration) is not carried; weida delivers it whenever it can.
	LossExpiry Loss = "expiry"
	// LossReplyTo: the reply address (MQTT Response Topic, NATS reply
	// subject, AMQP reply_to) is not carried, so request/reply does not
	// cross the bridge.
	LossReplyTo Loss = "reply-to"
	// LossDottedLevels: MQTT topics with a '.' inside a level are dropped
	// (mqtt-levels/v1; mqtt-levels-escaped/v1 carries them).
	LossDottedLevels Loss = "dotted-levels"
	// LossSlashedSegments: weida topics with a '/' inside a segment are
	// dropped on the way to MQTT, where '/' would split the segment.
	LossSlashedSegments Loss = "slashed-segments"
	// LossWildcardNames: weida topics the broker would read as holding a
	// wildcard are dropped ('+' or '#' anywhere for MQTT; a whole segment
	// '*' or '>' for NATS).
	LossWildcardNames Loss = "wildcard-names"
	// LossForbiddenChars: weida topics holding a character the broker
	// forbids in names are dropped (U+0000 for MQTT; space, tab, CR, LF or
	// FF for NATS).
	LossForbiddenChars Loss = "forbidden-chars"
	// LossEmptySegments: weida topics with an empty segment the broker
	// cannot carry are dropped (NATS: "", "a.", ".a", "a..b", which the
	// server would silently deliver to nobody; MQTT: the empty topic "").
	LossEmptySegments Loss = "empty-segments"
	// LossEmptyRoutingKey: the AMQP empty routing key is dropped in both
	// directions: AMQP reads it as zero words, weida as one empty segment,
	// so '*' would select it on one side and not on the other.
	LossEmptyRoutingKey Loss = "empty-routing-key"
	// LossUnescapedNames: under mqtt-levels-escaped/v1, weida topics that
	// are not in the policy's escaped form (a bare '*' or '.', or a '%'
	// that does not start %25, %2E or %2A) are dropped on the way to MQTT.
	LossUnescapedNames Loss = "unescaped-names"
	// LossTopicLength: topics too long for the other side are dropped
	// (over 256 bytes into weida, over 255 bytes into AMQP, over 201
	// levels into MQTT).
	LossTopicLength Loss = "topic-length"
	// LossNonUTF8Names: NATS subjects and AMQP routing keys that are not
	// valid UTF-8 are dropped; weida topics are UTF-8 text.
	LossNonUTF8Names Loss = "non-utf8-names"
	// LossDollarTopics: on the way to MQTT, a weida topic starting with '$'
	// is dropped when the route's filter starts with a wildcard (MQTT never
	// delivers such a topic to such a filter), and brokers may refuse
	// publishes to reserved names such as $SYS (Mosquitto: reason 0x87).
	LossDollarTopics Loss = "dollar-topics"
)

// LossInfo describes one loss for an operator.
type LossInfo struct {
	Loss        Loss   `json:"loss"`
	Description string `json:"description"`
}

// lossTable is the vocabulary in documentation order. It is a function, not
// a package variable, so that no caller can change the vocabulary.
func lossTable() []LossInfo {
	return []LossInfo{
		{LossOrdering, "messages may reach a subscriber in another order than they were published: weida sends each on its own stream"},
		{LossDeliveryBestEffort, "weida keeps no session or retained copy: a copy that does not fit a slow subscriber's buffer, or is published while the bridge reconnects or nobody subscribes (whenNoSubscriber: drop), is dropped"},
		{LossAtMostOnce, "the broker side neither acknowledges nor redelivers (MQTT QoS 0, core NATS): a message in flight when a connection breaks is lost"},
		{LossRetain, "MQTT retained messages cross as ordinary messages: the retain flag is dropped and later weida subscribers get nothing (spec.lastValue replays them instead)"},
		{LossProperties, "broker metadata other than the content type and W3C trace context (MQTT 5 user properties, payload format, correlation data; NATS headers; AMQP headers and properties) is not carried"},
		{LossExpiry, "message expiry (MQTT Message Expiry Interval, AMQP expiration) is not carried: weida delivers late messages too"},
		{LossReplyTo, "the reply address (MQTT Response Topic, NATS reply subject, AMQP reply_to) is not carried: request/reply does not cross"},
		{LossDottedLevels, "MQTT topics with a '.' inside a level are dropped and counted (mqtt-levels-escaped/v1 carries them)"},
		{LossSlashedSegments, "weida topics with a '/' inside a segment are dropped and counted: MQTT would split the segment in two"},
		{LossWildcardNames, "weida topics the broker would read as wildcards are dropped and counted ('+' or '#' for MQTT, a segment '*' or '>' for NATS)"},
		{LossForbiddenChars, "weida topics with a character the broker forbids are dropped and counted (U+0000 for MQTT, whitespace for NATS)"},
		{LossEmptySegments, "weida topics with an empty segment the broker cannot carry are dropped and counted (any empty token for NATS, the empty topic for MQTT)"},
		{LossEmptyRoutingKey, "the AMQP empty routing key is dropped and counted both ways: AMQP reads it as zero words, weida as one empty segment"},
		{LossUnescapedNames, "under mqtt-levels-escaped/v1, weida topics not in the escaped form (bare '*', '%' not starting %25, %2E or %2A) are dropped and counted"},
		{LossTopicLength, "topics too long for the other side are dropped and counted (over 256 bytes into weida, 255 into AMQP, 201 levels into MQTT)"},
		{LossNonUTF8Names, "NATS subjects and AMQP routing keys that are not valid UTF-8 are dropped and counted: weida topics are text"},
		{LossDollarTopics, "weida topics starting with '$' are dropped and counted when the MQTT filter starts with a wildcard, and brokers may refuse $SYS publishes"},
	}
}

// AllLosses returns every loss with its description, in documentation order.
// The slice is new on every call; the caller may keep and change it.
func AllLosses() []LossInfo { return lossTable() }

// Valid reports whether l belongs to the vocabulary.
func (l Loss) Valid() bool {
	for _, i := range lossTable() {
		if i.Loss == l {
			return true
		}
	}
	return false
}

// Description returns the one-line description of l, or "" when l is not in
// the vocabulary.
func (l Loss) Description() string {
	for _, i := range lossTable() {
		if i.Loss == l {
			return i.Description
		}
	}
	return ""
}

// LossForRule returns the loss a topic refusal by one of this package's
// grammars or policies belongs to: the runtime drops the message, counts it
// under the returned loss, and a resource that uses the policy in that
// direction has declared that loss. Each of this package's policies answers
// [Policy.LossFor] with it; callers holding a policy ask the policy, which
// also covers policies written elsewhere. ok is false for rules
// that never refuse a topic (filter rules, unknown names). RuleMQTTDollarTopic
// maps to LossDollarTopics, for drops made because [Policy.Admit] is false.
func LossForRule(rule string) (loss Loss, ok bool) {
	switch rule {
	case RuleTopicTooLong, RuleMQTTTooLong, RuleMQTTTooManyLevels, RuleAMQPTooLong:
		return LossTopicLength, true
	case RuleInvalidUTF8, RuleMQTTInvalidUTF8:
		return LossNonUTF8Names, true
	case RuleMQTTDottedLevel:
		return LossDottedLevels, true
	case RuleMQTTSlashSegment:
		return LossSlashedSegments, true
	case RuleMQTTWildcardInName, RuleNATSWildcardTok:
		return LossWildcardNames, true
	case RuleMQTTNul, RuleNATSWhitespace:
		return LossForbiddenChars, true
	case RuleMQTTEmpty, RuleNATSEmptyToken:
		return LossEmptySegments, true
	case RuleAMQPEmptyRoutingKey:
		return LossEmptyRoutingKey, true
	case RuleMQTTEscape:
		return LossUnescapedNames, true
	case RuleMQTTDollarTopic:
		return LossDollarTopics, true
	}
	return "", false
}

// without returns ls without l, in a new slice.
func without(ls []Loss, l Loss) []Loss {
	return slices.DeleteFunc(slices.Clone(ls), func(x Loss) bool { return x == l })
}

// lossSet returns ls sorted and without duplicates.
func lossSet(ls ...Loss) []Loss {
	slices.Sort(ls)
	return slices.Compact(ls)
}
