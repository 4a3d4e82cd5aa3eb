package weida

import (
	"context"
	"errors"
	"io"
	"reflect"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quic-go/quic-go"

	"weida.dev/connector/weida/wire"
)

// queued returns the number of copies waiting for Receive.
func (q *recvQueue) queued() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.items) - q.head
}

// partialCopy dials a raw publisher that sends HELLO and then one copy for
// /p with topic "half" whose payload stops after "first " without a FIN.
// It returns the subscriber and the copy's stream, on which the test may
// write the rest.
func partialCopy(t *testing.T) (*Subscriber, *quic.SendStream) {
	t.Helper()
	srv := rawListen(t)
	streams := make(chan *quic.SendStream, 1)
	srv.start(func(qc *quic.Conn) {
		sendUni(qc, helloFrame(hello(nil)))
		streams <- sendUniOpen(qc, dataFrame("/p", "half", []byte("first ")))
	})
	s, err := Dial(testCtx(t), srv.url("/p"), DialConfig{InsecureSkipVerifyForTesting: true})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = s.Close() })
	st := <-streams
	if st == nil {
		t.Fatal("the raw publisher could not open the copy's stream")
	}
	waitFor(t, "the copy to be queued", func() bool { return s.queue.queued() == 1 })
	return s, st
}

// receiveAsync runs Receive on its own goroutine.
func receiveAsync(t *testing.T, s *Subscriber, ctx context.Context) <-chan receiveResult {
	t.Helper()
	out := make(chan receiveResult, 1)
	go func() {
		m, err := s.Receive(ctx)
		out <- receiveResult{m, err}
	}()
	return out
}

type receiveResult struct {
	m   Message
	err error
}

// TestReceiveCancel: a ctx that ends makes Receive return its error,
// whether Receive waits for a copy to arrive or for the rest of a copy's
// bytes; a copy abandoned that way is stopped with CANCELED, and the
// connection carries on.
func TestReceiveCancel(t *testing.T) {
	t.Run("waiting for a copy", func(t *testing.T) {
		l := listen(t, ListenConfig{})
		p := publisher(t, l, "/p")
		s := dial(t, l, "/p", DialConfig{})
		subscribe(t, l, s, 1, "#")
		for _, tc := range []struct {
			ctx  func() context.Context
			want error
		}{
			{func() context.Context {
				ctx, cancel := context.WithCancel(context.Background())
				cancel()
				return ctx
			}, context.Canceled},
			{func() context.Context {
				ctx, cancel := context.WithDeadline(context.Background(), time.Unix(1, 0))
				t.Cleanup(cancel)
				return ctx
			}, context.DeadlineExceeded},
		} {
			if _, err := s.Receive(tc.ctx()); !errors.Is(err, tc.want) {
				t.Errorf("Receive = %v, want %v", err, tc.want)
			}
		}
		publish(t, p, "after", []byte("x"))
		if m := receive(t, s); m.Topic != "after" {
			t.Errorf("received %q after the cancelled calls, want %q", m.Topic, "after")
		}
	})

	// Bytes missing, ctx live until Receive has had to watch it.
	t.Run("ends while bytes are missing", func(t *testing.T) {
		s, st := partialCopy(t)
		ctx, cancel := context.WithCancel(testCtx(t))
		res := receiveAsync(t, s, ctx)
		waitFor(t, "Receive to watch ctx", func() bool { return s.watched.Load() == 1 })
		cancel()
		if r := <-res; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Receive = %+v, %v; want context.Canceled", r.m, r.err)
		}
		if code := stopCode(t, st); code != quic.StreamErrorCode(Canceled) {
			t.Errorf("abandoned copy stopped with %d, want CANCELED", code)
		}
		if s.Err() != nil {
			t.Errorf("connection ended: %v", s.Err())
		}
	})

	// Bytes missing, ctx already over when Receive starts.
	t.Run("ended before the read", func(t *testing.T) {
		s, st := partialCopy(t)
		ctx, cancel := context.WithCancel(context.Background())
		cancel()
		if m, err := s.Receive(ctx); !errors.Is(err, context.Canceled) {
			t.Fatalf("Receive = %+v, %v; want context.Canceled", m, err)
		}
		if code := stopCode(t, st); code != quic.StreamErrorCode(Canceled) {
			t.Errorf("abandoned copy stopped with %d, want CANCELED", code)
		}
	})
}

// TestReceiveLateBytes: a copy whose payload arrives after Receive began
// reading it is returned whole, whether Receive watches a ctx that does not
// end or has a ctx that cannot end.
func TestReceiveLateBytes(t *testing.T) {
	t.Run("live ctx", func(t *testing.T) {
		s, st := partialCopy(t)
		ctx, cancel := context.WithCancel(testCtx(t))
		defer cancel()
		res := receiveAsync(t, s, ctx)
		// Once ctx is watched, the short first deadline has passed
		// with bytes missing; the rest arrives after it.
		waitFor(t, "Receive to watch ctx", func() bool { return s.watched.Load() == 1 })
		finish(t, st)
		if r := <-res; r.err != nil || r.m.Topic != "half" || string(r.m.Payload) != "first second" {
			t.Fatalf("Receive = %+v, %v; want topic half, payload %q", r.m, r.err, "first second")
		}
	})
	t.Run("ctx without Done", func(t *testing.T) {
		s, st := partialCopy(t)
		res := receiveAsync(t, s, context.WithoutCancel(testCtx(t)))
		finish(t, st)
		if r := <-res; r.err != nil || string(r.m.Payload) != "first second" {
			t.Fatalf("Receive = %+v, %v; want payload %q", r.m, r.err, "first second")
		}
		if n := s.watched.Load(); n != 0 {
			t.Errorf("%d reads watched a ctx that cannot end", n)
		}
	})
}

