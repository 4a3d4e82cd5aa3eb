package wire_test

import (
	"bytes"
	"errors"
	"fmt"

	"weida.dev/connector/weida/wire"
)

// A publisher frames one fan-out copy; the subscriber reads the preamble
// from the stream and decodes the header. The payload follows on the stream.
func Example() {
	copyHeader := wire.Data{Endpoint: "/md", Topic: "px.eur"}
	frame := wire.AppendData(nil, &copyHeader)
	frame = wire.InsertPreamble(frame, 0, wire.KindData)
	frame = append(frame, "payload"...)
	fmt.Printf("% X\n", frame[:17])

	stream := bytes.NewReader(frame)
	kind, header, err := wire.ReadPreamble(stream, wire.DefaultMaxHeaderBytes, nil)
	if err != nil {
		panic(err)
	}
	d, err := wire.DecodeData(header)
	if err != nil {
		panic(err)
	}
	fmt.Println(kind, d.Endpoint, d.Topic, stream.Len(), "payload bytes left")
	// Output:
	// 57 01 0E A2 00 63 2F 6D 64 05 66 70 78 2E 65 75 72
	// DATA /md px.eur 7 payload bytes left
}

// Every decoding failure is a *wire.Error naming the broken rule; a peer
// closes the connection with PROTOCOL_VIOLATION.
func ExampleDecodeSubscribe() {
	// A SUBSCRIBE whose filter key comes twice.
	_, err := wire.DecodeSubscribe([]byte{0xA3, 0x00, 0x60, 0x01, 0x60, 0x01, 0x60})
	var we *wire.Error
	if errors.As(err, &we) {
		fmt.Println(we.Rule == wire.RuleDuplicateKey, "->", wire.CodeProtocolViolation)
	}
	fmt.Println(err)
	// Output:
	// true -> PROTOCOL_VIOLATION
	// wire: SUBSCRIBE header key 1: duplicate map key
}

// The HELLO a v0 peer sends, byte for byte the vector of PROTOCOL §8.
func ExampleAppendHello() {
	h := wire.NewHello(wire.DefaultMaxHeaderBytes, 1024)
	fmt.Printf("% X\n", wire.AppendPreamble(nil, wire.KindHello, wire.AppendHello(nil, &h)))
	// Output:
	// 57 00 10 A5 00 81 00 01 19 40 00 02 19 04 00 03 80 04 80
}

// ReadPreamble refuses an oversized header before allocating for it.
func ExampleReadPreamble() {
	frame := wire.AppendPreamble(nil, wire.KindData, make([]byte, 100))
	_, _, err := wire.ReadPreamble(bytes.NewReader(frame), 64, nil)
	fmt.Println(errors.Is(err, wire.ErrHeaderTooLarge))
	fmt.Println(err)
	// Output:
	// true
	// wire: preamble of DATA: header_len exceeds max_header_bytes (100 > 64)
}
