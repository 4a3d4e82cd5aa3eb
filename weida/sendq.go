package weida

import (
	"context"
	"sync"
	"time"
)

type pushResult int

const (
	pushOK pushResult = iota
	pushFull
	pushClosed
	// pushOwnReplay is pushFull while the copy is replayed or copies of a
	// replay wait in the queue: the subscriber's own SUBSCRIBE filled its
	// buffer (see DropCounts.OwnReplay).
	pushOwnReplay
)

// sendQueue is one subscriber connection's fan-out queue: frames waiting
// for the connection's writer, and the budget they are charged against. Its
// methods are safe for concurrent use; pop is called by the writer only.
type sendQueue struct {
	mu      sync.Mutex
	items   []*frame // items[head:] wait, oldest first
	head    int
	bytes   int64 // charged: waiting, being written and parked in QUIC
	writing bool
	closed  bool
	wake    chan struct{} // capacity 1: "items may be waiting"
	// replayed is how many of items[head:] are replayed copies: while
	// any wait, a copy that does not fit is one the subscriber's own
	// replay crowded out.
	replayed int

	// poppedAt is when the writer took the copy it is writing (valid
	// while writing), or, if it took it without waiting, when its
	// previous write ended: the same instant give or take a lock, and a
	// clock read fewer per copy. stallAfter is Limits.SlowConsumerAfter;
	// stalled is closed once a copy was refused while the writer had been
	// stuck on one copy for stallAfter (see push), or once the writer of
	// a connection that tracks receipts waited that long for its
	// subscriber (see stall); stallCause says which.
	poppedAt   time.Time
	stallAfter time.Duration
	stalled    chan struct{}
	stallSeen  bool
	stallCause string
}

// Why a subscriber was taken for a slow consumer (sendQueue.stallCause).
const (
	stallOverBuffer     = "over its buffer and no copy taken"
	stallCreditWithheld = "its stream or flow-control credit withheld while receipts are awaited"
)

func (q *sendQueue) init(stallAfter time.Duration) {
	q.wake = make(chan struct{}, 1)
	q.stalled = make(chan struct{})
	q.stallAfter = stallAfter
}

// push queues f (taking a reference) unless that would take the charged
// bytes past budget or the queue is closed. When it does not fit, the
// arriving copy is the one dropped, never a queued one (PROTOCOL §9.5):
// a queued copy was counted Queued in its Publish's Result, and dropping
// it later would turn a delivery the publisher was told of into a loss
// it learns of only through a callback.
func (q *sendQueue) push(f *frame, budget int64) pushResult {
	c := f.queuedCharge()
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return pushClosed
	case q.bytes+c > budget:
		q.noteStallLocked()
		own := f.replayed || q.replayed > 0
		q.mu.Unlock()
		if own {
			return pushOwnReplay
		}
		return pushFull
	}
	q.bytes += c
	if f.replayed {
		q.replayed++
	}
	f.retain()
	q.items = append(q.items, f)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return pushOK
}

// noteStallLocked closes q.stalled, once, when the writer has been stuck
// on one copy for stallAfter: the subscriber is over its bound (a copy was
// just refused) and has taken nothing for that long, a slow consumer. A
// subscriber that reads, however slowly the endpoint serves it, lets the
// writer hand a copy to QUIC now and then and is never taken for one. The
// clock is read only here, on a refused copy. q.mu must be held.
func (q *sendQueue) noteStallLocked() {
	if q.stallSeen || !q.writing || time.Since(q.poppedAt) < q.stallAfter {
		return
	}
	q.stallLocked(stallOverBuffer)
}

// stall closes q.stalled, once, for the writer of a connection that
// tracks receipts: it waited stallAfter for its subscriber's stream or
// flow-control credit. There no refused copy is needed to tell a slow
// consumer: every copy it holds keeps a broker message unacknowledged,
// and once the broker's flow control is used up by them nothing more is
// published, so none would ever be refused.
func (q *sendQueue) stall() {
	q.mu.Lock()
	defer q.mu.Unlock()
	if !q.stallSeen {
		q.stallLocked(stallCreditWithheld)
	}
}

// stallLocked closes q.stalled for cause. q.mu must be held, and
// q.stallSeen false.
func (q *sendQueue) stallLocked(cause string) {
	q.stallSeen = true
	q.stallCause = cause
	close(q.stalled)
}

