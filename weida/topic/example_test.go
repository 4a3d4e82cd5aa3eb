package topic_test

import (
	"errors"
	"fmt"
	"slices"

	"weida.dev/connector/weida/topic"
)

func ExampleMatch() {
	for _, c := range []struct{ filter, topic string }{
		{"sensors.*.temp", "sensors.a.temp"},
		{"sensors.*.temp", "sensors.a.b.temp"}, // '*' is exactly one segment
		{"a.#", "a"},                           // '#' matches the parent too
		{"", "any.topic"},                      // the empty filter matches everything
		{"sensors.temp", "sensors.temperature"},
		{"px.*", "px.*"}, // a topic is never a pattern: its '*' is a literal byte
	} {
		fmt.Printf("%-16q %-20q %v\n", c.filter, c.topic, topic.Match(c.filter, c.topic))
	}
	// Output:
	// "sensors.*.temp" "sensors.a.temp"     true
	// "sensors.*.temp" "sensors.a.b.temp"   false
	// "a.#"            "a"                  true
	// ""               "any.topic"          true
	// "sensors.temp"   "sensors.temperature" false
	// "px.*"           "px.*"               true
}

func ExampleValidateFilter() {
	for _, f := range []string{"orders.*.created", "orders.eu*", "a.#.b"} {
		err := topic.ValidateFilter(f)
		var fe *topic.FilterError
		if errors.As(err, &fe) {
			fmt.Printf("%q: segment %d: %s\n", f, fe.Segment, fe.Rule)
			continue
		}
		fmt.Printf("%q: ok\n", f)
	}
	// Output:
	// "orders.*.created": ok
	// "orders.eu*": segment 1: star-not-alone
	// "a.#.b": segment 1: hash-not-final
}

func ExampleIndex() {
	// A publisher keeps one entry per subscription, keyed by subscriber.
	var subs topic.Index[string] // the zero Index is ready to use
	for _, s := range []struct{ filter, who string }{
		{"sensors.*.temp", "alice"},
		{"sensors.#", "alice"}, // alice's second filter: she still gets one copy
		{"sensors.kitchen.#", "bob"},
		{"orders.#", "carol"},
		{"", "dave"}, // everything
	} {
		if err := subs.Insert(s.filter, s.who); err != nil {
			fmt.Println(err)
		}
	}
	fmt.Println(subs.Insert("sensors.temp*", "eve"))

	for _, tp := range []string{"sensors.kitchen.temp", "orders.eu.created", "metrics.cpu"} {
		var who []string
		subs.Match(tp, func(s string) bool {
			who = append(who, s)
			return true
		})
		slices.Sort(who) // Match reports in no particular order
		fmt.Println(tp, who)
	}

	subs.Remove("", "dave")
	fmt.Println(subs.Len(), "entries")
	// Output:
	// topic: "sensors.temp*": segment 1: star-not-alone
	// sensors.kitchen.temp [alice bob dave]
	// orders.eu.created [carol dave]
	// metrics.cpu [dave]
	// 4 entries
}

// A Store as a last-value cache: the latest reading of each topic, and the
// readings a new subscription's filter selects.
func ExampleStore() {
	var last topic.Store[string]
	last.Set("room.kitchen.temp", "21.0")
	last.Set("room.hall.temp", "19.5")
	last.Set("room.kitchen.hum", "40%")
	last.Set("room.kitchen.temp", "21.5") // replaces 21.0
	last.Delete("room.hall.temp")

	var got []string
	last.MatchFilter("room.*.temp", func(t, v string) bool {
		got = append(got, t+"="+v)
		return true
	})
	slices.Sort(got) // MatchFilter reports in no particular order
	fmt.Println(got, last.Len())
	// Output:
	// [room.kitchen.temp=21.5] 2
}

func ExampleCovers() {
	for _, filter := range []string{"plant.a.x", "plant.a.*.temp", "plant.a", "plant.#", "#", "plant.*.x"} {
		fmt.Printf("%-16q %v\n", filter, topic.Covers("plant.a.#", filter))
	}
	// The union can cover what no single scope does: "a" takes the topic
	// "a", "a.*.#" every longer one.
	fmt.Println(topic.CoveredBy("a.#", []string{"a", "a.*.#"}))
	// Output:
	// "plant.a.x"      true
	// "plant.a.*.temp" true
	// "plant.a"        true
	// "plant.#"        false
	// "#"              false
	// "plant.*.x"      false
	// true
}
