package weida

import "weida.dev/connector/weida/topic"

// A Replayer supplies what a new subscription receives before live
// traffic: typically the last message of each topic its filter selects,
// from a cache the publishing side keeps (weida itself keeps nothing for
// late subscribers). Install one with [Publisher.SetReplayer].
type Replayer interface {
	// Replay calls yield once for each message the subscription to filter
	// (a valid filter, see [topic.ValidateFilter]) is to receive, until
	// yield returns false (the connection is closing: stop). Messages
	// whose Topic filter does not match are skipped, so a faulty Replayer
	// cannot leak a topic nobody asked for. yield copies what it needs
	// before it returns, as [Publisher.Publish] does. Each copy carries
	// the replay marks (extension keys of DATA, see docs/WEIDA.md): the
	// listener marks it replayed, and writes the Age (when HasAge) and
	// Stale the message's Replay holds.
	//
	// Replay runs on the goroutine that handles the subscriber's
	// SUBSCRIBE, while the path's fan-out is held (see
	// [Publisher.PublishWith]): Publish calls on the path wait for it to
	// return, so it must not call them (it would deadlock) and should
	// not block on anything else.
	Replay(filter string, yield func(Message) bool)
}

// SetReplayer makes r supply the replay of every later SUBSCRIBE on the
// publisher's path; nil stops replaying. The replay of one SUBSCRIBE goes
// to the subscribing connection alone, and is queued on it before any live
// copy published after the SUBSCRIBE took effect: for each topic T, no live
// copy of T published after the subscription was added is queued on that
// connection ahead of the replayed copy of T.
//
// What the subscriber sees follows from weida's per-copy streams (PROTOCOL
// §9.5): copies are written in queue order, one uni stream each, but
// nothing orders streams at the receiver, so a replayed copy of T may
// still be read after a live copy of T when the network reorders them.
// A receiver that needs the latest value must compare what the payload
// says (a timestamp or sequence), as with any two weida copies.
//
// Replayed copies are charged to the connection's buffer like live ones: a
// replay larger than Limits.SubscriberBufferBytes has its excess dropped
// and counted in [ListenerStats].Dropped as OwnReplay, as are the live
// copies that find the buffer still taken by replayed ones; the replay of
// a SUBSCRIBE already held (a repeated one) does not happen. A connection
// gets at most Limits.ReplayBurst replays at once and one more per
// Limits.ReplayInterval: a SUBSCRIBE beyond that is applied without a
// replay and counted in [ListenerStats].ReplaysLimited. A connection holding
// several filters receives a replayed copy per SUBSCRIBE whose filter
// matches, where live traffic sends it one copy per message.
//
// Subscriptions made before SetReplayer, including those held for the path
// while no publisher had it, are not replayed. After [Publisher.Close]
// nothing is replayed.
//
// While a Replayer is set, the HELLO of every connection the listener
// accepts advertises it: extension key 64 (wire.HelloLastValue), version 1,
// listing the listener's replaying paths, which a subscriber reads with
// [Subscriber.PeerReplays]. Connections accepted before SetReplayer were
// told nothing, as they are replayed nothing.
func (p *Publisher) SetReplayer(r Replayer) {
	ps := p.ps
	ps.fan.Lock()
	defer ps.fan.Unlock()
	// A publisher closed meanwhile no longer owns the path: its late call
	// must not replace what its successor set.
	if p.closed.Load() {
		return
	}
	ps.replay, ps.replayPub = r, p
	if r != nil {
		ps.advertised.Store(p)
	} else {
		ps.advertised.Store(nil)
	}
}

// replay queues the copies the path's Replayer supplies for filter, just
// added for sc. ps.fan must be held for writing.
func (sc *serverConn) replay(ps *pathState, filter string) {
	r := ps.replay
	if r == nil || ps.replayPub.closed.Load() {
		return
	}
	l := sc.l
	if !sc.replays.Allow() {
		// The subscription stands: only its replay is withheld (see
		// Limits.ReplayBurst).
		l.stats.replaysLimited.Add(1)
		l.warn.warn("replay-limited", "weida: SUBSCRIBE not replayed: the connection used up its replays",
			"remote", sc.c.qc.RemoteAddr().String(), "path", ps.path, "filter", filter,
			"replay_burst", l.limits.ReplayBurst, "replay_interval", l.limits.ReplayInterval)
		return
	}
	r.Replay(filter, func(m Message) bool {
		if sc.c.ctx.Err() != nil {
			return false
		}
		if !topic.Match(filter, m.Topic) {
			return true
		}
		// The mark that it is replayed is the listener's, whatever the
		// Replayer set; age and staleness are the Replayer's to know.
		m.Replay.Replayed = true
		f, err := l.frames.encode(ps.path, &m, m.Replay.marks())
		if err != nil {
			l.log.Warn("weida: replay: skipping a message weida cannot send", "path", ps.path, "topic", m.Topic, "err", err)
			return true
		}
		// A replayed copy lost after queueing is the publisher's to count,
		// as a live one is.
		f.pub = ps.replayPub
		f.replayed = true
		if f.queuedCharge() > l.limits.SubscriberBufferBytes {
			l.stats.dropped.ownReplay.Add(1)
		} else if sc.enqueue(f) == pushOK {
			l.stats.copiesReplayed.Add(1)
		}
		f.release()
		return true
	})
}
