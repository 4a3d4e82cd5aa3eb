package weida

import (
	"context"
	"sync"
)

type pushResult int

const (
	pushOK pushResult = iota
	pushFull
	pushClosed
)

// sendQueue is one subscriber connection's fan-out queue: frames waiting
// for the connection's writer, and the budget they are charged against. Its
// methods are safe for concurrent use; pop is called by the writer only.
type sendQueue struct {
	mu      sync.Mutex
	items   []*frame // items[head:] wait, oldest first
	head    int
	bytes   int64 // charged: waiting plus the one being written
	writing bool
	closed  bool
	wake    chan struct{} // capacity 1: "items may be waiting"
}

func (q *sendQueue) init() { q.wake = make(chan struct{}, 1) }

// push queues f (taking a reference) unless that would take the charged
// bytes past budget or the queue is closed.
func (q *sendQueue) push(f *frame, budget int64) pushResult {
	c := f.charge()
	q.mu.Lock()
	switch {
	case q.closed:
		q.mu.Unlock()
		return pushClosed
	case q.bytes+c > budget:
		q.mu.Unlock()
		return pushFull
	}
	q.bytes += c
	f.retain()
	q.items = append(q.items, f)
	q.mu.Unlock()
	select {
	case q.wake <- struct{}{}:
	default:
	}
	return pushOK
}

// pop returns the oldest waiting frame, waiting for one; nil once the queue
// is closed or ctx is done. The frame stays charged until done.
func (q *sendQueue) pop(ctx context.Context) *frame {
	for {
		q.mu.Lock()
		if q.closed {
			q.mu.Unlock()
			return nil
		}
		if q.head < len(q.items) {
			f := q.items[q.head]
			q.items[q.head] = nil
			q.head++
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
			q.mu.Unlock()
			return f
		}
		q.mu.Unlock()
		select {
		case <-q.wake:
		case <-ctx.Done():
			return nil
		}
	}
}

// done releases the budget of the frame pop returned.
func (q *sendQueue) done(f *frame) {
	q.mu.Lock()
	q.bytes -= f.charge()
	q.writing = false
	q.mu.Unlock()
}

// close refuses further pushes and drops what waits, counting it.
func (q *sendQueue) close(st *listenerCounters) {
	q.mu.Lock()
	q.closed = true
	waiting := q.items[q.head:]
	for _, f := range waiting {
		q.bytes -= f.charge()
		f.pub.copiesLost(1)
		f.release()
	}
	st.dropped.connectionClosed.Add(uint64(len(waiting)))
	q.items, q.head = nil, 0
	q.mu.Unlock()
}

// idle reports whether nothing waits and nothing is being written.
func (q *sendQueue) idle() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.head == len(q.items) && !q.writing
}
