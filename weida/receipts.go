package weida

import (
	"cmp"
	"context"
	"errors"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// Receipt is what became of the copies one [Publisher.PublishWithReceipt]
// queued: Received + Lost = the Result's Queued.
type Receipt struct {
	// Received counts copies whose every byte and FIN the subscriber's
	// QUIC stack acknowledged: the transport receipt, weida v0's only
	// delivery signal. The subscriber's application may not have read
	// them yet.
	Received int
	// Lost counts copies that ended otherwise: dropped before they were
	// written (their connection closed, counted as ConnectionClosed),
	// stopped by the subscriber (CopiesRefused), or written and not
	// acknowledged when their connection ended, however it ended.
	Lost int
}

// receiptGroup gathers the copies of one published message until every
// one has settled. pending starts at one, the publisher's own reference,
// so that copies settling during the fan-out cannot complete the group
// before its last copy is queued.
type receiptGroup struct {
	pending, received, lost atomic.Int32
	done                    func(Receipt)
}

func newReceiptGroup(done func(Receipt)) *receiptGroup {
	g := &receiptGroup{done: done}
	g.pending.Store(1)
	return g
}

// add counts one more copy to wait for; call it before the copy can
// settle.
func (g *receiptGroup) add() { g.pending.Add(1) }

// settle ends one copy. A nil group (a copy nobody waits for) is ignored.
func (g *receiptGroup) settle(received bool) {
	if g == nil {
		return
	}
	if received {
		g.received.Add(1)
	} else {
		g.lost.Add(1)
	}
	g.release()
}

// release drops one reference without a copy: the publisher's own, or a
// copy the fan-out counted and then failed to queue.
func (g *receiptGroup) release() {
	if g.pending.Add(-1) == 0 {
		g.done(Receipt{Received: int(g.received.Load()), Lost: int(g.lost.Load())})
	}
}

// TrackReceipts makes every connection of the listener record which
// stream data its subscriber acknowledged, so that
// [Publisher.PublishWithReceipt] can tell when a copy was received. It
// is sticky and listener-wide: once called, every connection of the
// listener pays for it (quic-go builds a trace event for each packet it
// sends and receives, a few allocations per packet, and the connection
// keeps the stream ranges of each packet in flight until it is
// acknowledged or declared lost). Listeners where no Publisher calls it
// pay nothing.
//
// A connection records acknowledgements only from its handshake on, and
// any connection may subscribe to this publisher's path: so
// TrackReceipts closes, with SHUTDOWN, the connections the listener
// accepted before tracking began, as a restarted listener would, and
// their subscribers reconnect tracked. Subscribers of the listener's
// other paths are closed too. Call it before publishing with receipts,
// or set [ListenConfig].TrackReceipts, which closes nobody.
func (p *Publisher) TrackReceipts() { p.l.trackReceipts() }

// trackReceipts turns tracking on for the connections accepted from now
// on and closes those accepted without a tracker; admit closes those
// whose handshake began before and that it admits after.
func (l *Listener) trackReceipts() {
	l.mu.Lock()
	l.receipts.Store(true)
	var untracked []*serverConn
	for sc := range l.conns {
		if sc.receipts == nil {
			untracked = append(untracked, sc)
		}
	}
	l.mu.Unlock()
	if len(untracked) == 0 {
		return
	}
	l.log.Info("weida: closing the connections accepted before receipt tracking began, for their subscribers to reconnect tracked",
		"connections", len(untracked))
	var wg sync.WaitGroup
	for _, sc := range untracked {
		wg.Go(func() { sc.c.close(Shutdown, untrackedReason) })
	}
	wg.Wait()
}

// untrackedReason is the close reason of a connection that records no
// acknowledgements on a listener that tracks receipts.
const untrackedReason = "receipt tracking began: reconnect"

// PublishWithReceipt is [Publisher.PublishWith] that also reports, through
// done, what became of the copies it queued: done is called exactly once
// when PublishWithReceipt returns a nil error (possibly before it
// returns), once every copy counted in Result.Queued was received by the
// subscriber's QUIC stack or lost (see [Receipt]); at once, with a zero
// Receipt, when nothing was queued. It is never called when
// PublishWithReceipt fails. done is called from the listener's goroutines,
// among them quic-go's connection loop: it must not block, and must not
// call the Publisher.
//
// Copies are reported received only on connections that record
// acknowledgements (see [Publisher.TrackReceipts]); on a listener where
// nothing tracks receipts, a copy is reported Received once it is handed
// to QUIC with its FIN, as nothing records more. A connection that
// ends reports each copy still unacknowledged as Lost, whether it
// vanished or was closed by either side; what the subscriber's stack
// acknowledged before the end stays Received.
func (p *Publisher) PublishWithReceipt(ctx context.Context, m Message, record func(), done func(Receipt)) (Result, error) {
	return p.publish(ctx, m, record, done)
}

// receiptsKey is the connection-context key of a connection's tracker.
type receiptsKey struct{}

// connContext gives each connection accepted while some publisher tracks
// receipts a tracker, found again by the Tracer quic-go calls next and by
// admit through the connection's context.
func (l *Listener) connContext(ctx context.Context, _ *quic.ClientInfo) (context.Context, error) {
	if !l.receipts.Load() {
		return ctx, nil
	}
	return context.WithValue(ctx, receiptsKey{}, new(receiptTracker)), nil
}

// tracer hands quic-go the connection's tracker, or nil, which turns its
// tracing off for the connection.
func tracer(ctx context.Context, _ bool, _ quic.ConnectionID) qlogwriter.Trace {
	if t, ok := ctx.Value(receiptsKey{}).(*receiptTracker); ok {
		return t
	}
	return nil
}

// bothTracers gives each connection the traces of a and b: a listener's
// receipts and its owner's QUICTracer.
func bothTracers(a, b QUICTracer) QUICTracer {
	return func(ctx context.Context, isClient bool, id quic.ConnectionID) qlogwriter.Trace {
		ta, tb := a(ctx, isClient, id), b(ctx, isClient, id)
		switch {
		case ta == nil:
			return tb
		case tb == nil:
			return ta
		}
		return teeTrace{ta, tb}
	}
}

// teeTrace hands every event to two traces.
type teeTrace struct{ a, b qlogwriter.Trace }

func (t teeTrace) AddProducer() qlogwriter.Recorder {
	return teeRecorder{t.a.AddProducer(), t.b.AddProducer()}
}

type teeRecorder struct{ a, b qlogwriter.Recorder }

func (r teeRecorder) RecordEvent(ev qlogwriter.Event) {
	r.a.RecordEvent(ev)
	r.b.RecordEvent(ev)
}

func (r teeRecorder) Close() error { return errors.Join(r.a.Close(), r.b.Close()) }

// trackerOf returns the tracker of qc, or nil.
func trackerOf(qc *quic.Conn) *receiptTracker {
	t, _ := qc.Context().Value(receiptsKey{}).(*receiptTracker)
	return t
}

// receiptTracker learns, from the qlog events of one connection, when the
// peer has acknowledged a whole stream. quic-go tells no stream's
// acknowledgement to its user, but its trace says which STREAM frames went
// into each sent packet and which packet numbers each received ACK
// covers: the stream is received once ACKs cover the packets carrying all
// of its bytes and its FIN. A frame lost and sent again appears as a new
// packet, so a packet declared lost is simply forgotten.
//
// quic-go records the events on the connection's own loop, one at a time;
// the writer registers streams from another goroutine, hence the lock.
// Only 1-RTT packets carry stream data: the rest are ignored.
//
// Memory: an entry per watched stream until it is received or the
// connection ends, and one per packet carrying watched stream data until
// that packet is acknowledged or declared lost. quic-go does not record
// every loss: a packet it gives up on for a PTO probe or a path migration
// leaves no PacketLost event, and its entry would stay until the
// connection ends. Nothing else would bound that, so sent prunes, now and
// then, the packets all of whose streams are settled (see compactAt).
type receiptTracker struct {
	mu      sync.Mutex
	ended   bool
	streams map[quic.StreamID]*awaitedStream
	// packets are the sent packets carrying watched stream data, in
	// increasing packet number (the order quic-go sends them in).
	packets []sentPacket
	// compactAt is the length of packets at which sent next prunes it:
	// twice what the last pruning kept, at least minCompactAt. A pruning
	// walks packets once, and at least as many packets as it kept are
	// appended before the next, so it costs O(1) per packet sent, amortised;
	// and packets never holds more than minCompactAt entries or twice the
	// packets of awaited streams the last pruning kept, whichever is more.
	compactAt int
	// completed is scratch for the groups an event settled, handed their
	// receipts once the lock is released.
	completed []*receiptGroup
}

type sentPacket struct {
	pn     qlog.PacketNumber
	frames []sentFrame
}

// sentFrame is the byte range [off, end) of one stream in one packet; fin
// when the frame carried the stream's FIN.
type sentFrame struct {
	id       quic.StreamID
	off, end int64
	fin      bool
}

// awaitedStream is one copy's stream until its peer acknowledged it all.
type awaitedStream struct {
	group    *receiptGroup
	size     int64
	acked    []byteRange // disjoint, sorted, adjacent ones merged
	finAcked bool
}

type byteRange struct{ off, end int64 }

// AddProducer implements qlogwriter.Trace: quic-go asks for one recorder
// per connection.
func (t *receiptTracker) AddProducer() qlogwriter.Recorder { return t }

// Close implements qlogwriter.Recorder; the connection's end is settled
// by end, which the listener calls once the writer is gone.
func (t *receiptTracker) Close() error { return nil }

// watch starts waiting for the acknowledgement of stream id, whose size
// bytes (FIN after them) are about to be written. Call it before the
// first byte is written, so that no packet of the stream goes unseen.
func (t *receiptTracker) watch(id quic.StreamID, size int64, g *receiptGroup) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if t.ended {
		g.settle(false) // unreachable: the writer ends before the tracker
		return
	}
	if t.streams == nil {
		t.streams = make(map[quic.StreamID]*awaitedStream)
	}
	t.streams[id] = &awaitedStream{group: g, size: size}
}

