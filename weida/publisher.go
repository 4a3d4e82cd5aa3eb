package weida

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"weida.dev/connector/weida/wire"
)

// Message is one Pub/Sub message.
//
// On [Publisher.Publish] Endpoint and Replay are ignored (the publisher's
// path is sent, and a live copy carries no replay marks) and Publish
// neither modifies nor keeps any of the fields: it copies what it needs
// before it returns, so the caller may reuse Payload at once. On
// [Subscriber.Receive] every field comes from the copy's DATA header, an
// absent text key reads as "", and Payload is a fresh slice the caller owns.
type Message struct {
	Endpoint    string // DATA key 0: the publisher path
	Topic       string // key 5: at most 256 bytes of UTF-8; '*' and '#' are ordinary bytes here
	ContentType string // key 2: opaque label, at most 256 bytes
	Traceparent string // key 3: W3C trace context, at most 128 bytes; forwarded, never minted
	Tracestate  string // key 4: opaque, at most 512 bytes; forwarded unchanged
	// SourceSequence is extension key 68 (wire.DataSourceSequence): the
	// message's position in the source it was bridged from (a JetStream
	// stream sequence), carried alike on a replayed and a live copy, so a
	// subscriber can order the two and see gaps. 0 = none.
	SourceSequence uint64
	Payload        []byte
	// Replay holds the replay marks (extension keys 65-67, see
	// docs/WEIDA.md): on Receive, whether the copy was replayed from the
	// publisher's last-value cache rather than published live, and how
	// old and how current its value is. A [Replayer] sets Age and Stale
	// on what it yields; the listener sets Replayed.
	Replay Replay
}

// Replay are the marks of a replayed copy. The zero value is a live copy's,
// or one from a publisher that does not mark its replays (weida itself
// replays nothing, so only an extension such as this one's can say).
type Replay struct {
	// Replayed is true when the copy came from the publisher's cache on
	// subscribing, not from a publish after it (key 65).
	Replayed bool
	// Age is how long before the replay the publisher's source delivered
	// the value, in whole milliseconds, when HasAge (key 66).
	Age    time.Duration
	HasAge bool
	// Stale is true when the publisher's source was disconnected as the
	// copy was replayed: the source may hold a newer value, or none
	// (key 67).
	Stale bool
}

func (r Replay) marks() wire.ReplayMarks {
	m := wire.ReplayMarks{Replayed: r.Replayed, Stale: r.Stale, HasAge: r.HasAge}
	if r.HasAge && r.Age > 0 {
		m.AgeMillis = uint64(r.Age / time.Millisecond)
	}
	return m
}

func replayOf(m wire.ReplayMarks) Replay {
	r := Replay{Replayed: m.Replayed, Stale: m.Stale, HasAge: m.HasAge}
	if m.HasAge {
		const maxMillis = uint64(1<<63-1) / uint64(time.Millisecond)
		r.Age = time.Duration(min(m.AgeMillis, maxMillis)) * time.Millisecond
	}
	return r
}

// messageOf is the Message a decoded DATA header and its payload make.
func messageOf(d *wire.Data, payload []byte) Message {
	return Message{
		Endpoint:       d.Endpoint,
		Topic:          d.Topic,
		ContentType:    d.ContentType,
		Traceparent:    d.Traceparent,
		Tracestate:     d.Tracestate,
		SourceSequence: d.SourceSequence,
		Payload:        payload,
		Replay:         replayOf(d.Replay),
	}
}

// Result counts what one Publish did with the subscribers whose filters
// matched: Matched = Queued + Dropped, one per subscriber connection however
// many of its filters matched.
type Result struct {
	Matched int // subscriber connections with at least one matching filter
	Queued  int // copies accepted into a subscriber's send queue
	Dropped int // copies dropped: the subscriber's buffer was full, or the header exceeded its max_header_bytes, or it was closing
	// Closing counts the copies of Dropped whose subscriber connection was
	// already closing: nobody was there to take them, as opposed to a
	// subscriber too slow or too small for them.
	Closing int
	// OwnReplay counts the copies of Dropped that did not fit because
	// their subscriber's buffer still held copies of a replay it asked
	// for (see [DropCounts].OwnReplay): it filled its own buffer.
	OwnReplay int
}

