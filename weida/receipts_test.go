package weida

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"

	"weida.dev/connector/internal/brokertest"
)

// receiptLog collects the receipts of a test's publishes, by message.
type receiptLog struct {
	mu  sync.Mutex
	got map[int]Receipt
	n   map[int]int // calls per message: exactly one each
}

func newReceiptLog() *receiptLog {
	return &receiptLog{got: make(map[int]Receipt), n: make(map[int]int)}
}

func (r *receiptLog) done(i int) func(Receipt) {
	return func(rc Receipt) {
		r.mu.Lock()
		defer r.mu.Unlock()
		r.got[i] = rc
		r.n[i]++
	}
}

func (r *receiptLog) of(i int) (Receipt, int) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.got[i], r.n[i]
}

func (r *receiptLog) len() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return len(r.got)
}

func sentEvent(pn int64, frames ...*qlog.StreamFrame) qlog.PacketSent {
	e := qlog.PacketSent{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT, PacketNumber: qlog.PacketNumber(pn)}}
	for _, f := range frames {
		e.Frames = append(e.Frames, qlog.Frame{Frame: f})
	}
	return e
}

func ackEvent(ranges ...[2]int64) qlog.PacketReceived {
	ack := &qlog.AckFrame{}
	for _, r := range ranges {
		ack.AckRanges = append(ack.AckRanges, qlog.AckRange{Smallest: qlog.PacketNumber(r[0]), Largest: qlog.PacketNumber(r[1])})
	}
	return qlog.PacketReceived{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT}, Frames: []qlog.Frame{{Frame: ack}}}
}

func stopSendingEvent(id quic.StreamID) qlog.PacketReceived {
	return qlog.PacketReceived{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT}, Frames: []qlog.Frame{{Frame: &qlog.StopSendingFrame{StreamID: id, ErrorCode: quic.StreamErrorCode(Rejected)}}}}
}

func lostEvent(pn int64) qlog.PacketLost {
	return qlog.PacketLost{Header: qlog.PacketHeader{PacketType: qlog.PacketType1RTT, PacketNumber: qlog.PacketNumber(pn)}}
}

func stream(id quic.StreamID, off, n int64, fin bool) *qlog.StreamFrame {
	return &qlog.StreamFrame{StreamID: id, Offset: off, Length: n, Fin: fin}
}

