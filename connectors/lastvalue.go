package connectors

import (
	"context"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"

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
}

// Eviction reasons of a last-value cache: a topic's value left the cache
// for a bound, not because the broker deleted it.
const (
	EvictMaxTopics = "max-topics"
	EvictMaxBytes  = "max-bytes"
	EvictTooLarge  = "too-large"
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
	mode      LastValueMode
	maxTopics int
	maxBytes  int64

	store topic.Store[*lvEntry] // internally locked; its lock is taken inside mu when both are

	mu         sync.Mutex // guards the fields below and the recency list
	head, tail *lvEntry   // updated most recently at head
	bytes      int64
	evicted    map[string]uint64

	replayed atomic.Uint64

	disk *lvDisk // where the cache persists; nil: in memory only (lastvalue_store.go)

	entriesG, bytesG prometheus.Gauge
	evictedC         *prometheus.CounterVec
	replayedC        prometheus.Counter
	resource         string
}

// lvEntry is one cached topic: an immutable copy of its last message (a
// Replay reads it without the cache's lock) and its place in the recency
// list.
type lvEntry struct {
	m          weida.Message
	size       int64
	prev, next *lvEntry // mu
}

// lvOverhead is what an entry is charged beyond its bytes, so that many
// tiny messages still count against MaxBytes.
const lvOverhead = 64

func newLastValues(cfg LastValue, m *Metrics, resource string) *lastValues {
	if cfg.Mode == LastValueOff {
		return nil
	}
	lv := &lastValues{
		mode: cfg.Mode, maxTopics: cfg.MaxTopics, maxBytes: cfg.MaxBytes,
		evicted:   make(map[string]uint64),
		entriesG:  m.LastValueEntries.WithLabelValues(resource),
		bytesG:    m.LastValueBytes.WithLabelValues(resource),
		evictedC:  m.LastValueEvictions,
		replayedC: m.LastValueReplayed.WithLabelValues(resource),
		resource:  resource,
	}
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
// m is a retained message with an empty payload (MQTT's deletion).
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
	e := &lvEntry{m: weida.Message{
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

// Replay implements [weida.Replayer]: every cached topic filter selects,
// found by walking the cache's topic trie with the filter.
func (lv *lastValues) Replay(filter string, yield func(weida.Message) bool) {
	var n uint64
	lv.store.MatchFilter(filter, func(_ string, e *lvEntry) bool {
		if !yield(e.m) {
			return false
		}
		n++
		return true
	})
	if n > 0 {
		lv.replayed.Add(n)
		lv.replayedC.Add(float64(n))
	}
}

// LastValueCounters describe an inbound resource's last-value cache, for
// /status.
type LastValueCounters struct {
	Mode     string            `json:"mode"`
	Entries  int               `json:"entries"`
	Bytes    int64             `json:"bytes"`
	Evicted  map[string]uint64 `json:"evicted,omitempty"` // by reason
	Replayed uint64            `json:"replayed"`          // copies offered to new weida subscriptions
}

func (lv *lastValues) snapshot() *LastValueCounters {
	lv.mu.Lock()
	defer lv.mu.Unlock()
	c := &LastValueCounters{
		Mode:     string(lv.mode),
		Entries:  lv.store.Len(),
		Bytes:    lv.bytes,
		Replayed: lv.replayed.Load(),
	}
	if len(lv.evicted) > 0 {
		c.Evicted = make(map[string]uint64, len(lv.evicted))
		for k, v := range lv.evicted {
			c.Evicted[k] = v
		}
	}
	return c
}

// install makes pub replay the cache; a nil cache does nothing.
func (lv *lastValues) install(pub Publisher) {
	if lv == nil {
		return
	}
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
	err := lvs.LastValues(ctx, filters, func(m *Message) {
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
		return weida.Message{}, false
	}
	return weida.Message{Topic: wt, ContentType: m.ContentType, Traceparent: m.Traceparent, Tracestate: m.Tracestate, SourceSequence: m.Sequence, Payload: m.Payload}, true
}