// finish writes the rest of partialCopy's payload and its FIN.
func finish(t *testing.T, st *quic.SendStream) {
	t.Helper()
	if _, err := st.Write([]byte("second")); err != nil {
		t.Fatal(err)
	}
	if err := st.Close(); err != nil {
		t.Fatal(err)
	}
}

// arrivedStream is a copy's stream whose bytes have all arrived.
type arrivedStream struct {
	data []byte
	off  int
}

func (a *arrivedStream) Read(b []byte) (int, error) {
	n := copy(b, a.data[a.off:])
	a.off += n
	if a.off == len(a.data) {
		return n, io.EOF
	}
	return n, nil
}

func (a *arrivedStream) SetReadDeadline(time.Time) error { return nil }

// TestReadPayloadAllocs: reading a copy whose bytes have arrived costs one
// allocation, the payload, whether or not the caller's ctx can end: the
// ctx is watched only when bytes are missing.
func TestReadPayloadAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	frame := dataFrame("/p", "t", make([]byte, 256))
	skip := len(frame) - 256
	cancellable, cancel := context.WithCancel(context.Background())
	defer cancel()
	for _, ctx := range []context.Context{context.Background(), cancellable} {
		st := &arrivedStream{data: frame}
		var watched atomic.Uint64
		a := testing.AllocsPerRun(100, func() {
			st.off = 0
			r := copyReader{st: st, ctx: ctx, watched: &watched}
			p, err := readPayload(&r, skip, DefaultMaxPayloadBytes)
			if err != nil || len(p) != 256 || r.stop != nil {
				t.Fatalf("readPayload = %d bytes, %v, watching ctx %t", len(p), err, r.stop != nil)
			}
		})
		if a != 1 {
			t.Errorf("ctx.Done() != nil: %t: %v allocations, want 1", ctx.Done() != nil, a)
		}
		if watched.Load() != 0 {
			t.Errorf("ctx.Done() != nil: %t: %d reads watched ctx", ctx.Done() != nil, watched.Load())
		}
	}
}

// TestDroppedUnread: copies that arrived but were never returned by
// Receive are counted when the subscriber closes, and so is a copy whose
// read the caller's ctx abandoned: the publisher counted all of them as
// written, so the subscriber's count is their only record.
func TestDroppedUnread(t *testing.T) {
	t.Run("waiting at Close", func(t *testing.T) {
		l := listen(t, ListenConfig{})
		p := publisher(t, l, "/p")
		s := dial(t, l, "/p", DialConfig{})
		subscribe(t, l, s, 1, "#")
		const sent = 5
		for range sent {
			publish(t, p, "t", []byte("x"))
		}
		waitFor(t, "the copies to arrive", func() bool { return s.queue.queued() == sent })
		receive(t, s)
		if got := s.Stats().DroppedUnread; got != 0 {
			t.Fatalf("DroppedUnread = %d before Close, want 0", got)
		}
		_ = s.Close()
		if st := s.Stats(); st.DroppedUnread != sent-1 || st.Received != 1 {
			t.Fatalf("after Close: %+v, want DroppedUnread %d and Received 1", st, sent-1)
		}
	})
	t.Run("abandoned by ctx", func(t *testing.T) {
		s, _ := partialCopy(t)
		ctx, cancel := context.WithCancel(context.Background())
		res := receiveAsync(t, s, ctx)
		// Receive takes the queued copy first, whether or not ctx has
		// ended, then gives it up waiting for its missing bytes.
		cancel()
		if r := <-res; !errors.Is(r.err, context.Canceled) {
			t.Fatalf("Receive = %v, want context.Canceled", r.err)
		}
		if got := s.Stats().DroppedUnread; got != 1 {
			t.Fatalf("DroppedUnread = %d, want 1", got)
		}
	})
}

// TestDecodeDataRemembersLast: a worker decodes a DATA header that repeats
// the previous one without decoding or allocating again, and gets what
// decoding would have given; any other header, a malformed one or one too
// long to remember, is decoded as before.
func TestDecodeDataRemembersLast(t *testing.T) {
	header := func(topic string) []byte {
		d := wire.Data{Endpoint: "/p", HasEndpoint: true, ContentLen: 3, HasContentLen: true, Topic: topic, HasTopic: true}
		return wire.AppendData(nil, &d)
	}
	a, b := header("a.b"), header("c")
	long := header(strings.Repeat("x", lastHdrSize))
	sb := newStreamBuf()
	for _, hdr := range [][]byte{a, a, b, a, long, long, a} {
		got, err := sb.decodeData(hdr)
		want, werr := wire.DecodeData(hdr)
		if err != nil || werr != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("decodeData = %+v, %v; DecodeData = %+v, %v", got, err, want, werr)
		}
	}
	if _, err := sb.decodeData([]byte{0xff}); err == nil {
		t.Fatal("a malformed header decoded")
	}
	if got, err := sb.decodeData(a); err != nil || got.Topic != "a.b" {
		t.Fatalf("after a malformed header: %+v, %v", got, err)
	}
	if raceEnabled {
		return // allocation counts are not meaningful under -race
	}
	if allocs := testing.AllocsPerRun(100, func() { _, _ = sb.decodeData(a) }); allocs != 0 {
		t.Errorf("decoding a repeated header: %v allocations, want 0", allocs)
	}
}