// TestReceiptTracker feeds the tracker the events quic-go records for one
// connection and checks when each watched stream is settled. Streams 3
// (100 bytes) and 7 (10 bytes) are watched; 11 is not.
func TestReceiptTracker(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name   string
		events []any // qlog events, or "end"
		want   map[quic.StreamID]Receipt
	}{
		{"one packet, acknowledged", []any{
			sentEvent(1, stream(7, 0, 10, true)), ackEvent([2]int64{1, 1}),
		}, map[quic.StreamID]Receipt{7: {Received: 1}}},
		{"sent, not acknowledged", []any{
			sentEvent(1, stream(7, 0, 10, true)),
		}, map[quic.StreamID]Receipt{}},
		{"two packets, the first acknowledged", []any{
			sentEvent(1, stream(3, 0, 60, false)), sentEvent(2, stream(3, 60, 40, true)), ackEvent([2]int64{1, 1}),
		}, map[quic.StreamID]Receipt{}},
		{"two packets, acknowledged out of order", []any{
			sentEvent(1, stream(3, 0, 60, false)), sentEvent(2, stream(3, 60, 40, true)),
			ackEvent([2]int64{2, 2}), ackEvent([2]int64{1, 2}),
		}, map[quic.StreamID]Receipt{3: {Received: 1}}},
		{"bytes acknowledged, FIN in a lost packet, sent again", []any{
			sentEvent(1, stream(3, 0, 100, false)), sentEvent(2, stream(3, 100, 0, true)),
			lostEvent(2), ackEvent([2]int64{1, 2}),
			sentEvent(3, stream(3, 100, 0, true)), ackEvent([2]int64{3, 3}),
		}, map[quic.StreamID]Receipt{3: {Received: 1}}},
		{"a lost packet acknowledged late counts nothing, its retransmission does", []any{
			sentEvent(1, stream(7, 0, 10, true)), lostEvent(1), ackEvent([2]int64{1, 1}),
		}, map[quic.StreamID]Receipt{}},
		{"a hole in the bytes", []any{
			sentEvent(1, stream(3, 0, 40, false)), sentEvent(2, stream(3, 40, 20, false)), sentEvent(3, stream(3, 60, 40, true)),
			ackEvent([2]int64{3, 3}, [2]int64{1, 1}),
		}, map[quic.StreamID]Receipt{}},
		{"the hole filled", []any{
			sentEvent(1, stream(3, 0, 40, false)), sentEvent(2, stream(3, 40, 20, false)), sentEvent(3, stream(3, 60, 40, true)),
			ackEvent([2]int64{3, 3}, [2]int64{1, 1}), ackEvent([2]int64{2, 2}),
		}, map[quic.StreamID]Receipt{3: {Received: 1}}},
		{"two streams in one packet", []any{
			sentEvent(1, stream(3, 0, 100, true), stream(7, 0, 10, true), stream(11, 0, 5, true)), ackEvent([2]int64{0, 5}),
		}, map[quic.StreamID]Receipt{3: {Received: 1}, 7: {Received: 1}}},
		{"an ACK in a Handshake packet is not for 1-RTT packets", []any{
			sentEvent(1, stream(7, 0, 10, true)),
			qlog.PacketReceived{Header: qlog.PacketHeader{PacketType: qlog.PacketTypeHandshake}, Frames: []qlog.Frame{{Frame: &qlog.AckFrame{AckRanges: []qlog.AckRange{{Smallest: 1, Largest: 1}}}}}},
		}, map[quic.StreamID]Receipt{}},
		{"stopped by the subscriber before all of it was acknowledged", []any{
			sentEvent(1, stream(3, 0, 60, false)), sentEvent(2, stream(3, 60, 40, true)), ackEvent([2]int64{1, 1}),
			stopSendingEvent(3), ackEvent([2]int64{2, 2}),
		}, map[quic.StreamID]Receipt{3: {Lost: 1}}},
		{"stopped after it was acknowledged", []any{
			sentEvent(1, stream(7, 0, 10, true)), ackEvent([2]int64{1, 1}), stopSendingEvent(7),
		}, map[quic.StreamID]Receipt{7: {Received: 1}}},
		{"the connection ends first", []any{
			sentEvent(1, stream(3, 0, 100, true)), sentEvent(2, stream(7, 0, 10, true)), ackEvent([2]int64{2, 2}), "end",
			ackEvent([2]int64{1, 1}),
		}, map[quic.StreamID]Receipt{3: {Lost: 1}, 7: {Received: 1}}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var tr receiptTracker
			got := make(map[quic.StreamID]Receipt)
			for _, id := range []quic.StreamID{3, 7} {
				g := newReceiptGroup(func(r Receipt) {
					if _, again := got[id]; again {
						t.Errorf("stream %d settled twice", id)
					}
					got[id] = r
				})
				g.add()
				g.release() // the publisher's reference
				tr.watch(id, map[quic.StreamID]int64{3: 100, 7: 10}[id], g)
			}
			for _, e := range c.events {
				switch e := e.(type) {
				case string:
					tr.end()
				case qlog.PacketSent:
					tr.RecordEvent(e)
				case qlog.PacketReceived:
					tr.RecordEvent(e)
				case qlog.PacketLost:
					tr.RecordEvent(e)
				}
			}
			if len(got) != len(c.want) {
				t.Fatalf("settled %v, want %v", got, c.want)
			}
			for id, r := range c.want {
				if got[id] != r {
					t.Errorf("stream %d: %+v, want %+v", id, got[id], r)
				}
			}
			// What is settled is forgotten; the end forgets everything.
			if n := tr.awaiting(); n != 2-len(got) {
				t.Errorf("%d streams awaited, want %d", n, 2-len(got))
			}
		})
	}
}

