package amqp

import (
	"context"
	"errors"
	"fmt"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
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

// wireLog is an acknowledger that records frames for a test that reads
// them after synctest.Wait.
type wireLog struct {
	mu     sync.Mutex
	frames []string
}

func (l *wireLog) Ack(tag uint64, multiple bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frames = append(l.frames, fmt.Sprintf("ack %d multiple=%v", tag, multiple))
	return nil
}

func (l *wireLog) Nack(tag uint64, multiple, requeue bool) error {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.frames = append(l.frames, fmt.Sprintf("nack %d multiple=%v requeue=%v", tag, multiple, requeue))
	return nil
}

func (l *wireLog) take() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	f := l.frames
	l.frames = nil
	return f
}

// TestAckWindowDelay: settlements that leave acks waiting are sent delay
// later with no reader and no further settlement; the multiple ack stops
// below a tag not yet settled; a flush disarms the timer; nothing is sent
// once the channel is lost.
func TestAckWindowDelay(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		lost := make(chan struct{})
		w := ackWindow{flushEvery: 64, delay: ackDelay, lost: lost}
		var wire wireLog
		step := func(what string, want ...string) {
			t.Helper()
			synctest.Wait()
			if got := wire.take(); !slices.Equal(got, want) {
				t.Fatalf("%s: frames %q, want %q", what, got, want)
			}
		}
		for _, tag := range []uint64{2, 1, 4} {
			if err := w.settle(&wire, tag, true); err != nil {
				t.Fatal(err)
			}
		}
		step("at once")
		time.Sleep(ackDelay - time.Nanosecond)
		step("just before the delay")
		time.Sleep(time.Nanosecond)
		step("after the delay", "ack 2 multiple=true") // 3 is not settled: 4 waits

		if err := w.settle(&wire, 3, true); err != nil {
			t.Fatal(err)
		}
		time.Sleep(ackDelay)
		step("3 joins 4", "ack 4 multiple=true")

		if err := w.settle(&wire, 5, true); err != nil {
			t.Fatal(err)
		}
		if err := w.flush(&wire); err != nil {
			t.Fatal(err)
		}
		time.Sleep(10 * ackDelay)
		step("flushed, timer disarmed", "ack 5 multiple=true")

		if err := w.settle(&wire, 6, true); err != nil {
			t.Fatal(err)
		}
		close(lost)
		time.Sleep(10 * ackDelay)
		step("lost channel")
	})
}

// TestSourceFlushesSettledWhileReadBlocks: deliveries settled from another
// goroutine while Read waits for a delivery that does not come, fewer than
// a multiple ack's batch, reach the broker within a bound, not only when
// the next delivery arrives or the Source closes.
func TestSourceFlushesSettledWhileReadBlocks(t *testing.T) {
	const n = 10 // below flushEvery (25), so only the delay sends them
	key := conntest.Unique() + ".blocked"
	src, _, queue := durableSource(t, key, func(cfg *Config) { cfg.Prefetch = 100 })
	_, ch := directChannel(t)
	for i := range n {
		publish(t, ch, key, fmt.Sprint(i))
	}
	ctx := testCtx(t)
	var acks []connectors.AckFunc
	for range n {
		_, ack, err := src.Read(ctx)
		if err != nil {
			t.Fatal(err)
		}
		acks = append(acks, ack)
	}

	readCtx, stopRead := context.WithCancel(ctx)
	read := make(chan error, 1)
	go func() {
		m, _, err := src.Read(readCtx)
		if err == nil {
			err = fmt.Errorf("unexpected delivery %q", m.Payload)
		}
		read <- err
	}()
	// Let Read block before anything is settled, as the bridge's settler
	// does with acknowledge: received.
	time.Sleep(50 * time.Millisecond)
	settled := make(chan struct{})
	go func() {
		defer close(settled)
		for _, a := range acks {
			a(nil)
		}
	}()
	<-settled

	// ackDelay is a millisecond; the bound allows for rabbitmqctl.
	deadline := time.Now().Add(5 * time.Second)
	for {
		u := unacknowledged(t, queue)
		if u == 0 {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("the broker still holds %d of %d settled deliveries unacknowledged while Read waits", u, n)
		}
		time.Sleep(50 * time.Millisecond)
	}
	stopRead()
	if err := <-read; !errors.Is(err, context.Canceled) {
		t.Fatalf("the blocked Read ended with %v", err)
	}
}

// unacknowledged returns the deliveries of queue its consumers hold
// unacknowledged, as the broker counts them.
func unacknowledged(t *testing.T, queue string) int {
	t.Helper()
	out, err := exec.Command("rabbitmqctl", "-q", "list_queues", "name", "messages_unacknowledged").CombinedOutput()
	if err != nil {
		t.Fatalf("rabbitmqctl list_queues: %v\n%s", err, out)
	}
	for line := range strings.Lines(string(out)) {
		f := strings.Fields(line)
		if len(f) == 2 && f[0] == queue {
			n, err := strconv.Atoi(f[1])
			if err != nil {
				t.Fatalf("rabbitmqctl list_queues: %q: %v", line, err)
			}
			return n
		}
	}
	t.Fatalf("rabbitmqctl list_queues does not list %q:\n%s", queue, out)
	return 0
}
