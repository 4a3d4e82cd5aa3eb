package bench

import (
	"context"
	"sync/atomic"

	"github.com/quic-go/quic-go"
	"github.com/quic-go/quic-go/qlog"
	"github.com/quic-go/quic-go/qlogwriter"

	"weida.dev/connector/weida"
)

// Packets counts the 1-RTT QUIC packets one end of a rig sent in a sample
// ([Options.CountPackets]), by what they carried, and the packets that end
// declared lost: what one end sent and did not declare lost is what the
// other received.
type Packets struct {
	Sent  int64 // packets
	Bytes int64 // their length on the wire, headers and AEAD tags included
	// WithStream counts those carrying STREAM frames: copies, or a
	// subscriber's SUBSCRIBE and probes.
	WithStream int64
	// AckOnly counts those carrying ACK frames and nothing else: what a
	// receiver sends for copies, and what either end sends for the other's
	// ack-eliciting packets that carry no copy.
	AckOnly int64
	// PingNoStream counts those carrying a PING and no STREAM frame:
	// QUIC keep-alives, probe-timeout probes and path MTU probes, alone or
	// beside control frames.
	PingNoStream int64
	// MaxStreams counts MAX_STREAMS frames (not packets): new stream
	// credit, which a receiver grants as it is done with streams, and which
	// the other end must acknowledge.
	MaxStreams int64
	// Lost counts the packets this end declared lost.
	Lost int64
}

// endCounter counts the packets of one end of a rig. It is a
// [weida.QUICTracer] trace and recorder at once, shared by every
// connection of that end. Its fields are read one at a time, so a packet
// recorded during a snapshot may be in some of them and not yet in others.
type endCounter struct {
	sent, bytes, withStream, ackOnly, pingNoStream, maxStreams, lost atomic.Int64
}

// rigCounters are a rig's two ends' counters; nil when the rig does not
// count.
type rigCounters struct{ endpoint, receiver endCounter }

// newRigCounters returns the counters of a rig built with opts, or nil
// when it does not count.
func newRigCounters(opts Options) *rigCounters {
	if !opts.CountPackets {
		return nil
	}
	return new(rigCounters)
}

// quicTracer is the tracer of the rig's connections, or nil (no tracing,
// which costs quic-go nothing) when the rig does not count.
func (c *rigCounters) quicTracer() weida.QUICTracer {
	if c == nil {
		return nil
	}
	return c.tracer
}

func (c *rigCounters) snapshot() (endpoint, receiver Packets) {
	if c == nil {
		return
	}
	return c.endpoint.load(), c.receiver.load()
}

// tracer is the QUIC tracer of the rig's connections: the dialling side
// is the receivers' in both rigs.
func (c *rigCounters) tracer(_ context.Context, isClient bool, _ quic.ConnectionID) qlogwriter.Trace {
	if isClient {
		return &c.receiver
	}
	return &c.endpoint
}

func (c *endCounter) load() Packets {
	return Packets{
		Sent: c.sent.Load(), Bytes: c.bytes.Load(), WithStream: c.withStream.Load(), AckOnly: c.ackOnly.Load(),
		PingNoStream: c.pingNoStream.Load(), MaxStreams: c.maxStreams.Load(), Lost: c.lost.Load(),
	}
}

func (c *endCounter) AddProducer() qlogwriter.Recorder { return c }
func (c *endCounter) Close() error                     { return nil }

// RecordEvent implements qlogwriter.Recorder: it counts sent and lost
// 1-RTT packets (the handshake's are in no sample).
func (c *endCounter) RecordEvent(ev qlogwriter.Event) {
	switch e := ev.(type) {
	case qlog.PacketLost:
		if e.Header.PacketType == qlog.PacketType1RTT {
			c.lost.Add(1)
		}
	case qlog.PacketSent:
		if e.Header.PacketType == qlog.PacketType1RTT {
			c.sent.Add(1)
			c.bytes.Add(int64(e.Raw.Length))
			c.classify(e.Frames)
		}
	}
}

// classify counts one sent packet by the frames it carried.
func (c *endCounter) classify(frames []qlog.Frame) {
	var stream, ping, other bool
	for _, f := range frames {
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
		c.withStream.Add(1)
	case ping:
		c.pingNoStream.Add(1)
	case !other:
		c.ackOnly.Add(1)
	}
}

// sub returns p - q, field by field.
func (p Packets) sub(q Packets) Packets {
	return Packets{
		Sent: p.Sent - q.Sent, Bytes: p.Bytes - q.Bytes, WithStream: p.WithStream - q.WithStream, AckOnly: p.AckOnly - q.AckOnly,
		PingNoStream: p.PingNoStream - q.PingNoStream, MaxStreams: p.MaxStreams - q.MaxStreams, Lost: p.Lost - q.Lost,
	}
}
