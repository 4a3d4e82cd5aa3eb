package weida

import (
	"context"
	"runtime"
	"testing"

	"github.com/quic-go/quic-go"
)

// heapInUse is the live heap after a full collection.
func heapInUse() int64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return int64(ms.HeapAlloc)
}

// TestParkedStreamCost measures what one small copy costs while it waits
// unsent inside quic-go: a stream opened, its bytes written and FIN
// queued, the peer's connection flow-control window exhausted so nothing
// leaves. That is the state a plain Write leaves a copy in, and the
// number copyOverhead must cover (with the part of the send queue the
// copy also holds, measured by TestQueuedCopyCost).
func TestParkedStreamCost(t *testing.T) {
	const streams = 2000
	srv := rawListen(t)
	ready := make(chan *quic.Conn, 1)
	srv.start(func(qc *quic.Conn) { ready <- qc })
	// The client grants the streams but a connection window of 16 KiB,
	// and never reads, so nearly every copy stays parked at the server.
	qc, err := quic.DialAddr(testCtx(t), srv.ln.Addr().String(), rawTLS(), &quic.Config{
		MaxIncomingUniStreams:          streams + 10,
		InitialConnectionReceiveWindow: 16 << 10,
		MaxConnectionReceiveWindow:     16 << 10,
	})
	if err != nil {
		t.Fatal(err)
	}
	defer qc.CloseWithError(0, "")
	server := <-ready
	buf := make([]byte, 300) // a 256-byte message with its header
	before := heapInUse()
	kept := make([]*quic.SendStream, 0, streams) // what the writer would have dropped; quic-go keeps them too
	for range streams {
		s, err := server.OpenUniStreamSync(context.Background())
		if err != nil {
			t.Fatal(err)
		}
		if _, err := s.Write(buf); err != nil {
			t.Fatal(err)
		}
		_ = s.Close()
		kept = append(kept, s)
	}
	after := heapInUse()
	per := (after - before - int64(cap(kept))*8) / streams
	t.Logf("a parked %d-byte copy costs %d bytes of heap in quic-go", len(buf), per)
	if per > parkedCopyCost {
		t.Errorf("a parked copy costs %d bytes, more than parkedCopyCost (%d): raise it", per, parkedCopyCost)
	}
	runtime.KeepAlive(kept)
}

// TestQueuedCopyCost measures what a queued copy costs the heap when its
// frame is its own (no other subscriber shares it, the worst case): the
// frame, its buffer and the queue's slot, against what the budget charges
// it (queuedCharge). A shared frame costs each further subscriber only the
// slot, so the charge over-counts it and the bound holds a fortiori.
func TestQueuedCopyCost(t *testing.T) {
	const copies = 4000
	l := fakeListener(1 << 30)
	p, _ := l.Publisher("/a")
	sc := fakeConn(l, 16384)
	sc.subscribe("/a", "")
	msg := Message{Topic: "sensors.a.temp", Payload: make([]byte, 256)}
	f, _ := l.frames.get("/a", &msg)
	charge := f.queuedCharge()
	f.release()
	before := heapInUse()
	for range copies {
		// A fresh pool each time defeats reuse, as distinct messages
		// queued behind a stalled writer would.
		l.frames = framePool{}
		if r, err := p.Publish(context.Background(), msg); err != nil || r.Queued != 1 {
			t.Fatalf("publish: %+v %v", r, err)
		}
	}
	after := heapInUse()
	per := (after - before) / copies
	t.Logf("a queued copy with its own %d-byte frame costs %d bytes of heap; it is charged %d", f.charge(), per, charge)
	if per > charge {
		t.Errorf("a queued copy costs %d bytes, more than its charge (%d): raise queuedCopyOverhead", per, charge)
	}
	if sc.queued() != copies {
		t.Fatalf("queued %d, want %d", sc.queued(), copies)
	}
	sc.q.close(&l.stats)
}
