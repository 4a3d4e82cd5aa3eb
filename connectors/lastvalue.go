package connectors

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"weida.dev/connector/weida"
	"weida.dev/connector/weida/topic"
)

// LastValueMode says which messages of an inbound resource update its
// last-value cache.
type LastValueMode string

const (
	// LastValueOff keeps no cache: late weida subscribers get live
	// traffic only.
	LastValueOff LastValueMode = ""
	// LastValueRetained caches what the broker itself keeps for late
	// subscribers: MQTT retained messages (an empty one deletes its
	// topic), and with JetStream every message of the stream (seeded
	// with the last message per subject at start).
	LastValueRetained LastValueMode = "retained"
	// LastValueAll caches every message bridged, whatever the broker
	// keeps. It is the only mode that caches anything for core NATS and
	// AMQP, whose brokers keep nothing for late subscribers.
	LastValueAll LastValueMode = "all"
)

// Defaults of [LastValue]'s bounds.
const (
	DefaultLastValueTopics = 10000
	DefaultLastValueBytes  = 64 << 20
)

// LastValue configures an inbound resource's last-value cache: the last
// message of each weida topic the resource bridged, replayed to every new
// weida subscription whose filter selects it, before live traffic. The zero
// value keeps no cache.
type LastValue struct {
	Mode LastValueMode
	// MaxTopics bounds the topics cached; zero means
	// [DefaultLastValueTopics]. Beyond it the topic updated longest ago
	// is evicted and counted under [EvictMaxTopics].
	MaxTopics int
	// MaxBytes bounds the bytes cached (topics, payloads and metadata);
	// zero means [DefaultLastValueBytes]. Beyond it topics are evicted,
	// the one updated longest ago first, and counted under
	// [EvictMaxBytes]; a single message larger than MaxBytes is not
	// cached and removes its topic's older value ([EvictTooLarge]).
	MaxBytes int64
	// MaxAge ends a cached value that long after its source delivered it
	// (counted under [EvictExpired]), for sources whose messages carry no
	// expiry of their own; zero keeps values until replaced. A message's
	// own expiry ([Message].ExpiresUnixNano) ends it earlier.
	MaxAge time.Duration
	// WhenSourceDown says what a new subscription is replayed while the
	// source is disconnected: [LastValueMark] (also "") replays the cache
	// with every copy marked stale, [LastValueWithhold] replays nothing
	// (counted in last_value_withheld_total).
	WhenSourceDown LastValueWhenDown
	// OrphanAfter purges the cache once the source has been disconnected
	// that long (counted under [EvictOrphaned]); zero never purges.
	OrphanAfter time.Duration
}

// LastValueWhenDown is the choice of [LastValue].WhenSourceDown.
type LastValueWhenDown string

const (
	// LastValueMark replays cached values while the source is down, each
	// copy marked stale (DATA key 67). The default.
	LastValueMark LastValueWhenDown = "mark"
	// LastValueWithhold replays nothing while the source is down: a new
	// subscription gets live traffic only, once the source is back.
	LastValueWithhold LastValueWhenDown = "withhold"
)

// Removal reasons of a last-value cache: a topic's value left the cache
// for a bound, because it could not be updated, or because it ended, not
// because the broker deleted it.
const (
	EvictMaxTopics = "max-topics"
	EvictMaxBytes  = "max-bytes"
	// EvictTooLarge: an update larger than the cache's MaxBytes, or than
	// spec.limits.maxMessageBytes, or than weida can send, was dropped;
	// the older value goes with it, so that the cache never contradicts
	// the newer value the broker holds.
	EvictTooLarge = "too-large"
	// EvictWeidaRefused: weida refused the update (a field over its
	// cap); the older value goes with it, as for EvictTooLarge.
	EvictWeidaRefused = "weida-refused"
	// EvictExpired: the value's expiry passed (MQTT Message Expiry,
	// JetStream MaxAge or per-message TTL, or [LastValue].MaxAge).
	EvictExpired = "expired"
	// EvictOrphaned: the source was disconnected for OrphanAfter, and the
	// whole cache was purged.
	EvictOrphaned = "orphaned"
)

