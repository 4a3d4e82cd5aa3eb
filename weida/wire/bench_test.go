package wire

import (
	"bytes"
	"testing"
)

// The benchmarks measure the headers a Pub/Sub peer handles per message (the
// fan-out DATA copy) and per subscription (SUBSCRIBE). Run with
//
//	go test -run '^$' -bench . -benchmem ./weida/wire

func BenchmarkAppendDataFanOut(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(AppendData(nil, &fanOut))))
	for b.Loop() {
		buf = AppendData(buf[:0], &fanOut)
	}
}

func BenchmarkDecodeDataFanOut(b *testing.B) {
	h := AppendData(nil, &fanOut)
	b.ReportAllocs()
	b.SetBytes(int64(len(h)))
	for b.Loop() {
		if _, err := DecodeData(h); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFrameDataFanOut is the whole per-copy write path: header and
// preamble into one reused buffer.
func BenchmarkFrameDataFanOut(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = InsertPreamble(AppendData(buf[:0], &fanOut), 0, KindData)
	}
}

// BenchmarkReadDataFanOut is the whole per-copy read path: preamble from a
// stream into a reused buffer, then the header.
func BenchmarkReadDataFanOut(b *testing.B) {
	frame := AppendPreamble(nil, KindData, AppendData(nil, &fanOut))
	r := bytes.NewReader(frame)
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	b.SetBytes(int64(len(frame)))
	for b.Loop() {
		r.Reset(frame)
		_, h, err := ReadPreamble(r, DefaultMaxHeaderBytes, buf[:0])
		if err != nil {
			b.Fatal(err)
		}
		if _, err := DecodeData(h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendSubscribe(b *testing.B) {
	buf := make([]byte, 0, 512)
	b.ReportAllocs()
	for b.Loop() {
		buf = AppendSubscribe(buf[:0], &subscribe)
	}
}

func BenchmarkDecodeSubscribe(b *testing.B) {
	h := AppendSubscribe(nil, &subscribe)
	b.ReportAllocs()
	b.SetBytes(int64(len(h)))
	for b.Loop() {
		if _, err := DecodeSubscribe(h); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkDecodeHello(b *testing.B) {
	h := AppendHello(nil, &Hello{Versions: []uint64{0}, MaxHeaderBytes: DefaultMaxHeaderBytes, MaxTransfers: 1024})
	b.ReportAllocs()
	for b.Loop() {
		if _, err := DecodeHello(h); err != nil {
			b.Fatal(err)
		}
	}
}