// Publisher is one publisher path registered on a [Listener]. Its methods
// are safe for concurrent use.
type Publisher struct {
	l      *Listener
	path   string
	ps     *pathState
	closed atomic.Bool
	lost   atomic.Pointer[func(n int)] // see OnCopiesLost
	// lostCopy is the OnCopyLost callback: each lost copy as published.
	lostCopy atomic.Pointer[func(Message)]
	// unconfirmed is the OnCopiesUnconfirmed or CountCopiesUnconfirmed
	// callback; while it is nil, or set by CountCopiesUnconfirmed,
	// connections keep no copy of this publisher's.
	unconfirmed atomic.Pointer[unconfirmedCallback]
}

// unconfirmedCallback is a Publisher's unconfirmed-copies callback and
// whether it wants the copies themselves or only their number.
type unconfirmedCallback struct {
	fn   func(UnconfirmedCopies)
	keep bool
}

// Path returns the publisher's path.
func (p *Publisher) Path() string { return p.path }

// Subscribers returns the number of connections holding at least one
// subscription on this path.
func (p *Publisher) Subscribers() int {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	return p.ps.refs
}

// Matches reports whether a live subscriber connection (one not closing)
// holds a filter on this path that matches topic: whether a Publish of
// topic now would queue a copy for somebody, buffers permitting. The answer
// may be stale by the time the caller acts on it; see
// [Publisher.SubscriptionsChanged] to wait for a change.
func (p *Publisher) Matches(topic string) bool {
	found := false
	p.ps.idx.Match(topic, func(cp *connPath) bool {
		if cp.sc.c.ctx.Err() == nil {
			found = true
			return false
		}
		return true
	})
	return found
}

// SubscriptionsChanged returns a channel that is closed the next time a
// subscription is added on this path. To wait for a subscriber without
// missing one, take the channel first, then test [Publisher.Matches], then
// wait on the channel.
func (p *Publisher) SubscriptionsChanged() <-chan struct{} {
	p.l.mu.Lock()
	defer p.l.mu.Unlock()
	if p.ps.changed == nil {
		p.ps.changed = make(chan struct{})
	}
	return p.ps.changed
}

// OnCopiesLost sets fn to be called with n whenever n copies this
// Publisher queued are dropped before they were written, because their
// subscriber connection closed: losses that happen after Publish returned
// and so are absent from its [Result]. fn is called from the listener's
// goroutines, must be safe for concurrent use and must not block; nil
// stops the calls. The calls go on after Close for copies still queued.
func (p *Publisher) OnCopiesLost(fn func(n int)) {
	if fn == nil {
		p.lost.Store(nil)
		return
	}
	p.lost.Store(&fn)
}

// OnCopyLost sets fn to be called with each copy this Publisher queued
// that was then dropped before it was written, because its subscriber
// connection closed: the copies [Publisher.OnCopiesLost] counts, one call
// per copy, with the message as published (Endpoint is the path), so that
// a caller can tell which messages a subscriber missed. The Message and
// its Payload are fresh: fn may keep them. Decoding a copy back into its
// Message costs an allocation, paid only for lost copies and only while
// fn is set. fn is called from the listener's goroutines, must be safe
// for concurrent use and must not block; nil stops the calls. It is
// independent of OnCopiesLost: with both set, both are called.
func (p *Publisher) OnCopyLost(fn func(Message)) {
	if fn == nil {
		p.lostCopy.Store(nil)
		return
	}
	p.lostCopy.Store(&fn)
}

// lost reports f, a copy queued for a subscriber connection that closed
// before it was written, to its publisher.
func (f *frame) lost() {
	p := f.pub
	if p == nil {
		return
	}
	if fn := p.lost.Load(); fn != nil {
		(*fn)(1)
	}
	if fn := p.lostCopy.Load(); fn != nil {
		(*fn)(f.message())
	}
}

