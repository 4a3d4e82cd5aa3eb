package policy

import (
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Policy names, as resources and `connector explain` write them.
const (
	MQTTLevels        = "mqtt-levels/v1"         // MQTT levels are segments; refuses what it cannot carry
	MQTTLevelsEscaped = "mqtt-levels-escaped/v1" // the same, with '%', '.' and '*' escaped inside levels
	NATSTokens        = "nats-tokens/v1"         // NATS tokens are segments; refuses '>'
	NATSTokensTail    = "nats-tokens-tail/v1"    // nats-tokens/v1, with a final '>' written as '*.#' (opt-in)
	AMQPWords         = "amqp-words/v1"          // AMQP words are segments; '#' only where weida allows it
)

// The policies themselves. Which protocol offers which policies, and which
// one is its default, is not decided here: each broker driver lists its
// own, and the program composes the lists (see package service).

// MQTTLevelsV1 returns mqtt-levels/v1.
func MQTTLevelsV1() Policy { return mqttLevels{} }

// MQTTLevelsEscapedV1 returns mqtt-levels-escaped/v1.
func MQTTLevelsEscapedV1() Policy { return mqttLevels{escaped: true} }

// NATSTokensV1 returns nats-tokens/v1.
func NATSTokensV1() Policy { return natsTokens{} }

// AMQPWordsV1 returns amqp-words/v1.
func AMQPWordsV1() Policy { return amqpWords{} }

// Names returns the name of every policy in ps, sorted, in a new slice.
func Names(ps []Policy) []string {
	names := make([]string, len(ps))
	for i, p := range ps {
		names[i] = p.Name()
	}
	slices.Sort(names)
	return names
}

// Lookup returns the policy of ps with the given name. An unknown name
// gives a *Refusal with Rule RuleUnknownPolicy whose Hint lists the names
// in ps. Policies are immutable values, safe to share between goroutines.
func Lookup(ps []Policy, name string) (Policy, error) {
	for _, p := range ps {
		if p.Name() == name {
			return p, nil
		}
	}
	return nil, refuse("policy", name, name, RuleUnknownPolicy,
		"no conversion policy has this name",
		"known policies: "+strings.Join(Names(ps), ", "))
}

// Setting is one broker setting that changes what a protocol's
// conversions lose ([Options]), as `connector explain` offers it on its
// command line. A driver lists the settings its protocol has.
type Setting struct {
	// Name is the flag's name, without dashes: "qos".
	Name string
	// Usage is the flag's one-line help.
	Usage string
	// Values shows the values a synopsis offers ("0|1"); "" for a Bool.
	Values string
	// Bool makes the flag a boolean one (--jetstream, no value).
	Bool bool
	// Default is the value the setting has when the flag is not given, as
	// the flag would be written ("1", "false").
	Default string
	// Apply stores value, as written on the command line, into o, or says
	// why it is not a valid value ("must be 0 or 1").
	Apply func(o *Options, value string) error
}

// BoolSetting is a boolean [Setting], false unless the flag is given; set
// stores its value into the options.
func BoolSetting(name, usage string, set func(o *Options, v bool)) Setting {
	return Setting{Name: name, Usage: usage, Bool: true, Default: "false",
		Apply: func(o *Options, v string) error {
			b, err := strconv.ParseBool(v)
			if err != nil {
				return fmt.Errorf("must be true or false, not %s", v)
			}
			set(o, b)
			return nil
		}}
}
