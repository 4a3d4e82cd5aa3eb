package weida

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"runtime"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quic-go/quic-go"
)

// window bounds the copies in flight in the throughput benchmarks, well
// under the subscriber budget, so that they measure delivery and not drops.
const window = 512

// BenchmarkPublishReceive publishes 256-byte messages to one subscriber
// over loopback and counts delivered copies; compare with
// BenchmarkRawQUIC, which does the same stream work without weida.
func BenchmarkPublishReceive(b *testing.B) {
	for _, subs := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			benchFanout(b, subs, 256)
		})
	}
}

func benchFanout(b *testing.B, nsubs, size int) {
	ctx := context.Background()
	l, err := Listen(ctx, "127.0.0.1:0", ListenConfig{})
	if err != nil {
		b.Fatal(err)
	}
	defer l.Close()
	p, err := l.Publisher("/bench")
	if err != nil {
		b.Fatal(err)
	}
	subs := make([]*Subscriber, nsubs)
	for i := range subs {
		s, err := Dial(ctx, pinnedURL(l, "/bench"), DialConfig{})
		if err != nil {
			b.Fatal(err)
		}
		defer s.Close()
		if err := s.Subscribe(ctx, ""); err != nil {
			b.Fatal(err)
		}
		subs[i] = s
	}
	for l.Stats().Subscriptions != int64(nsubs) {
		runtime.Gosched() // until the listener has read every SUBSCRIBE
	}
	// Each subscriber returns one credit per copy received; the publisher
	// takes one from every subscriber before each publish, so that no
	// queue grows past window copies.
	credits := make([]chan struct{}, nsubs)
	var wg sync.WaitGroup
	for i, s := range subs {
		credits[i] = make(chan struct{}, window)
		for range window {
			credits[i] <- struct{}{}
		}
		wg.Go(func() {
			for range b.N {
				if _, err := s.Receive(ctx); err != nil {
					b.Error(err)
					return
				}
				credits[i] <- struct{}{}
			}
		})
	}
	msg := Message{Topic: "bench.topic", Payload: make([]byte, size)}
	b.SetBytes(int64(size))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for range b.N {
		for _, c := range credits {
			<-c
		}
		r, err := p.Publish(ctx, msg)
		if err != nil || r.Dropped != 0 {
			b.Fatalf("Publish = %+v, %v", r, err)
		}
	}
	wg.Wait()
	b.StopTimer()
	reportRates(b, cpu0)
}

// BenchmarkRawQUIC is the transport's own limit for the work of
// BenchmarkPublishReceive/subs=1: per message, open a uni stream, write the
// same bytes (a DATA preamble and header are about 30 bytes), FIN; the
// other side accepts and reads each to FIN.
func BenchmarkRawQUIC(b *testing.B) {
	ctx := context.Background()
	cert, err := selfSigned()
	if err != nil {
		b.Fatal(err)
	}
	srvConf := rawTLS()
	srvConf.Certificates = []tls.Certificate{cert}
	ln, err := quic.ListenAddr("127.0.0.1:0", srvConf, &quic.Config{MaxIncomingUniStreams: DefaultMaxConcurrentUniStreams})
	if err != nil {
		b.Fatal(err)
	}
	defer ln.Close()
	cl, err := quic.DialAddr(ctx, ln.Addr().String(), rawTLS(), &quic.Config{MaxIncomingUniStreams: DefaultMaxConcurrentUniStreams})
	if err != nil {
		b.Fatal(err)
	}
	defer cl.CloseWithError(0, "")
	sc, err := ln.Accept(ctx)
	if err != nil {
		b.Fatal(err)
	}
	defer sc.CloseWithError(0, "")
	msg := make([]byte, 256+30)
	credit := make(chan struct{}, window)
	var wg sync.WaitGroup
	wg.Go(func() {
		buf := make([]byte, 4096)
		for range b.N {
			st, err := cl.AcceptUniStream(ctx)
			if err != nil {
				b.Error(err)
				return
			}
			for {
				if _, err := st.Read(buf); err == io.EOF {
					break
				} else if err != nil {
					b.Error(err)
					return
				}
			}
			<-credit
		}
	})
	b.SetBytes(256)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := processCPU()
	for range b.N {
		credit <- struct{}{}
		st, err := sc.OpenUniStreamSync(ctx)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := st.Write(msg); err != nil {
			b.Fatal(err)
		}
		_ = st.Close()
	}
	wg.Wait()
	b.StopTimer()
	reportRates(b, cpu0)
}

// TestPublishAllocs: Publish itself allocates nothing per call once its
// frame pool is warm, whether nobody matches or the copy is dropped. (A
// queued copy lives on in the writer, so the allocations of that path are
// those BenchmarkPublishReceive reports for the whole pipeline.)
func TestPublishAllocs(t *testing.T) {
	if raceEnabled {
		t.Skip("allocation counts are not meaningful under -race")
	}
	l := listen(t, ListenConfig{Limits: Limits{SubscriberBufferBytes: 1000}})
	p := publisher(t, l, "/md")
	// A subscriber that never reads and grants a single stream: its
	// writer blocks, its queue fills, and later copies are dropped.
	s := dial(t, l, "/md", DialConfig{Limits: Limits{MaxConcurrentUniStreams: 1}})
	subscribe(t, l, s, 1, "a.#")
	ctx := context.Background()
	for _, topic := range []string{"b.c", "a.b"} {
		msg := Message{Topic: topic, Payload: make([]byte, 256)}
		for range 20 { // fill the queue, warm the pool
			_, _ = p.Publish(ctx, msg)
		}
		allocs := testing.AllocsPerRun(1000, func() { _, _ = p.Publish(ctx, msg) })
		if allocs != 0 {
			t.Errorf("Publish(%q): %v allocations, want 0", topic, allocs)
		}
	}
	if l.Stats().Dropped.BufferFull == 0 {
		t.Error("the drop path was not exercised")
	}
}

// processCPU returns the CPU time this process has used, user and system.
func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRates adds the delivered rate and the CPU time per message, which
// is steadier than wall time on a machine shared with other work.
func reportRates(b *testing.B, cpu0 time.Duration) {
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "msgs/s")
	if cpu := processCPU() - cpu0; cpu > 0 {
		b.ReportMetric(float64(cpu.Nanoseconds())/float64(b.N), "cpu-ns/msg")
	}
}