// OnCopiesUnconfirmed sets fn to be called when a subscriber connection
// ends without a close from either side (idle timeout, stateless reset, a
// broken socket: the subscriber's process was killed or its host is gone),
// with the copies of this Publisher written to that connection within the
// unconfirmed window before the end was seen. weida v0 has no
// acknowledgement: such a copy was handed to QUIC and counted as written,
// and may or may not have reached the subscriber. Copies still queued at
// the end are not among them; they go to [Publisher.OnCopiesLost].
//
// The window is the listener's Limits.IdleTimeout plus one second, reaching
// back from the moment the end was seen: quic-go tells neither which
// stream data the peer acknowledged nor when its last packet arrived, so
// the window covers every copy written after the peer's last packet, and
// some before it that were delivered. A copy that QUIC held back longer
// than the window before the peer vanished (a subscriber that lagged, its
// stream credit used up) would escape it: when the connection's writer
// found the peer's stream credit used up within the window, the last
// copies written up to that credit (the peer's HELLO max_transfers) are
// reported too, as Unkept.
//
// While fn is set, each connection keeps the copies it writes for this
// Publisher (holding their encoded frames, not copies of them) for as long
// as the window, and its last ones up to the peer's max_transfers however
// old, so that those reported through the peer's credit come with their
// messages too; at most 4096 copies and Limits.SubscriberBufferBytes of
// them per connection; copies that do not fit are counted in
// [UnconfirmedCopies].Unkept. While no Publisher of a listener has fn set,
// nothing is kept. Copies written before fn was set are not reported.
// [ListenerStats].CopiesUnconfirmed counts the copies of every publisher,
// with or without fn.
//
// A close by the subscriber (its Close, an UNSUBSCRIBE, a protocol
// error it reports) or by the listener (Close, Shutdown, a violation, a
// limit) reports nothing: the side that closed chose what it gave up.
//
// fn is called once per vanished connection that had such copies, from
// the listener's goroutines, after the connection's subscriptions are
// gone; it must be safe for concurrent use and must not block. nil stops
// the calls. The calls go on after Close for connections already open.
func (p *Publisher) OnCopiesUnconfirmed(fn func(UnconfirmedCopies)) {
	p.setUnconfirmed(fn, true)
}

// CountCopiesUnconfirmed is [Publisher.OnCopiesUnconfirmed] for a caller
// that needs only how many copies are at risk: fn gets every one of them
// in [UnconfirmedCopies].Unkept and no Messages, and connections hold no
// frame for it, so that publishing costs what it costs without a callback
// but for one map lookup per written copy. It replaces a callback set by
// OnCopiesUnconfirmed, and the other way round.
func (p *Publisher) CountCopiesUnconfirmed(fn func(UnconfirmedCopies)) {
	p.setUnconfirmed(fn, false)
}

func (p *Publisher) setUnconfirmed(fn func(UnconfirmedCopies), keep bool) {
	if fn == nil {
		p.unconfirmed.Store(nil)
		return
	}
	p.unconfirmed.Store(&unconfirmedCallback{fn: fn, keep: keep})
}

// Close unregisters the path: later Publish calls return [ErrClosed], and
// DATA arriving for the path is refused as UNKNOWN_ENDPOINT. Subscriptions
// on the path are kept, and a new Publisher for the path serves them.
// Copies already queued are still sent. Closing twice is harmless.
func (p *Publisher) Close() error {
	if p.closed.Swap(true) {
		return nil
	}
	p.l.unregister(p)
	return nil
}

