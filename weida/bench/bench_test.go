package bench

import (
	"context"
	"fmt"
	"testing"
)

// BenchmarkPublishReceive publishes 256-byte messages through package weida
// to 1, 10 and 100 subscribers over loopback; compare subs=1 with
// BenchmarkRawQUIC, which does the same stream work with quic-go alone.
// The rigs are those of `connector weida bench`, which alternates them in
// one run and is the reference measurement (docs/PERFORMANCE.md).
func BenchmarkPublishReceive(b *testing.B) {
	for _, subs := range []int{1, 10, 100} {
		b.Run(fmt.Sprintf("subs=%d", subs), func(b *testing.B) {
			w, err := NewWeida(context.Background(), subs, Options{})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			runRig(b, w)
		})
	}
}

// BenchmarkPublishReceiveReceipts is BenchmarkPublishReceive/subs=1
// with receipts tracked (spec.delivery.acknowledge: received): the cost of
// quic-go's trace events and the endpoint's receipt bookkeeping per copy.
func BenchmarkPublishReceiveReceipts(b *testing.B) {
	for _, receipts := range []bool{false, true} {
		b.Run(fmt.Sprintf("receipts=%t", receipts), func(b *testing.B) {
			w, err := NewWeida(context.Background(), 1, Options{Receipts: receipts})
			if err != nil {
				b.Fatal(err)
			}
			defer w.Close()
			runRig(b, w)
		})
	}
}

// BenchmarkRawQUIC is the transport's own limit for
// BenchmarkPublishReceive/subs=1: per message, open a uni stream, write the
// same frame, FIN; the other side accepts and reads each to its FIN.
func BenchmarkRawQUIC(b *testing.B) {
	r, err := NewRaw(context.Background(), 1, Options{})
	if err != nil {
		b.Fatal(err)
	}
	defer r.Close()
	runRig(b, r)
}

// runRig runs b.N messages through rig and reports the delivered rates and
// the process's CPU time per copy, steadier than wall time on a shared
// machine.
func runRig(b *testing.B, rig Rig) {
	b.SetBytes(DefaultSize)
	b.ReportAllocs()
	b.ResetTimer()
	s, err := rig.Run(context.Background(), Load{Messages: int64(b.N)})
	b.StopTimer()
	if err != nil {
		b.Fatal(err)
	}
	b.ReportMetric(s.MessagesPerSecond(), "msgs/s")
	if rig.Receivers() > 1 {
		b.ReportMetric(s.CopiesPerSecond(), "copies/s")
	}
	if s.CPU > 0 {
		b.ReportMetric(float64(s.CPUPerCopy().Nanoseconds()), "cpu-ns/copy")
	}
}
