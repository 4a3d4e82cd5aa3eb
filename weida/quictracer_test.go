package weida

import (
	"context"
	"sync/atomic"
	"testing"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// streamPackets counts the 1-RTT packets that carry STREAM frames, sent
// and received, of the connections it traces.
type streamPackets struct{ sent, received atomic.Int64 }

func (c *streamPackets) tracer(context.Context, bool, quic.ConnectionID) qlogwriter.Trace {
	return c
}

func (c *streamPackets) AddProducer() qlogwriter.Recorder { return c }
func (c *streamPackets) Close() error                     { return nil }

func (c *streamPackets) RecordEvent(ev qlogwriter.Event) {
	count := func(h qlog.PacketHeader, frames []qlog.Frame, n *atomic.Int64) {
		if h.PacketType != qlog.PacketType1RTT {
			return
		}
		for _, f := range frames {
			if _, ok := f.Frame.(*qlog.StreamFrame); ok {
				n.Add(1)
				return
			}
		}
	}
	switch e := ev.(type) {
	case qlog.PacketSent:
		count(e.Header, e.Frames, &c.sent)
	case qlog.PacketReceived:
		count(e.Header, e.Frames, &c.received)
	}
}

// TestQUICTracer: a QUICTracer sees the packets of the connections it is
// set for, on either side, and on a listener that tracks receipts it
// shares the events with the receipts' trace, whose receipt still comes.
func TestQUICTracer(t *testing.T) {
	t.Parallel()
	var atListener, atSubscriber streamPackets
	l := listen(t, ListenConfig{TrackReceipts: true, QUICTracer: atListener.tracer})
	p := publisher(t, l, "/q")
	s := dial(t, l, "/q", DialConfig{QUICTracer: atSubscriber.tracer})
	subscribe(t, l, s, 1, "#")

	rl := newReceiptLog()
	if res, err := p.PublishWithReceipt(testCtx(t), Message{Topic: "a", Payload: []byte("x")}, nil, rl.done(0)); err != nil || res.Queued != 1 {
		t.Fatalf("publish: %+v, %v", res, err)
	}
	receive(t, s)
	waitFor(t, "the receipt", func() bool { return rl.len() == 1 })
	if rc, _ := rl.of(0); rc != (Receipt{Received: 1}) {
		t.Errorf("receipt %+v, want one Received", rc)
	}
	// The subscriber's SUBSCRIBE went one way, the copy the other.
	if atListener.sent.Load() == 0 || atListener.received.Load() == 0 {
		t.Errorf("listener's tracer saw %d sent and %d received packets with streams, want both > 0",
			atListener.sent.Load(), atListener.received.Load())
	}
	if atSubscriber.sent.Load() == 0 || atSubscriber.received.Load() == 0 {
		t.Errorf("subscriber's tracer saw %d sent and %d received packets with streams, want both > 0",
			atSubscriber.sent.Load(), atSubscriber.received.Load())
	}
}
