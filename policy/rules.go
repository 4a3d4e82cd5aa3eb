package policy

// Rule codes a [Refusal] carries in its Rule field. They are stable: metrics,
// logs, resource diagnostics and the JSON of `connector explain` name them.
// A rule code is never reused for another meaning; a rule that changes
// meaning gets a new code.
//
// Rules marked "topic" can refuse a topic name at run time; [LossForRule]
// maps each of them to the [Loss] a bridge declares for it. The others refuse
// a filter, a policy name or a protocol at configuration time.
const (
	// Shared by every policy.

	RuleUnknownPolicy   = "unknown-policy"   // no policy has this name
	RuleUnknownProtocol = "unknown-protocol" // no driver of the program has this name
	RuleFilterTooLong   = "filter-too-long"  // the weida filter would exceed 256 bytes
	RuleTopicTooLong    = "topic-too-long"   // topic: the weida topic would exceed 256 bytes
	RuleInvalidUTF8     = "invalid-utf8"     // topic: not valid UTF-8, which weida cannot carry

	// MQTT 5 grammar (Mosquitto 2.0.11 where it is stricter than the spec).

	RuleMQTTEmpty          = "mqtt-empty"           // topic: a zero-length name or filter
	RuleMQTTTooLong        = "mqtt-too-long"        // topic: more than 65,535 bytes
	RuleMQTTInvalidUTF8    = "mqtt-invalid-utf8"    // topic: not valid UTF-8
	RuleMQTTNul            = "mqtt-nul"             // topic: contains U+0000
	RuleMQTTTooManyLevels  = "mqtt-too-many-levels" // topic: more than 201 levels (Mosquitto disconnects)
	RuleMQTTWildcardInName = "mqtt-wildcard-name"   // topic: '+' or '#' in a topic name
	RuleMQTTPlusNotAlone   = "mqtt-plus-not-alone"  // '+' shares its level with other characters
	RuleMQTTHashNotAlone   = "mqtt-hash-not-alone"  // '#' shares its level with other characters
	RuleMQTTHashNotFinal   = "mqtt-hash-not-final"  // '#' is not the last level
	RuleMQTTShared         = "mqtt-shared-subscription"

	// MQTT policies.

	RuleMQTTDottedLevel  = "mqtt-dotted-level"  // topic: a level holds '.', which weida reads as a separator
	RuleMQTTStarLevel    = "mqtt-star-level"    // a filter level holds '*', which weida reads as a wildcard
	RuleMQTTSlashSegment = "mqtt-slash-segment" // topic: a weida segment holds '/', which MQTT reads as a separator
	RuleMQTTEscape       = "mqtt-escape"        // topic: a weida topic that is not in the escaped form
	// RuleMQTTDollarTopic is not returned by any conversion: it names the
	// drop the runtime makes when [Policy.Admit] is false (a filter that
	// starts with a wildcard never receives a topic that starts with '$').
	RuleMQTTDollarTopic = "mqtt-dollar-topic"

	// NATS grammar (nats-server 2.9.10 and later).

	RuleNATSEmptyToken  = "nats-empty-token"    // topic: an empty subject or an empty token
	RuleNATSWhitespace  = "nats-whitespace"     // topic: space, tab, CR, LF or FF, which split the protocol line
	RuleNATSGtNotFinal  = "nats-gt-not-final"   // '>' is not the last token of a filter
	RuleNATSOneOrMore   = "nats-one-or-more"    // '>' (one or more) has no exact form under nats-tokens/v1
	RuleNATSHashToken   = "nats-hash-token"     // a literal token '#' would be a weida wildcard
	RuleNATSWildcardMix = "nats-wildcard-mix"   // a literal token mixing '*' or '#' with other bytes is invalid weida
	RuleNATSWildcardTok = "nats-wildcard-token" // topic: a weida segment '*' or '>' would be a NATS wildcard
	RuleNATSTailTooLong = "nats-tail-too-long"  // writing a final '>' as '*.#' (nats-tokens-tail/v1) passes 256 bytes
	RuleNATSZeroOrMore  = "nats-zero-or-more"   // weida filter X.# (zero or more) has no single NATS filter

	// AMQP 0-9-1 topic exchange (RabbitMQ 3.10.8).

	RuleAMQPTooLong         = "amqp-too-long"          // topic: more than 255 bytes (shortstr)
	RuleAMQPEmptyRoutingKey = "amqp-empty-routing-key" // topic: "" is zero words in AMQP, one empty segment in weida
	RuleAMQPEmptyBindingKey = "amqp-empty-binding-key" // binding key "" selects only "", which weida cannot express
	RuleAMQPHashThenLiteral = "amqp-hash-then-literal" // '#' followed by a literal word (#.leaf, a.#.b)
	RuleAMQPWildcardMix     = "amqp-wildcard-mix"      // a word mixing '*' or '#' with other bytes is invalid weida

	// Mounting ([Mount], [Mounted]). None of them refuses a topic at run
	// time under a bridge whose routes the same Mounted converted: such a
	// route selects only topics inside the mount, so LossForRule maps
	// none of them to a loss.

	RuleMountBoundary   = "mount-boundary"    // a prefix does not end with its separator ('/' for MQTT, '.' otherwise)
	RuleMountWildcard   = "mount-wildcard"    // a prefix holds a wildcard
	RuleMountEmptyJoint = "mount-empty-joint" // the last level or segment of a prefix, next to the joint, is empty
	RuleMountOutside    = "mount-outside"     // a filter may select, or a topic is, outside the mounted subtree
	RuleMountParent     = "mount-parent"      // the foreign prefix's parent topic has no weida form (empty weida prefix)
	RuleMountEmptyRest  = "mount-empty-rest"  // a filter selecting only prefix+"" under an empty weida prefix, whose weida form "" selects all
)
