package weida

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// unconfirmedRecorder collects what OnCopiesUnconfirmed reports.
type unconfirmedRecorder struct {
	mu      sync.Mutex
	reports []UnconfirmedCopies
}

func (r *unconfirmedRecorder) add(u UnconfirmedCopies) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.reports = append(r.reports, u)
}

func (r *unconfirmedRecorder) all() []UnconfirmedCopies {
	r.mu.Lock()
	defer r.mu.Unlock()
	return slices.Clone(r.reports)
}

// numbered is the payload of copy i, padded to size bytes.
func numbered(i, size int) []byte {
	b := make([]byte, size)
	copy(b, strconv.Itoa(i)+";")
	return b
}

func numberOf(payload []byte) int {
	for j, c := range payload {
		if c == ';' {
			n, _ := strconv.Atoi(string(payload[:j]))
			return n
		}
	}
	return -1
}

// TestVanishedSubscriberUnconfirmed: a subscriber whose socket vanishes
// without a CONNECTION_CLOSE while copies are published to it. Every copy
// it did not receive was either never written (counted lost) or is among
// the copies reported unconfirmed, with its message as published. The
// copies never written are reported one by one too (OnCopyLost), and
// they are exactly the missing copies not reported unconfirmed.
func TestVanishedSubscriberUnconfirmed(t *testing.T) {
	t.Parallel()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/vanish")
	var rec unconfirmedRecorder
	p.OnCopiesUnconfirmed(rec.add)
	var lost atomic.Int64
	p.OnCopiesLost(func(n int) { lost.Add(int64(n)) })
	var (
		lostMu   sync.Mutex
		lostMsgs = make(map[int]int)
	)
	p.OnCopyLost(func(m Message) {
		if m.Endpoint != "/vanish" || m.Topic != "v.t" {
			t.Errorf("lost copy on %s %q is not one published", m.Endpoint, m.Topic)
		}
		lostMu.Lock()
		lostMsgs[numberOf(m.Payload)]++
		lostMu.Unlock()
	})
	s := dial(t, l, "/vanish", DialConfig{})
	subscribe(t, l, s, 1, "")

	received := make(map[int]bool)
	const before, copies = 20, 320
	for i := range before {
		publish(t, p, "v.t", numbered(i, 64))
		received[numberOf(receive(t, s).Payload)] = true
	}
	_ = s.udp.Close() // the process is gone: no CONNECTION_CLOSE leaves
	for i := before; i < copies; i++ {
		if r := publish(t, p, "v.t", numbered(i, 4096)); r.Queued != 1 {
			t.Fatalf("publish %d: %+v", i, r)
		}
	}
	waitFor(t, "the vanished subscriber to be noticed", func() bool { return l.Stats().Connections == 0 })
	// Whatever reached the subscriber and Receive still returns counts as
	// received; the rest it discarded unread.
	for {
		ctx, cancel := context.WithTimeout(t.Context(), 200*time.Millisecond)
		m, err := s.Receive(ctx)
		cancel()
		if err != nil {
			break
		}
		received[numberOf(m.Payload)] = true
	}

	reports := rec.all()
	if len(reports) != 1 {
		t.Fatalf("%d reports, want one for the one vanished connection: %+v", len(reports), reports)
	}
	u := reports[0]
	if u.Remote == "" || !vanished(u.Cause) {
		t.Errorf("report names remote %q, cause %v", u.Remote, u.Cause)
	}
	if u.Unkept != 0 {
		t.Errorf("Unkept = %d, want 0: the record had room for every copy", u.Unkept)
	}
	unconfirmed := make(map[int]bool)
	for _, m := range u.Messages {
		n := numberOf(m.Payload)
		if m.Endpoint != "/vanish" || m.Topic != "v.t" || n < 0 || n >= copies {
			t.Fatalf("reported message %q on %s %q is not one published", m.Payload[:8], m.Endpoint, m.Topic)
		}
		if unconfirmed[n] {
			t.Errorf("copy %d reported twice", n)
		}
		unconfirmed[n] = true
	}
	missing := 0
	lostMu.Lock()
	defer lostMu.Unlock()
	for i := range copies {
		switch {
		case lostMsgs[i] > 1:
			t.Errorf("copy %d reported lost %d times", i, lostMsgs[i])
		case lostMsgs[i] == 1 && (received[i] || unconfirmed[i]):
			t.Errorf("copy %d reported lost, and also received (%v) or unconfirmed (%v)", i, received[i], unconfirmed[i])
		case !received[i] && !unconfirmed[i]:
			missing++
			if lostMsgs[i] == 0 {
				t.Errorf("copy %d missing and neither reported unconfirmed nor lost", i)
			}
		}
	}
	if len(lostMsgs) != int(lost.Load()) {
		t.Errorf("OnCopyLost reported %d copies, OnCopiesLost counted %d", len(lostMsgs), lost.Load())
	}
	st := l.Stats()
	if int64(missing) != lost.Load() || st.Dropped.ConnectionClosed != uint64(lost.Load()) {
		t.Errorf("%d copies neither received nor reported unconfirmed, %d counted lost (listener: %d connection-closed)",
			missing, lost.Load(), st.Dropped.ConnectionClosed)
	}
	if st.CopiesUnconfirmed != uint64(u.Len()) {
		t.Errorf("CopiesUnconfirmed = %d, reported %d", st.CopiesUnconfirmed, u.Len())
	}
	if st.CopiesUnconfirmed > st.CopiesWritten {
		t.Errorf("CopiesUnconfirmed %d > CopiesWritten %d", st.CopiesUnconfirmed, st.CopiesWritten)
	}
	t.Logf("%d copies: %d received, %d written, %d unconfirmed, %d lost", copies, len(received), st.CopiesWritten, u.Len(), lost.Load())
}

