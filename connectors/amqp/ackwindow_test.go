package amqp

import (
	"context"
	"fmt"
	"testing"
	"time"

	"pgregory.net/rapid"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
)

// frameLog is an acknowledger that checks every frame against what has been
// settled, as the broker would see it.
type frameLog struct {
	t       *rapid.T
	settled map[uint64]bool // tag → positive
	done    map[uint64]bool // acknowledged or rejected on the wire
	frames  int
}

func (f *frameLog) Ack(tag uint64, multiple bool) error {
	f.frames++
	if !multiple {
		f.t.Fatalf("single ack %d; the window only sends multiple acks", tag)
	}
	if positive, ok := f.settled[tag]; ok && !positive {
		// RabbitMQ: 406 unknown delivery tag, closing the channel.
		f.t.Fatalf("multiple ack names tag %d, which was nacked and is no longer outstanding", tag)
	}
	for k := uint64(1); k <= tag; k++ {
		positive, ok := f.settled[k]
		if !ok {
			f.t.Fatalf("ack up to %d covers tag %d, which is not settled", tag, k)
		}
		if positive {
			f.done[k] = true
		}
	}
	return nil
}

func (f *frameLog) Nack(tag uint64, multiple, requeue bool) error {
	f.frames++
	if multiple || !requeue {
		f.t.Fatalf("nack %d multiple=%v requeue=%v", tag, multiple, requeue)
	}
	if f.settled[tag] || f.done[tag] {
		f.t.Fatalf("nack of tag %d, already settled positively or on the wire", tag)
	}
	f.done[tag] = true
	return nil
}

// TestAckWindowProperty: whatever the order and outcome of settlements, an
// ack never covers an unsettled tag, a nack is sent at once, and after a
// flush every settled tag is done on the wire, each with at most one frame
// per flushEvery positive settlements plus one per nack and flush.
func TestAckWindowProperty(t *testing.T) {
	rapid.Check(t, func(t *rapid.T) {
		n := rapid.IntRange(1, 200).Draw(t, "n")
		order := rapid.Permutation(seq(n)).Draw(t, "order")
		every := uint64(rapid.IntRange(1, 70).Draw(t, "flushEvery"))
		w := ackWindow{flushEvery: every}
		f := &frameLog{t: t, settled: map[uint64]bool{}, done: map[uint64]bool{}}
		nacks, flushes := 0, 0
		for _, tag := range order {
			positive := rapid.Float64Range(0, 1).Draw(t, "p") < 0.9
			f.settled[tag] = positive
			if !positive {
				nacks++
			}
			if err := w.settle(f, tag, positive); err != nil {
				t.Fatal(err)
			}
			if !positive && !f.done[tag] {
				t.Fatalf("nack of %d not sent at once", tag)
			}
			if rapid.Float64Range(0, 1).Draw(t, "flush?") < 0.05 {
				flushes++
				if err := w.flush(f); err != nil {
					t.Fatal(err)
				}
			}
		}
		if err := w.flush(f); err != nil {
			t.Fatal(err)
		}
		flushes++
		for tag := uint64(1); tag <= uint64(n); tag++ {
			if !f.done[tag] {
				t.Fatalf("tag %d settled but never sent", tag)
			}
		}
		if max := n/int(every) + nacks + flushes; f.frames > max {
			t.Fatalf("%d frames for %d settlements, want at most %d", f.frames, n, max)
		}
	})
}

func seq(n int) []uint64 {
	s := make([]uint64, n)
	for i := range s {
		s[i] = uint64(i + 1)
	}
	return s
}

// TestSourceSettlesOutOfOrder: settlements in any order, mixed with nacks,
// leave the queue holding exactly the nacked messages, on the real broker.
func TestSourceSettlesOutOfOrder(t *testing.T) {
	key := conntest.Unique() + ".order"
	src, _, queue := durableSource(t, key, func(cfg *Config) { cfg.Prefetch = 20 })
	_, ch := directChannel(t)
	for i := range 20 {
		publish(t, ch, key, fmt.Sprint(i))
	}
	ctx := testCtx(t)
	var acks []connectors.AckFunc
	for range 20 {
		_, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}
	for i := len(acks) - 1; i >= 0; i-- {
		if i%5 == 0 {
			acks[i](fmt.Errorf("nack %d", i))
		} else {
			acks[i](nil)
		}
	}
	// The four nacked messages come back; settle them for good. Reading
	// with nothing waiting also sends the acknowledgements held back.
	for range 4 {
		_, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		ack(nil)
	}
	short, cancel := context.WithTimeout(ctx, 100*time.Millisecond)
	defer cancel()
	if m, _, err := src.Read(short); err == nil {
		t.Fatalf("unexpected delivery %q", m.Payload)
	}
	closeSource(t, src)
	if d := queueDepth(t, ch, queue); d != 0 {
		t.Fatalf("queue holds %d messages after every one was acknowledged", d)
	}
}