// LastValueSource is implemented by a [Source] whose broker stores the
// last message of each topic (a JetStream stream). When the resource keeps
// a last-value cache, the runtime calls LastValues once per attempt, after
// Start and before the first Read, to seed it; MQTT needs no such call, as
// the broker delivers its retained messages on subscribe (see
// [Message].Retained).
type LastValueSource interface {
	// LastValues calls yield with the last message the broker stores for
	// each topic the filters select, then returns. It must not affect
	// what Read delivers (no acknowledgement, no consumer of Read's). A
	// nil error with no call means there is nothing stored; an error
	// leaves the cache with what yield received, and the runtime logs it
	// and goes on bridging.
	LastValues(ctx context.Context, filters []string, yield func(*Message)) error
}

// recordingPublisher is the power a [Publisher] needs for the cache to be
// exact: update it and fan out with no replay in between, and replay it to
// new subscriptions. *weida.Publisher has it.
type recordingPublisher interface {
	PublishWith(ctx context.Context, m weida.Message, record func()) (weida.Result, error)
	SetReplayer(r weida.Replayer)
}

// lastValues is an inbound bridge's last-value cache. It outlives attempts
// (and a reload that keeps the resource unchanged), like the bridge's stats.
// Its methods are safe for concurrent use.
type lastValues struct {
	mode        LastValueMode
	maxTopics   int
	maxBytes    int64
	maxAge      time.Duration
	withhold    bool
	orphanAfter time.Duration
	now         func() time.Time

	store topic.Store[*lvEntry] // internally locked; its lock is taken inside mu when both are

	mu         sync.Mutex // guards the fields below and the recency list
	head, tail *lvEntry   // updated most recently at head
	bytes      int64
	evicted    map[string]uint64
	nextExpiry int64 // UnixNano; no entry expires before it (0: none expires)
	// The source's state, as its driver last reported it: down from
	// downSince (UnixNano) while down. A cache starts down: its first
	// attempt has not connected yet.
	down      bool
	downSince int64
	orphan    *time.Timer // purges the cache OrphanAfter into an outage

	replayed, withheld atomic.Uint64
	sourceDown         atomic.Bool // down, for Replay, which does not take mu
	// fenced, set by install, reports whether the unit that replays the
	// cache no longer holds its lease (see core.fenced); nil: no fence.
	fenced atomic.Pointer[func() bool]

	disk *lvDisk // where the cache persists; nil: in memory only (lastvalue_store.go)

	entriesG, bytesG     prometheus.Gauge
	evictedC             *prometheus.CounterVec
	replayedC, withheldC prometheus.Counter
	resource             string
}

// lvEntry is one cached topic: an immutable copy of its last message (a
// Replay reads it without the cache's lock), when the source delivered it
// and when it expires, and its place in the recency list.
type lvEntry struct {
	m          weida.Message
	size       int64
	at         int64    // UnixNano: when the source delivered the value
	expires    int64    // UnixNano; 0: never
	prev, next *lvEntry // mu
}

func (e *lvEntry) expired(now int64) bool { return e.expires != 0 && now >= e.expires }

// lvOverhead is what an entry is charged beyond its bytes, so that many
// tiny messages still count against MaxBytes.
const lvOverhead = 64

func newLastValues(cfg LastValue, m *Metrics, resource string, now func() time.Time) *lastValues {
	if cfg.Mode == LastValueOff {
		return nil
	}
	lv := &lastValues{
		mode: cfg.Mode, maxTopics: cfg.MaxTopics, maxBytes: cfg.MaxBytes,
		maxAge: cfg.MaxAge, withhold: cfg.WhenSourceDown == LastValueWithhold, orphanAfter: cfg.OrphanAfter,
		now:       now,
		evicted:   make(map[string]uint64),
		entriesG:  m.LastValueEntries.WithLabelValues(resource),
		bytesG:    m.LastValueBytes.WithLabelValues(resource),
		evictedC:  m.LastValueEvictions,
		replayedC: m.LastValueReplayed.WithLabelValues(resource),
		withheldC: m.LastValueWithheld.WithLabelValues(resource),
		resource:  resource,
		down:      true,
		downSince: now().UnixNano(),
	}
	lv.sourceDown.Store(true)
	if lv.maxTopics <= 0 {
		lv.maxTopics = DefaultLastValueTopics
	}
	if lv.maxBytes <= 0 {
		lv.maxBytes = DefaultLastValueBytes
	}
	return lv
}

