package weida

import (
	"errors"
	"math"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// UnconfirmedCopies is what [Publisher.OnCopiesUnconfirmed] reports for one
// subscriber connection that ended without either side closing it: the
// copies of one Publisher written to it within the unconfirmed window
// before the end was seen. Some of them may have been delivered; nobody
// can tell which.
type UnconfirmedCopies struct {
	// Messages are the copies as published (Endpoint is the path), oldest
	// first, from the record the connection keeps while a callback is
	// set. The slice and every Payload are fresh: the callback may keep
	// them.
	Messages []Message
	// Unkept counts further copies written within the window that the
	// record had no room for (see [Publisher.OnCopiesUnconfirmed]); they
	// are as unconfirmed as Messages, only without their content.
	Unkept int
	// Remote is the subscriber's address, Cause how its connection ended
	// (a *quic.IdleTimeoutError, a *quic.StatelessResetError...).
	Remote string
	Cause  error
}

// Len is the number of unconfirmed copies: len(Messages) + Unkept.
func (u UnconfirmedCopies) Len() int { return len(u.Messages) + u.Unkept }

// unconfirmedMargin is added to the idle timeout to form the window. A
// connection ends by idle timeout one idle timeout after the last packet
// from the peer arrived; copies written before that packet were in all
// likelihood acknowledged by the peer's QUIC stack, those written after it
// may not have been. quic-go does not tell when the last packet arrived,
// nor which stream data the peer acknowledged, so the window reaches back
// the whole idle timeout from the end, and the margin covers what the
// timeout itself does not: the acknowledgement delay and a round trip for
// copies written just before the last packet, and the end's detection. A
// stateless reset is seen within a keep-alive period and a round trip of
// the peer's restart, well inside the same window.
//
// The idle timeout quic-go applies is not always the configured one: it
// is at least three probe timeouts (see idleReach), which on a path whose
// round trips grew (a peer starved of CPU acknowledges late) exceeds 2 s.
// The window then reaches back that much further, up to reachBuckets.
const unconfirmedMargin = time.Second

// windowBuckets is how many time buckets the window spans at the
// configured idle timeout; writtenBuckets is how many a connection keeps:
// enough for a window that quic-go's probe timeouts stretched to four
// times that (reachBuckets), plus the one the end falls into and one spare
// for copies whose write completed while the end was being noticed. A
// bucket is 16 bytes, so a connection's counts take 2 KiB.
const (
	windowBuckets  = 30
	reachBuckets   = 4 * windowBuckets
	writtenBuckets = reachBuckets + 2
)

// maxKeptCopies bounds the record of one connection by count (its ring
// then takes 64 KiB); its bytes are bounded by
// Limits.SubscriberBufferBytes. A subscriber's stream credit lets far fewer
// copies be in flight on a healthy path, and what does not fit is still
// counted, only without its message.
const maxKeptCopies = 4096

// bucket counts the copies written in one time bucket; idx is the bucket's
// number plus one, so that the zero value is an empty bucket.
type bucket struct {
	idx int64
	n   uint64
}

type buckets [writtenBuckets]bucket

func (bs *buckets) add(idx int64, n uint64) {
	b := &bs[idx%writtenBuckets]
	if b.idx != idx+1 {
		b.idx, b.n = idx+1, 0
	}
	b.n += n
}

// since sums the buckets numbered first or later.
func (bs *buckets) since(first int64) uint64 {
	var n uint64
	for _, b := range bs {
		if b.idx != 0 && b.idx-1 >= first {
			n += b.n
		}
	}
	return n
}

// keptCopy is one written copy held for a possible report.
type keptCopy struct {
	f   *frame
	idx int64 // the bucket it was written in
}

// writtenLog is what one subscriber connection remembers of the copies it
// wrote, so that those at risk can be reported if it vanishes. Counting
// costs nothing beyond the clock reading the writer passes in; copies of
// a Publisher with an [Publisher.OnCopiesUnconfirmed] callback are also
// kept, their frame held, in a ring bounded by time, count and bytes.
// Only the connection's writer calls written; finish is called once the
// writer has ended, so nothing here is locked.
type writtenLog struct {
	start    time.Time // monotonic origin of the bucket numbers
	width    time.Duration
	span     int64 // buckets the window reaches back from the end's at the configured idle timeout
	maxBytes int64

	counts buckets
	// total counts every copy written; totals those of each publisher
	// with a callback (the last lookup cached), for the copies a vanished
	// peer may hold from before the window (see finish).
	total   uint64
	blocked int64 // bucket number + 1 of the last time the peer's stream credit ran out; 0: never
	// parkedAtEnd is how many of the last copies written were still
	// parked in QUIC, not known to be in packets, when the writer ended.
	parkedAtEnd uint64
	totals      map[*Publisher]*uint64
	lastTotPub  *Publisher
	lastTot     *uint64

	ring    []keptCopy // ring[head:head+n], modulo len(ring)
	head, n int
	bytes   int64
	unkept  map[*Publisher]*buckets // copies that fell out of a full ring, or were never kept
	lastPub *Publisher              // the last lookup in unkept, cached
	lastBs  *buckets
	maxKept int // maxKeptCopies; lowered by tests
	// keepLast is how many of the last kept copies stay in the ring
	// however old they are: as many as the peer can hold unread (its
	// HELLO max_transfers, see finish) and the writer can leave parked,
	// so that finish can report those it counts with their messages.
	// Set by the writer before its first copy (setHold); 0 until then.
	keepLast int
}

// setHold sets keepLast from the peer's HELLO max_transfers (0: absent).
func (w *writtenLog) setHold(peerMaxTransfers uint64) {
	hold := peerMaxTransfers
	if hold == 0 {
		hold = DefaultMaxConcurrentUniStreams + DefaultMaxConcurrentBidiStreams
	}
	w.keepLast = int(min(max(hold, maxParked), math.MaxInt32))
}

func (w *writtenLog) init(limits *Limits) {
	window := limits.IdleTimeout + unconfirmedMargin
	w.start = time.Now()
	w.span = windowBuckets
	w.width = max((window+time.Duration(w.span)-1)/time.Duration(w.span), time.Millisecond)
	w.maxBytes = limits.SubscriberBufferBytes
	w.maxKept = maxKeptCopies
}

func (w *writtenLog) bucketOf(d time.Duration) int64 { return int64(d / w.width) }

// now reads the monotonic clock, as the time since the log's start that
// written takes.
func (w *writtenLog) now() time.Duration { return time.Since(w.start) }

// at turns a reading of now into a time, with its monotonic reading.
func (w *writtenLog) at(d time.Duration) time.Time { return w.start.Add(d) }

// written notes f, just written and finished with FIN, at now (a reading
// of w.now taken after the write).
func (w *writtenLog) written(f *frame, now time.Duration) {
	idx := w.bucketOf(now)
	w.counts.add(idx, 1)
	w.total++
	if f.pub == nil {
		return
	}
	cb := f.pub.unconfirmed.Load()
	if cb == nil {
		return
	}
	*w.totalOf(f.pub)++
	if !cb.keep {
		w.unkeptBuckets(f.pub).add(idx, 1)
		return
	}
	// Forget what no end from now on can reach: one bucket more than the
	// longest span, for a copy noted after the end's bucket; but keep the
	// last keepLast copies, which an end can reach through the peer's hold.
	for w.n > w.keepLast && w.ring[w.head].idx < idx-reachBuckets-1 {
		w.dropOldest(false)
	}
	c := f.charge()
	for w.n > 0 && (w.n >= w.maxKept || w.bytes+c > w.maxBytes) {
		w.dropOldest(true)
	}
	if w.n == len(w.ring) {
		w.grow()
	}
	f.retain()
	w.ring[(w.head+w.n)%len(w.ring)] = keptCopy{f: f, idx: idx}
	w.n++
	w.bytes += c
}

func (w *writtenLog) grow() {
	size := min(max(2*len(w.ring), 64), w.maxKept)
	ring := make([]keptCopy, size)
	for i := range w.n {
		ring[i] = w.ring[(w.head+i)%len(w.ring)]
	}
	w.ring, w.head = ring, 0
}

// dropOldest releases the oldest kept copy; unkept means it leaves while
// still possibly at risk, so it is counted for its publisher.
func (w *writtenLog) dropOldest(unkept bool) {
	k := w.ring[w.head]
	w.ring[w.head] = keptCopy{}
	w.head = (w.head + 1) % len(w.ring)
	w.n--
	w.bytes -= k.f.charge()
	if unkept {
		w.unkeptBuckets(k.f.pub).add(k.idx, 1)
	}
	k.f.release()
}

// unkeptBuckets are the counts of p's copies written without being kept.
func (w *writtenLog) unkeptBuckets(p *Publisher) *buckets {
	if p == w.lastPub && w.lastBs != nil {
		return w.lastBs // a connection mostly writes for one publisher
	}
	defer func() { w.lastPub, w.lastBs = p, w.unkept[p] }()
	if w.unkept == nil {
		w.unkept = make(map[*Publisher]*buckets)
	}
	bs := w.unkept[p]
	if bs == nil {
		bs = new(buckets)
		w.unkept[p] = bs
	}
	return bs
}

// creditExhausted notes that the writer found the peer's stream credit
// used up: the peer held as many unread copies as it allows.
func (w *writtenLog) creditExhausted() {
	w.blocked = w.bucketOf(w.now()) + 1
}

// totalOf is the counter of p's written copies.
func (w *writtenLog) totalOf(p *Publisher) *uint64 {
	if p == w.lastTotPub && w.lastTot != nil {
		return w.lastTot
	}
	if w.totals == nil {
		w.totals = make(map[*Publisher]*uint64)
	}
	n := w.totals[p]
	if n == nil {
		n = new(uint64)
		w.totals[p] = n
	}
	w.lastTotPub, w.lastTot = p, n
	return n
}

// finish settles the log of a connection whose end was seen ended after
// its start: when cause says the peer vanished, the copies written within
// the window are counted in st and reported to their publishers'
// callbacks. Every kept frame is released. idle is the idle timeout
// quic-go applied at the end (idleReach): when it exceeds the configured
// one, the window grows by the difference, up to reachBuckets.
//
// The window alone misses copies written earlier that the peer still
// held: a subscriber starved of CPU, or reading slowly, keeps copies
// unread, in flight or in its QUIC buffers, for longer than any window
// (issue 21: 5,498 copies of a 300-subscriber run counted nowhere). What
// it can hold is bounded by the stream credit it grants, since a copy is
// a stream and a weida Subscriber returns a stream's credit only once
// Receive has read it; its HELLO states that bound as max_transfers
// (hold, advisory; the defaults when absent). So when the peer's credit
// ran out within the window (it then held all it allows), at least the
// last hold copies written are counted too, per publisher and in total:
// an upper bound, like the window. A peer that never used up its credit
// within the window adds nothing beyond the window, so a reader that kept
// up is counted as before.
//
// Likewise the copies the writer had parked in QUIC and not yet seen
// packetized when it ended (at most maxParked, the last written): on a
// starved endpoint they may have waited in quic-go for longer than the
// window and died with the connection without ever being sent.
func (w *writtenLog) finish(st *listenerCounters, ended time.Duration, cause error, remote string, hold uint64, idle time.Duration) {
	defer func() {
		for w.n > 0 {
			w.dropOldest(false)
		}
		w.ring, w.unkept, w.lastPub, w.lastBs = nil, nil, nil, nil
		w.totals, w.lastTotPub, w.lastTot = nil, nil, nil
	}()
	if !vanished(cause) {
		return
	}
	if hold == 0 {
		hold = DefaultMaxConcurrentUniStreams + DefaultMaxConcurrentBidiStreams
	}
	first := w.bucketOf(ended) - w.spanFor(idle)
	if w.blocked == 0 || w.blocked-1 < first {
		hold = 0 // the peer had credit to spare: the window covers it
	}
	hold = max(hold, w.parkedAtEnd)
	total := max(w.counts.since(first), min(w.total, hold))
	if total == 0 {
		return
	}
	st.copiesUnconfirmed.Add(total)
	var reports []*pubReport
	report := func(p *Publisher) *pubReport {
		for _, r := range reports {
			if r.pub == p {
				return r
			}
		}
		r := &pubReport{pub: p}
		reports = append(reports, r)
		return r
	}
	for i := range w.n {
		k := w.ring[(w.head+i)%len(w.ring)]
		if k.idx < first && uint64(w.n-i) > hold {
			continue // neither in the window nor among the last hold
		}
		r := report(k.f.pub)
		r.u.Messages = append(r.u.Messages, k.f.message())
	}
	for p, bs := range w.unkept {
		if n := bs.since(first); n > 0 {
			report(p).u.Unkept += int(n)
		}
	}
	for p, n := range w.totals {
		if held := int(min(*n, hold)); held > 0 {
			if r := report(p); r.u.Len() < held {
				r.u.Unkept += held - r.u.Len()
			}
		}
	}
	for _, r := range reports {
		if cb := r.pub.unconfirmed.Load(); cb != nil {
			r.u.Remote, r.u.Cause = remote, cause
			cb.fn(r.u)
		}
	}
}

// spanFor is how many buckets the window reaches back when quic-go ended
// the connection after idle without a packet: the configured span, or
// more when idle plus the margin exceeds the configured window, at most
// reachBuckets.
func (w *writtenLog) spanFor(idle time.Duration) int64 {
	need := (int64(idle+unconfirmedMargin) + int64(w.width) - 1) / int64(w.width)
	return min(max(need, w.span), reachBuckets)
}

// idleReach is the idle timeout quic-go applies to a connection configured
// with idle, given its path's statistics: never less than three probe
// timeouts (quic-go's Conn.nextIdleTimeoutTime, after RFC 9000 §10.1), a
// probe timeout being the smoothed RTT, four mean deviations (at least
// the 1 ms timer granularity) and the peer's max_ack_delay. The peer's
// value is not exposed; weida's peers run quic-go, whose default is
// 25 ms. Without a measured RTT quic-go's probe timeout is short, and the
// configured value applies.
func idleReach(idle time.Duration, s quic.ConnectionStats) time.Duration {
	if s.SmoothedRTT == 0 {
		return idle
	}
	pto := s.SmoothedRTT + max(4*s.MeanDeviation, time.Millisecond) + peerMaxAckDelay
	return max(idle, 3*pto)
}

// peerMaxAckDelay is quic-go's default max_ack_delay (RFC 9000 §18.2).
const peerMaxAckDelay = 25 * time.Millisecond

type pubReport struct {
	pub *Publisher
	u   UnconfirmedCopies
}

// message decodes the frame back into the message it was encoded from.
func (f *frame) message() Message {
	_, hdr, n, err := wire.ParsePreamble(f.buf, math.MaxUint32)
	if err != nil {
		return Message{} // unreachable: the frame was encoded here
	}
	d, err := wire.DecodeData(hdr)
	if err != nil {
		return Message{}
	}
	return messageOf(&d, append([]byte(nil), f.buf[n:]...))
}

// vanished reports whether a connection that ended with cause ended
// without a CONNECTION_CLOSE from either side: by idle timeout, by a
// stateless reset, or by anything else that is not a close (a broken
// socket). Then nobody can tell what the peer received of what was
// written to it last.
//
// A close by the peer (an application close such as Subscriber.Close, or
// its QUIC stack's transport close) is the peer's decision: it knows what
// it took and what it gave up. A close of ours (Listener.Close or Shutdown,
// a protocol violation, a limit) is reported to the peer with a code, and
// what QUIC had not delivered when it went out is abandoned by a choice
// made here, not lost to an unseen failure; Shutdown waits until the
// queued copies are handed to QUIC before it closes, and weida v0 has no
// acknowledgement that would let it wait longer. Neither is reported as
// unconfirmed.
func vanished(cause error) bool {
	var idle *quic.IdleTimeoutError
	var reset *quic.StatelessResetError
	if errors.As(cause, &idle) || errors.As(cause, &reset) {
		return true
	}
	var app *quic.ApplicationError
	var te *quic.TransportError
	return !errors.As(cause, &app) && !errors.As(cause, &te)
}