// Publish sends one copy of m to every subscriber connection holding a
// filter on this path that matches m.Topic, however many of its filters
// match (PROTOCOL §9.5). Each copy is a DATA frame {endpoint, topic,
// content_type, traceparent, tracestate, content_len} and the payload on a
// fresh uni stream of the connection the SUBSCRIBE arrived on.
//
// Publish never blocks on a subscriber: it hands each copy to that
// connection's writer, which opens the stream and writes it. A copy that
// would take the connection's queued bytes past Limits.SubscriberBufferBytes
// is dropped for that subscriber alone (the arriving copy, never a queued
// one), as is a copy whose header exceeds the subscriber's advertised
// max_header_bytes; both are counted in [Listener.Stats]. A copy is charged
// what it costs the listener's memory, not only its header and payload
// bytes: its buffer as allocated plus a fixed overhead while queued, and
// quic-go's state for its stream while QUIC holds it unsent (see
// docs/WEIDA.md, "Memory under load").
//
// Publish fails without sending anything when ctx is already done, the
// publisher is closed ([ErrClosed]), a field breaks its cap
// ([ErrInvalidMessage]), or the copy could never fit a subscriber's budget
// ([ErrPayloadTooLarge]). A nil error with Matched = 0 means nobody was
// subscribed; weida keeps nothing for later subscribers.
func (p *Publisher) Publish(ctx context.Context, m Message) (Result, error) {
	return p.PublishWith(ctx, m, nil)
}

// PublishWith is [Publisher.Publish] with a hook: record, when not nil, is
// called once m has passed every check Publish makes and before its first
// copy is queued, and no SUBSCRIBE on the path replays (see
// [Publisher.SetReplayer]) between the start of record and the end of the
// fan-out. A last-value cache that record updates and the Replayer reads is
// therefore replayed either before m (the new subscription gets m live) or
// after it (the replay holds m and the fan-out did not reach the new
// subscription): never both, never neither, unless the copy is dropped
// for the subscriber's full buffer (counted, as any drop). record is not
// called when PublishWith fails. It must not call the Publisher and should
// be quick: concurrent Publish calls on the path proceed, but a SUBSCRIBE
// waits.
func (p *Publisher) PublishWith(ctx context.Context, m Message, record func()) (Result, error) {
	return p.publish(ctx, m, record, nil)
}

// publish is PublishWith, and PublishWithReceipt when done is not nil.
func (p *Publisher) publish(ctx context.Context, m Message, record func(), done func(Receipt)) (Result, error) {
	if err := ctx.Err(); err != nil {
		return Result{}, err
	}
	if p.closed.Load() {
		return Result{}, fmt.Errorf("weida: publish on %s: %w", p.path, ErrClosed)
	}
	f, err := p.l.frames.get(p.path, &m)
	if err != nil {
		return Result{}, err
	}
	f.pub = p
	if f.queuedCharge() > p.l.limits.SubscriberBufferBytes {
		f.release()
		return Result{}, fmt.Errorf("weida: publish on %s: %d bytes of payload and header (%d with the copy's overhead): %w",
			p.path, f.charge(), f.queuedCharge(), ErrPayloadTooLarge)
	}
	if done != nil {
		f.group = newReceiptGroup(done)
	}
	fo := fanoutPool.Get().(*fanout)
	fo.f, fo.r = f, Result{}
	p.ps.fan.RLock()
	if record != nil {
		record()
	}
	p.ps.idx.Match(m.Topic, fo.yield)
	p.ps.fan.RUnlock()
	r := fo.r
	fo.f = nil
	fanoutPool.Put(fo)
	// The publisher's own reference: from here on the copies alone keep
	// the group waiting.
	f.group.releaseIfAny()
	f.release()
	st := &p.l.stats
	st.published.Add(1)
	st.copiesQueued.Add(uint64(r.Queued))
	return r, nil
}

// fanout is the state of one Publish's walk over the matching connections.
// It is pooled with its yield function bound once, because a closure handed
// to the index would be allocated on every Publish.
type fanout struct {
	f     *frame
	r     Result
	yield func(*connPath) bool
}

var fanoutPool = sync.Pool{New: func() any {
	fo := new(fanout)
	fo.yield = fo.visit
	return fo
}}

func (fo *fanout) visit(cp *connPath) bool {
	fo.r.Matched++
	g := fo.f.group
	if g != nil {
		g.add() // before the push: the writer may settle the copy at once
	}
	switch cp.sc.enqueue(fo.f) {
	case pushOK:
		fo.r.Queued++
		return true
	case pushClosed:
		fo.r.Dropped++
		fo.r.Closing++
	case pushOwnReplay:
		fo.r.Dropped++
		fo.r.OwnReplay++
	default:
		fo.r.Dropped++
	}
	if g != nil {
		g.release()
	}
	return true
}