// takes reports whether m updates the cache.
func (lv *lastValues) takes(m *Message) bool {
	return lv.mode == LastValueAll || m.Retained
}

// record makes wm the last value of its topic, or removes the topic when
// m is a retained message with an empty payload (MQTT's deletion) or has
// expired already.
//
// Its branches are the ways an update can end an entry (deletion, expiry,
// too large to cache, refused by weida) before one is stored; the replay
// property test drives each of them.
func (lv *lastValues) record(m *Message, wm *weida.Message) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	defer lv.disk.changed(lv)
	if m.Retained && len(wm.Payload) == 0 {
		if e, ok := lv.store.Delete(wm.Topic); ok {
			lv.unlinkLocked(e)
		}
		lv.gaugesLocked()
		return
	}
	now := lv.now().UnixNano()
	at := m.SourceUnixNano
	if at == 0 || at > now {
		at = m.ReceivedUnixNano
	}
	if at == 0 || at > now {
		at = now
	}
	expires := m.ExpiresUnixNano
	if lv.maxAge > 0 {
		if byAge := at + int64(lv.maxAge); expires == 0 || byAge < expires {
			expires = byAge
		}
	}
	if expires != 0 && now >= expires {
		// Expired on arrival: the broker no longer holds it either.
		if old, ok := lv.store.Delete(wm.Topic); ok {
			lv.unlinkLocked(old)
		}
		lv.evictLocked(EvictExpired, 1)
		lv.gaugesLocked()
		return
	}
	e := &lvEntry{at: at, expires: expires, m: weida.Message{
		Topic:       strings.Clone(wm.Topic),
		ContentType: strings.Clone(wm.ContentType),
		Traceparent: strings.Clone(wm.Traceparent),
		Tracestate:  strings.Clone(wm.Tracestate),
		Payload:     append([]byte(nil), wm.Payload...),
		// The source's number for the message, replayed as it went live.
		SourceSequence: wm.SourceSequence,
	}}
	e.size = int64(len(e.m.Topic)+len(e.m.ContentType)+len(e.m.Traceparent)+len(e.m.Tracestate)+len(e.m.Payload)) + lvOverhead
	if e.size > lv.maxBytes {
		if old, ok := lv.store.Delete(wm.Topic); ok {
			lv.unlinkLocked(old)
		}
		lv.evictLocked(EvictTooLarge, 1)
		lv.gaugesLocked()
		return
	}
	if old, replaced := lv.store.Set(e.m.Topic, e); replaced {
		lv.unlinkLocked(old)
	}
	lv.pushLocked(e)
	if expires != 0 && (lv.nextExpiry == 0 || expires < lv.nextExpiry) {
		lv.nextExpiry = expires
	}
	for lv.store.Len() > lv.maxTopics {
		lv.dropOldestLocked(EvictMaxTopics)
	}
	for lv.bytes > lv.maxBytes {
		lv.dropOldestLocked(EvictMaxBytes)
	}
	lv.gaugesLocked()
}

func (lv *lastValues) pushLocked(e *lvEntry) {
	e.prev, e.next = nil, lv.head
	if lv.head != nil {
		lv.head.prev = e
	} else {
		lv.tail = e
	}
	lv.head = e
	lv.bytes += e.size
}

func (lv *lastValues) unlinkLocked(e *lvEntry) {
	if e.prev != nil {
		e.prev.next = e.next
	} else {
		lv.head = e.next
	}
	if e.next != nil {
		e.next.prev = e.prev
	} else {
		lv.tail = e.prev
	}
	e.prev, e.next = nil, nil
	lv.bytes -= e.size
}

// dropOldestLocked evicts the topic updated longest ago. The tail is never
// the entry just pushed while a bound is exceeded, since that entry alone
// fits both bounds.
func (lv *lastValues) dropOldestLocked(reason string) {
	e := lv.tail
	lv.store.Delete(e.m.Topic)
	lv.unlinkLocked(e)
	lv.evictLocked(reason, 1)
}

func (lv *lastValues) evictLocked(reason string, n uint64) {
	lv.evicted[reason] += n
	lv.evictedC.WithLabelValues(lv.resource, reason).Add(float64(n))
}