// pop returns the oldest waiting frame, waiting for one; nil once the queue
// is closed or ctx is done. The frame stays charged until done or parked.
// now is the time to note for a frame taken at once (see tryPop); one taken
// after a wait is noted with the clock read then.
func (q *sendQueue) pop(ctx context.Context, now time.Time) *frame {
	for {
		if f, closed := q.tryPop(now); f != nil || closed {
			return f
		}
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil
		}
		now = time.Now()
	}
}

// tryPop is pop without the wait: nil when nothing waits, and closed once
// the queue is closed. now becomes poppedAt: the caller's last clock
// reading, taken with nothing that waits since.
func (q *sendQueue) tryPop(now time.Time) (f *frame, closed bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if q.closed {
		return nil, true
	}
	if q.head == len(q.items) {
		return nil, false
	}
	f = q.items[q.head]
	q.items[q.head] = nil
	q.head++
	if f.replayed {
		q.replayed--
	}
	switch {
	case q.head == len(q.items):
		q.head = 0
		q.items = q.items[:0]
		if cap(q.items) > 4096 {
			q.items = nil // a burst is over: do not keep its backlog's array
		}
	case q.head >= 1024 && 2*q.head >= len(q.items):
		n := copy(q.items, q.items[q.head:])
		clear(q.items[n:])
		q.items = q.items[:n]
		q.head = 0
	}
	q.writing = true
	q.poppedAt = now
	return f, false
}

// done releases the budget of the frame pop returned, when it did not
// reach QUIC.
func (q *sendQueue) done(f *frame) {
	q.mu.Lock()
	q.bytes -= f.queuedCharge()
	q.writing = false
	q.mu.Unlock()
}

// parked turns the charge of the frame pop returned from its queued
// charge into parkedCopyCost: the writer handed it to QUIC, which holds
// its stream state until it has packetized it.
func (q *sendQueue) parked(f *frame) {
	q.mu.Lock()
	q.bytes += parkedCopyCost - f.queuedCharge()
	q.writing = false
	q.mu.Unlock()
}

// sent releases the charge of n parked copies that QUIC has packetized.
func (q *sendQueue) sent(n int) {
	if n == 0 {
		return
	}
	q.mu.Lock()
	q.bytes -= int64(n) * parkedCopyCost
	q.mu.Unlock()
}

// close refuses further pushes and drops what waits, counting it.
func (q *sendQueue) close(st *listenerCounters) {
	q.mu.Lock()
	q.closed = true
	waiting := q.items[q.head:]
	for _, f := range waiting {
		q.bytes -= f.queuedCharge()
		f.lost()
		f.group.settle(false)
		f.release()
	}
	st.dropped.connectionClosed.Add(uint64(len(waiting)))
	q.items, q.head, q.replayed = nil, 0, 0
	q.mu.Unlock()
}

// waitingNone reports whether no copy waits behind the one being written.
func (q *sendQueue) waitingNone() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.items)
}

// idle reports whether nothing waits and nothing is being written.
func (q *sendQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.items) && !q.writing
}

// What a copy costs a subscriber's budget. A queued copy holds a slot in
// the queue and a reference to a frame that every subscriber's copy
// shares; it is charged its frame as allocated (as if it were alone on the
// frame, which over-counts a shared one; see frame.queuedCharge): the
// buffer, and queuedCopyOverhead for the frame's struct and the slot. Once the writer
// has handed it to QUIC and until QUIC has put it into packets, it costs
// quic-go's state for its stream instead: a SendStream with its flow
// controller and a pooled STREAM frame with a packet-sized buffer holding
// a copy of up to one packet of its bytes (a larger write returns only
// when all but that much is in packets). That is parkedCopyCost, whatever
// the copy's size; TestParkedStreamCost measures it (about 2.4 KiB with
// quic-go v0.65 on linux/amd64) and TestQueuedCopyCost the queue's part.
const (
	queuedCopyOverhead = 96
	parkedCopyCost     = 3 << 10
)

// maxParked is how many copies a connection's writer hands to QUIC before
// it waits until QUIC has put them into packets: the bound on copies
// parked in quic-go per connection (maxParked x parkedCopyCost, 192 KiB).
// Waiting costs a hand-off to QUIC's send loop and back, so it is paid
// once per maxParked copies under load, not per copy.
const maxParked = 64

// ParkedBytesPerConnection bounds what a listener's writer leaves unsent in
// quic-go for one subscriber connection beyond its SubscriberBufferBytes:
// maxParked copies at parkedCopyCost. What QUIC has sent and not yet seen
// acknowledged comes on top (see docs/WEIDA.md, "Memory").
const ParkedBytesPerConnection = maxParked * parkedCopyCost
