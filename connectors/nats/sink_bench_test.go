package nats

import (
	"context"
	"sync"
	"testing"

	natsgo "github.com/nats-io/nats.go"

	"weida.dev/connector/connectors"
	"weida.dev/connector/connectors/conntest"
	"weida.dev/connector/internal/proccpu"
)

// BenchmarkSinkWrite measures Write alone: writers concurrent Writes of
// 256-byte messages against the loopback nats-server, with a subscriber
// draining them. Compare writers=1 (a round trip per message) with many
// (round trips shared).
func BenchmarkSinkWrite(b *testing.B) {
	for _, writers := range []int{1, 16, 256} {
		b.Run("writers="+itoa(writers), func(b *testing.B) { benchSinkWrite(b, writers) })
	}
}

func itoa(n int) string {
	return string([]byte{byte('0' + n/100%10), byte('0' + n/10%10), byte('0' + n%10)})
}

func benchSinkWrite(b *testing.B, writers int) {
	requireServer(b)
	subject := "sinkbench." + conntest.Unique()
	nc := dial(b)
	defer nc.Close()
	sub, err := nc.Subscribe(subject, func(*natsgo.Msg) {})
	if err != nil {
		b.Fatal(err)
	}
	sub.SetPendingLimits(-1, -1)
	nc.Flush()
	sink, err := NewSink(Config{Host: loopback, Port: serverPort, LoopMarker: "bench"}, func(connectors.ConnState) {})
	if err != nil {
		b.Fatal(err)
	}
	defer sink.Close(context.Background())
	if err := sink.Start(context.Background()); err != nil {
		b.Fatal(err)
	}
	payload := make([]byte, 256)
	b.SetBytes(256)
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := proccpu.Self()
	var wg sync.WaitGroup
	per := b.N / writers
	for w := range writers {
		n := per
		if w == 0 {
			n += b.N % writers
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range n {
				if err := sink.Write(context.Background(), &connectors.Message{Topic: subject, Payload: payload}); err != nil {
					b.Error(err)
					return
				}
			}
		}()
	}
	wg.Wait()
	b.StopTimer()
	b.ReportMetric(float64(proccpu.Self()-cpu0)/float64(b.N), "cpu-ns/op")
	st := sink.Stats()
	b.ReportMetric(float64(st.Confirmed)/float64(max(st.FlushRounds, 1)), "msgs/round")
}
