package mqtt

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"testing"
	"time"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
)

// TestPipelinedOutOfOrder: a pipelined Source returns further messages
// while earlier ones are unsettled, and settling them from other
// goroutines, out of order, acknowledges exactly those settled with nil:
// a Source of the same session afterwards receives again only the one
// settled with an error and the one never settled (DUP set), not the
// acknowledged ones.
func TestPipelinedOutOfOrder(t *testing.T) {
	requireBroker(t)
	h := harness{t: t}
	u := conntest.Unique()
	filter := u + "/#"
	name := "pipe-" + u
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()

	up := make(chan struct{}, 1)
	src, err := h.NewSource(name, "", func(s connectors.ConnState) {
		if s.Up {
			select {
			case up <- struct{}{}:
			default:
			}
		}
	})
	if err != nil {
		t.Fatal(err)
	}
	src.(*Source).Pipeline()
	if err := src.Start(ctx, []string{filter}); err != nil {
		t.Fatal(err)
	}
	select { // Up once the subscription is granted
	case <-up:
	case <-ctx.Done():
		t.Fatal("the Source never reported up")
	}
	const n = 6
	var acks []connectors.AckFunc
	var topics []string
	for i := range n {
		if err := h.Publish(ctx, &connectors.Message{Topic: fmt.Sprintf("%s/%d", u, i), Payload: []byte("x")}); err != nil {
			t.Fatal(err)
		}
	}
	for range n {
		rctx, rcancel := context.WithTimeout(ctx, 10*time.Second)
		m, ack, err := src.Read(rctx)
		rcancel()
		if err != nil {
			t.Fatalf("Read with %d unsettled: %v (a pipelined Read must not wait for settlement)", len(acks), err)
		}
		acks = append(acks, ack)
		topics = append(topics, m.Topic)
	}
	// Settle from other goroutines: topics[0], then, once its PUBACK is
	// out, the later ones last first, leaving topics[1] unsettled, and
	// topics[3] last with an error, which cuts the connection.
	done := make(chan struct{})
	for _, i := range []int{0, 5, 4, 2, 3} {
		go func() {
			var err error
			if i == 3 {
				err = errors.New("not delivered")
			}
			acks[i](err)
			done <- struct{}{}
		}()
		<-done
		time.Sleep(100 * time.Millisecond) // paho sends due PUBACKs every pipelinedAckInterval
	}
	cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
	_ = src.Close(cctx)
	ccancel()

	again, err := h.NewSource(name, "", nil)
	if err != nil {
		t.Fatal(err)
	}
	again.(*Source).Pipeline()
	defer func() {
		cctx, ccancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = again.(*Source).Retire(cctx)
		_ = again.Close(cctx)
		ccancel()
	}()
	if err := again.Start(ctx, []string{filter}); err != nil {
		t.Fatal(err)
	}
	var redelivered []string
	for {
		rctx, rcancel := context.WithTimeout(ctx, 2*time.Second)
		m, ack, err := again.Read(rctx)
		rcancel()
		if err != nil {
			break
		}
		ack(nil)
		if !m.Redelivered {
			t.Errorf("%s delivered again without DUP", m.Topic)
		}
		redelivered = append(redelivered, m.Topic)
	}
	slices.Sort(redelivered)
	// The never-settled topics[1] and the nacked topics[3] come again;
	// topics[0], acknowledged before them, does not. paho sends PUBACKs
	// in arrival order, stopping at the first unsettled one, so
	// topics[2], [4] and [5], settled behind topics[1], come again too.
	want := []string{topics[1], topics[2], topics[3], topics[4], topics[5]}
	slices.Sort(want)
	if !slices.Equal(redelivered, want) {
		t.Errorf("delivered again: %v; want %v (sent in order %v)", redelivered, want, topics)
	}
}