func (lv *lastValues) gaugesLocked() {
	lv.entriesG.Set(float64(lv.store.Len()))
	lv.bytesG.Set(float64(lv.bytes))
}

// remove drops topic's value because an update of it could not be cached
// (reason EvictTooLarge or EvictWeidaRefused): the broker holds the newer
// value, which the cache must not contradict. It counts only a value that
// was there.
func (lv *lastValues) remove(topic, reason string) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if e, ok := lv.store.Delete(topic); ok {
		lv.unlinkLocked(e)
		lv.evictLocked(reason, 1)
		lv.gaugesLocked()
	}
}

// sourceState records the source's state as its driver reports it (and as
// the runtime sees it between attempts: down). The first report of an
// outage starts the orphan timer; the next report of up stops it.
func (lv *lastValues) sourceState(up bool) {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	if up == !lv.down {
		return
	}
	lv.down = !up
	lv.sourceDown.Store(!up)
	if lv.orphan != nil {
		lv.orphan.Stop()
		lv.orphan = nil
	}
	if up {
		return
	}
	lv.downSince = lv.now().UnixNano()
	if lv.orphanAfter > 0 {
		lv.orphan = time.AfterFunc(lv.orphanAfter, func() {
			lv.mu.Lock()
			defer lv.mu.Unlock()
			lv.purgeOrphanedLocked(lv.now().UnixNano())
		})
	}
}

// purgeOrphanedLocked empties the cache when the source has been down for
// OrphanAfter at now: from then until the source is back, the cache holds
// nothing (a value recorded meanwhile goes at the next look).
func (lv *lastValues) purgeOrphanedLocked(now int64) {
	if !lv.down || lv.orphanAfter <= 0 || now-lv.downSince < int64(lv.orphanAfter) || lv.head == nil {
		return
	}
	var n uint64
	for e := lv.head; e != nil; {
		next := e.next
		lv.store.Delete(e.m.Topic)
		lv.unlinkLocked(e)
		n++
		e = next
	}
	lv.evictLocked(EvictOrphaned, n)
	lv.nextExpiry = 0
	lv.gaugesLocked()
}

// sweepLocked removes every value expired at now, and empties an orphaned
// cache. It walks the cache only once the earliest expiry has passed.
func (lv *lastValues) sweepLocked(now int64) {
	lv.purgeOrphanedLocked(now)
	if lv.nextExpiry == 0 || now < lv.nextExpiry {
		return
	}
	var n uint64
	lv.nextExpiry = 0
	for e := lv.head; e != nil; {
		next := e.next
		switch {
		case e.expired(now):
			lv.store.Delete(e.m.Topic)
			lv.unlinkLocked(e)
			n++
		case e.expires != 0 && (lv.nextExpiry == 0 || e.expires < lv.nextExpiry):
			lv.nextExpiry = e.expires
		}
		e = next
	}
	if n > 0 {
		lv.evictLocked(EvictExpired, n)
		lv.gaugesLocked()
	}
}

// sweep is sweepLocked at the present time.
func (lv *lastValues) sweep() {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	lv.sweepLocked(lv.now().UnixNano())
}

// Replay implements [weida.Replayer]: every cached topic filter selects,
// found by walking the cache's topic trie with the filter, but for values
// expired by now. Each copy carries its age; while the source is down each
// is marked stale, or, with whenSourceDown: withhold, none is replayed.
//
// A fenced unit replays nothing and counts what it withheld: a replica
// resumed after a pause past its lease still has its endpoint open until
// placement stops it, and a subscriber reaching it then must not be
// handed values the holder now has, and may since have replaced.
func (lv *lastValues) Replay(filter string, yield func(weida.Message) bool) {
	// Replay runs while the path's fan-out is held, so no record runs
	// meanwhile: taking mu here keeps the lock order record has.
	lv.sweep()
	now := lv.now().UnixNano()
	stale := lv.sourceDown.Load()
	withhold := stale && lv.withhold
	if f := lv.fenced.Load(); f != nil && (*f)() {
		withhold = true
	}
	var n uint64
	lv.store.MatchFilter(filter, func(_ string, e *lvEntry) bool {
		if e.expired(now) {
			return true
		}
		if withhold {
			n++
			return true
		}
		m := e.m
		m.Replay = weida.Replay{Age: time.Duration(max(now-e.at, 0)), HasAge: true, Stale: stale}
		if !yield(m) {
			return false
		}
		n++
		return true
	})
	if n == 0 {
		return
	}
	if withhold {
		lv.withheld.Add(n)
		lv.withheldC.Add(float64(n))
		return
	}
	lv.replayed.Add(n)
	lv.replayedC.Add(float64(n))
}