// forget stops waiting for stream id (its write failed) and reports
// whether it was still awaited, so that the caller settles it.
func (t *receiptTracker) forget(id quic.StreamID) bool {
	t.mu.Lock()
	defer t.mu.Unlock()
	if _, ok := t.streams[id]; !ok {
		return false
	}
	delete(t.streams, id)
	return true
}

// awaiting is how many streams wait for their acknowledgement.
func (t *receiptTracker) awaiting() int {
	t.mu.Lock()
	defer t.mu.Unlock()
	return len(t.streams)
}

// end settles every stream still awaited as lost and forgets everything:
// the connection is gone, and what its peer did not acknowledge by now it
// never will.
func (t *receiptTracker) end() {
	t.mu.Lock()
	t.ended = true
	streams := t.streams
	t.streams, t.packets, t.completed = nil, nil, nil
	t.mu.Unlock()
	for _, s := range streams {
		s.group.settle(false)
	}
}

// RecordEvent implements qlogwriter.Recorder.
func (t *receiptTracker) RecordEvent(ev qlogwriter.Event) {
	switch e := ev.(type) {
	case qlog.PacketSent:
		if e.Header.PacketType == qlog.PacketType1RTT {
			t.sent(e.Header.PacketNumber, e.Frames)
		}
	case qlog.PacketReceived:
		if e.Header.PacketType != qlog.PacketType1RTT {
			return // an ACK there covers Initial or Handshake packets
		}
		for _, f := range e.Frames {
			switch f := f.Frame.(type) {
			case *qlog.AckFrame:
				t.acked(f.AckRanges)
			case *qlog.StopSendingFrame:
				t.stopped(f.StreamID)
			}
		}
	case qlog.PacketLost:
		if e.Header.PacketType == qlog.PacketType1RTT {
			t.lost(e.Header.PacketNumber)
		}
	}
}

