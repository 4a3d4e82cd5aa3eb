package weida

import (
	"context"
	"time"

	"weida.dev/connector/weida/wire"
)

// probePadding is the size of the extension value a probe carries. The
// probe must draw a stateless reset from a restarted publisher, and quic-go
// answers no packet of protocol.MinStatelessResetSize (42) bytes or less,
// lest two endpoints trade resets forever. A keep-alive PING packet stays
// below that; a short SUBSCRIBE (path "/", filter "") may too. 32 bytes of
// padding plus the 16-byte AEAD tag alone pass it, whatever the filter.
const probePadding = 32

// probe sends a liveness probe after every probeAfter in which the
// connection received no packet at all, until the connection ends or
// Shutdown begins. Any packet counts, a keep-alive PING included: this is
// about the publisher process being there, not about copies.
func (s *Subscriber) probe() {
	tick := time.NewTicker(max(s.probeAfter/4, time.Millisecond))
	defer tick.Stop()
	seen := s.c.qc.ConnectionStats().PacketsReceived
	quietSince := time.Now()
	for {
		select {
		case <-s.c.ctx.Done():
			return
		case <-s.stopProbe:
			return
		case now := <-tick.C:
			if n := s.c.qc.ConnectionStats().PacketsReceived; n != seen {
				seen, quietSince = n, now
				continue
			}
			if now.Sub(quietSince) < s.probeAfter {
				continue
			}
			quietSince = now
			s.sendProbe()
		}
	}
}

// sendProbe re-sends the SUBSCRIBE of one held filter, padded with an
// extension key. Both halves are what PROTOCOL allows any subscriber:
// §6.4 makes a SUBSCRIBE for a filter already held on that connection and
// path idempotent (so the publisher's subscriptions do not change, and a
// publisher that replays to new subscriptions, as Publisher.SetReplayer
// does here, replays nothing), and §5 reserves keys 0-63 and makes every
// decoder skip an unknown key, so key 64 adds bytes and no meaning. With no
// filter held nothing is sent: such a subscriber expects nothing, and an
// UNSUBSCRIBE of some filter instead could race a later Subscribe of it.
func (s *Subscriber) sendProbe() {
	s.orderMu.Lock()
	defer s.orderMu.Unlock()
	if s.shutting.Load() {
		return
	}
	filter, ok := "", false
	s.subMu.Lock()
	for f := range s.filters {
		filter, ok = f, true
		break
	}
	s.subMu.Unlock()
	if !ok {
		return
	}
	// A dead publisher leaves the probe unacknowledged; bound how long it
	// may hold orderMu should QUIC make the write wait.
	ctx, cancel := context.WithTimeout(s.c.ctx, s.probeAfter)
	defer cancel()
	// Counted once written: on loopback the reset a probe draws from a
	// restarted publisher can end the connection before the stream's
	// Close returns.
	if err := s.sendSubscription(ctx, wire.KindSubscribe, filter, probePadding, func() { s.probes.Add(1) }); err != nil {
		s.log.Debug("weida: liveness probe not completed", "err", err)
	}
}