// LastValueCounters describe an inbound resource's last-value cache, for
// /status.
type LastValueCounters struct {
	Mode     string            `json:"mode"`
	Entries  int               `json:"entries"`
	Bytes    int64             `json:"bytes"`
	Evicted  map[string]uint64 `json:"evicted,omitempty"`  // removed other than by the broker, by reason
	Replayed uint64            `json:"replayed"`           // copies offered to new weida subscriptions
	Withheld uint64            `json:"withheld,omitempty"` // copies not replayed while the source was down
	// Stale is true while the source is disconnected: replays now are
	// marked stale, or withheld.
	Stale bool `json:"stale,omitempty"`
}

func (lv *lastValues) snapshot() *LastValueCounters {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	lv.sweepLocked(lv.now().UnixNano())
	c := &LastValueCounters{
		Mode:     string(lv.mode),
		Entries:  lv.store.Len(),
		Bytes:    lv.bytes,
		Replayed: lv.replayed.Load(),
		Withheld: lv.withheld.Load(),
		Stale:    lv.down,
	}
	if len(lv.evicted) > 0 {
		c.Evicted = make(map[string]uint64, len(lv.evicted))
		for k, v := range lv.evicted {
			c.Evicted[k] = v
		}
	}
	return c
}

// install makes pub replay the cache for a unit that may act while
// fenced (see core.fenced) says false; a nil cache does nothing.
func (lv *lastValues) install(pub Publisher, fenced func() bool) {
	if lv == nil {
		return
	}
	lv.fenced.Store(&fenced)
	if rp, ok := pub.(recordingPublisher); ok {
		rp.SetReplayer(lv)
	}
}

// seedLastValues asks a Source whose broker stores last values for them,
// and caches those the resource's routes admit, without publishing them:
// they are history, for subscriptions made from now on.
func (b *inboundBridge) seedLastValues(ctx context.Context, src Source, filters []string) {
	lvs, ok := src.(LastValueSource)
	if b.lv == nil || !ok {
		return
	}
	n := 0
	now := b.deps.Now().UnixNano()
	err := lvs.LastValues(ctx, filters, func(m *Message) {
		if m.ReceivedUnixNano == 0 {
			m.ReceivedUnixNano = now
		}
		wm, ok := b.convertSeed(m)
		if ok {
			b.lv.record(m, &wm)
			n++
		}
	})
	if err != nil && ctx.Err() == nil {
		b.log.Warn("seeding the last-value cache from the broker failed; it fills from live messages", "err", err)
	}
	b.log.Info("last-value cache seeded from the broker", "topics", n)
}

// convertSeed applies to a seeding message the checks a live one passes.
func (b *inboundBridge) convertSeed(m *Message) (weida.Message, bool) {
	if m.Looped {
		return weida.Message{}, false
	}
	route, ok := b.inboundRoute(m.Topic)
	if !ok {
		return weida.Message{}, false
	}
	wt, err := b.spec.Policy.TopicToWeida(m.Topic)
	if err != nil || !b.exact(route, m.Topic, wt) {
		b.stats.rlog.Log(slog.LevelWarn, "seed", "a stored message has no exact weida topic; not cached", slog.String("topic", m.Topic))
		return weida.Message{}, false
	}
	if b.spec.MaxMessageBytes > 0 && len(m.Payload) > b.spec.MaxMessageBytes {
		// The broker's value is one the cache cannot hold: an older one
		// kept from an earlier attempt must not stand for it.
		b.lv.remove(wt, EvictTooLarge)
		return weida.Message{}, false
	}
	return weida.Message{Topic: wt, ContentType: m.ContentType, Traceparent: m.Traceparent, Tracestate: m.Tracestate, SourceSequence: m.Sequence, Payload: m.Payload}, true
}