// sent notes the watched stream data packet pn carries.
func (t *receiptTracker) sent(pn qlog.PacketNumber, frames []qlog.Frame) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.streams) == 0 {
		return
	}
	var watched []sentFrame
	for _, f := range frames {
		sf, ok := f.Frame.(*qlog.StreamFrame)
		if !ok {
			continue
		}
		if _, ok := t.streams[sf.StreamID]; ok {
			watched = append(watched, sentFrame{id: sf.StreamID, off: sf.Offset, end: sf.Offset + sf.Length, fin: sf.Fin})
		}
	}
	if len(watched) == 0 {
		return
	}
	if len(t.packets) >= max(t.compactAt, minCompactAt) {
		t.compact()
	}
	t.packets = append(t.packets, sentPacket{pn: pn, frames: watched})
}

// minCompactAt is the fewest packets the tracker prunes, so that a
// connection with few packets in flight never pays for a pruning.
const minCompactAt = 256

// compact drops the packets that carry data of no stream still awaited:
// their streams were received, stopped or forgotten since they were
// sent, so acknowledging them settles nothing. A packet quic-go gave up
// on without a PacketLost event is among them once the retransmission
// of its frames completed their stream. t.mu must be held.
func (t *receiptTracker) compact() {
	kept := t.packets[:0]
	for _, p := range t.packets {
		if t.awaitsAny(p.frames) {
			kept = append(kept, p)
		}
	}
	clear(t.packets[len(kept):])
	t.packets = kept
	t.compactAt = 2 * len(kept)
}