// frame is one encoded DATA copy (preamble, header, payload), shared by
// every subscriber connection it is queued on and returned to its pool when
// the last of them has written it.
type frame struct {
	buf    []byte // preamble, header and payload: written with one Write
	hdrLen int    // header bytes, checked against each peer's max_header_bytes
	refs   atomic.Int32
	pool   *framePool
	pub    *Publisher // who published it, told of its copies lost after queueing
	// group waits for the receipts of the frame's copies; nil unless it
	// was published with PublishWithReceipt.
	group *receiptGroup
	// replayed marks the copy of a replay, queued on one connection only
	// (see sendQueue.replayed).
	replayed bool
}

// charge is the frame's bytes, header and payload; what a copy of it
// costs a subscriber's budget while queued is queuedCharge.
func (f *frame) charge() int64 { return int64(len(f.buf)) }

// queuedCharge is what a queued copy of f costs its subscriber's budget:
// its buffer as allocated (its capacity, which a pooled buffer may have
// beyond its length, plus what the allocator rounds it up by: at most an
// eighth to its size class up to 32 KiB, at most a page of 8 KiB above)
// and its slot and frame (queuedCopyOverhead).
func (f *frame) queuedCharge() int64 {
	c := int64(cap(f.buf))
	return c + min(c/8, 8<<10) + queuedCopyOverhead
}

func (f *frame) retain() { f.refs.Add(1) }

// release drops one reference; the last one recycles the frame.
func (f *frame) release() {
	if f.refs.Add(-1) == 0 {
		f.pool.put(f)
	}
}

// framePool recycles frames whose buffers are small enough to keep.
type framePool struct{ p sync.Pool }

// replayMarksBytes bounds what the replay marks add to a header: three
// two-byte keys, two one-byte flags and a uint of at most nine bytes.
const replayMarksBytes = 3*2 + 2 + 9

// maxPooledFrame bounds the buffers kept for reuse, so one large message
// does not pin its size in the pool.
const maxPooledFrame = 64 << 10

// get encodes m for path into a frame holding one reference (the caller's),
// as a live copy: without m.Replay.
func (fp *framePool) get(path string, m *Message) (*frame, error) {
	return fp.encode(path, m, wire.ReplayMarks{})
}

// encode is get with the replay marks to write.
func (fp *framePool) encode(path string, m *Message, marks wire.ReplayMarks) (*frame, error) {
	d := wire.Data{
		Replay:   marks,
		Endpoint: path, HasEndpoint: true,
		ContentLen: uint64(len(m.Payload)), HasContentLen: true,
		ContentType: m.ContentType,
		Traceparent: m.Traceparent,
		Tracestate:  m.Tracestate,
		Topic:       m.Topic, HasTopic: true,
		SourceSequence: m.SourceSequence,
	}
	if err := d.Validate(); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidMessage, err)
	}
	f, _ := fp.p.Get().(*frame)
	if f == nil {
		f = &frame{pool: fp}
	}
	buf := f.buf[:0]
	if need := 16 + 64 + len(path) + len(m.Topic) + len(m.ContentType) +
		len(m.Traceparent) + len(m.Tracestate) + len(m.Payload) + replayMarksBytes; cap(buf) < need {
		buf = make([]byte, 0, need)
	}
	buf = wire.AppendData(buf, &d)
	hdrLen := len(buf)
	buf = wire.InsertPreamble(buf, 0, wire.KindData)
	buf = append(buf, m.Payload...)
	f.buf, f.hdrLen = buf, hdrLen
	f.refs.Store(1)
	return f, nil
}

func (fp *framePool) put(f *frame) {
	f.pub, f.group, f.replayed = nil, nil, false
	if cap(f.buf) > maxPooledFrame {
		f.buf = nil
	}
	fp.p.Put(f)
}
