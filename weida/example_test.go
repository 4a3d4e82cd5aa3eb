package weida_test

import (
	"context"
	"fmt"
	"log"
	"time"

	"weida.dev/connector/weida"
)

// A listener hosts a publisher path; a subscriber dials it, pinning the
// listener's generated certificate, and receives what its filter selects.
func Example() {
	ctx := context.Background()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	pub, err := l.Publisher("/sensors")
	if err != nil {
		log.Fatal(err)
	}

	url := fmt.Sprintf("weida://%s@%s/sensors", l.Fingerprint(), l.Addr())
	sub, err := weida.Dial(ctx, url, weida.DialConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "sensors.*.temp"); err != nil {
		log.Fatal(err)
	}
	// weida acknowledges no SUBSCRIBE: wait until the publisher holds it.
	for pub.Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}

	for _, topic := range []string{"sensors.a.b.temp", "sensors.a.temp"} {
		r, err := pub.Publish(ctx, weida.Message{Topic: topic, Payload: []byte("21.5")})
		if err != nil {
			log.Fatal(err)
		}
		fmt.Printf("%s: matched %d\n", topic, r.Matched)
	}
	m, err := sub.Receive(ctx)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("received %s %s on %s\n", m.Topic, m.Payload, m.Endpoint)
	// Output:
	// sensors.a.b.temp: matched 0
	// sensors.a.temp: matched 1
	// received sensors.a.temp 21.5 on /sensors
}

// A subscriber that leaves with Shutdown receives the copies its publisher
// already sent it; Close would drop those still on their way.
func ExampleSubscriber_Shutdown() {
	ctx := context.Background()
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	pub, err := l.Publisher("/orders")
	if err != nil {
		log.Fatal(err)
	}
	sub, err := weida.Dial(ctx, fmt.Sprintf("weida://%s@%s/orders", l.Fingerprint(), l.Addr()), weida.DialConfig{})
	if err != nil {
		log.Fatal(err)
	}
	if err := sub.Subscribe(ctx, "#"); err != nil {
		log.Fatal(err)
	}
	for pub.Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}

	// Receive runs until the subscriber is closed.
	received := make(chan int)
	go func() {
		n := 0
		for {
			if _, err := sub.Receive(ctx); err != nil {
				received <- n
				return
			}
			n++
		}
	}()
	queued := 0
	for range 100 {
		r, err := pub.Publish(ctx, weida.Message{Topic: "order", Payload: []byte("x")})
		if err != nil {
			log.Fatal(err)
		}
		queued += r.Queued
	}
	sctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	if err := sub.Shutdown(sctx); err != nil {
		log.Fatal(err)
	}
	fmt.Printf("queued %d, received %d, dropped unread %d\n", queued, <-received, sub.Stats().DroppedUnread)
	// Output:
	// queued 100, received 100, dropped unread 0
}

// A bridge that must not acknowledge its source before delivery waits for
// the receipt: done is called once the subscriber's QUIC stack has
// acknowledged every copy (or each was lost), on the listener's goroutines.
func ExamplePublisher_PublishWithReceipt() {
	ctx := context.Background()
	// TrackReceipts in the config: no subscriber connects untracked.
	l, err := weida.Listen(ctx, "127.0.0.1:0", weida.ListenConfig{TrackReceipts: true})
	if err != nil {
		log.Fatal(err)
	}
	defer l.Close()
	pub, err := l.Publisher("/orders")
	if err != nil {
		log.Fatal(err)
	}
	sub, err := weida.Dial(ctx, fmt.Sprintf("weida://%s@%s/orders", l.Fingerprint(), l.Addr()), weida.DialConfig{})
	if err != nil {
		log.Fatal(err)
	}
	defer sub.Close()
	if err := sub.Subscribe(ctx, "#"); err != nil {
		log.Fatal(err)
	}
	for pub.Subscribers() == 0 {
		time.Sleep(time.Millisecond)
	}

	receipt := make(chan weida.Receipt, 1)
	r, err := pub.PublishWithReceipt(ctx, weida.Message{Topic: "order.1", Payload: []byte("x")}, nil,
		func(rc weida.Receipt) { receipt <- rc }) // must not block
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("queued %d\n", r.Queued)
	fmt.Printf("%+v\n", <-receipt) // now the source may be acknowledged
	// Output:
	// queued 1
	// {Received:1 Lost:0}
}