// TestReceiptTrackerFreesPackets: a long run of acknowledged copies
// leaves nothing behind.
func TestReceiptTrackerFreesPackets(t *testing.T) {
	t.Parallel()
	var tr receiptTracker
	var received atomic.Int64
	for i := range 1000 {
		id := quic.StreamID(3 + 4*i)
		g := newReceiptGroup(func(r Receipt) { received.Add(int64(r.Received)) })
		g.add()
		g.release()
		tr.watch(id, 50, g)
		tr.RecordEvent(sentEvent(int64(2*i), stream(id, 0, 25, false)))
		tr.RecordEvent(sentEvent(int64(2*i+1), stream(id, 25, 25, true)))
		if i%3 == 2 {
			tr.RecordEvent(ackEvent([2]int64{0, int64(2*i + 1)}))
		}
	}
	tr.RecordEvent(ackEvent([2]int64{0, 2000}))
	if received.Load() != 1000 || tr.awaiting() != 0 || len(tr.packets) != 0 {
		t.Fatalf("received %d, %d streams awaited, %d packets kept; want 1000, 0, 0", received.Load(), tr.awaiting(), len(tr.packets))
	}
}

func receiptSetup(t *testing.T) (*Listener, *Publisher, *brokertest.UDPRelay, *Subscriber) {
	t.Helper()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/r")
	p.TrackReceipts()
	r := brokertest.NewUDPRelay(t, l.Addr().String())
	s, err := Dial(testCtx(t), "weida://"+l.Fingerprint()+"@"+r.Addr()+"/r", DialConfig{})
	if err != nil {
		t.Fatalf("Dial: %v", err)
	}
	t.Cleanup(func() { _ = s.Close() })
	subscribe(t, l, s, 1, "#")
	return l, p, r, s
}

// TestReceiptAfterPeerAck: with real quic-go connections on loopback, a
// copy is reported received only once the subscriber's QUIC stack has
// acknowledged it: not while its acknowledgements are held back, though
// the copy was written, sent and even read; and as soon as they pass.
func TestReceiptAfterPeerAck(t *testing.T) {
	t.Parallel()
	l, p, r, s := receiptSetup(t)
	rl := newReceiptLog()
	ctx := testCtx(t)

	res, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: []byte("before")}, nil, rl.done(0))
	if err != nil || res.Queued != 1 {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	receive(t, s)
	waitFor(t, "the first receipt", func() bool { return rl.len() == 1 })

	r.Mute(true) // the subscriber's ACKs no longer reach the listener
	if _, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: []byte("held")}, nil, rl.done(1)); err != nil {
		t.Fatal(err)
	}
	if m := receive(t, s); string(m.Payload) != "held" {
		t.Fatalf("received %q", m.Payload)
	}
	waitFor(t, "the copy to be written", func() bool { return l.Stats().CopiesWritten == 2 })
	time.Sleep(300 * time.Millisecond) // a dozen round trips and ACK delays on loopback
	if _, n := rl.of(1); n != 0 {
		t.Fatal("reported before the subscriber's acknowledgement reached the listener")
	}
	r.Mute(false)
	waitFor(t, "the second receipt", func() bool { return rl.len() == 2 })
	for i := range 2 {
		if rc, n := rl.of(i); n != 1 || rc != (Receipt{Received: 1}) {
			t.Errorf("message %d: %+v in %d calls, want one Received", i, rc, n)
		}
	}
	if p.l.receipts.Load() && trackerOfConns(l) != 0 {
		t.Errorf("%d streams still awaited", trackerOfConns(l))
	}
}

// trackerOfConns sums the streams the listener's connections await.
func trackerOfConns(l *Listener) int {
	l.mu.Lock()
	defer l.mu.Unlock()
	n := 0
	for sc := range l.conns {
		if sc.receipts != nil {
			n += sc.receipts.awaiting()
		}
	}
	return n
}

// TestReceiptVanishedSubscriber: copies sent to a subscriber that
// vanished (nothing it sends arrives any more) are reported lost once the
// listener notices its connection is gone; copies queued behind them too.
func TestReceiptVanishedSubscriber(t *testing.T) {
	t.Parallel()
	l, p, r, s := receiptSetup(t)
	rl := newReceiptLog()
	ctx := testCtx(t)
	r.Mute(true)
	r.Deafen(true)
	const copies = 50
	queued := 0
	for i := range copies {
		res, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: numbered(i, 2048)}, nil, rl.done(i))
		if err != nil {
			t.Fatal(err)
		}
		queued += res.Queued
	}
	if queued != copies {
		t.Fatalf("queued %d of %d", queued, copies)
	}
	waitFor(t, "the vanished subscriber to be noticed", func() bool { return l.Stats().Connections == 0 })
	waitFor(t, "every receipt", func() bool { return rl.len() == copies })
	for i := range copies {
		if rc, n := rl.of(i); n != 1 || rc != (Receipt{Lost: 1}) {
			t.Errorf("message %d: %+v in %d calls, want one Lost", i, rc, n)
		}
	}
	_ = s.Close()
}

