package wire

import (
	"bytes"
	"testing"
)

// fanOut is the header a publisher writes for every copy: endpoint, topic,
// content type, content length and trace context.
var fanOut = Data{
	Endpoint: "/md", HasEndpoint: true,
	ContentLen: 256, HasContentLen: true,
	ContentType: "application/json",
	Traceparent: "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
	Tracestate:  "congo=t61rcWkgMzE",
	Topic:       "sensors.building-7.floor-3.temp", HasTopic: true,
}

var subscribe = Subscribe{Endpoint: "/md", Filter: "sensors.*.temp"}

func TestEncodeDoesNotAllocate(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	hello := NewHello(DefaultMaxHeaderBytes, 1024)
	hello.GuaranteesOffered = map[uint64]uint64{GuaranteeOrdering: 1, GuaranteeBackpressure: 2}
	hello.GuaranteesRequired = map[uint64]uint64{GuaranteeOrdering: 1, GuaranteeBackpressure: 2}
	errFrame := ErrorFrame{Code: ErrorUnsupported, Message: "publisher path"}
	buf := make([]byte, 0, 512)
	for name, f := range map[string]func(){
		"AppendData":       func() { buf = AppendData(buf[:0], &fanOut) },
		"AppendSubscribe":  func() { buf = AppendSubscribe(buf[:0], &subscribe) },
		"AppendHello":      func() { buf = AppendHello(buf[:0], &hello) },
		"AppendErrorFrame": func() { buf = AppendErrorFrame(buf[:0], &errFrame) },
		"AppendPreamble":   func() { buf = AppendPreamble(buf[:0], KindData, buf[100:200]) },
		"InsertPreamble":   func() { buf = InsertPreamble(AppendData(buf[:0], &fanOut), 0, KindData) },
		"Validate": func() {
			_ = fanOut.Validate()
			_ = subscribe.Validate()
			_ = hello.Validate()
		},
	} {
		if n := testing.AllocsPerRun(100, f); n != 0 {
			t.Errorf("%s: %v allocations, want 0", name, n)
		}
	}
}

// TestDecodeAllocations pins what each decoder allocates: the strings and
// lists it returns, nothing for parsing.
func TestDecodeAllocations(t *testing.T) {
	if raceEnabled {
		t.Skip("the race detector changes allocation counts")
	}
	fan := AppendData(nil, &fanOut)
	sub := AppendSubscribe(nil, &subscribe)
	hello := AppendHello(nil, &Hello{Versions: []uint64{0}, Capabilities: []uint64{}, RequiredCapabilities: []uint64{}})
	frame := AppendPreamble(nil, KindData, fan)
	r := bytes.NewReader(frame)
	buf := make([]byte, 0, 512)
	for _, c := range []struct {
		name string
		want float64
		f    func()
	}{
		{"DecodeData fan-out (one shared string)", 1, func() { _, _ = DecodeData(fan) }},
		{"DecodeData reply", 0, func() { _, _ = DecodeData([]byte{0xa0}) }},
		{"DecodeData confirm", 0, func() { _, _ = DecodeData([]byte{0xa1, 0x08, 0x02}) }},
		{"DecodeSubscribe (one shared string)", 1, func() { _, _ = DecodeSubscribe(sub) }},
		{"DecodeErrorFrame without message", 0, func() { _, _ = DecodeErrorFrame([]byte{0xa1, 0x00, 0x05}) }},
		{"DecodeHello v0 (the versions list; empty lists cost nothing)", 1, func() { _, _ = DecodeHello(hello) }},
		{"ReadPreamble into a reused buffer", 0, func() {
			r.Reset(frame)
			_, buf, _ = ReadPreamble(r, DefaultMaxHeaderBytes, buf[:0])
		}},
		{"ReadPreamble with a nil buffer (scratch doubles as header)", 1, func() {
			r.Reset(frame)
			_, _, _ = ReadPreamble(r, DefaultMaxHeaderBytes, nil)
		}},
		{"ParsePreamble", 0, func() { _, _, _, _ = ParsePreamble(frame, DefaultMaxHeaderBytes) }},
	} {
		if n := testing.AllocsPerRun(100, c.f); n != c.want {
			t.Errorf("%s: %v allocations, want %v", c.name, n, c.want)
		}
	}
}