// TestClosedConnectionsNotUnconfirmed: a subscriber that closes its
// connection, and a listener that closes its own, report nothing
// unconfirmed: the side that closed chose what it gave up.
func TestClosedConnectionsNotUnconfirmed(t *testing.T) {
	t.Parallel()
	l := listen(t, ListenConfig{})
	p := publisher(t, l, "/closed")
	var rec unconfirmedRecorder
	p.OnCopiesUnconfirmed(rec.add)
	a := dial(t, l, "/closed", DialConfig{})
	b := dial(t, l, "/closed", DialConfig{})
	subscribe(t, l, a, 1, "")
	subscribe(t, l, b, 2, "")
	for i := range 50 {
		publish(t, p, "c", numbered(i, 1024))
	}
	_ = a.Close()
	waitFor(t, "the closed subscriber to be gone", func() bool { return l.Stats().Connections == 1 })
	_ = l.Close()
	if st := l.Stats(); st.CopiesUnconfirmed != 0 || st.CopiesWritten == 0 {
		t.Errorf("written %d, unconfirmed %d; want some written, none unconfirmed", st.CopiesWritten, st.CopiesUnconfirmed)
	}
	if r := rec.all(); len(r) != 0 {
		t.Errorf("reports after closes: %+v", r)
	}
}

// testFrame encodes m for p as Publish would.
func testFrame(t *testing.T, fp *framePool, p *Publisher, m Message) *frame {
	t.Helper()
	f, err := fp.get("/log", &m)
	if err != nil {
		t.Fatal(err)
	}
	f.pub = p
	return f
}