// TestReceiptSubscriberKilled: a subscriber whose process is killed (its
// socket closed under it) after reading part of the copies: those it
// acknowledged are received, the rest lost, each reported once.
func TestReceiptSubscriberKilled(t *testing.T) {
	t.Parallel()
	l, p, _, s := receiptSetup(t)
	rl := newReceiptLog()
	ctx := testCtx(t)
	const before, copies = 10, 200
	for i := range before {
		if _, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: numbered(i, 64)}, nil, rl.done(i)); err != nil {
			t.Fatal(err)
		}
		receive(t, s)
	}
	waitFor(t, "the first receipts", func() bool { return rl.len() == before })
	_ = s.udp.Close() // the process is gone: no CONNECTION_CLOSE leaves
	for i := before; i < copies; i++ {
		if _, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: numbered(i, 4096)}, nil, rl.done(i)); err != nil {
			t.Fatal(err)
		}
	}
	waitFor(t, "the killed subscriber to be noticed", func() bool { return l.Stats().Connections == 0 })
	waitFor(t, "every receipt", func() bool { return rl.len() == copies })
	lost := 0
	for i := range copies {
		rc, n := rl.of(i)
		if n != 1 || rc.Received+rc.Lost != 1 {
			t.Errorf("message %d: %+v in %d calls", i, rc, n)
		}
		if i < before && rc.Received != 1 {
			t.Errorf("message %d, read before the kill: %+v", i, rc)
		}
		lost += rc.Lost
	}
	if lost == 0 {
		t.Error("no copy published after the kill was reported lost")
	}
}

// TestReceiptNothingQueued: without a matching subscriber, done is called
// at once with a zero Receipt; a failing publish never calls it.
func TestReceiptNothingQueued(t *testing.T) {
	t.Parallel()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/none")
	p.TrackReceipts()
	rl := newReceiptLog()
	if _, err := p.PublishWithReceipt(context.Background(), Message{Topic: "a"}, nil, rl.done(0)); err != nil {
		t.Fatal(err)
	}
	if rc, n := rl.of(0); n != 1 || rc != (Receipt{}) {
		t.Errorf("%+v in %d calls, want one zero Receipt", rc, n)
	}
	if _, err := p.PublishWithReceipt(context.Background(), Message{Topic: string(make([]byte, 300))}, nil, rl.done(1)); err == nil {
		t.Fatal("an over-long topic was published")
	}
	if _, n := rl.of(1); n != 0 {
		t.Error("done called for a failed publish")
	}
}

// TestReceiptTrackerCutsFront: an ACK of the oldest packets in flight
// removes them without moving the packets after them (the slice's array
// keeps its place), and the rest are still found and settled.
func TestReceiptTrackerCutsFront(t *testing.T) {
	t.Parallel()
	var tr receiptTracker
	var received atomic.Int64
	const copies = 100
	for i := range copies {
		id := quic.StreamID(3 + 4*i)
		g := newReceiptGroup(func(r Receipt) { received.Add(int64(r.Received)) })
		g.add()
		g.release()
		tr.watch(id, 10, g)
		tr.RecordEvent(sentEvent(int64(i), stream(id, 0, 10, true)))
	}
	last := &tr.packets[copies-1]
	tr.RecordEvent(ackEvent([2]int64{0, 9}))
	tr.RecordEvent(lostEvent(10))
	if len(tr.packets) != copies-11 || &tr.packets[len(tr.packets)-1] != last {
		t.Fatalf("%d packets kept, the last moved: %v; want %d in place", len(tr.packets), &tr.packets[len(tr.packets)-1] != last, copies-11)
	}
	// A hole: 50 and after acknowledged, 11..49 not yet.
	tr.RecordEvent(ackEvent([2]int64{50, 99}))
	tr.RecordEvent(ackEvent([2]int64{11, 49}))
	if received.Load() != copies-1 || len(tr.packets) != 0 || tr.awaiting() != 1 {
		t.Fatalf("received %d, %d packets kept, %d awaited; want %d, 0, 1", received.Load(), len(tr.packets), tr.awaiting(), copies-1)
	}
}

