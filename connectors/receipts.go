package connectors

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida"
)

// receiptPublisher is the power a [Publisher] needs for Spec.AwaitReceipt:
// publish and be told when every copy was received by its subscriber's
// QUIC stack or lost. *weida.Publisher has it.
type receiptPublisher interface {
	PublishWithReceipt(ctx context.Context, m weida.Message, record func(), done func(weida.Receipt)) (weida.Result, error)
	TrackReceipts()
}

// receiptSettler settles, on a goroutine of its own, the messages of one
// inbound attempt whose copies were all received or lost. Receipts arrive
// on the listener's goroutines, quic-go's connection loops among them,
// which must not wait for a broker's acknowledgement; and the read loop
// goes on meanwhile, so that the broker's flow control (MQTT receive
// maximum, JetStream MaxAckPending, AMQP prefetch), not one message's
// round trip to a subscriber, bounds what is outstanding.
type receiptSettler struct {
	b *inboundBridge

	// pending counts the messages handed to publish and not yet settled
	// here: published and waiting for their receipt, or received and
	// waiting in ready.
	pending atomic.Int64

	mu      sync.Mutex
	ready   []AckFunc // received or lost: to acknowledge, in arrival order
	stopped bool      // no acknowledgement any more: the Source is closing
	wake    chan struct{}
	quit    chan struct{}
	wg      sync.WaitGroup
}

func newReceiptSettler(b *inboundBridge) *receiptSettler {
	s := &receiptSettler{b: b, wake: make(chan struct{}, 1), quit: make(chan struct{})}
	s.wg.Go(s.loop)
	return s
}

// begin counts a message about to be published with a receipt.
func (s *receiptSettler) begin() {
	s.pending.Add(1)
	s.b.stats.awaitReceipt()
}

// end ends the count of a message begin counted that will not be settled
// here: its publish failed, or queued nothing.
func (s *receiptSettler) end() {
	s.pending.Add(-1)
	s.b.stats.receiptSettled()
}

// receiptOf returns the receipt callback of a message read with ack. A
// receipt of no copies is that of a publish that queued none: the bridge
// settles such a message itself.
func (s *receiptSettler) receiptOf(ack AckFunc) func(weida.Receipt) {
	return func(r weida.Receipt) {
		if r.Received+r.Lost == 0 {
			s.end()
			return
		}
		s.mu.Lock()
		if s.stopped {
			s.mu.Unlock()
			// The attempt is over and its Source closing: the broker
			// delivers the message again to the next one.
			s.end()
			s.b.stats.settled()
			return
		}
		s.ready = append(s.ready, ack)
		s.mu.Unlock()
		select {
		case s.wake <- struct{}{}:
		default:
		}
	}
}

func (s *receiptSettler) loop() {
	var batch []AckFunc
	for {
		select {
		case <-s.wake:
		case <-s.quit:
			return
		}
		s.mu.Lock()
		batch, s.ready = s.ready, batch[:0]
		s.mu.Unlock()
		for i, ack := range batch {
			// The fence is asked now, at the acknowledgement, not when
			// the message was published.
			s.b.settle(ack, nil)
			s.end()
			batch[i] = nil
		}
	}
}

// stop waits, at most bound and not at all once the unit is fenced, for
// the messages published to be received and acknowledged, then stops:
// receipts arriving later acknowledge nothing, and the broker delivers
// those messages again.
func (s *receiptSettler) stop(bound time.Duration) {
	deadline := time.Now().Add(bound)
	for s.pending.Load() > 0 && time.Now().Before(deadline) && !s.b.tripped.Load() {
		time.Sleep(5 * time.Millisecond)
	}
	s.mu.Lock()
	s.stopped = true
	s.mu.Unlock()
	close(s.quit)
	s.wg.Wait()
	// What arrived and was not acknowledged before the goroutine saw
	// quit stays with the broker too.
	s.mu.Lock()
	left := s.ready
	s.ready = nil
	s.mu.Unlock()
	for range left {
		s.end()
		s.b.stats.settled()
	}
}

// receiptDrain bounds how long an attempt that ends waits for the receipts
// of what it published before it closes its Source.
func (b *inboundBridge) receiptDrain() time.Duration { return min(b.deps.drain(), 2*time.Second) }
