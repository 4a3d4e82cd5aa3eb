package policy

// The tests of this package cover every policy it defines; the program's
// own lists come from its drivers.

func all() []Policy {
	return []Policy{AMQPWordsV1(), MQTTLevelsV1(), MQTTLevelsEscapedV1(), NATSTokensV1(), NATSTail()}
}

func lookup(name string) (Policy, error) { return Lookup(all(), name) }

func protocols() []Protocol { return []Protocol{MQTT, NATS, AMQP} }

// defaultPolicy is each protocol's default as its driver lists it.
func defaultPolicy(p Protocol) Policy {
	switch p {
	case MQTT:
		return MQTTLevelsV1()
	case NATS:
		return NATSTokensV1()
	case AMQP:
		return AMQPWordsV1()
	}
	return nil
}

func grammarOf(p Protocol) Grammar {
	switch p {
	case MQTT:
		return MQTTGrammar()
	case NATS:
		return NATSGrammar()
	case AMQP:
		return AMQPGrammar()
	}
	return nil
}