// TestReceiptTrackerPrunesUnreportedLosses: quic-go declares some packets
// lost without a PacketLost event (a PTO probe, a path migration). Their
// entries carry data of streams a retransmission completed since; the
// tracker drops them once its packets reach the pruning threshold, and
// keeps those of streams still awaited.
func TestReceiptTrackerPrunesUnreportedLosses(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		// copies are sent, each in one packet, lost without an event
		// and sent again in a packet that is acknowledged; open streams
		// are then watched and sent, and never acknowledged.
		copies, open int
		wantMax      int // packets the tracker may hold at the end
	}{
		{"few losses, under the threshold", 10, 0, 10},
		{"many losses, every stream settled", 10_000, 0, minCompactAt},
		{"many losses, some streams open", 10_000, 300, 2 * 300},
		{"open streams alone are all kept", 0, 1000, 1000},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			var tr receiptTracker
			var received, lost atomic.Int64
			pn := int64(0)
			watch := func(id quic.StreamID) {
				g := newReceiptGroup(func(r Receipt) { received.Add(int64(r.Received)); lost.Add(int64(r.Lost)) })
				g.add()
				g.release()
				tr.watch(id, 10, g)
			}
			id := quic.StreamID(3)
			for range c.copies {
				watch(id)
				tr.RecordEvent(sentEvent(pn, stream(id, 0, 10, true))) // lost unreported
				tr.RecordEvent(sentEvent(pn+1, stream(id, 0, 10, true)))
				tr.RecordEvent(ackEvent([2]int64{pn + 1, pn + 1}))
				pn += 2
				id += 4
			}
			for range c.open {
				watch(id)
				tr.RecordEvent(sentEvent(pn, stream(id, 0, 10, true)))
				pn++
				id += 4
			}
			if int(received.Load()) != c.copies || tr.awaiting() != c.open {
				t.Fatalf("received %d, %d awaited; want %d, %d", received.Load(), tr.awaiting(), c.copies, c.open)
			}
			if len(tr.packets) > max(c.wantMax, c.open) || len(tr.packets) < c.open {
				t.Fatalf("%d packets kept; want %d to %d", len(tr.packets), c.open, max(c.wantMax, c.open))
			}
			// What was kept still settles its streams.
			tr.RecordEvent(ackEvent([2]int64{0, pn}))
			if tr.awaiting() != 0 || len(tr.packets) != 0 || int(received.Load()) != c.copies+c.open || lost.Load() != 0 {
				t.Fatalf("after the last ACK: received %d, lost %d, %d awaited, %d packets", received.Load(), lost.Load(), tr.awaiting(), len(tr.packets))
			}
		})
	}
}

// TestTrackReceiptsClosesUntracked: subscribers that connected before a
// publisher of the listener began tracking receipts, on its path or
// another, are closed with SHUTDOWN, since nothing records what they
// acknowledge; once they dial again they are tracked, and their copies
// wait for their acknowledgement.
func TestTrackReceiptsClosesUntracked(t *testing.T) {
	t.Parallel()
	var logs logBuffer
	l := listen(t, ListenConfig{Logger: logs.logger()})
	p := publisher(t, l, "/r")
	publisher(t, l, "/other")
	before := dial(t, l, "/r", DialConfig{})
	other := dial(t, l, "/other", DialConfig{})
	subscribe(t, l, before, 1, "#")
	subscribe(t, l, other, 2, "#")

	p.TrackReceipts()
	ctx := testCtx(t)
	for _, s := range []*Subscriber{before, other} {
		select {
		case <-s.Done():
		case <-ctx.Done():
			t.Fatal("a subscriber accepted before tracking began is still connected")
		}
		var ce *CloseError
		if !errors.As(s.Err(), &ce) || ce.Code != Shutdown || !ce.Remote {
			t.Fatalf("ended with %v, want a remote SHUTDOWN", s.Err())
		}
	}
	if !strings.Contains(logs.String(), "before receipt tracking began") {
		t.Errorf("the closes were not logged:\n%s", logs.String())
	}
	waitFor(t, "the closed connections forgotten", func() bool { return l.Stats().Connections == 0 })

	after := dial(t, l, "/r", DialConfig{})
	subscribe(t, l, after, 1, "#")
	l.mu.Lock()
	for sc := range l.conns {
		if sc.receipts == nil {
			t.Error("a connection accepted after tracking began has no tracker")
		}
	}
	l.mu.Unlock()
	rl := newReceiptLog()
	if _, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: []byte("x")}, nil, rl.done(0)); err != nil {
		t.Fatal(err)
	}
	receive(t, after)
	waitFor(t, "the receipt", func() bool { return rl.len() == 1 })
	if rc, n := rl.of(0); n != 1 || rc != (Receipt{Received: 1}) {
		t.Errorf("%+v in %d calls, want one Received", rc, n)
	}
	if after.Err() != nil {
		t.Fatalf("the tracked subscriber was closed: %v", after.Err())
	}
}