// TestWrittenLogBounds: past its count bound the record lets the oldest
// copies go, counting them as unkept, so that the report still adds up to
// every copy written in the window; copies of a publisher without a
// callback are counted and not kept.
func TestWrittenLogBounds(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	watched := &Publisher{path: "/log"}
	watched.OnCopiesUnconfirmed(rec.add)
	other := &Publisher{path: "/log"}
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	w.maxKept = 4
	for i := range 10 {
		f := testFrame(t, &fp, watched, Message{Topic: "w", ContentType: "text/plain", Traceparent: "tp", Payload: numbered(i, 16)})
		w.written(f, w.now())
		f.release()
		g := testFrame(t, &fp, other, Message{Topic: "o", Payload: numbered(i, 16)})
		w.written(g, w.now())
		g.release()
	}
	if w.n != 4 {
		t.Fatalf("kept %d copies, want the bound 4", w.n)
	}
	var st listenerCounters
	w.finish(&st, time.Since(w.start), &quic.IdleTimeoutError{}, "peer", 1, limits.IdleTimeout)
	if got := st.copiesUnconfirmed.Load(); got != 20 {
		t.Errorf("CopiesUnconfirmed = %d, want all 20 written", got)
	}
	reports := rec.all()
	if len(reports) != 1 {
		t.Fatalf("reports: %+v", reports)
	}
	u := reports[0]
	if len(u.Messages) != 4 || u.Unkept != 6 {
		t.Fatalf("reported %d messages and %d unkept, want the last 4 and 6", len(u.Messages), u.Unkept)
	}
	for j, m := range u.Messages {
		want := Message{Endpoint: "/log", Topic: "w", ContentType: "text/plain", Traceparent: "tp", Payload: numbered(6+j, 16)}
		if fmt.Sprint(m) != fmt.Sprint(want) {
			t.Errorf("message %d = %+v, want %+v", j, m, want)
		}
	}
	if w.n != 0 || w.ring != nil {
		t.Errorf("finish kept %d copies", w.n)
	}
}

// TestWrittenLogNotVanished: a connection closed by either side reports
// nothing and releases what it kept.
func TestWrittenLogNotVanished(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	p := &Publisher{path: "/log"}
	p.OnCopiesUnconfirmed(rec.add)
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	f := testFrame(t, &fp, p, Message{Topic: "x"})
	w.written(f, w.now())
	if f.refs.Load() != 2 {
		t.Fatalf("a kept copy holds its frame: refs %d", f.refs.Load())
	}
	var st listenerCounters
	w.finish(&st, time.Since(w.start), &quic.ApplicationError{Remote: true}, "peer", 1, limits.IdleTimeout)
	if f.refs.Load() != 1 || st.copiesUnconfirmed.Load() != 0 || len(rec.all()) != 0 {
		t.Errorf("refs %d, unconfirmed %d, reports %d", f.refs.Load(), st.copiesUnconfirmed.Load(), len(rec.all()))
	}
	f.release()
}

// TestWrittenLogAllocs: while no publisher asked for reports, noting a
// written copy allocates nothing and keeps nothing.
func TestWrittenLogAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	var fp framePool
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	f := testFrame(t, &fp, &Publisher{path: "/log"}, Message{Topic: "x", Payload: make([]byte, 256)})
	if allocs := testing.AllocsPerRun(1000, func() { w.written(f, w.now()) }); allocs != 0 {
		t.Errorf("written: %v allocations, want 0", allocs)
	}
	if w.n != 0 || f.refs.Load() != 1 {
		t.Errorf("kept %d copies without a callback", w.n)
	}
}

