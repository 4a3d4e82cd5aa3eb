package weida

import "sync/atomic"

// ListenerStats is a snapshot of a [Listener]'s counters. Counters named
// for events only grow; Connections and Subscriptions are current values.
type ListenerStats struct {
	Connections         int    // open connections
	ConnectionsAccepted uint64 // connections admitted after the handshake
	ConnectionsRefused  uint64 // closed at once: the sum of RefusedBy
	// RefusedBy counts ConnectionsRefused by reason.
	RefusedBy      ConnectionRefusals
	ClientsRefused uint64 // TLS handshakes refused by ClientFingerprints: no client certificate, one not listed, or a listed one whose key the client did not prove
	Subscriptions  int64  // (path, filter) pairs held, over all connections

	Published     uint64 // Publish calls that reached fan-out
	CopiesQueued  uint64 // copies accepted into a connection's send queue
	CopiesWritten uint64 // copies written to their stream and finished with FIN
	CopiesRefused uint64 // copies the subscriber stopped with STOP_SENDING
	// CopiesUnconfirmed counts written copies (among CopiesWritten) whose
	// connection then vanished within the unconfirmed window: delivered
	// or not, nobody can tell (see [Publisher.OnCopiesUnconfirmed]).
	CopiesUnconfirmed uint64
	// CopiesReplayed counts copies a [Replayer] supplied that were queued
	// for a new subscription; they are not in CopiesQueued.
	CopiesReplayed uint64
	// ReplaysLimited counts SUBSCRIBEs applied without their replay:
	// their connection had used up its replays (Limits.ReplayBurst).
	ReplaysLimited uint64
	Dropped        DropCounts

	StreamsParked       uint64 // streams that arrived before the peer's HELLO and waited for it
	StreamsRefused      uint64 // streams refused per PROTOCOL §9.4 (UNSUPPORTED, UNKNOWN_ENDPOINT; REJECTED for a SUBSCRIBE outside its scopes)
	ProtocolViolations  uint64 // connections closed with PROTOCOL_VIOLATION
	NegotiationFailures uint64 // connections closed with NEGOTIATION_FAILED (incl. hello_timeout)
	// SlowConsumersClosed counts subscriber connections closed with
	// LIMIT_EXCEEDED by the slow-consumer policy (Limits.SlowConsumerAfter).
	SlowConsumersClosed uint64
	// Scopes counts, per path that [Listener.SetScopes] has restricted
	// (at zero from then on), the SUBSCRIBEs refused and the
	// subscriptions revoked; nil while no path was ever restricted.
	Scopes map[string]ScopeStats
}

// ConnectionRefusals counts the connections a listener closed at once
// after their handshake, by the reason their CONNECTION_CLOSE gives.
type ConnectionRefusals struct {
	MaxConnections        uint64 // the listener held Limits.MaxConnections
	MaxConnectionsPerPeer uint64 // the client fingerprint held Limits.MaxConnectionsPerPeer
	MaxConnectionsPerAddr uint64 // the source address held Limits.MaxConnectionsPerAddress
	Closing               uint64 // the listener was closing, or the connection predates receipt tracking
}

// DropCounts counts copies that were matched but not sent, by reason.
type DropCounts struct {
	BufferFull       uint64 // the subscriber's queued bytes would exceed subscriber_buffer_bytes
	HeaderTooLarge   uint64 // the header exceeds the subscriber's advertised max_header_bytes
	ConnectionClosed uint64 // the connection closed before the copy was written
	// OwnReplay counts copies that did not fit a subscriber's buffer
	// because of a replay that subscriber asked for: a replayed copy
	// itself, or a live copy arriving while replayed copies were still
	// queued for it. Its own SUBSCRIBEs filled its buffer, so these are
	// not in BufferFull, which stays a measure of subscribers too slow
	// for the traffic.
	OwnReplay uint64
}

// Total is the sum of every reason.
func (d DropCounts) Total() uint64 {
	return d.BufferFull + d.HeaderTooLarge + d.ConnectionClosed + d.OwnReplay
}

type dropCounters struct {
	bufferFull, headerTooLarge, connectionClosed, ownReplay atomic.Uint64
}

type listenerCounters struct {
	connectionsAccepted, connectionsRefused atomic.Uint64
	clientsRefused                          atomic.Uint64
	subscriptions                           atomic.Int64
	published, copiesQueued                 atomic.Uint64
	copiesWritten, copiesRefused            atomic.Uint64
	copiesUnconfirmed                       atomic.Uint64
	copiesReplayed, replaysLimited          atomic.Uint64
	refusedMax, refusedPerPeer              atomic.Uint64
	refusedPerAddr, refusedClosing          atomic.Uint64
	dropped                                 dropCounters
	streamsParked, streamsRefused           atomic.Uint64
	protocolViolations, negotiationFailures atomic.Uint64
	slowConsumersClosed                     atomic.Uint64
}

// Stats returns a snapshot of the listener's counters. The fields are read
// one by one, so a snapshot taken under load need not add up exactly.
func (l *Listener) Stats() ListenerStats {
	l.mu.Lock()
	conns := len(l.conns)
	scopes := l.scopeStatsLocked()
	l.mu.Unlock()
	c := &l.stats
	return ListenerStats{
		Connections:         conns,
		ConnectionsAccepted: c.connectionsAccepted.Load(),
		ConnectionsRefused:  c.connectionsRefused.Load(),
		RefusedBy: ConnectionRefusals{
			MaxConnections:        c.refusedMax.Load(),
			MaxConnectionsPerPeer: c.refusedPerPeer.Load(),
			MaxConnectionsPerAddr: c.refusedPerAddr.Load(),
			Closing:               c.refusedClosing.Load(),
		},
		ClientsRefused:    c.clientsRefused.Load(),
		Subscriptions:     c.subscriptions.Load(),
		Published:         c.published.Load(),
		CopiesQueued:      c.copiesQueued.Load(),
		CopiesWritten:     c.copiesWritten.Load(),
		CopiesRefused:     c.copiesRefused.Load(),
		CopiesUnconfirmed: c.copiesUnconfirmed.Load(),
		CopiesReplayed:    c.copiesReplayed.Load(),
		ReplaysLimited:    c.replaysLimited.Load(),
		Dropped: DropCounts{
			BufferFull:       c.dropped.bufferFull.Load(),
			HeaderTooLarge:   c.dropped.headerTooLarge.Load(),
			ConnectionClosed: c.dropped.connectionClosed.Load(),
			OwnReplay:        c.dropped.ownReplay.Load(),
		},
		StreamsParked:       c.streamsParked.Load(),
		StreamsRefused:      c.streamsRefused.Load(),
		ProtocolViolations:  c.protocolViolations.Load(),
		NegotiationFailures: c.negotiationFailures.Load(),
		SlowConsumersClosed: c.slowConsumersClosed.Load(),
		Scopes:              scopes,
	}
}

// refused counts a connection admit closed at once for reason.
func (c *listenerCounters) refused(reason string) {
	c.connectionsRefused.Add(1)
	switch reason {
	case RefusedMaxConnections:
		c.refusedMax.Add(1)
	case RefusedMaxConnectionsPerPeer:
		c.refusedPerPeer.Add(1)
	case RefusedMaxConnectionsPerAddr:
		c.refusedPerAddr.Add(1)
	default:
		c.refusedClosing.Add(1)
	}
}
