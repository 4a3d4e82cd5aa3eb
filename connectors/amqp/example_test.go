package amqp_test

import (
	"context"
	"errors"
	"log"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/amqp"
)

// A Source on a named durable queue, bound to amq.topic with two binding
// keys. In a connector the runtime drives it; here a loop reads and
// acknowledges.
func ExampleNewSource() {
	src, err := amqp.NewSource(amqp.Config{
		Host:           "127.0.0.1",
		Port:           5672,
		Username:       "guest",
		Password:       "guest", // resolved from a secret reference in practice
		Queue:          amqp.Queue{Name: "weida-audit", Durable: true},
		Prefetch:       256,
		ConnectionName: "weida-audit-in",
	}, func(s connectors.ConnState) { log.Printf("broker: %s %s", s.Reason, s.Detail) })
	if err != nil {
		log.Fatal(err)
	}
	defer src.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := src.Start(ctx, []string{"audit.events.#", "orders.*.new.#"}); err != nil {
		log.Fatal(err)
	}
	for {
		m, ack, err := src.Read(ctx)
		if err != nil {
			return
		}
		log.Printf("%s: %d bytes", m.Topic, len(m.Payload))
		ack(nil) // basic.ack, coalesced; ack(err) would requeue it
	}
}

// A Sink publishing with confirms; an unroutable message is an error of its
// own.
func ExampleNewSink() {
	sink, err := amqp.NewSink(amqp.Config{
		Host:       "127.0.0.1",
		Port:       5672,
		Exchange:   "amq.topic",
		LoopMarker: "weida-connector",
	}, func(s connectors.ConnState) { log.Printf("broker: %s %s", s.Reason, s.Detail) })
	if err != nil {
		log.Fatal(err)
	}
	defer sink.Close(context.Background())
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := sink.Start(ctx); err != nil {
		log.Fatal(err)
	}
	err = sink.Write(ctx, &connectors.Message{Topic: "orders.eu.created", Payload: []byte(`{"id":1}`), ContentType: "application/json"})
	var u *amqp.UnroutableError
	var f *connectors.Failure
	switch {
	case errors.As(err, &u):
		log.Printf("no queue is bound for %s", u.RoutingKey)
	case errors.As(err, &f):
		log.Printf("the connection is gone (%s); a new Sink is needed", f.Reason)
	case err != nil:
		log.Fatal(err)
	}
}
