package bench

import (
	"context"
	"sync/atomic"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"
)

// Packets counts the 1-RTT QUIC packets one end of a rig sent in a sample
// ([Options.CountPackets]), by what they carried. On loopback nothing is
// lost, so what one end sent is what the other received.
type Packets struct {
	Sent  int64 // packets
	Bytes int64 // their length on the wire, headers and AEAD tags included
	// Streams counts those carrying STREAM frames: copies, or a
	// subscriber's SUBSCRIBE and probes.
	Streams int64
	// AckOnly counts those carrying ACK frames and nothing else: what a
	// receiver sends for copies, and what either end sends for the other's
	// acknowledged control frames.
	AckOnly int64
	// PingOnly counts those carrying a PING and no STREAM frame: QUIC
	// keep-alives and probe timeouts' probes.
	PingOnly int64
	// MaxStreams counts MAX_STREAMS frames: new stream credit, which a
	// receiver grants as it consumes streams, and which the other end must
	// acknowledge.
	MaxStreams int64
}

// packetCounter counts the packets of one end of a rig. It is a
// [weida.QUICTracer] trace and recorder at once, shared by every
// connection of that end.
type packetCounter struct {
	sent, bytes, streams, ackOnly, pingOnly, maxStreams atomic.Int64
}

// packetCounters are a rig's two ends' counters; nil when the rig does not
// count.
type packetCounters struct{ endpoint, receiver packetCounter }

func (c *packetCounters) snapshot() (endpoint, receiver Packets) {
	if c == nil {
		return
	}
	return c.endpoint.load(), c.receiver.load()
}

// tracer is the QUIC tracer of the rig's connections: the dialling side
// is the receivers' in both rigs.
func (c *packetCounters) tracer(_ context.Context, isClient bool, _ quic.ConnectionID) qlogwriter.Trace {
	if isClient {
		return &c.receiver
	}
	return &c.endpoint
}

func (c *packetCounter) load() Packets {
	return Packets{
		Sent: c.sent.Load(), Bytes: c.bytes.Load(), Streams: c.streams.Load(),
		AckOnly: c.ackOnly.Load(), PingOnly: c.pingOnly.Load(), MaxStreams: c.maxStreams.Load(),
	}
}

func (c *packetCounter) AddProducer() qlogwriter.Recorder { return c }
func (c *packetCounter) Close() error                     { return nil }

// RecordEvent implements qlogwriter.Recorder: it counts sent 1-RTT packets
// (the handshake's are not part of any sample).
func (c *packetCounter) RecordEvent(ev qlogwriter.Event) {
	e, ok := ev.(qlog.PacketSent)
	if !ok || e.Header.PacketType != qlog.PacketType1RTT {
		return
	}
	c.sent.Add(1)
	c.bytes.Add(int64(e.Raw.Length))
	var stream, ping, other bool
	for _, f := range e.Frames {
		switch f.Frame.(type) {
		case *qlog.AckFrame:
		case *qlog.StreamFrame:
			stream = true
		case *qlog.PingFrame:
			ping = true
		case *qlog.MaxStreamsFrame:
			c.maxStreams.Add(1)
			other = true
		default:
			other = true
		}
	}
	switch {
	case stream:
		c.streams.Add(1)
	case ping:
		c.pingOnly.Add(1)
	case !other:
		c.ackOnly.Add(1)
	}
}

// sub returns p - q, field by field.
func (p Packets) sub(q Packets) Packets {
	return Packets{
		Sent: p.Sent - q.Sent, Bytes: p.Bytes - q.Bytes, Streams: p.Streams - q.Streams,
		AckOnly: p.AckOnly - q.AckOnly, PingOnly: p.PingOnly - q.PingOnly, MaxStreams: p.MaxStreams - q.MaxStreams,
	}
}