// awaitsAny reports whether a frame of fs belongs to a stream still
// awaited. t.mu must be held.
func (t *receiptTracker) awaitsAny(fs []sentFrame) bool {
	for _, f := range fs {
		if _, ok := t.streams[f.id]; ok {
			return true
		}
	}
	return false
}

// acked marks the frames of the packets ranges cover as acknowledged and
// settles the streams that are now complete. Each range covers a run of
// the sorted packets, found by binary search, and removed by cut. An ACK
// usually acknowledges the oldest packets in flight, a run at the front,
// and then costs its ranges and the packets it acknowledges, not every
// packet in flight; a run behind a hole (a packet still unacknowledged
// before it) also shifts the packets after it.
func (t *receiptTracker) acked(ranges []qlog.AckRange) {
	t.mu.Lock()
	for _, r := range ranges {
		i := t.search(r.Smallest)
		j := i
		for j < len(t.packets) && t.packets[j].pn <= r.Largest {
			for _, f := range t.packets[j].frames {
				t.ackFrame(f)
			}
			j++
		}
		t.cut(i, j)
	}
	completed := t.completed
	t.completed = t.completed[:0]
	t.mu.Unlock()
	for i, g := range completed {
		g.settle(true)
		completed[i] = nil
	}
}

// cut removes packets[i:j]. A run at the front is cut off by reslicing,
// without moving the packets after it: the array's head it leaves behind
// is dropped when append next grows the array, which copies only the
// packets kept. t.mu must be held.
func (t *receiptTracker) cut(i, j int) {
	switch {
	case i == j:
	case j == len(t.packets) && i == 0:
		clear(t.packets)
		t.packets = t.packets[:0]
	case i == 0:
		clear(t.packets[:j])
		t.packets = t.packets[j:]
	default:
		t.packets = slices.Delete(t.packets, i, j)
	}
}

// search returns the index of the first packet numbered pn or later.
// t.mu must be held.
func (t *receiptTracker) search(pn qlog.PacketNumber) int {
	i, _ := slices.BinarySearchFunc(t.packets, pn, func(p sentPacket, pn qlog.PacketNumber) int {
		return cmp.Compare(p.pn, pn)
	})
	return i
}

// ackFrame applies one acknowledged frame to its stream. t.mu must be
// held.
func (t *receiptTracker) ackFrame(f sentFrame) {
	s := t.streams[f.id]
	if s == nil {
		return // already complete (a retransmission acknowledged twice), or forgotten
	}
	if f.fin {
		s.finAcked = true
	}
	if f.end > f.off {
		s.acked = addRange(s.acked, byteRange{f.off, f.end})
	}
	if s.finAcked && (s.size == 0 || len(s.acked) == 1 && s.acked[0].off == 0 && s.acked[0].end >= s.size) {
		delete(t.streams, f.id)
		t.completed = append(t.completed, s.group)
	}
}

// addRange merges r into rs, sorted, disjoint and with adjacent ranges
// joined.
func addRange(rs []byteRange, r byteRange) []byteRange {
	i := 0
	for i < len(rs) && rs[i].end < r.off {
		i++
	}
	j := i
	for j < len(rs) && rs[j].off <= r.end {
		r.off = min(r.off, rs[j].off)
		r.end = max(r.end, rs[j].end)
		j++
	}
	return slices.Replace(rs, i, j, r)
}

// stopped settles stream id as lost when its subscriber asked to stop it
// (STOP_SENDING) before acknowledging all of it: the copy was refused,
// and quic-go resets the stream rather than send the rest, so no ACK
// would ever complete it, and its message would wait for the
// connection's end.
func (t *receiptTracker) stopped(id quic.StreamID) {
	t.mu.Lock()
	s := t.streams[id]
	delete(t.streams, id)
	t.mu.Unlock()
	if s != nil {
		s.group.settle(false)
	}
}

// lost forgets packet pn: quic-go sends its frames again in new packets.
func (t *receiptTracker) lost(pn qlog.PacketNumber) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if i := t.search(pn); i < len(t.packets) && t.packets[i].pn == pn {
		t.cut(i, i+1)
	}
}

// releaseIfAny is release on a group that may be nil.
func (g *receiptGroup) releaseIfAny() {
	if g != nil {
		g.release()
	}
}
