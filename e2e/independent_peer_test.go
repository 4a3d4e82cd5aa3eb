package e2e

import (
	"context"
	"crypto/tls"
	"encoding/binary"
	"io"
	"testing"
	"time"

	"github.com/fxamacker/cbor/v2"
	"github.com/quic-go/quic-go"
)

// independentCopy is what a weida subscriber written from PROTOCOL.md
// alone, with quic-go and a general CBOR library and no code of this
// repository, reads from an endpoint: it sends HELLO and one SUBSCRIBE and
// returns the first DATA copy's header, as a map of every key it holds,
// and its payload. It is how the e2e tests check that the extension keys
// the connector writes reach a peer that is not ours, well-formed.
func independentCopy(t *testing.T, hostPort, path, filter string) (map[uint64]cbor.RawMessage, []byte) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	dm, err := cbor.DecOptions{
		DupMapKey:   cbor.DupMapKeyEnforcedAPF,
		IndefLength: cbor.IndefLengthForbidden,
		TagsMd:      cbor.TagsForbidden,
		UTF8:        cbor.UTF8RejectInvalid,
	}.DecMode()
	if err != nil {
		t.Fatal(err)
	}
	em, err := cbor.CoreDetEncOptions().EncMode() // ascending keys, shortest forms (§5)
	if err != nil {
		t.Fatal(err)
	}
	qc, err := quic.DialAddr(ctx, hostPort,
		&tls.Config{InsecureSkipVerify: true, NextProtos: []string{"weida/0"}, MinVersion: tls.VersionTLS13},
		&quic.Config{MaxIncomingUniStreams: 1000})
	if err != nil {
		t.Fatalf("independent peer: dial %s: %v", hostPort, err)
	}
	defer func() { _ = qc.CloseWithError(0, "") }()
	send := func(kind byte, hdr any) {
		b, err := em.Marshal(hdr)
		if err != nil {
			t.Fatal(err)
		}
		st, err := qc.OpenUniStreamSync(ctx)
		if err != nil {
			t.Fatalf("independent peer: open stream: %v", err)
		}
		frame := append([]byte{0x57, kind}, quicVarint(uint64(len(b)))...)
		if _, err := st.Write(append(frame, b...)); err != nil {
			t.Fatalf("independent peer: write: %v", err)
		}
		_ = st.Close()
	}
	// HELLO (kind 0): version 0, header and stream limits, no capabilities.
	send(0, map[uint64]any{0: []uint64{0}, 1: 16384, 2: 1024, 3: []uint64{}, 4: []uint64{}})
	// SUBSCRIBE (kind 3): path and filter.
	send(3, map[uint64]string{0: path, 1: filter})
	for {
		st, err := qc.AcceptUniStream(ctx)
		if err != nil {
			t.Fatalf("independent peer: no DATA: %v (connection: %v)", err, context.Cause(qc.Context()))
		}
		all, err := io.ReadAll(st)
		if err != nil || len(all) < 3 || all[0] != 0x57 {
			t.Fatalf("independent peer: frame % X: %v", all, err)
		}
		n, w := readQuicVarint(all[2:])
		hdr, payload := all[2+w:2+w+int(n)], all[2+w+int(n):]
		if all[1] != 1 { // not DATA: the publisher's HELLO
			continue
		}
		var keys map[uint64]cbor.RawMessage
		if err := dm.Unmarshal(hdr, &keys); err != nil {
			t.Fatalf("independent peer: DATA header % X: %v", hdr, err)
		}
		return keys, payload
	}
}

func quicVarint(v uint64) []byte {
	switch {
	case v < 1<<6:
		return []byte{byte(v)}
	case v < 1<<14:
		return binary.BigEndian.AppendUint16(nil, uint16(v)|0x4000)
	case v < 1<<30:
		return binary.BigEndian.AppendUint32(nil, uint32(v)|0x8000_0000)
	}
	return binary.BigEndian.AppendUint64(nil, v|0xc000_0000_0000_0000)
}

func readQuicVarint(b []byte) (uint64, int) {
	n := 1 << (b[0] >> 6)
	v := uint64(b[0] & 0x3f)
	for _, c := range b[1:n] {
		v = v<<8 | uint64(c)
	}
	return v, n
}

// cborTrue and cborUint read one extension value the way the independent
// peer's library does.
func cborTrue(t *testing.T, raw cbor.RawMessage) bool {
	t.Helper()
	var v bool
	if err := cbor.Unmarshal(raw, &v); err != nil {
		t.Fatalf("independent peer: % X is no bool: %v", raw, err)
	}
	return v
}

func cborUint(t *testing.T, raw cbor.RawMessage) uint64 {
	t.Helper()
	var v uint64
	if err := cbor.Unmarshal(raw, &v); err != nil {
		t.Fatalf("independent peer: % X is no unsigned integer: %v", raw, err)
	}
	return v
}