// TestReceiptSlowConsumerClosed: on a connection that tracks receipts, a
// subscriber that stops reading holds its stream credit, or its
// flow-control credit, and the copies queued behind them would never be
// sent nor their receipts come, though none is refused (its buffer has
// room). Its writer waits SlowConsumerAfter for the credit and then
// closes it as a slow consumer; every receipt arrives, Lost for the
// copies it never got.
func TestReceiptSlowConsumerClosed(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name    string
		limits  Limits // the subscriber's
		payload int
		held    int // copies the subscriber can hold unread
	}{
		{"stream credit", Limits{MaxConcurrentUniStreams: 4}, 256, 4},
		{"flow-control credit", Limits{StreamReceiveWindow: 64 << 10, ConnectionReceiveWindow: 64 << 10}, 16 << 10, 4},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			testReceiptSlowConsumerClosed(t, c.limits, c.payload, c.held)
		})
	}
}

func testReceiptSlowConsumerClosed(t *testing.T, limits Limits, payload, held int) {
	const after = 250 * time.Millisecond
	var logs logBuffer
	l := listen(t, ListenConfig{Logger: logs.logger(), Limits: Limits{SlowConsumerAfter: after}})
	p := publisher(t, l, "/r")
	p.TrackReceipts()
	slow := dial(t, l, "/r", DialConfig{Limits: limits})
	subscribe(t, l, slow, 1, "#")
	rl := newReceiptLog()
	ctx := testCtx(t)
	copies := 3 * held
	start := time.Now()
	for i := range copies {
		res, err := p.PublishWithReceipt(ctx, Message{Topic: "a", Payload: numbered(i, payload)}, nil, rl.done(i))
		if err != nil || res.Queued != 1 {
			t.Fatalf("publish %d: %+v, %v", i, res, err)
		}
	}
	select {
	case <-slow.Done():
	case <-ctx.Done():
		t.Fatalf("the subscriber that stopped reading was never closed: %+v", l.Stats())
	}
	took := time.Since(start)
	var ce *CloseError
	if !errors.As(slow.Err(), &ce) || ce.Code != LimitExceeded || !ce.Remote {
		t.Fatalf("ended with %v, want a remote LIMIT_EXCEEDED", slow.Err())
	}
	// The bound cannot trip early; the upper limit is generous for a
	// loaded machine and far below the test's own timeout.
	if took < after || took > after+5*time.Second {
		t.Errorf("closed %v after the first publish; want between %v and %v", took, after, after+5*time.Second)
	}
	waitFor(t, "every receipt", func() bool { return rl.len() == copies })
	received := 0
	for i := range copies {
		rc, n := rl.of(i)
		if n != 1 || rc.Received+rc.Lost != 1 {
			t.Fatalf("message %d: %+v in %d calls, want one receipt of one copy", i, rc, n)
		}
		if rc.Received == 1 {
			if i != received {
				t.Errorf("message %d received after a lost one", i)
			}
			received++
		}
	}
	if received > held {
		t.Errorf("%d received, %d lost; want at most %d received, what it can hold", received, copies-received, held)
	}
	waitFor(t, "the connection forgotten", func() bool { return l.Stats().Connections == 0 })
	if st := l.Stats(); st.SlowConsumersClosed != 1 || st.Dropped.BufferFull != 0 {
		t.Errorf("SlowConsumersClosed = %d, BufferFull = %d; want 1 and 0", st.SlowConsumersClosed, st.Dropped.BufferFull)
	}
	if !strings.Contains(logs.String(), "closing slow consumer: "+stallCreditWithheld) {
		t.Errorf("the close was not logged with its cause:\n%s", logs.String())
	}
	t.Logf("closed after %v; %d received, %d lost", took.Round(time.Millisecond), received, copies-received)
}