func TestVanished(t *testing.T) {
	for _, c := range []struct {
		err  error
		want bool
	}{
		{&quic.IdleTimeoutError{}, true},
		{&quic.StatelessResetError{}, true},
		{fmt.Errorf("wrapped: %w", &quic.IdleTimeoutError{}), true},
		{errors.New("read udp: use of closed network connection"), true},
		{&quic.ApplicationError{Remote: true, ErrorCode: quic.ApplicationErrorCode(NoError)}, false},
		{&quic.ApplicationError{Remote: false, ErrorCode: quic.ApplicationErrorCode(Shutdown)}, false},
		{&quic.TransportError{Remote: true}, false},
		{&quic.TransportError{Remote: false}, false},
	} {
		if got := vanished(c.err); got != c.want {
			t.Errorf("vanished(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}

// TestWrittenLogCountOnly: a publisher that asked only for the number
// holds no frame, and its report carries every copy in the window as
// Unkept; noting a copy then allocates nothing once its counter exists.
func TestWrittenLogCountOnly(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	p := &Publisher{path: "/log"}
	p.CountCopiesUnconfirmed(rec.add)
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	f := testFrame(t, &fp, p, Message{Topic: "x", Payload: make([]byte, 64)})
	for range 7 {
		w.written(f, w.now())
	}
	if w.n != 0 || f.refs.Load() != 1 {
		t.Fatalf("count-only kept %d copies, frame refs %d", w.n, f.refs.Load())
	}
	if !raceEnabled {
		if allocs := testing.AllocsPerRun(1000, func() { w.written(f, w.now()) }); allocs != 0 {
			t.Errorf("written, count only: %v allocations, want 0", allocs)
		}
	}
	var st listenerCounters
	w.finish(&st, time.Since(w.start), &quic.StatelessResetError{}, "peer", 1, limits.IdleTimeout)
	reports := rec.all()
	want := int(st.copiesUnconfirmed.Load())
	if len(reports) != 1 || len(reports[0].Messages) != 0 || reports[0].Unkept != want || want < 7 {
		t.Fatalf("reports %+v, want one with Unkept = %d (>= 7) and no messages", reports, want)
	}
	f.release()
}

// TestWrittenLogHold: when a vanished peer had used up its stream credit
// within the window, copies written before the window still count as
// unconfirmed up to what it could hold unread (its HELLO's
// max_transfers), per publisher with a callback and in total; a publisher
// without a callback gets no report.
func TestWrittenLogHold(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	watched := &Publisher{path: "/log"}
	watched.OnCopiesUnconfirmed(rec.add)
	other := &Publisher{path: "/log"}
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	for i := range 10 {
		f := testFrame(t, &fp, watched, Message{Topic: "w", Payload: numbered(i, 16)})
		w.written(f, w.now())
		f.release()
	}
	g := testFrame(t, &fp, other, Message{Topic: "o"})
	w.written(g, w.now())
	g.release()
	// A peer that had credit to spare adds nothing beyond the window...
	var fast writtenLog
	fast.init(&limits)
	f := testFrame(t, &fp, watched, Message{Topic: "w"})
	fast.written(f, fast.now())
	f.release()
	var none listenerCounters
	fast.finish(&none, time.Since(fast.start)+time.Hour, &quic.IdleTimeoutError{}, "peer", 4, limits.IdleTimeout)
	if got := none.copiesUnconfirmed.Load(); got != 0 || len(rec.all()) != 0 {
		t.Fatalf("a peer that never ran out of credit: %d unconfirmed outside the window", got)
	}
	// ... one whose credit ran out held up to its hold. The end is seen
	// an hour later: nothing written lies in the window but the block.
	var st listenerCounters
	ended := time.Since(w.start) + time.Hour
	w.blocked = w.bucketOf(ended) + 1
	w.finish(&st, ended, &quic.IdleTimeoutError{}, "peer", 4, limits.IdleTimeout)
	if got := st.copiesUnconfirmed.Load(); got != 4 {
		t.Errorf("CopiesUnconfirmed = %d, want the hold of 4", got)
	}
	// The ring still holds them, so they come with their messages.
	reports := rec.all()
	if len(reports) != 1 || reports[0].Len() != 4 || len(reports[0].Messages) != 4 {
		t.Fatalf("reports %+v, want one with the last 4 copies", reports)
	}
	for j, m := range reports[0].Messages {
		if n := numberOf(m.Payload); n != 6+j {
			t.Errorf("reported copy %d is number %d, want %d", j, n, 6+j)
		}
	}
}

// TestWrittenLogKeepsHold: copies older than the window stay in the ring
// while they are among the last the peer can hold (its max_transfers), so
// that a peer whose credit ran out gets them reported with their messages,
// not only counted as Unkept.
func TestWrittenLogKeepsHold(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	p := &Publisher{path: "/log"}
	p.OnCopiesUnconfirmed(rec.add)
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	w.setHold(100)
	for i := range 10 {
		f := testFrame(t, &fp, p, Message{Topic: "w", Payload: numbered(i, 16)})
		w.written(f, w.now())
		f.release()
	}
	// An hour passes: the ten are far older than any window.
	w.start = w.start.Add(-time.Hour)
	f := testFrame(t, &fp, p, Message{Topic: "w", Payload: numbered(10, 16)})
	w.written(f, w.now())
	f.release()
	if w.n != 11 {
		t.Fatalf("the ring holds %d copies, want all 11: they are among the last 100", w.n)
	}
	var st listenerCounters
	ended := time.Since(w.start)
	w.blocked = w.bucketOf(ended) + 1
	w.finish(&st, ended, &quic.IdleTimeoutError{}, "peer", 100, limits.IdleTimeout)
	reports := rec.all()
	if len(reports) != 1 || len(reports[0].Messages) != 11 || reports[0].Unkept != 0 {
		t.Fatalf("reports %+v, want one with all 11 copies as messages", reports)
	}
}

// TestWrittenLogParkedAtEnd: the copies still parked in QUIC when the
// writer of a vanished connection ended count as unconfirmed even when
// they were handed over before the window, since QUIC may never have
// sent them.
func TestWrittenLogParkedAtEnd(t *testing.T) {
	var fp framePool
	var rec unconfirmedRecorder
	p := &Publisher{path: "/log"}
	p.CountCopiesUnconfirmed(rec.add)
	limits, _ := Limits{}.withDefaults(true)
	var w writtenLog
	w.init(&limits)
	for range 10 {
		f := testFrame(t, &fp, p, Message{Topic: "w"})
		w.written(f, w.now())
		f.release()
	}
	w.parkedAtEnd = 3
	var st listenerCounters
	w.finish(&st, time.Since(w.start)+time.Hour, &quic.IdleTimeoutError{}, "peer", 1000, limits.IdleTimeout)
	if got := st.copiesUnconfirmed.Load(); got != 3 {
		t.Errorf("CopiesUnconfirmed = %d, want the 3 parked", got)
	}
	if r := rec.all(); len(r) != 1 || r[0].Unkept != 3 {
		t.Fatalf("reports %+v, want one with 3 unkept", r)
	}
}

// TestWrittenLogReachStretchedByProbeTimeouts: when quic-go's idle timeout
// was stretched by three probe timeouts of a slow path, the window reaches
// back as far as that timeout did (plus the margin), so copies written
// after the peer's last packet are counted even when that was longer ago
// than the configured idle timeout.
func TestWrittenLogReachStretchedByProbeTimeouts(t *testing.T) {
	var fp framePool
	p := &Publisher{path: "/log"}
	limits, _ := Limits{}.withDefaults(true) // idle timeout 2 s: a 3 s window
	write := func(w *writtenLog, at ...time.Duration) {
		for _, d := range at {
			f := testFrame(t, &fp, p, Message{Topic: "w"})
			w.written(f, d)
			f.release()
		}
	}
	ended := 8 * time.Second
	for _, c := range []struct {
		idle time.Duration
		want uint64
	}{
		{limits.IdleTimeout, 1},      // 7 s only
		{4500 * time.Millisecond, 2}, // 3 s and 7 s: the window is 5.5 s
		{time.Hour, 3},               // all three, within the longest reach
	} {
		var w writtenLog
		w.init(&limits)
		write(&w, time.Second, 3*time.Second, 7*time.Second)
		var st listenerCounters
		w.finish(&st, ended, &quic.IdleTimeoutError{}, "peer", 1, c.idle)
		if got := st.copiesUnconfirmed.Load(); got != c.want {
			t.Errorf("idle %v: %d unconfirmed, want %d", c.idle, got, c.want)
		}
	}
}

// TestIdleReach follows quic-go's rule: the configured idle timeout, or
// three probe timeouts when those are longer.
func TestIdleReach(t *testing.T) {
	for _, c := range []struct {
		srtt, dev time.Duration
		want      time.Duration
	}{
		{0, 0, 2 * time.Second}, // no measurement yet
		{time.Millisecond, 0, 2 * time.Second},
		{time.Second, 100 * time.Millisecond, 3 * (time.Second + 400*time.Millisecond + 25*time.Millisecond)},
	} {
		if got := idleReach(2*time.Second, quic.ConnectionStats{SmoothedRTT: c.srtt, MeanDeviation: c.dev}); got != c.want {
			t.Errorf("srtt %v, deviation %v: %v, want %v", c.srtt, c.dev, got, c.want)
		}
	}
}
